"""`Classifier`: texts in, one prediction per text out, in input order.

Data flows one way through the modules:

    texts -> prompts (render, tokenize) -> prefix split (engine's prefix LRU)
          -> batch plan (batching) -> forward (engine) -> label scores (scoring)
          -> predictions -> calibration (calibration.Calibration) -> the caller

With a learned head (`heads.Head`, trained by `mlx-slm train`) the forward stops at the
head's layer and the head's numpy predict replaces label scoring: features (engine) ->
head -> predictions. No label tokens run, so the label count does not change the cost.

Each optimization can be switched off alone (`sort`, `use_prefix_cache`, the token
budget), so its worth can be measured, and none of them may change a prediction.
"""

from __future__ import annotations

import itertools
import numbers
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from . import batching
from .answers import QuestionCalibration
from .branches import QuestionPlan
from .calibration import DEFAULT_WARMUP, Calibration, CalibrationSpec, Calibrator
from .engine import Engine
from .labels import LabelError, LabelSet, build_labelset
from .labels import validate as validate_labels
from .models import Model
from .predictions import Item, Prediction, Stats
from .prefix_cache import PrefixCache
from .prompts import (
    DEFAULT_LABELS,
    DEFAULT_SYSTEM,
    DEFAULT_TEMPLATE,
    TRUNCATE_MODES,
    PromptError,
    PromptFormat,
    example_problem,
    fill_labels,
    render,
    shared_prefix,
    starts_with,
    tokenize,
)
from .questions import DEFAULT_SYSTEM as QUESTIONS_SYSTEM
from .questions import DEFAULT_TEMPLATE as QUESTIONS_TEMPLATE
from .questions import Question, QuestionError
from .registry import DEFAULT_MODEL
from .scorers import FeaturesOnly, HeadScorer, LabelScorer, QuestionScorer, pooled_features
from .scoring import LABEL_PASSES

if TYPE_CHECKING:
    from .heads import Head
    from .task import Task

# Batch planner defaults. On a 2-core x86 CPU throughput per processed token was flat from
# 256 to 4,096 padded tokens per batch (about 140 tokens/s, Qwen 0.5B, float32), so the CPU
# budget is small, to cut padding (benchmarks/results/budget-curve.md). GPUs want bigger
# batches; 4,096 there is a starting point that has not been measured yet.
DEFAULT_BATCH_SIZE = 32
DEFAULT_MAX_BATCH_TOKENS = 512
GPU_MAX_BATCH_TOKENS = 4096


def default_max_batch_tokens() -> int:
    return GPU_MAX_BATCH_TOKENS if mx.default_device() == mx.gpu else DEFAULT_MAX_BATCH_TOKENS


class Classifier:
    """One classification task on a shared `Engine`: labels, prompt, scoring and batching.

    The policy layer: it renders and tokenizes, plans length-bucketed batches, asks the
    engine for label scores and hands predictions back in input order. It holds settings
    only; what a run counts comes back with that run (`run()`), so one classifier (and
    one engine under many classifiers) can serve concurrent callers.
    """

    def __init__(
        self,
        engine: Engine,
        labels: Sequence[str] = DEFAULT_LABELS,
        system: str | None = DEFAULT_SYSTEM,
        template: str = DEFAULT_TEMPLATE,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_batch_tokens: int | None | str = "auto",
        sort: bool = True,
        use_prefix_cache: bool = True,
        scoring: str = "auto",
        truncate: str | None = None,
        max_length: int | None = None,
        keep_logits: bool = False,
        examples: Sequence[tuple[str, str]] = (),
        calibration: str | Calibrator | CalibrationSpec = "none",
        min_confidence: float | None = None,
        warmup: int = DEFAULT_WARMUP,
        label_pass: str = "trie",
        label_descriptions: Mapping[str, str] | None = None,
        head: Head | None = None,
        questions: Sequence[Question | Mapping[str, Any]] | None = None,
        features_only: bool = False,
    ):
        self.plan: QuestionPlan | None = None
        if questions is not None:
            _refuse_with_questions(
                labels=isinstance(labels, (str, bytes)) or tuple(labels) not in ((), DEFAULT_LABELS),
                head=head is not None, examples=bool(examples), label_descriptions=bool(label_descriptions),
                keep_logits=keep_logits, scoring=scoring != "auto", truncate=truncate is not None,
            )  # fmt: skip
            labels = ()
            system = QUESTIONS_SYSTEM if system is DEFAULT_SYSTEM else system
            template = QUESTIONS_TEMPLATE if template is DEFAULT_TEMPLATE else template
        else:
            labels = validate_labels(labels)  # once: a generator is read here, and one str is refused
        if head is not None:
            if tuple(labels) != tuple(head.labels):
                raise LabelError(
                    f"the head was trained for the labels {list(head.labels)[:8]}"
                    f"{' ...' if len(head.labels) > 8 else ''}; got {list(labels)[:8]}: pass the head's labels"
                )
            if CalibrationSpec.of(calibration).applies:
                raise LabelError(
                    "calibration does not apply to a learned head (its probabilities are fitted on labelled "
                    "data already): use calibration='none'"
                )
        self.head = head
        if label_pass not in LABEL_PASSES:
            raise ValueError(f"label_pass must be one of {', '.join(LABEL_PASSES)}, not {label_pass!r}")
        self.label_pass = label_pass
        if truncate is not None and truncate not in TRUNCATE_MODES:
            raise ValueError(f"truncate must be one of {', '.join(TRUNCATE_MODES)} or None, not {truncate!r}")
        if not isinstance(engine, Engine):
            raise TypeError(
                f"Classifier takes an Engine (Engine.load(name), or Engine(model, tokenizer)), not "
                f"{type(engine).__name__}; Classifier.load(name, ...) loads one"
            )
        self.engine = engine
        tokenizer = engine.tokenizer
        if questions is not None:
            self._init_questions(questions, system, template, batch_size, max_batch_tokens, sort, max_length)
            self.calibration = CalibrationSpec.of(calibration, warmup=warmup)
            self.min_confidence, self.warmup = min_confidence, warmup
            self.calibration_run(self.calibration, min_confidence)  # refused here if it does not apply
            self.prefix_tokens = self.plan.head if use_prefix_cache else ()  # type: ignore[union-attr]
            return
        if head is not None:
            _check_head(head, engine, scoring, keep_logits, label_pass)
        # How `classify` calibrates by default (settings, not run state: a batch prior
        # fitted on one input lives on that run's `Calibration`, never here).
        self.calibration = CalibrationSpec.of(calibration, warmup=warmup)
        self.min_confidence, self.warmup = min_confidence, warmup
        # `{labels}` / `{label_descriptions}` in the system message: filled once, here.
        system = fill_labels(system, labels, label_descriptions)
        examples = tuple((str(t), str(lab)) for t, lab in examples)
        for n, (ex_text, ex_label) in enumerate(examples, 1):  # as --examples and task files check them
            problem = example_problem(ex_text, ex_label, labels)
            if problem:
                raise PromptError(f"example {n}: {problem}")
        self.format = PromptFormat(system, template, examples)
        if max_batch_tokens == "auto":
            max_batch_tokens = default_max_batch_tokens()
        self.batch_size, self.max_batch_tokens = batch_size, max_batch_tokens
        self.sort, self.truncate, self.keep_logits = sort, truncate, keep_logits
        self.max_length = max_length or engine.max_length
        probe = render(tokenizer, self.format, "example")
        shared = shared_prefix(tokenizer, self.format)
        self.scorer: LabelScorer | HeadScorer | QuestionScorer | FeaturesOnly
        if head is None and not features_only:
            self.labelset = build_labelset(tokenizer, labels, probe, scoring)
            self.scorer = LabelScorer(engine, self.labelset, keep_logits, label_pass)
        else:  # the head reads hidden states: no label tokens run, none are scored
            self.labelset = LabelSet(tuple(labels), tuple(() for _ in labels), "head")
            self.scorer = HeadScorer(engine, head, len(shared)) if head is not None else FeaturesOnly()
        # Tokens that run after the prompt (label continuations in sequence mode; none with a head).
        self.label_extra = self.scorer.label_extra
        head = shared
        # The fixed part of every prompt (system, examples, template, chat head) must leave room
        # for at least one text token and the label: checked before any forward pass is paid for.
        # With truncation asked for, the run goes on and every row says why it failed.
        self.format_error: str | None = None
        fixed = len(tokenize(tokenizer, [render(tokenizer, self.format, "x")])[0])  # one text token included
        if fixed + self.label_extra > self.max_length:
            parts = (
                "the system prompt, template and examples" if self.format.examples else "the system prompt and template"
            )
            longest = max(range(len(self.labelset.labels)), key=lambda k: len(self.labelset.token_ids[k]))
            if fixed <= self.max_length:  # the prompt fits alone: the label is what does not
                self.format_error = (
                    f"label {self.labelset.labels[longest][:60]!r} is {self.labelset.max_len} tokens: with the "
                    f"prompt ({fixed - 1} tokens) it is over the model's context of {self.max_length}: shorten the label"
                )
            else:
                self.format_error = (
                    f"{parts} alone are {fixed - 1} tokens, over the model's context of "
                    f"{self.max_length}: shorten --system or --template"
                    + (" or use fewer --examples" if self.format.examples else "")
                )
            if truncate is None:  # a label too long is the labels' fault (a front end names that field)
                raise (LabelError if fixed <= self.max_length else PromptError)(self.format_error)
        # A mean-pooled head averages the prompt after this many tokens (the shared head), with
        # or without the prefix cache: the part of the prompt that differs between texts.
        self.pool_from = len(head)
        # The shared head's ids; its KV is computed by the engine on first use (and kept there).
        self.prefix_tokens: tuple[int, ...] = (
            tuple(head) if (use_prefix_cache and head and self.format_error is None) else ()
        )

    def _init_questions(
        self,
        questions: Sequence[Any],
        system: str | None,
        template: str,
        batch_size: int,
        max_batch_tokens: int | None | str,
        sort: bool,
        max_length: int | None,
    ) -> None:
        """Settings of a classifier that asks several questions (`branches.QuestionPlan`)."""
        if not getattr(self.engine.model, "supports_tree", False):
            raise QuestionError(
                f"several questions per text need one of our architectures (tree masks); {self.engine.path} runs "
                "through mlx-lm's class: ask one question (--labels) per run"
            )
        self.plan = QuestionPlan(self.engine.tokenizer, questions, system, template)
        for q in self.plan.questions:
            if q.head is not None:
                _check_head(q.head, self.engine, "auto", False, "trie")
        self.head, self.label_pass, self.keep_logits, self.truncate = None, "trie", False, None
        self.format = PromptFormat(system, template)  # as given: a request's task is told apart by it
        if max_batch_tokens == "auto":
            max_batch_tokens = default_max_batch_tokens()
        self.batch_size, self.max_batch_tokens, self.sort = batch_size, max_batch_tokens, sort
        self.max_length = max_length or self.engine.max_length
        self.labelset = LabelSet((), (), "questions")
        self.scorer = QuestionScorer(self.engine, self.plan)
        self.label_extra = self.scorer.label_extra
        self.format_error = None
        self.pool_from = len(self.plan.head)

    @property
    def questions(self) -> tuple[Question, ...] | None:
        return self.plan.questions if self.plan is not None else None

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(
        cls,
        model: str | Path = DEFAULT_MODEL,
        labels: Sequence[str] = DEFAULT_LABELS,
        system: str | None = DEFAULT_SYSTEM,
        template: str = DEFAULT_TEMPLATE,
        dtype: str | None = None,
        dequantize: bool | None = None,
        **kwargs: Any,
    ) -> Classifier:
        """Load a built-in name, converted dir, HF dir, `.gguf` or hub id (converted once, cached).

        dequantize: an MLX-quantized model's weights are dequantized at load on the CPU
        (None, the default), kept packed on a GPU; True or False decides."""
        return cls(Engine.load(model, dtype, dequantize), labels, system, template, **kwargs)

    @classmethod
    def from_task(
        cls,
        task: str | Path | Task,
        dtype: str | None = None,
        engine: Engine | None = None,
        dequantize: bool | None = None,
        **kwargs: Any,
    ) -> Classifier:
        """A classifier as a saved task file defines it (model, prompt, examples, calibration).

        Pass `engine` to share loaded weights between tasks of the same model."""
        from .task import Task

        t = task if isinstance(task, Task) else Task.load(task)
        engine = engine or Engine.load(t.model, dtype, dequantize)
        # A saved prior or a head was fitted on these weights' scores: the same weights only.
        if engine.path is not None and (t.calibration.fitted or t.heads):
            t.check_weights(engine.weights_sha256, str(engine.path))
        fixed = {"labels", "system", "template", "scoring", "examples", "head", "label_descriptions", "tokenizer"}
        clash = sorted(fixed & kwargs.keys())
        if clash:
            raise TypeError(
                f"from_task takes {', '.join(clash)} from the task: build Classifier(engine, labels, "
                "system, template, ...) for another task, or save one (Task, --save-task)"
            )
        # Run settings may be overridden, as classify's own arguments can.
        run = {"calibration": t.calibration, "min_confidence": t.min_confidence, "warmup": t.warmup, **kwargs}
        if t.questions:
            return cls(engine, system=t.system, template=t.template, questions=t.questions, **kwargs)
        return cls(engine, t.labels, t.system, t.template, scoring=t.scoring, examples=t.examples, head=t.head, **run)

    @property
    def model(self) -> Model:
        return self.engine.model

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def path(self) -> Path | None:
        return self.engine.path

    @property
    def labelset(self) -> LabelSet:
        return self._labelset

    @labelset.setter
    def labelset(self, ls: LabelSet) -> None:
        """A new label set (tests and benchmarks set one directly) reaches the label scorer too."""
        self._labelset = ls
        if isinstance(getattr(self, "scorer", None), LabelScorer):
            self.scorer = LabelScorer(self.engine, ls, self.keep_logits, self.label_pass)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.labelset.labels

    @property
    def mode(self) -> str:
        return self.labelset.mode

    @property
    def row_extra(self) -> int:
        """Tokens each row runs besides its prompt in one pass, counted in the batch's token
        budget (the scorer's: the label trie's nodes, the question branches, or none)."""
        return self.scorer.row_extra

    @property
    def prefix(self) -> PrefixCache | None:
        """The shared head's KV (computed on first use, then kept by the engine)."""
        return self.engine.prefix(self.prefix_tokens)[0] if self.prefix_tokens else None

    # ------------------------------------------------------------------ public API
    def classify(
        self,
        texts: Iterable[str] | str,
        calibration: str | Calibrator | CalibrationSpec | None = None,
        min_confidence: float | None = None,
        *,
        text_column: str | None = None,
        progress: bool = False,
    ) -> list[Prediction]:
        """Predictions in input order, calibrated as the classifier (or this call) says.

        `texts`: any iterable of strings; a single `str` is one text (a list of one
        prediction comes back); a pandas DataFrame needs `text_column=` (or use
        `classify_frame`). `calibration="batch"` takes the prior from all of these texts.
        `progress=True` draws a tqdm bar on stderr, advanced as each batch finishes.
        """
        texts = list(_as_texts(texts, text_column))
        cal = self.calibration if calibration is None else CalibrationSpec.of(calibration)
        if cal.applies and not self.scorer.calibrates:
            raise LabelError(self.scorer.no_calibration)
        conf = self.min_confidence if min_confidence is None else min_confidence
        if progress:  # as each batch finishes, then back in input order before calibrating
            done = self.classify_iter(texts, window=max(1, len(texts)), ordered=False, progress=True)
            run: Iterable[Prediction] = sorted(done, key=lambda p: p.index)
        else:
            run = self.classify_iter(texts, window=max(1, len(texts)))
        return list(self.calibration_run(CalibrationSpec.of(cal, warmup=max(2, len(texts))), conf)(run))

    def calibration_run(
        self, spec: CalibrationSpec, min_confidence: float | None = None, on_fit: Any = None
    ) -> Calibration | QuestionCalibration:
        """The per-run calibration (and abstain) of this task's predictions: the labels', or one
        per question (`answers.QuestionCalibration`)."""
        if self.plan is not None:
            return QuestionCalibration(spec, self.plan.questions, min_confidence=min_confidence)
        return spec.run(self.labels, min_confidence, on_fit)

    def classify_iter(
        self,
        texts: Iterable[str] | str,
        window: int = 1024,
        *,
        ordered: bool = True,
        text_column: str | None = None,
        progress: bool = False,
    ) -> Iterator[Prediction]:
        """Stream the model's raw predictions (see `run` for the run's figures).

        ordered=True: in input order (an item waits for the items before it, so with
        length-sorted batches predictions arrive in bursts); ordered=False: each batch's
        predictions as soon as that batch finishes (`Prediction.index` is the item's
        position), error items first within their window. `progress=True`: a tqdm bar."""
        texts = _as_texts(texts, text_column)
        _check_window(window)
        total = len(texts) if isinstance(texts, Sized) else None
        it: Iterator[Prediction] = iter(self.run(texts, window, ordered=ordered))
        return _with_progress(it, total) if progress else it

    def classify_frame(
        self,
        df: Any,
        text_column: str = "text",
        calibration: str | Calibrator | CalibrationSpec | None = None,
        min_confidence: float | None = None,
        *,
        prefix: str = "",
        progress: bool = False,
    ) -> Any:
        """A copy of the pandas DataFrame `df` with the predictions of its `text_column`.

        Added columns (each name after `prefix`), as the CSV output has them: `label`,
        `p_<label>` per label (float), and when calibrated `raw_p_<label>` and `calibration`;
        `abstained` (bool) with a confidence threshold; `truncated` (bool) and `error` (a
        row whose text is missing or empty gets its reason there and NaN elsewhere). A
        column that is already in `df` is refused (pass `prefix=`); the index is kept."""
        from .output import csv_columns

        if not _is_frame(df):
            raise TypeError(f"classify_frame takes a pandas DataFrame, got {type(df).__name__}: use classify()")
        if text_column not in df.columns:
            raise KeyError(
                f"text_column={text_column!r} is not a column of the frame (its columns: "
                f"{', '.join(map(str, list(df.columns)[:10]))}): name the column holding the texts"
            )
        if list(df.columns).count(text_column) > 1:
            raise ValueError(
                f"the frame has {list(df.columns).count(text_column)} columns named {text_column!r}: rename them"
            )
        if not isinstance(prefix, str):  # `prefix + name` would raise a bare TypeError further on
            raise TypeError(
                f"classify_frame(prefix=...) takes a string put before each new column's name "
                f"(e.g. prefix='pred_'), got {type(prefix).__name__} {prefix!r}"
            )
        cal = self.calibration if calibration is None else CalibrationSpec.of(calibration)
        conf = self.min_confidence if min_confidence is None else min_confidence
        calibrated = cal.applies
        names = [
            c for c in csv_columns(self.labels, raw=calibrated, abstain=conf is not None) if c not in ("id", "line")
        ]
        clash = [prefix + c for c in names if prefix + c in df.columns]
        if clash:
            raise ValueError(
                f"the frame already has a column {clash[0]!r}: pass prefix='pred_' (or another) to "
                "classify_frame so the predictions do not overwrite it"
            )
        preds = self.classify(list(df[text_column]), cal, conf, progress=progress)
        nan = float("nan")
        cols: dict[str, list[Any]] = {c: [] for c in names}
        for p in preds:
            row: dict[str, Any] = {"label": p.label, "truncated": bool(p.truncated), "error": p.error}
            for lab in self.labels:
                row[f"p_{lab}"] = p.probs.get(lab, nan)
                if calibrated:
                    row[f"raw_p_{lab}"] = (p.raw_probs or {}).get(lab, nan)
            if calibrated:
                row["calibration"] = None if p.error else cal.kind
            if conf is not None:
                row["abstained"] = bool(p.abstained)
            for c in names:
                cols[c].append(row[c])
        out = df.copy()
        for c in names:
            out[prefix + c] = cols[c]
        return out

    def fit_calibration(
        self,
        texts: Iterable[str],
        labels: Iterable[str],
        kind: str | CalibrationSpec = "fit",
        *,
        window: int = 1024,
        progress: bool = False,
        source: str | None = None,
        lines: Sequence[int] | None = None,
    ) -> CalibrationSpec:
        """Calibration fitted on labelled texts in memory (what --calibration-data fits).

        `labels`: each text's gold label, one of this classifier's labels. `kind`: "fit"
        (per-label offsets, maybe a temperature, applied as they are) or "em" (those offsets
        as the base on which each input re-estimates its own label mix). Returns the
        `CalibrationSpec` to classify with (`classify(texts, calibration=spec)`, or a
        `Task`'s calibration); its calibrator's `info` holds the cross-validated figures.
        The classifier itself is left unchanged. A missing or empty text, a gold label that
        is not a label, or a prompt over the context is a `CalibrationError` naming the item
        (`source` and `lines`, when given, name the file and line instead)."""
        from .calibration import CalibrationError, fit_labelled, gold_indices
        from .labels import log_softmax

        spec = CalibrationSpec.of(kind, warmup=None if isinstance(kind, CalibrationSpec) else self.warmup)
        if spec.kind not in ("fit", "em"):
            raise CalibrationError(f"fit_calibration fits 'fit' or 'em' calibration, not {spec.kind!r}")
        if self.head is not None:
            raise LabelError("calibration does not apply to a learned head: its probabilities are fitted already")
        texts, gold = list(_as_texts(texts, None)), list(_as_texts(labels, None))
        at = f"{source}: " if source else ""

        def where(i: int) -> str:
            return f"{at}line {lines[i]}" if lines is not None else f"{at}item {i}"

        if len(texts) != len(gold):
            raise CalibrationError(f"{at}{len(texts)} texts but {len(gold)} gold labels: give one label per text")
        if not texts:
            raise CalibrationError(f"{at}no labelled texts: give some (texts and their gold labels)")
        for i, g in enumerate(gold):
            if g not in self.labels:
                raise CalibrationError(
                    f"{where(i)}: gold label {g!r} is not one of the labels {list(self.labels)}: fix it, or add the label"
                )
        lp = []
        for p in self.classify_iter(texts, window=window, progress=progress):
            if not p.ok:
                raise CalibrationError(f"{where(p.index)}: {p.error}")
            lp.append([p.scores[lab] for lab in self.labels])
        cal = fit_labelled(log_softmax(np.array(lp)), gold_indices(gold, self.labels), self.labels)
        return replace(spec, base=cal) if spec.kind == "em" else replace(spec, prior=cal)

    def run(self, texts: Iterable[str], window: int = 1024, *, ordered: bool = True) -> Run:
        """A run over `texts`: iterate it for raw predictions in input order; `.stats` counts it.

        Memory is bounded by `window` items: sorting by length happens inside a window,
        and each window's predictions are yielded as soon as the items before them are
        done (ordered=False: as soon as their batch is). Wrap the stream in a
        `Calibration` to calibrate it or to abstain.
        """
        texts = _as_texts(texts, None)
        _check_window(window)
        stats = Stats()
        return Run(self._windows(texts, window, stats, ordered), stats)

    # ------------------------------------------------------------------ pipeline
    def _windows(self, texts: Iterable[str], window: int, stats: Stats, ordered: bool = True) -> Iterator[Prediction]:
        it = iter(texts)
        start = 0
        while True:
            chunk = list(itertools.islice(it, window))
            if not chunk:
                return
            yield from self._run_window(chunk, start, stats, ordered)
            start += len(chunk)

    def prepare(self, texts: Sequence[str], start: int = 0) -> list[Item]:
        """Render and tokenize (batched); flag empty and over-long items."""
        with self.engine.lock:
            return self._prepare(texts, start)

    def _prepare(self, texts: Sequence[str], start: int) -> list[Item]:
        items = self._check_texts(texts, start)
        good = [(it, t) for it, t in zip(items, texts) if it.error is None]
        if self.plan is not None:
            for (item, _), (common, chains) in zip(good, self.plan.split([t for _, t in good])):
                item.ids, item.chains = common, chains
                n = self.plan.longest(common, chains)
                if n > self.max_length:
                    item.error = (
                        f"the longest question's prompt is {n} tokens with its answer, over the model's context "
                        f"of {self.max_length}: shorten the text"
                    )
            return items
        return self._tokenize_items(good, items)

    def _check_texts(self, texts: Sequence[str], start: int) -> list[Item]:
        """One item per text, with an error for a text that cannot be classified (missing, empty)."""
        items = [Item(start + i, []) for i in range(len(texts))]
        for item, text in zip(items, texts):
            if self.format_error is not None:
                item.error = self.format_error
            elif not isinstance(text, str):
                item.error = (
                    "the text is missing (None/NaN, not a string): give the item some text, or drop the row"
                    if _missing(text)
                    else f"text must be a string, got {type(text).__name__}"
                )
            elif not text.strip():
                item.error = "empty text: give the item some text, or drop the row"
        return items

    def _tokenize_items(self, good: list[tuple[Item, str]], items: list[Item]) -> list[Item]:
        ids = tokenize(self.tokenizer, [render(self.tokenizer, self.format, t) for _, t in good])
        extra = self.label_extra  # label tokens run after the prompt in sequence mode
        for (item, text), seq in zip(good, ids):
            item.ids = seq
            if len(seq) + extra > self.max_length:
                if self.truncate is None:
                    item.error = (
                        f"prompt is {len(seq)} tokens, over the model's context of {self.max_length}: "
                        "shorten the text, or pass --truncate head|tail|middle"
                    )
                else:
                    try:
                        item.ids = self._truncate(text, self.max_length - extra)
                        item.truncated = True
                    except ValueError as e:
                        item.error = str(e)
        return items

    def _truncate(self, text: str, limit: int) -> list[int]:
        tok = self.tokenizer
        text_ids = tok(text, add_special_tokens=False)["input_ids"]
        overhead = len(tokenize(tok, [render(tok, self.format, text)])[0]) - len(text_ids)
        keep = limit - overhead - 4  # a small margin: re-tokenizing at the cut may merge differently
        while keep > 0:
            if self.truncate == "head":
                kept = tok.decode(text_ids[:keep])
            elif self.truncate == "tail":
                kept = tok.decode(text_ids[-keep:])
            else:
                a = keep // 2
                kept = tok.decode(text_ids[:a]) + " ... " + tok.decode(text_ids[len(text_ids) - (keep - a) :])
            ids = tokenize(tok, [render(tok, self.format, kept)])[0]
            if len(ids) <= limit:
                return ids
            keep -= max(4, len(ids) - limit)
        raise ValueError("the template alone is longer than the model's context")

    def _run_window(self, texts: Sequence[str], start: int, st: Stats, ordered: bool = True) -> Iterator[Prediction]:
        items = self.prepare(texts, start)
        results: dict[int, Prediction] = {}
        for item in items:
            if item.error:
                results[item.index] = Prediction(item.index, error=item.error, n_tokens=len(item.ids))
        # Counted up front: a consumer that stops at the window's last prediction sees them too.
        st.items += len(items)
        st.errors += sum(1 for it in items if it.error)
        st.prompt_tokens += sum(len(it.ids) for it in items if not it.error)
        next_out = 0
        if not ordered:  # each batch as it finishes; the error items first
            yield from (results.pop(it.index) for it in items if it.error)
            for batch, group, pre in self._batches(items, st):
                yield from self._run_batch(batch, group, pre, st)
            return
        for batch, group, pre in self._batches(items, st):
            for pred in self._run_batch(batch, group, pre, st):
                results[pred.index] = pred
            # Hand out whatever is now complete in input order.
            while next_out < len(items) and items[next_out].index in results:
                yield results.pop(items[next_out].index)
                next_out += 1
        while next_out < len(items):
            yield results.pop(items[next_out].index)
            next_out += 1

    def _batches(
        self, items: Sequence[Item], st: Stats
    ) -> Iterator[tuple[batching.Batch, list[Item], PrefixCache | None]]:
        """The length-bucketed batches of a window's good items: (padded batch, its items, the
        prefix KV it continues, or None). Items starting with the shared head run after it."""
        live = [it for it in items if not it.error]
        p_len = len(self.prefix_tokens)
        hit = [bool(p_len) and starts_with(it.ids, self.prefix_tokens) for it in live]
        cached = [it for it, h in zip(live, hit) if h]
        uncached = [it for it, h in zip(live, hit) if not h]
        prefix = None
        if cached:
            prefix, computed = self.engine.prefix(self.prefix_tokens)
            # Net of the pass that computed the prefix, when this run paid for it (a prefix
            # already in the engine's cache, from an earlier run or task, costs nothing).
            st.processed_tokens += p_len if computed else 0
            st.prefix_saved_tokens += len(cached) * p_len - (p_len if computed else 0)
        for group, pre in ((cached, prefix), (uncached, None)):
            if not group:
                continue
            p = len(pre) if pre is not None else 0
            suffixes = [it.ids[p:] for it in group]
            lengths = [len(s) for s in suffixes]
            for idx in batching.plan(lengths, self.batch_size, self.max_batch_tokens, self.sort, self.row_extra):
                yield batching.pad(suffixes, idx, self.engine.pad_id, cache_len=p), [group[i] for i in idx], pre

    def features(
        self,
        texts: Sequence[str],
        layers: Sequence[int] | None = None,
        window: int = 1024,
        poolings: Sequence[str] | None = None,
        *,
        progress: bool = False,
    ) -> tuple[dict[str, np.ndarray], list[str | None], Stats]:
        """The model's hidden states for every text: what a learned head reads.

        Each text goes through the same prompt, prefix cache and batch plan as
        classification, and the forward stops at the deepest of `layers` (Transformers'
        `hidden_states[l]` numbering, 1..number of layers; None: the head's own layers).
        Each layer is pooled as each of `poolings` asks ("last": the state at the last
        prompt position; "mean": the mean over the prompt after its shared head, i.e. the
        text's part; None: the head's poolings, else "last").

        Returns ({pooling: (N, len(layers), D) float32}, one error or None per text (an
        empty, missing or over-long text; its rows are NaN), the run's figures). The forward
        runs once per text whatever the number of layers and poolings. `progress=True`
        draws a tqdm bar on stderr. `heads.head_input` picks a head's parts out of them.
        A classifier built with `features_only=True` gives features without any label
        scoring set up (the labels are then only names)."""
        _check_window(window)
        if layers is None:
            if self.head is None:
                raise ValueError(
                    "features(texts, layers): give the layers (1..number of layers); only a head has its own"
                )
            layers = sorted(set(self.head.layers))
            poolings = poolings or tuple(sorted(set(self.head.poolings)))
        poolings = tuple(poolings or ("last",))
        texts = list(_as_texts(texts, None))
        st = Stats()
        t0 = time.perf_counter()
        n, dim = len(texts), int(self.model.args.hidden_size)
        out = {p: np.full((n, len(layers), dim), np.nan, dtype=np.float32) for p in poolings}
        errors: list[str | None] = [None] * n
        bar = _progress_bar(n) if progress else None
        try:
            for start in range(0, n, window):
                items = self.prepare(texts[start : start + window], start)
                for it in items:
                    errors[it.index] = it.error
                if bar is not None:
                    bar.update(sum(1 for it in items if it.error))
                for batch, group, pre in self._batches(items, st):
                    got = self._features(batch, pre, list(layers), poolings)
                    for p in poolings:
                        out[p][[it.index for it in group]] = got[p]
                    st.batches += 1
                    st.processed_tokens += batch.padded_tokens
                    st.padding_tokens += batch.padded_tokens - batch.real_tokens
                    if bar is not None:
                        bar.update(len(group))
                st.items += len(items)
                st.errors += sum(1 for it in items if it.error)
                st.prompt_tokens += sum(len(it.ids) for it in items if not it.error)
        finally:
            if bar is not None:
                bar.close()
        st.seconds = time.perf_counter() - t0
        return out, errors, st

    def _features(
        self, batch: batching.Batch, prefix: PrefixCache | None, layers: list[int], poolings: Sequence[str]
    ) -> dict[str, np.ndarray]:
        return pooled_features(self.engine, batch, prefix, layers, poolings, self.pool_from)

    def _run_batch(
        self, batch: batching.Batch, items: list[Item], prefix: PrefixCache | None, st: Stats
    ) -> list[Prediction]:
        return self.scorer.run(batch, items, prefix, st)


def _check_head(head: Head, engine: Engine, scoring: str, keep_logits: bool, label_pass: str) -> None:
    """A head reads this model's hidden states, and nothing of label scoring applies to it."""
    n, dim = len(engine.model.layers), int(engine.model.args.hidden_size)
    if head.dim != dim or max(head.layers) > n:
        raise LabelError(
            f"the head reads layer(s) {list(head.layers)} of width {head.dim}; this model has {n} layers of "
            f"width {dim}: use the model the head was trained on (its task file names it)"
        )
    for name, value, default in (
        ("scoring", scoring, "auto"),
        ("keep_logits", keep_logits, False),
        ("label_pass", label_pass, "trie"),
    ):
        if value != default:
            raise LabelError(
                f"{name}={value!r} is a label-scoring setting; a learned head scores no label tokens and has no "
                f"vocabulary logits: leave {name} at {default!r}"
            )


def _refuse_with_questions(**given: bool) -> None:
    """What a classifier that asks several questions does not take (each question carries its own options)."""
    bad = [k for k, v in given.items() if v]
    if bad:
        why = {
            "labels": "each question has its own labels",
            "examples": "few-shot examples answer one question",
            "label_descriptions": "a question carries its own descriptions",
        }
        raise QuestionError(
            f"questions= does not go with {bad[0]}"
            + (f" ({why[bad[0]]})" if bad[0] in why else " (not supported with several questions yet)")
            + ": drop it, or ask one question with labels="
        )


class Run:
    """One classification run: iterate it for predictions; `stats` fills in as it goes.

    `stats.seconds` counts only the time spent producing predictions, not the time the
    consumer takes between them (writing rows, calibrating)."""

    def __init__(self, gen: Iterator[Prediction], stats: Stats):
        self._gen, self.stats = gen, stats

    def __iter__(self) -> Iterator[Prediction]:
        while True:
            t0 = time.perf_counter()
            try:
                p = next(self._gen)
            except StopIteration:
                self.stats.seconds += time.perf_counter() - t0
                return
            self.stats.seconds += time.perf_counter() - t0
            yield p


def _is_frame(x: Any) -> bool:
    """A pandas DataFrame (or one like it), told without importing pandas."""
    return type(x).__name__ == "DataFrame" and hasattr(x, "columns") and hasattr(x, "iloc")


def _as_texts(texts: Any, text_column: str | None) -> Any:
    """`texts` as an iterable of texts, refusing what would silently give wrong answers:
    a single `str` is one text (iterating it would classify each character), a DataFrame
    needs `text_column` (iterating it gives its column names), bytes are not text."""
    if isinstance(texts, str):
        if text_column is not None:
            raise TypeError("text_column= goes with a pandas DataFrame; got a single string")
        return [texts]
    if isinstance(texts, (bytes, bytearray)):
        raise TypeError("texts are str, not bytes: decode them first (e.g. data.decode('utf-8'))")
    if _is_frame(texts):
        if text_column is None:
            raise TypeError(
                "a pandas DataFrame iterates over its column names, not its rows: pass text_column='text' "
                "(the column holding the texts), or df['text'], or use classify_frame(df, text_column=...)"
            )
        if text_column not in texts.columns:
            raise KeyError(f"text_column={text_column!r} is not a column of the frame: name the column of texts")
        return list(texts[text_column])
    if text_column is not None:
        raise TypeError(f"text_column= goes with a pandas DataFrame; got {type(texts).__name__}")
    if isinstance(texts, Mapping):
        raise TypeError("a mapping iterates over its keys: pass the texts themselves (e.g. list(d.values()))")
    if not isinstance(texts, Iterable):
        raise TypeError(
            f"texts must be an iterable of str (a list, a pandas Series) or one str, got {type(texts).__name__}: "
            "e.g. classify(['My card was charged twice'])"
        )
    return texts


def _check_window(window: Any) -> None:
    """A window of items is read, sorted and batched at a time: 0 would read nothing."""
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"window must be an integer of at least 1 (items read at a time), got {window!r}")


def _missing(x: Any) -> bool:
    """None, a float NaN, or pandas' NA/NaT: a missing text, told without importing pandas."""
    if x is None or (isinstance(x, float) and x != x):
        return True
    return type(x).__name__ in ("NAType", "NaTType")


def _with_progress(preds: Iterator[Prediction], total: int | None) -> Iterator[Prediction]:
    """A tqdm bar on stderr, one step per prediction (they come a batch at a time)."""
    with _progress_bar(total) as bar:
        for p in preds:
            bar.update(1)
            yield p


def _progress_bar(total: int | None, desc: str = "mlx-slm") -> Any:
    """A tqdm bar on stderr (tqdm.auto: a widget in a notebook), counting items."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        from .errors import MissingExtra

        raise MissingExtra("progress=True needs tqdm: pip install tqdm") from None
    import sys

    return tqdm(total=total, unit="item", file=sys.stderr, desc=desc)


__all__ = ["Calibration", "Classifier", "Engine", "Prediction", "Run", "Stats"]
