"""`Classifier`: texts in, one prediction per text out, in input order.

Data flows one way through the modules:

    texts -> items (the kind renders and tokenizes) -> prefix split (engine's prefix LRU)
          -> batch plan (batching) -> kind.score (engine primitives) -> predictions
          -> calibration (the kind's calibration run) -> the caller

A classifier is a scoring kind (`kinds/`: the labels' tokens, a learned head, several
questions, a model's own head, a reranker, fine-tuned adapters) bound to an engine, with its
calibration and batch settings. The kind is chosen once, here, where the model is known: the
arguments go through `kinds.arguments` (the one translator every front end uses) and the
kinds table (`kinds.spec_of`) on the model's facts. Everything that differs between kinds
is the kind's; the views below read the kind's interface, never guess at it.

Each optimization can be switched off alone (`sort`, `use_prefix_cache`, the token
budget), so its worth can be measured, and none of them may change a prediction. The
window and batch pipeline is `pipeline.py`; calibration fitted on labelled texts is
`calibrate.py`; what the API takes as texts is `text.inputs`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence, Sized
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache
from ..kinds import Kind, KindArgs, KindSpec, ModelFacts, spec_of
from ..kinds.head import FeaturesSettings, HeadSettings
from ..models import Model, embeds_only
from ..text.calibration import Calibration, CalibrationSpec, Calibrator
from ..text.heads import Head
from ..text.inputs import as_texts as _as_texts
from ..text.inputs import check_window as _check_window
from ..text.inputs import with_progress as _with_progress
from ..text.labels import LabelSet
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE, PromptFormat
from ..text.questions import Question
from ..weights.registry import DEFAULT_MODEL, ModelRef
from . import pipeline
from .calibrate import fit_calibration
from .frames import classify_frame
from .plan import Plan, resolved
from .task import Task


def _on_model(kind: KindArgs, engine: Engine) -> KindArgs:
    """`kind` with the facts of the engine's model the kinds table chooses on (its own score head, its
    name, whether it embeds only); a model that embeds only, with no head given, gives its features."""
    m = engine.model
    model = ModelFacts(getattr(m, "seqcls", None), str(engine.path or ""), True, embeds_only(m))
    if model.embeds_only and kind.get(HeadSettings) is None and kind.get(FeaturesSettings) is None:
        kind = replace(kind, own=(*kind.own, FeaturesSettings()))  # no head to score with: its features
    return replace(kind, model=model)


class Classifier:
    """One classification task on a shared `Engine`: its kind, prompt, calibration and batching.

    It holds settings only; what a run counts comes back with that run (`run()`), so one
    classifier (and one engine under many classifiers) can serve concurrent callers.

    Everything it runs with is one `Plan`, resolved once from the keywords (`Plan.of`) or given
    (`plan=`, `from_plan`). Scoring arguments (keywords; `kinds.arguments` reads them): `scoring`
    ("auto", "first-token", "sequence"), `examples` ((text, label) pairs), `label_descriptions`,
    `keep_logits`, `label_pass`; `head` (a learned `Head`); `questions` (several per text);
    `features_only`; `threshold` (a multi-label sequence classifier's); `reranker` and
    `instruction`; `finetuned` (a `FineTuned`) and `fused`. Or `kind`: a `KindArgs` or a
    `KindSpec` made already."""

    def __init__(
        self,
        engine: Engine,
        labels: Sequence[str] = DEFAULT_LABELS,
        system: str | None = DEFAULT_SYSTEM,
        template: str = DEFAULT_TEMPLATE,
        *,
        plan: Plan | None = None,
        **options: Any,
    ):
        """`options`: the run settings (`plan.RUN_OPTIONS`) and the scoring arguments."""
        if not isinstance(engine, Engine):
            raise TypeError(
                f"Classifier takes an Engine (Engine.load(name), or Engine(model, tokenizer)), not "
                f"{type(engine).__name__}; Classifier.load(name, ...) loads one"
            )
        plan = resolved(plan, labels, system, template, options)
        kind = plan.kind
        if isinstance(kind, KindArgs):  # chosen here, once, where the model (and any score head of its own) is known
            kind = spec_of(_on_model(kind, engine))
        kind.check_calibration(plan.calibration, plan.min_confidence)  # a head's, a question's: refused if not
        filled = kind.prompt_labels()
        if filled is not None and not plan.labels_filled:
            plan = plan.with_labels(*filled)
        self.plan: Plan = plan.with_kind(kind)
        self.engine = engine
        self.calibration, self.min_confidence, self.warmup = plan.calibration, plan.min_confidence, plan.warmup
        self.batching = plan.batching()
        run = plan.run_settings(engine.max_length)
        self.kind: Kind = kind.bind(engine, kind.prompt(plan.system, plan.template), run)

    @classmethod
    def from_plan(cls, plan: Plan, engine: Engine | None = None) -> Classifier:
        """The classifier `plan` says, on `engine` (shared), or on the plan's model loaded."""
        if engine is None:
            if plan.model is None:
                raise TypeError("this plan names no model (it was made for an engine): pass engine=")
            engine = Engine.load(plan.model)
        return cls(engine, plan=plan)

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(
        cls,
        model: str | Path | ModelRef = DEFAULT_MODEL,
        labels: Sequence[str] = DEFAULT_LABELS,
        system: str | None = DEFAULT_SYSTEM,
        template: str = DEFAULT_TEMPLATE,
        dtype: str | None = None,
        **kwargs: Any,
    ) -> Classifier:
        """Load a built-in name, converted dir, HF dir, `.gguf` or hub id (converted once, cached).
        `model` and `dtype`, and the rest of how it loads (`ModelRef`'s fields by name: an
        MLX-quantized model's weights, as `Engine.load` takes them), become the plan's `ModelRef`."""
        return cls.from_plan(
            Plan.loading(model=model, labels=labels, system=system, template=template, dtype=dtype, **kwargs)
        )

    @classmethod
    def from_task(
        cls,
        task: str | Path | Task,
        dtype: str | None = None,
        engine: Engine | None = None,
        **kwargs: Any,
    ) -> Classifier:
        """A classifier as a saved task file defines it (model, prompt, examples, calibration). Pass
        `engine` to share loaded weights between tasks of the same model. The task's model loads in
        `dtype` and as `ModelRef`'s other fields given by name say (`Classifier.load`)."""
        t = task if isinstance(task, Task) else Task.load(task)
        fixed = {"labels", "system", "template", "scoring", "examples", "head", "label_descriptions", "tokenizer"}
        clash = sorted(fixed & kwargs.keys())
        if clash:
            raise TypeError(
                f"from_task takes {', '.join(clash)} from the task: build Classifier(engine, labels, "
                "system, template, ...) for another task, or save one (Task, --save-task)"
            )
        # Run-time settings a caller may set (label_pass, keep_logits, features_only, empty_ok, controls_as_text).
        own = {k: kwargs.pop(k) for k in ("keep_logits", "label_pass") if k in kwargs}
        run = {k: bool(kwargs.pop(k, False)) for k in ("empty_ok", "controls_as_text", "features_only")}
        features = run.pop("features_only")
        ref, kwargs = ModelRef.take({**kwargs, "model": t.model, "dtype": dtype})
        plan = replace(t.plan(ref, **kwargs), **run)  # run settings overridden, as classify's can be
        engine = engine or Engine.load(plan.model)
        # A saved prior or a head was fitted on these weights' scores: the same weights only.
        if engine.path is not None and t.pins_weights:
            t.check_weights(engine.weights_sha256, str(engine.path))
        args = replace(plan.kind, **own)
        if features and args.get(FeaturesSettings) is None:
            args = replace(args, own=(*args.own, FeaturesSettings()))
        return cls(engine, plan=plan.with_kind(args))

    # ------------------------------------------------------------------ views of the settings
    @property
    def spec(self) -> KindSpec:
        """The kind's settings (what a task file saves)."""
        return self.kind.spec

    @property
    def format(self) -> PromptFormat:
        return self.kind.format

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.kind.labelset.labels)

    @property
    def labelset(self) -> LabelSet:
        """The labels' token ids and scoring mode (the labels kind's; names only for another kind)."""
        return self.kind.labelset

    @property
    def mode(self) -> str:
        return self.kind.mode

    @property
    def head(self) -> Head | None:
        """The learned head the kind scores with (None for any other kind)."""
        return self.spec.learned_head

    @property
    def questions(self) -> tuple[Question, ...] | None:
        return self.spec.questions

    @property
    def truncate(self) -> str | None:
        return self.kind.run.truncate

    @property
    def max_length(self) -> int:
        return self.kind.max_length

    @property
    def prefix_tokens(self) -> tuple[int, ...]:
        return self.kind.prefix_tokens

    @property
    def model(self) -> Model:
        return self.engine.model

    @property
    def path(self) -> Path | None:
        return self.engine.path

    @property
    def prefix(self) -> PrefixCache | None:
        """The shared head's KV (computed on first use, then kept by the engine)."""
        return self.engine.prefix(self.prefix_tokens)[0] if self.prefix_tokens else None

    def calibration_run(
        self, spec: CalibrationSpec, min_confidence: float | None = None, on_fit: Any = None
    ) -> Calibration | Any:
        """The per-run calibration (and abstain) of this task's predictions (the kind's)."""
        return self.spec.calibration_run(spec, min_confidence, on_fit)

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
        self.spec.check_calibration(cal)
        conf = self.min_confidence if min_confidence is None else min_confidence
        if progress:  # as each batch finishes, then back in input order before calibrating
            done = self.classify_iter(texts, window=max(1, len(texts)), ordered=False, progress=True)
            run: Iterable[Prediction] = sorted(done, key=lambda p: p.index)
        else:
            run = self.classify_iter(texts, window=max(1, len(texts)))
        return list(self.calibration_run(CalibrationSpec.of(cal, warmup=max(2, len(texts))), conf)(run))

    def classify_iter(
        self,
        texts: Iterable[str] | str,
        window: int = 1024,
        *,
        ordered: bool = True,
        text_column: str | None = None,
        progress: bool = False,
    ) -> Iterator[Prediction]:
        """Stream the model's raw predictions (`run` counts them): in input order (ordered=True: an item
        waits for those before it), or each batch's as it finishes (`Prediction.index` is the position)."""
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
        return classify_frame(self, df, text_column, calibration, min_confidence, prefix=prefix, progress=progress)

    def fit_calibration(
        self,
        texts: Iterable[str],
        labels: Iterable[str],
        method: str | CalibrationSpec = "fit",
        *,
        window: int = 1024,
        progress: bool = False,
        source: str | None = None,
        lines: Sequence[int] | None = None,
        kind: str | CalibrationSpec | None = None,
    ) -> CalibrationSpec:
        """Calibration fitted on labelled texts (`calibrate.fit_calibration`; `kind=`: `method`'s old name)."""
        method = method if kind is None else kind
        return fit_calibration(
            self, texts, labels, method, window=window, progress=progress, source=source, lines=lines
        )

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
        return Run(pipeline.windows(self.kind, texts, window, self.batching, stats, ordered), stats)

    def run_items(self, items: Sequence[Item], *, ordered: bool = True) -> Run:
        """A run over items `prepare` made (the service's worker: its front end tokenized them)."""
        stats = Stats()
        return Run(pipeline.run_items(self.kind, items, self.batching, stats, ordered), stats)

    # ------------------------------------------------------------------ pipeline (pipeline.py, kinds/)
    def prepare(self, texts: Sequence[str], start: int = 0) -> list[Item]:
        """Render and tokenize (batched); flag empty and over-long items (the kind's `items`)."""
        return self.kind.items(texts, start)

    def features(
        self,
        texts: Sequence[str],
        layers: Sequence[int] | None = None,
        window: int = 1024,
        poolings: Sequence[str] | None = None,
        *,
        progress: bool = False,
    ) -> tuple[dict[str, np.ndarray], list[str | None], Stats]:
        """The model's hidden states for every text: what a learned head reads. Each text goes through
        classification's prompt, prefix cache and batch plan; the forward stops at the deepest of `layers`
        (Transformers' `hidden_states[l]` numbering, 1..layers; None: the head's own), each pooled as each
        of `poolings` asks ("last": the last prompt position; "mean": the text's part; None: the head's, else
        "last"). Returns ({pooling: (N, len(layers), D) float32}, an error or None per text (its rows NaN),
        the run's figures); one forward per text. `heads.head_input` picks a head's parts out of them."""
        _check_window(window)
        if layers is None:
            own = self.spec.feature_parts()
            if own is None:
                raise ValueError(
                    "features(texts, layers): give the layers (1..number of layers); only a head has its own"
                )
            layers, poolings = own[0], poolings or own[1]
        poolings = tuple(poolings or ("last",))
        texts = list(_as_texts(texts, None))
        return pipeline.features(self.kind, texts, list(layers), window, poolings, self.batching, progress)


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


__all__ = ["Calibration", "Classifier", "Engine", "Prediction", "Run", "Stats"]
