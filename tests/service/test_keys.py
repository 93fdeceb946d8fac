"""The task cache's keys and a request's task (issue 48): a key is a frozen value that builds its own
task (no tuple dispatched on its first part); a request's classifier is the served plan with its own
kind, prompt and truncation (`Classifier(engine, plan=...)`), its kind chosen by the kinds table."""

from __future__ import annotations

import dataclasses

import pytest

from mlx_slm.kinds import ChatChoiceSpec, LabelsSpec, NextTokenSpec
from mlx_slm.server import ServeOptions, Service, classifier_loader
from mlx_slm.service import Call
from mlx_slm.service.keys import DECIDE_KEY, ChatTask, ClassifyTask, EmbedTask, RerankTask


def test_keys_are_frozen_values_compared_by_their_class():
    a, b = ClassifyTask(("x", "y"), None, "{text}", None), ClassifyTask(("x", "y"), None, "{text}", None)
    assert a == b and hash(a) == hash(b) and len({a, b, RerankTask(None), EmbedTask(False), DECIDE_KEY}) == 4
    assert RerankTask(None) != ChatTask(()) and EmbedTask(False) != EmbedTask(True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.labels = ("z",)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Call(("text",), "text", 0.0).whole = "texts"  # type: ignore[misc]


def test_a_requests_task_is_the_served_plan_with_its_own_kind(tiny_qwen_mlx):
    svc = Service(
        classifier_loader(str(tiny_qwen_mlx), ["billing", "technical"], batch_size=3, use_prefix_cache=False),
        ServeOptions(max_wait_ms=5),
    )
    svc.tasks.load(svc.loader())
    served = svc.tasks.base
    own = svc.tasks.front(svc.task_key(["up", "down"], None, None, "tail"))
    assert isinstance(own.spec, LabelsSpec) and own.labels == ("up", "down") and own.truncate == "tail"
    plan = own.plan
    assert (plan.batch_size, plan.use_prefix_cache) == (3, False) == (served.plan.batch_size, False)
    assert plan.calibration.method == "none" and plan.min_confidence is None
    assert own.prefix_tokens == ()  # the served task's run settings: no prefix cache
    chat = svc.tasks.front(svc.tasks.chat_key(("yes", "no")))
    assert isinstance(chat.spec, ChatChoiceSpec) and chat.labels == ("yes", "no")
    assert isinstance(svc.tasks.front(svc.tasks.chat_key(())).spec, NextTokenSpec)
    assert svc.tasks.front(svc.default_key) is svc.tasks.front(svc.task_key(None, None, None, None))
