"""The scoring kinds: one module per kind, one table that chooses the kind once.

| kind        | module          | scores                                                  |
|-------------|-----------------|---------------------------------------------------------|
| `chat`      | `chat.py`       | a chat completion's choices, as `labels` scores labels  |
| `next-token`| `chat.py`       | a chat completion's next token over the vocabulary      |
| `rerank`    | `rerank.py`     | (query, document) relevance, each query's tokens once   |
| `finetune`  | `finetune.py`   | LoRA adapters and a score head (or the labels' tokens)  |
| `seqcls`    | `seqcls.py`     | a sequence-classification checkpoint's own score head   |
| `questions` | `questions.py`  | several questions per text, each a branch after it      |
| `head`      | `head.py`       | a learned linear head on hidden states                  |
| `features`  | `head.py`       | nothing: a classifier made for its hidden states        |
| `labels`    | `labels.py`     | the labels' own tokens after the prompt (the default)   |

`KINDS` is asked in order: the first kind whose `wants(args)` is true is the one (`labels`
wants anything, so it is last). Everything that varies by kind (its settings' checks, items,
extra tokens per row, batch scoring, calibration, output shape, task-file section) is a
method of the kind (`base.KindSpec`, `base.Kind`); the classifier, the task file, the job,
the service and the estimator ask the kind instead of branching on it.

Adding a kind: one module here (a `KindSpec` and its `Kind`) and one line in `KINDS`.

May import: ground, text, models, weights, engine.
"""

from __future__ import annotations

from typing import Any

from ..ground.errors import UserError
from .base import Kind, KindArgs, KindSpec, OnePrompt, RunSettings, TaskError
from .chat import ChatChoiceSpec, NextTokenSpec, chat_spec
from .finetune import FinetuneSpec
from .head import FeaturesSpec, HeadSpec
from .labels import LabelsSpec
from .questions import QuestionsSpec
from .rerank import RerankSpec
from .seqcls import SeqClsSpec

KINDS: tuple[type[KindSpec], ...] = (
    ChatChoiceSpec,
    NextTokenSpec,
    RerankSpec,
    FinetuneSpec,
    SeqClsSpec,
    QuestionsSpec,
    HeadSpec,
    FeaturesSpec,
    LabelsSpec,
)
BY_NAME: dict[str, type[KindSpec]] = {k.name: k for k in KINDS}


def spec_of(args: KindArgs | None = None, **kw: Any) -> KindSpec:
    """The kind `args` (or the `KindArgs` fields given by name) ask for, its settings checked."""
    args = args if args is not None else KindArgs(**kw)
    for kind in KINDS:
        if kind.wants(args):
            return kind.from_args(args)
    raise AssertionError("the labels kind takes any arguments")  # pragma: no cover


def read_task(d: dict[str, Any], where: str, labels: list[str], calibration: Any) -> dict[str, Any]:
    """The scoring section of a task file's JSON object, read by the kind it belongs to."""
    for kind in KINDS:
        section = kind.read_task(d, where, labels, calibration)
        if section is not None:
            return section
    raise AssertionError("the labels kind reads any task file")  # pragma: no cover


def request_spec(
    served: KindSpec, labels: tuple[str, ...], same_prompt: bool, truncate: str | None, descriptions: Any = None
) -> KindSpec:
    """The kind of a service request on the served task (`served`): the served kind where it holds
    for the request's labels and prompt (`KindSpec.for_request`), else zero-shot labels.
    A `TaskError` when the served kind cannot truncate and the request asks it to."""
    own = served.for_request(tuple(labels), same_prompt)
    if own is not None and truncate is not None and not own.truncates:
        raise TaskError(own.no_truncation)
    if own is not None:
        return own
    return LabelsSpec.from_args(KindArgs(tuple(labels), label_descriptions=descriptions))


def reranker_spec(served: KindSpec | None, model_head: Any, model_name: str) -> KindSpec:
    """The reranker a service's rerank routes run: the served kind when it is one (`serve
    --reranker`), else the one the model says it is (`--reranker auto`: a one-label sequence
    classifier, or a causal LM named *Reranker*). A `LabelError` says why the model is none."""
    if isinstance(served, RerankSpec):
        return served
    return RerankSpec.from_args(KindArgs(model_head=model_head, extra={"reranker": "auto", "model_name": model_name}))


def kind_named(name: str) -> type[KindSpec]:
    """The kind a task file or manifest names."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise UserError(f"unknown scoring kind {name!r}; this mlx-slm knows {', '.join(BY_NAME)}") from None


__all__ = [
    "BY_NAME",
    "KINDS",
    "ChatChoiceSpec",
    "NextTokenSpec",
    "chat_spec",
    "FeaturesSpec",
    "FinetuneSpec",
    "HeadSpec",
    "Kind",
    "KindArgs",
    "KindSpec",
    "LabelsSpec",
    "OnePrompt",
    "QuestionsSpec",
    "RerankSpec",
    "RunSettings",
    "SeqClsSpec",
    "TaskError",
    "read_task",
    "request_spec",
    "reranker_spec",
    "kind_named",
    "spec_of",
]
