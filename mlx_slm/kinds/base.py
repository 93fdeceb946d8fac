"""The contract every scoring kind keeps: a spec without a model, and the spec bound to one.

A kind of scoring is what turns a batch of prompts into predictions: the labels' own tokens
(`labels.py`), a learned head on hidden states (`head.py`), several questions per text
(`questions.py`). Each is one module with two halves:

* `KindSpec`: its settings alone, checked once at construction (no engine needed): its
  labels, the options it refuses, its section of a task file, its output shape
  (`records.RecordShape`), its per-run calibration and its prompt format;
* `Kind`: the spec bound to an `Engine` and a prompt: texts to tokenized `Item`s (with an
  error for what cannot run), what a row costs beside its prompt (`row_extra`, in the batch
  plan's token budget), what must still fit after it (`label_extra`), and one batch's
  predictions (`score`).

The pipeline (`pipeline.py`) runs any `Kind` the same way: items -> prefix split -> batch plan
-> `kind.score` -> predictions in input order. The table that chooses the kind is in
`kinds/__init__.py`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

import numpy as np

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache
from ..ground.errors import UserError
from ..ground.textfiles import has_lone_surrogate
from ..text.batching import Batch
from ..text.calibration import Calibration, CalibrationSpec
from ..text.inputs import missing
from ..text.labels import LabelError, LabelSet
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import (
    PROBES,
    PromptError,
    PromptFormat,
    common_prefix,
    example_problem,
    render,
    size_problem,
    tokenize,
)
from ..text.records import RecordShape


class KindSettings:
    """A kind's own settings, typed: a frozen dataclass in the kind's module (`RerankSettings`,
    `SeqClsSettings`, ...), named by its spec's `Settings`. Every front end says them by the
    Python API's argument names (`NAMES`: what `Classifier(...)` takes, what the CLI's options and
    a task file's section translate to); `take` reads them from those names, `named` gives them
    back (a task's section under options typed over it), `task` is what a task file holds."""

    NAMES: ClassVar[tuple[str, ...]] = ()
    # What of a task with these settings was trained on its own model, labels and prompt (None: nothing).
    trained: ClassVar[str | None] = None

    @classmethod
    def take(cls, named: Mapping[str, Any]) -> KindSettings | None:
        """These settings from the named arguments, or None when they ask nothing of this kind."""
        raise NotImplementedError

    def named(self, home: str | None = None) -> dict[str, Any]:
        """These settings as named arguments (`take` reads them back the same); `home`: the folder
        of the task file they were read from (files a task names live beside it)."""
        return {}

    def no_resume(self, calibration: Any) -> str | None:
        """Why a run with these settings and `calibration` (a `CalibrationSpec`) cannot be resumed, or None."""
        return None

    def weights_note(self) -> tuple[str, str] | None:
        """(what was fitted on the task's weights, how to make it again) for a task whose weights
        differ, or None (nothing of these settings pins the weights)."""
        return None

    def unused(self, spec: KindSpec) -> Exception:
        """The refusal when the kind chosen (`spec`) cannot use these settings."""
        return LabelError(f"{', '.join(self.NAMES)}: not a setting of {spec.name} scoring: drop it")


@dataclass(frozen=True)
class ModelFacts:
    """What the kinds table reads of the model a classifier runs on: its own score head (a
    `*ForSequenceClassification` checkpoint's `seqcls.SeqClsHead`, or None) and its name (a
    causal LM named *Reranker* reranks). Not `loaded`: the choice waits for the model."""

    head: Any = None
    name: str = ""
    loaded: bool = True
    embeds_only: bool = False  # a bare backbone, an embedding model: no LM head and no score head


@dataclass(frozen=True)
class KindArgs:
    """Everything a caller says about how it scores, typed: the one value the kinds table
    (`kinds.spec_of`) reads to choose the kind. `kinds.arguments` makes it from named arguments.
    The labels kind's fields (the default kind's) are here; every other kind's settings are its
    own typed `KindSettings` in `own`, found by their class (`get`)."""

    labels: tuple[str, ...] = ()
    scoring: str = "auto"
    examples: tuple[tuple[str, str], ...] = ()
    label_descriptions: Mapping[str, str] | None = None
    keep_logits: bool = False
    label_pass: str = "trie"
    none_label: str | None = None  # the label that means "none of these" (answered as no label)
    truncate: str | None = None
    # The prompt a caller typed (None: the defaults): a sequence classifier takes it as a chat prompt.
    system: str | None = None
    template: str | None = None
    model: ModelFacts = field(default_factory=ModelFacts)
    own: tuple[KindSettings, ...] = ()

    def get(self, cls: type[S]) -> S | None:
        """The settings of class `cls` these arguments hold, or None."""
        for s in self.own:
            if isinstance(s, cls):
                return s
        return None


S = TypeVar("S", bound=KindSettings)


@dataclass(frozen=True)
class RunSettings:
    """How a bound kind prepares items, the same for every kind: truncation of over-long
    prompts (None: an error row), the context limit, and whether the shared head is cached."""

    truncate: str | None = None
    max_length: int | None = None
    use_prefix_cache: bool = True
    empty_ok: bool = False  # an empty text is an item (a decision's state: its prompt is the rest), not an error
    # a decision client's text (the prompt style's state and question): its control tokens read as text
    controls_as_text: bool = False


class KindSpec(ABC):
    """A kind's settings, without a model (see the module docstring)."""

    name: ClassVar[str]  # its name in task files and manifests
    Settings: ClassVar[type[KindSettings] | None] = None  # its own typed settings (None: the labels kind's fields)
    task_fields: ClassVar[tuple[str, ...]] = ()  # the fields of its section in a task file
    classifies: ClassVar[bool] = True  # does it give labels (a features-only classifier: hidden states only)?
    # What a kind takes beside its own settings, said here once and asked by every caller (the
    # classifier, the CLI's set-up, `fit_calibration`, the service): never guessed from its name.
    calibrates: ClassVar[bool] = True  # does label calibration (batch, fit, em) apply?
    abstains: ClassVar[bool] = True  # does a confidence threshold (min_confidence) apply?
    no_calibration: ClassVar[str] = ""  # why not (calibration, or the threshold), when one does not
    truncates: ClassVar[bool] = True  # can an over-long prompt be cut (--truncate)?
    no_truncation: ClassVar[str] = ""  # why not, when it cannot

    def uses(self, settings: KindSettings) -> bool:
        """Whether this kind runs with `settings` (another kind's are refused: `KindSettings.unused`)."""
        return self.Settings is not None and isinstance(settings, self.Settings)

    @classmethod
    @abstractmethod
    def wants(cls, args: KindArgs) -> bool:
        """Whether `args` ask for this kind (the table asks each kind in turn)."""

    @classmethod
    @abstractmethod
    def from_args(cls, args: KindArgs) -> KindSpec:
        """The spec from a classifier's arguments, checked."""

    @property
    @abstractmethod
    def labels(self) -> tuple[str, ...]:
        """The names predictions carry (empty for a kind whose answers are per question)."""

    @property
    def questions(self) -> tuple[Any, ...] | None:
        return None

    @property
    def none_label(self) -> str | None:
        """The label that means "none of these" (its prediction is answered as no label,
        abstained), or None."""
        return None

    @property
    def learned_head(self) -> Any:
        """The learned head this kind scores with (`kinds.head`), or None."""
        return None

    @property
    def heads(self) -> list[Any]:
        """Learned heads the kind holds (they pin the task to its weights)."""
        return []

    @property
    def mode(self) -> str:
        """A word for how it scores, as summaries and manifests say it."""
        return self.name

    def feature_parts(self) -> tuple[list[int], tuple[str, ...]] | None:
        """The hidden-state layers and poolings the kind reads itself (a head's), or None."""
        return None

    def prompt(self, system: str | None, template: str) -> PromptFormat:
        """The prompt format of this kind's prompts (examples checked); `system` comes with its
        labels filled in already (`classifier.Plan.with_labels`, the one place)."""
        return PromptFormat(system, template)

    def prompt_labels(self) -> tuple[Sequence[str], Mapping[str, str] | None] | None:
        """The labels and descriptions this kind's system message has filled in (`{labels}`,
        `{label_descriptions}`: `Plan.with_labels` fills them); None: its prompt names no labels."""
        return None

    def record_shape(self, *, calibrated: bool = False, abstains: bool = False, scores: bool = False) -> RecordShape:
        """The output shape of a run of this kind (columns, records, Ray's fields)."""
        abstains = abstains or self.none_label is not None  # "none of these" is an abstention, said per record
        return RecordShape.of(self.labels, self.questions, calibrated=calibrated, abstains=abstains, scores=scores)

    def calibration_run(
        self, spec: CalibrationSpec, min_confidence: float | None = None, on_fit: Any = None
    ) -> Calibration | Any:
        """The per-run calibration (and abstain) of this kind's predictions."""
        return spec.run(self.labels, min_confidence, on_fit, self.none_label)

    def check_calibration(self, spec: CalibrationSpec, min_confidence: float | None = None) -> None:
        """Refuses a calibration or a confidence threshold this kind cannot apply, before any
        work: the one rule, read from what the kind says it takes (`calibrates`, `abstains`)."""
        if (spec.applies and not self.calibrates) or (min_confidence is not None and not self.abstains):
            raise LabelError(self.no_calibration)

    def to_task(self, path: Any = None) -> dict[str, Any]:
        """This kind's fields of a task file (`labels` always); `path`: where the task is saved
        (files of its own it names beside it)."""
        return {"labels": list(self.labels)}

    def info(self) -> dict[str, Any]:
        """What `/v1/model` says of the served task's kind."""
        return {"labels": list(self.labels)}

    def for_request(self, labels: tuple[str, ...], same_prompt: bool) -> KindSpec | None:
        """The kind a service request on this task runs, given the request's labels (the served
        ones when it gave none) and whether it kept the served prompt; None: zero-shot labels."""
        return None

    def example_input(self, text: str) -> Any:
        """An input of this kind made of `text` (the service's warm-up runs one)."""
        return text

    def task_kwargs(self, mode: str) -> dict[str, Any]:
        """This kind's `task.Task` fields (labels, scoring, examples, head, questions), for
        saving the task a run made (`mode`: the bound kind's scoring mode)."""
        return {"labels": tuple(self.labels)}

    def manifest(self, mode: str) -> dict[str, Any]:
        """What an output's manifest records of this kind (--resume and merge accept only the same)."""
        return {"labels": list(self.labels), "scoring": mode, "examples": []}

    @classmethod
    def read_task(
        cls, d: dict[str, Any], where: str, labels: list[str], calibration: CalibrationSpec
    ) -> dict[str, Any] | None:
        """This kind's section of a task file's JSON object `d`, each field checked (a
        `TaskError` names the file `where`, the field and the fix), as `task.Task` fields; None
        when the file is not of this kind."""
        return None

    @abstractmethod
    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> Kind:
        """The kind on a model: ready to prepare items and score batches."""


class Kind(ABC):
    """A kind bound to an engine and a prompt format (see the module docstring).

    Immutable once made; many runs (threads, requests) may share it. What a run counts goes
    to the `Stats` it passes in."""

    spec: KindSpec
    engine: Engine
    format: PromptFormat
    run: RunSettings
    # The shared head's token ids (its KV is the engine's prefix cache), or () when uncached.
    prefix_tokens: tuple[int, ...] = ()
    # A mean-pooling head averages the prompt after this many tokens (the shared head).
    pool_from: int = 0
    # Why no text can run (the fixed prompt over the context), when truncation is on; else None.
    format_error: str | None = None

    @property
    def max_length(self) -> int:
        return self.run.max_length or self.engine.max_length

    @property
    def mode(self) -> str:
        """A word for how it scores (the labels kind's: first-token or sequence)."""
        return self.spec.mode

    @property
    def labelset(self) -> LabelSet:
        """Its labels' token ids and scoring mode: the labels kind's own; the names only for a kind
        that scores no label tokens."""
        labels = tuple(self.spec.labels)
        return LabelSet(labels, tuple(() for _ in labels), self.mode)

    @property
    def row_extra(self) -> int:
        """Tokens each row runs beside its prompt in one pass (in the batch's token budget)."""
        return 0

    @property
    def label_extra(self) -> int:
        """Tokens that must still fit after the prompt (a label's later tokens)."""
        return 0

    @abstractmethod
    def items(self, texts: Sequence[Any], start: int = 0) -> list[Item]:
        """One tokenized item per text, with an error for what cannot run (holds the engine's lock)."""

    @abstractmethod
    def score(self, batch: Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        """The predictions of one planned batch (its rows are `items`, in order)."""


# --------------------------------------------------------------------------- shared by the kinds


class TaskError(UserError, ValueError):
    """A task file that cannot be read as it is: names the file, the field and the fix."""


def _json_kind(v: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(v), "a list" if isinstance(v, list) else "an object" if isinstance(v, dict) else type(v).__name__
    )


def bad_field(d: dict[str, Any], where: str, key: str, want: str) -> TaskError:
    """The error for task-file field `key` of the wrong type or value: what it must be, what it is."""
    got = d[key] if key in d else None
    shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:57] + "..."
    kind = "missing" if key not in d else f"{shown} ({_json_kind(got)})"
    return TaskError(f"{where}: field {key!r} must be {want}, got {kind}: fix it, or save the task again")


def task_examples(d: dict[str, Any], where: str, labels: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """A task file's few-shot examples as (text, label) pairs, each checked against the labels."""

    examples = d.get("examples", [])
    if not isinstance(examples, list):
        raise bad_field(d, where, "examples", 'a list of {"text": ..., "label": ...} objects')
    ex: list[tuple[str, str]] = []
    for i, e in enumerate(examples, 1):
        if not isinstance(e, dict) or not isinstance(e.get("text"), str) or not isinstance(e.get("label"), str):
            raise TaskError(
                f"{where}: field 'examples', example {i}: must be an object with string fields "
                '"text" and "label": fix it'
            )
        problem = example_problem(e["text"], e["label"], labels)
        if problem:
            raise TaskError(f"{where}: field 'examples', example {i}: {problem}")
        ex.append((e["text"], e["label"]))
    return tuple(ex)


def split_pair(x: Any) -> tuple[Any, str | None]:
    """An input as (text, second text or None): a (text, pair) tuple or list holds both."""
    if isinstance(x, (tuple, list)) and len(x) == 2:
        pair = x[1]
        return x[0], (pair if isinstance(pair, str) and pair else None)
    return x, None


def check_texts(format_error: str | None, texts: Sequence[Any], start: int, empty_ok: bool = False) -> list[Item]:
    """One item per text, with an error for a text that cannot be classified (missing, empty unless
    `empty_ok`, not valid Unicode: a lone surrogate no tokenizer takes). A (text, pair) is checked on
    its text and its pair's form (a string, valid Unicode); the pair is the kind's to take or refuse."""
    items = [Item(start + i, []) for i in range(len(texts))]
    for item, x in zip(items, texts):
        text, pair = split_pair(x)
        raw = x[1] if isinstance(x, (tuple, list)) and len(x) == 2 else None
        if format_error is not None:
            item.error = format_error
        elif not isinstance(text, str):
            item.error = (
                "the text is missing (None/NaN, not a string): give the item some text, or drop the row"
                if missing(text)
                else f"text must be a string, got {type(text).__name__}"
            )
        elif not text.strip() and not empty_ok:
            item.error = "empty text: give the item some text, or drop the row"
        elif has_lone_surrogate(text):
            item.error = "the text holds an unpaired surrogate escape (not valid Unicode): fix the text"
        elif raw is not None and not isinstance(raw, str):
            item.error = f"the second text (text_pair) must be a string, got {type(raw).__name__}"
        elif pair is not None and has_lone_surrogate(pair):
            item.error = "the second text (text_pair) holds an unpaired surrogate escape (not valid Unicode): fix it"
    return items


def refuse_by_size(items: list[Item], texts: Sequence[Any], tokenizer: Any, max_length: int) -> None:
    """A text (with its pair) far over the context by its size alone is an error row before it is
    tokenized (`prompts.size_problem`: a 20 MB line took 26 s and 3.6 GB to be refused)."""
    for it, x in zip(items, texts):
        if it.error is None:
            text, pair = split_pair(x)
            it.error = size_problem(tokenizer, text + (pair or ""), max_length)


def require_lm_head(engine: Engine) -> None:
    """Label tokens, questions and yes/no prompts are scored by the LM head: a model that has a
    sequence-classification head instead, or none (a bare backbone, an embedding model), refuses
    them, saying what it does (`Model.head`'s error)."""
    if not getattr(engine.model, "has_lm_head", True):
        engine.model.head()


def count(st: Stats, batch: Batch, extra: int) -> None:
    """A scored batch in the run's figures: its padded tokens and the extra tokens it ran."""
    st.batches += 1
    st.processed_tokens += batch.padded_tokens + extra
    st.padding_tokens += batch.padded_tokens - batch.real_tokens
    st.label_tokens += extra


def prediction(item: Item, labels: Sequence[str], scores: np.ndarray, probs: np.ndarray, **kw: Any) -> Prediction:
    """A labelled prediction: the arg-max label, each label's probability and raw score."""
    return Prediction(
        item.index,
        labels[int(np.argmax(scores))],
        {lab: float(x) for lab, x in zip(labels, probs)},
        {lab: float(x) for lab, x in zip(labels, scores)},
        len(item.ids),
        item.truncated,
        **kw,
    )


class OnePrompt(Kind):
    """A kind that runs one prompt per text (the labels' tokens, a learned head): render it with
    the chat template, tokenize in batches, and cut (`run.truncate`) or flag a prompt over the
    context. Subclasses score; `encode` is theirs to change (a model fed the bare text)."""

    def __init__(self, spec: KindSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        self.spec, self.engine, self.format, self.run = spec, engine, fmt, run

    def _settle(self) -> list[int]:
        """Checks the fixed part of every prompt against the context and sets the shared head
        (`prefix_tokens`, `pool_from`); returns the head's ids. Called once a subclass has set
        what `label_extra` reads."""

        problem = self.fixed_problem()
        self.format_error = None if problem is None else str(problem)
        if problem is not None and self.run.truncate is None:
            raise problem
        # Found on token ids of whole prompts whose texts differ in their first character (a BPE
        # merge may cross from the head into the text: see `prompts`).
        shared = common_prefix(self.encode(list(PROBES)))
        # A mean-pooled head averages the prompt after the shared head, with or without the cache.
        self.pool_from = len(shared)
        ok = self.run.use_prefix_cache and shared and self.format_error is None
        self.prefix_tokens = tuple(shared) if ok else ()
        return shared

    def fixed_problem(self) -> Exception | None:
        """Why no text can run (the fixed prompt, one text token and the label over the context)."""

        fmt = self.format
        fixed = len(self.encode(["x"])[0])  # one text token included
        if fixed + self.label_extra <= self.max_length:
            return None
        if fixed <= self.max_length:  # the prompt fits alone: the label is what does not
            return self.label_too_long(fixed)
        parts = "the system prompt, template and examples" if fmt.examples else "the system prompt and template"
        return PromptError(
            f"{parts} alone are {fixed - 1} tokens, over the model's context of "
            f"{self.max_length}: shorten --system or --template" + (" or use fewer --examples" if fmt.examples else "")
        )

    def label_too_long(self, fixed: int) -> Exception:
        return LabelError(f"the prompt ({fixed - 1} tokens) leaves no room in the model's context of {self.max_length}")

    @property
    def takes_pairs(self) -> bool:
        """Whether an item may carry a second text (the template's `{pair}`)."""
        return self.format.pairs

    def encode(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None) -> list[list[int]]:
        """Each text's whole prompt (with its pair, where the template has `{pair}`), tokenized (batched)."""

        tok = self.engine.tokenizer
        pairs = pairs if pairs is not None else [None] * len(texts)
        if self.run.controls_as_text:  # "<|im_end|>" in a client's text cannot close its turn
            return self._encode_as_text(texts, pairs)
        return tokenize(tok, [render(tok, self.format, t, p) for t, p in zip(texts, pairs)])

    def _encode_as_text(self, texts: Sequence[str], pairs: Sequence[str | None]) -> list[list[int]]:
        """`encode` with the control tokens of the texts and the system message read as text, as the
        decision path reads a client's (`prompt_tokens.encode_marked`); a prompt without any, whole."""
        from ..text.decisions.prompt_tokens import encode_marked, has_controls, mark_controls  # lazy: a decision's

        tok, fmt = self.engine.tokenizer, self.format
        if fmt.system is not None and has_controls(tok, fmt.system):
            fmt = replace(fmt, system=mark_controls(tok, fmt.system))
        marked = [fmt is not self.format or has_controls(tok, t) for t in texts]
        out = tokenize(tok, [render(tok, fmt, t, p) for t, p, m in zip(texts, pairs, marked) if not m])[::-1]
        return [
            encode_marked(tok, render(tok, fmt, mark_controls(tok, t), p)) if m else out.pop()
            for t, p, m in zip(texts, pairs, marked)
        ]

    def pair_problem(self, pair: str | None) -> str | None:
        """Why an item's pair (or its missing pair) cannot go into this kind's prompt, or None."""
        if pair is not None and not self.takes_pairs:
            return (
                "the item has a second text (text_pair), but the prompt takes one text: add {pair} to the "
                "template (e.g. --template 'Premise: {text}\nHypothesis: {pair}'), or drop the pair"
            )
        if pair is None and self.format.pairs:
            return "the template holds {pair}, but the item has no second text: give it a text_pair (--pair-field; a CSV's column: --pair-column)"
        return None

    def items(self, texts: Sequence[Any], start: int = 0) -> list[Item]:
        with self.engine.lock:  # the tokenizer is not safe to share mid-call
            items = check_texts(self.format_error, texts, start, self.run.empty_ok)
            if self.run.truncate is None:
                refuse_by_size(items, texts, self.engine.tokenizer, self.max_length)
            good: list[tuple[Item, str, str | None]] = []
            for it, x in zip(items, texts):
                if it.error is None:
                    text, pair = split_pair(x)
                    it.error = self.pair_problem(pair)
                    if it.error is None:
                        good.append((it, text, pair))
            extra, limit = self.label_extra, self.max_length
            seqs = self.encode([t for _, t, _ in good], [p for _, _, p in good])
            for (item, text, pair), seq in zip(good, seqs):
                item.ids = seq
                if len(seq) + extra <= limit:
                    continue
                if self.run.truncate is None:
                    item.error = (
                        f"prompt is {len(seq)} tokens, over the model's context of {limit}: "
                        "shorten the text, or pass --truncate head|tail|middle"
                    )
                    continue
                try:
                    item.ids = self.truncated(text, pair, limit - extra)
                    item.truncated = True
                except ValueError as e:
                    item.error = str(e)
            return items

    def truncated(self, text: str, pair: str | None, limit: int) -> list[int]:
        """The prompt cut to at most `limit` tokens: the longer of the text and its pair (the
        tokenizers' "longest first"), at its head, tail or middle as `run.truncate` says."""
        tok, mode = self.engine.tokenizer, self.run.truncate
        cut_pair = pair is not None and len(tok(pair, add_special_tokens=False)["input_ids"]) > len(
            tok(text, add_special_tokens=False)["input_ids"]
        )
        part = pair if cut_pair else text
        assert part is not None

        def whole(kept: str) -> list[int]:
            return self.encode([text if cut_pair else kept], [kept if cut_pair else pair])[0]

        part_ids = tok(part, add_special_tokens=False)["input_ids"]
        overhead = len(whole(part)) - len(part_ids)
        keep = limit - overhead - 4  # a small margin: re-tokenizing at the cut may merge differently
        while keep > 0:
            if mode == "head":
                kept = tok.decode(part_ids[:keep])
            elif mode == "tail":
                kept = tok.decode(part_ids[-keep:])
            else:
                a = keep // 2
                kept = tok.decode(part_ids[:a]) + " ... " + tok.decode(part_ids[len(part_ids) - (keep - a) :])
            ids = whole(kept)
            if len(ids) <= limit:
                return ids
            keep -= max(4, len(ids) - limit)
        raise ValueError("the template alone is longer than the model's context")
