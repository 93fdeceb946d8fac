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

`decisions.py` is no kind of this table: it is what a `classifier.decider.Decider` runs (typed
decisions, System One's and OpenAI's, each request its own state and questions), on the same
branch pieces as `questions` (`text.branches.pack_branches`, `questions.option_scores`).

May import: ground, text, models, weights, engine.
"""

from __future__ import annotations

from typing import Any

from .base import Kind, KindArgs, KindSettings, KindSpec, ModelFacts, OnePrompt, RunSettings, TaskError
from .chat import ChatChoiceSpec, ChatSettings, NextTokenSpec
from .finetune import FineTunedSettings, FinetuneSpec
from .head import FeaturesSettings, FeaturesSpec, HeadSettings, HeadSpec
from .labels import LabelsSpec
from .questions import QuestionsSettings, QuestionsSpec
from .rerank import RerankSettings, RerankSpec
from .seqcls import SeqClsSettings, SeqClsSpec

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


# The labels kind's arguments (`KindArgs`' own fields); every other kind's are its `Settings.NAMES`.
COMMON = (
    "labels",
    "scoring",
    "examples",
    "label_descriptions",
    "keep_logits",
    "label_pass",
    "none_label",
    "truncate",
    "system",
    "template",
)


def scoring_names() -> set[str]:
    """Every scoring argument's name: the labels kind's (`COMMON`) and each kind's own."""
    return set(COMMON) | {n for k in KINDS if k.Settings is not None for n in k.Settings.NAMES}


def arguments(model: ModelFacts | None = None, **named: Any) -> KindArgs:
    """The one translator: what a caller says about scoring, by the Python API's argument names
    (`Classifier`'s keywords; the CLI's options, a task file's section and a service request are
    said by these names too), to the typed `KindArgs` the table reads. The labels kind's fields
    are `COMMON`; each kind's `Settings.take` reads its own names (`system`, `template`: only
    when a caller typed its own prompt). A name no kind takes is a `TypeError` naming it."""
    known = scoring_names()
    unknown = sorted(set(named) - known)
    if unknown:
        raise TypeError(f"unknown scoring argument(s) {', '.join(unknown)}: the kinds take {', '.join(sorted(known))}")
    own = []
    for cls in dict.fromkeys(k.Settings for k in KINDS if k.Settings is not None):
        got = cls.take(named)
        if got is not None:
            own.append(got)
    common = {k: named[k] for k in COMMON if named.get(k) is not None}
    if "examples" in common:
        common["examples"] = tuple(common["examples"])
    return KindArgs(**common, model=model or ModelFacts(), own=tuple(own))


def spec_of(args: KindArgs | None = None, **kw: Any) -> KindSpec:
    """The kind `args` (or the arguments given by name, as `arguments` takes them) ask for, its
    settings checked; a kind's settings that the chosen kind cannot use are refused by name
    (`KindSettings.unused`): one rule for every front end."""
    args = args if args is not None else arguments(**kw)
    for kind in KINDS:
        if kind.wants(args):
            spec = kind.from_args(args)
            for other in args.own:
                if not spec.uses(other):
                    raise other.unused(spec)
            return spec
    raise AssertionError("the labels kind takes any arguments")  # pragma: no cover


def section_of(**named: Any) -> KindSettings | None:
    """The one kind section the Python API's names give a task (`Task(head=...)`,
    `Task(questions=...)`: a kind's own settings, read by the kind that owns each name), or None
    when they ask for no kind of their own; a `TypeError` when they ask for two."""
    own = arguments(**named).own
    if len(own) > 1:
        raise TypeError(f"give one kind's section, not {len(own)}: {', '.join(type(s).__name__ for s in own)}")
    return own[0] if own else None


def read_task(d: dict[str, Any], where: str, labels: list[str], calibration: Any) -> dict[str, Any]:
    """The scoring section of a task file's JSON object, read by the kind it belongs to."""
    for kind in KINDS:
        section = kind.read_task(d, where, labels, calibration)
        if section is not None:
            return section
    raise AssertionError("the labels kind reads any task file")  # pragma: no cover


def request_spec(served: KindSpec, args: KindArgs, same_prompt: bool = True) -> KindSpec:
    """The kind a service request runs beside the served task (`served`), chosen from the
    request's own arguments (`arguments`) by the table (`spec_of`), as every front end chooses.
    A request for a kind of its own (a reranker, a chat completion: its settings in `args.own`)
    runs the served kind when that is the kind asked (`serve --reranker`); a request of labels
    runs the served kind where it holds for those labels and that prompt (`for_request`), else
    zero-shot labels. A `TaskError` when the served kind cannot truncate and the request asks it to."""
    if args.own:
        return served if all(served.uses(s) for s in args.own) else spec_of(args)
    own = served.for_request(tuple(args.labels), same_prompt)
    if own is None:
        return spec_of(args)
    if args.truncate is not None and not own.truncates:
        raise TaskError(own.no_truncation)
    return own


def reranker_spec(served: KindSpec | None, model_head: Any, model_name: str) -> KindSpec:
    """The reranker a service's rerank routes run: the served kind when it is one (`serve
    --reranker`), else the one the model says it is (`--reranker auto`: a one-label sequence
    classifier, or a causal LM named *Reranker*). A `LabelError` says why the model is none."""
    args = arguments(ModelFacts(model_head, model_name), reranker="auto")
    return spec_of(args) if served is None else request_spec(served, args)


def chat_spec(choices: tuple[str, ...]) -> KindSpec:
    """The kind of a chat completion: its choices scored as labels, or (none) its next token."""
    return spec_of(arguments(labels=tuple(choices), conversation=True))


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
    "KindSettings",
    "ChatSettings",
    "FineTunedSettings",
    "FeaturesSettings",
    "HeadSettings",
    "QuestionsSettings",
    "RerankSettings",
    "SeqClsSettings",
    "ModelFacts",
    "arguments",
    "scoring_names",
    "section_of",
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
    "spec_of",
]
