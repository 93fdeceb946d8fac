"""`Classifier`: texts in, one prediction per text out, in input order.

Data flows one way through the modules:

    texts -> items (the kind renders and tokenizes) -> prefix split (engine's prefix LRU)
          -> batch plan (batching) -> kind.score (engine primitives) -> predictions
          -> calibration (the kind's calibration run) -> the caller

The scoring kind (`kinds/`: the labels' tokens, a learned head, several questions) is chosen
once at construction from the arguments; everything that differs between kinds is the
kind's. With a learned head the forward stops at the head's layer and no label token runs,
so the label count does not change the cost.

Each optimization can be switched off alone (`sort`, `use_prefix_cache`, the token
budget), so its worth can be measured, and none of them may change a prediction.

`Classifier` is the facade. Its construction and settings are `classifier_base.py`, the
window and batch pipeline `pipeline.py`, and the checks of what the API takes as texts
`inputs.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence, Sized
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine.engine import Engine
from ..text.calibration import Calibration, CalibrationSpec, Calibrator
from ..text.inputs import as_texts as _as_texts
from ..text.inputs import check_frame, check_new_columns
from ..text.inputs import check_window as _check_window

# train.py and sklearn.py take `_missing` from here (it moved to inputs.py).
from ..text.inputs import missing as _missing  # noqa: F401
from ..text.inputs import with_progress as _with_progress
from ..text.labels import LabelError
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from ..weights.registry import DEFAULT_MODEL
from . import pipeline
from .base import ClassifierBase

if TYPE_CHECKING:
    from .task import Task


class Classifier(ClassifierBase):
    """One classification task on a shared `Engine`: labels, prompt, scoring and batching.

    The policy layer: it renders and tokenizes, plans length-bucketed batches, asks the
    engine for label scores and hands predictions back in input order. It holds settings
    only; what a run counts comes back with that run (`run()`), so one classifier (and
    one engine under many classifiers) can serve concurrent callers.
    """

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
        if engine.path is not None and t.pins_weights:
            t.check_weights(engine.weights_sha256, str(engine.path))
        fixed = {"labels", "system", "template", "scoring", "examples", "head", "label_descriptions", "tokenizer"}
        clash = sorted(fixed & kwargs.keys())
        if clash:
            raise TypeError(
                f"from_task takes {', '.join(clash)} from the task: build Classifier(engine, labels, "
                "system, template, ...) for another task, or save one (Task, --save-task)"
            )
        # The kind's run-time settings (label_pass, keep_logits) may be set here; the rest is the task's.
        own = {k: kwargs.pop(k) for k in ("keep_logits", "label_pass", "features_only") if k in kwargs}
        kind = replace(t.kind_args(), **own)  # chosen on the engine (a model's own score head included)
        # Run settings may be overridden, as classify's own arguments can.
        run = {"calibration": t.calibration, "min_confidence": t.min_confidence, "warmup": t.warmup, **kwargs}
        return cls(engine, system=t.system, template=t.template, kind=kind, **run)

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
        check_frame(df, text_column, prefix)
        cal = self.calibration if calibration is None else CalibrationSpec.of(calibration)
        conf = self.min_confidence if min_confidence is None else min_confidence
        # the CSV output's columns (each question's, with several), less the input's id and line
        shape = self.spec.record_shape(calibrated=cal.applies, abstains=conf is not None)
        names = shape.frame_columns
        check_new_columns(df, names, prefix)
        preds = self.classify(list(df[text_column]), cal, conf, progress=progress)
        cols = shape.frame(preds, cal.kind if cal.applies else None)
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
        from ..text.calibration import CalibrationError, fit_labelled, gold_indices
        from ..text.labels import gold_problem, log_softmax

        spec = CalibrationSpec.of(kind, warmup=None if isinstance(kind, CalibrationSpec) else self.warmup)
        if spec.kind not in ("fit", "em"):
            raise CalibrationError(f"fit_calibration fits 'fit' or 'em' calibration, not {spec.kind!r}")
        if not self.spec.calibrates:
            raise LabelError(self.spec.no_calibration)
        texts, gold = list(_as_texts(texts, None)), list(_as_texts(labels, None))
        at = f"{source}: " if source else ""

        def where(i: int) -> str:
            return f"{at}line {lines[i]}" if lines is not None else f"{at}item {i}"

        if len(texts) != len(gold):
            raise CalibrationError(f"{at}{len(texts)} texts but {len(gold)} gold labels: give one label per text")
        if not texts:
            raise CalibrationError(f"{at}no labelled texts: give some (texts and their gold labels)")
        for i, g in enumerate(gold):
            if gold_problem(g, self.labels) is not None:
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
