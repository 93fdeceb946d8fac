"""The contract every scoring kind keeps (`kinds/base.py`): what a kind takes beside its own settings,
said once on the spec (`calibrates`, `abstains`, `truncates`) and refused by the one rule
(`KindSpec.check_calibration`), asked the same way by every caller (issue 48)."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.kinds import (
    ChatChoiceSpec,
    HeadSettings,
    LabelsSpec,
    ModelFacts,
    NextTokenSpec,
    QuestionsSettings,
    RerankSpec,
    TaskError,
    arguments,
    request_spec,
    section_of,
    spec_of,
)
from mlx_slm.text.calibration import CalibrationSpec
from mlx_slm.text.heads import Head
from mlx_slm.text.labels import LabelError
from mlx_slm.text.questions import Question

LABELS = ("billing", "technical", "account")


NONE, BATCH = CalibrationSpec(), CalibrationSpec.of("batch")


def _head(labels=LABELS, dim=8) -> Head:
    k, rng = len(labels), np.random.default_rng(0)
    w = rng.normal(size=(k, dim)).astype(np.float32)
    return Head(tuple(labels), (2,), np.zeros(dim, np.float32), np.ones(dim, np.float32), w, np.zeros(k, np.float32))


def _spec(model=None, **named):
    return spec_of(arguments(model, **named))


@pytest.mark.parametrize(
    ("named", "calibrates", "abstains", "truncates"),
    [
        (dict(labels=LABELS), True, True, True),
        (dict(labels=LABELS, head=_head()), False, True, True),
        (dict(labels=LABELS, conversation=True), False, False, False),
        (dict(conversation=True), False, False, False),
        (dict(questions=(Question("team", "Which team?", "choice", LABELS),)), True, True, False),
    ],
)
def test_what_a_kind_takes_is_said_once_and_refused_by_one_rule(named, calibrates, abstains, truncates):
    spec = _spec(**named)
    assert (spec.calibrates, spec.abstains, spec.truncates) == (calibrates, abstains, truncates)
    spec.check_calibration(NONE)  # nothing asked: nothing refused
    for cal, conf, takes in ((BATCH, None, calibrates), (NONE, 0.5, abstains)):
        if takes:
            spec.check_calibration(cal, conf)
        else:
            with pytest.raises(LabelError, match=spec.no_calibration[:20]):
                spec.check_calibration(cal, conf)


def test_a_relevance_score_takes_no_threshold():
    spec = _spec(ModelFacts(None, "Qwen3-Reranker-0.6B"), reranker="auto")
    assert isinstance(spec, RerankSpec) and not spec.abstains and not spec.calibrates
    with pytest.raises(LabelError, match="relevance scores"):
        spec.check_calibration(NONE, 0.5)


def test_a_kind_that_cannot_truncate_refuses_a_request_that_asks_it():
    served = _spec(questions=(Question("team", "Which team?", "choice", LABELS),))
    assert request_spec(served, arguments(labels=())) is served
    with pytest.raises(TaskError, match="truncation is not supported"):
        request_spec(served, arguments(labels=(), truncate="tail"))


# Asked the same way by every caller: a service request's kind chosen by the table (`kinds.request_spec`,
# `kinds.reranker_spec`), and a task section's names for the Python API.


def test_a_service_request_chooses_its_kind_through_the_table():
    served = _spec(labels=LABELS)
    assert request_spec(served, arguments(labels=LABELS)) is served  # the served kind holds for its labels
    other = request_spec(served, arguments(labels=("up", "down")), same_prompt=True)
    assert isinstance(other, LabelsSpec) and other.labels == ("up", "down")  # zero-shot labels
    chat = request_spec(served, arguments(labels=("yes", "no"), conversation=True))
    assert isinstance(chat, ChatChoiceSpec) and chat.labels == ("yes", "no")
    assert isinstance(request_spec(served, arguments(labels=(), conversation=True)), NextTokenSpec)
    head = _spec(labels=LABELS, head=_head())
    assert request_spec(head, arguments(labels=LABELS), same_prompt=True) is head
    assert isinstance(request_spec(head, arguments(labels=LABELS), same_prompt=False), LabelsSpec)


def test_a_served_reranker_answers_the_rerank_routes_and_others_are_the_tables():
    asked = arguments(ModelFacts(None, "tiny"), reranker="auto")
    served = _spec(ModelFacts(None, "tiny"), reranker="qwen3", instruction="Find the answer")
    assert request_spec(served, asked) is served
    with pytest.raises(LabelError, match="is not a reranker"):
        request_spec(_spec(labels=LABELS), asked)


def test_the_python_api_names_of_a_task_section():
    head = _head()
    assert section_of(head=None, questions=None) is None
    assert section_of(head=head) == HeadSettings(head)
    q = (Question("team", "Which team?", "choice", LABELS),)
    assert section_of(questions=q) == QuestionsSettings(q)
    assert QuestionsSettings(q).trained is None and HeadSettings(head).trained == "learned head"
    with pytest.raises(TypeError, match="one kind's section"):
        section_of(head=head, questions=q)


def test_a_text_far_over_the_context_is_refused_by_its_size_before_tokenizing(engine, monkeypatch):
    """The tiny model: tokens of at most 13 characters, a context of 1024: a text of more than
    2 x 13 x 1024 characters cannot fit, and is an error row without being tokenized (a 20 MB line
    took 26 s and 3.6 GB to be refused); a shorter over-long one is tokenized and refused as before;
    with truncation both are cut, not refused."""
    from mlx_slm.text.prompts import max_token_chars
    from tests.hostile import task_clf

    per = max_token_chars(engine.tokenizer)
    assert per == max(len(t) for t in engine.tokenizer.get_vocab())
    huge, long = "word " * (2 * per * 1024 // 5 + 10), "word " * 1500
    seen: list[int] = []
    clf = task_clf(engine)
    kind = type(clf.kind)
    real = kind.encode
    monkeypatch.setattr(
        kind, "encode", lambda self, texts, pairs=None: seen.extend(map(len, texts)) or real(self, texts, pairs)
    )
    preds = list(clf.run([huge, long, "My card was charged twice"]))
    assert "characters, far over the model's context of 1024" in preds[0].error
    assert "prompt is" in preds[1].error and preds[2].ok
    assert max(seen) < len(huge)  # the huge text never reached the tokenizer
    cut = list(task_clf(engine, truncate="head").run([huge, long]))
    assert all(p.ok and p.truncated for p in cut)
