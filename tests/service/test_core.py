"""The service core (`service/core.py`): `Service`, its lifecycle and one request's path; a load refused
for the user's reason says it without a class name, the warm-up measures a long item too."""

from __future__ import annotations

import pytest

from mlx_slm.service import ServeOptions, TaskCache

pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


from mlx_slm.server import Service  # noqa: E402

# ----------------------------------------------------------------------------- no class names


def test_a_load_refused_for_the_users_reason_shows_no_class_name():
    from mlx_slm.kinds.base import TaskError

    def load():
        raise TaskError("the task's prior was fitted on weights sha256 abab..., but the model loaded has cdcd...")

    service = Service(load, ServeOptions())
    service._main()  # the worker's start: the load fails, the worker returns
    assert service.load_error.startswith("the task's prior") and "TaskError" not in service.load_error


def test_the_warm_up_measures_a_long_item_too(tiny_qwen_mlx):
    """The slope of the estimate is a long item's cost per token: the warm-up measures a short, a
    longer and a long item (short items alone priced jevcompat's 5,642-token choice at twice its time)."""
    from mlx_slm.service import classifier_loader
    from mlx_slm.service.core import warm_up

    tasks = TaskCache(4)
    tasks.load(classifier_loader(str(tiny_qwen_mlx), ["billing", "technical"])())
    seen: list[int] = []
    warm_up(tasks, lambda seconds, tokens: seen.append(tokens))
    assert len(seen) == 3 and seen[0] < seen[1] < seen[2] and seen[2] >= 3 * seen[1], seen
