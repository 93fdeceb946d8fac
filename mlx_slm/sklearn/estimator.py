"""`SLMClassifier`: the scikit-learn estimator (see the package's docstring). Its parameters are
stored as given and checked when `fit` runs; the way it fits is its `method`'s object
(`methods.METHODS`); predictions run the fitted `Task` through a `Classifier` on the shared engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from ..classifier.classifier import Classifier
from ..classifier.pipeline import DEFAULT_BATCH_SIZE
from ..classifier.plan import Plan
from ..classifier.task import Task
from ..ground.ranges import check_all
from ..jobs.finetune import save_finetuned
from ..kinds.finetune import FineTunedSettings
from ..text.labels import log_softmax
from ..weights.adapters import FineTuned
from ..weights.registry import DEFAULT_MODEL, ModelRef
from .data import label_key, texts_of
from .engines import shared_engine
from .methods import METHOD_OF_KIND, METHODS, Method


class SLMClassifier(ClassifierMixin, BaseEstimator):
    """A text classifier on a small language model, with scikit-learn's API.

    Parameters (stored as given; checked when `fit` runs):

    model: a built-in name, converted dir, HF dir, `.gguf` or hub id (loaded once per process).
    method: "head" trains a linear head on the model's hidden states (`mlx-slm train`'s cross-
        validated choice of layers, poolings and estimator; needs `folds` examples per label);
        "labels" scores the label names zero-shot (`y` only sets `classes_` and fits the
        calibration); "model" uses a sequence-classification checkpoint's own head as it is
        (`classes_`: its labels, in its id order or as `labels=` orders them; nothing is
        trained: `y`, when given, is checked against its labels and fits the calibration; a
        multi-label or one-output head is refused: no single class a text); "finetune" trains
        LoRA adapters on the top `adapt_layers` blocks and a score head (`mlx-slm train
        --finetune lora`; at least 2 examples per label while `val_fraction` holds some out).
    labels: the classes, in order (default: the sorted labels of `y`); a `y` outside them is refused.
    system, template: the prompt (None: `DEFAULT_SYSTEM`, `DEFAULT_TEMPLATE`; `{labels}` in
        `system` is filled with the labels, `{text}` in `template` with each text; "" for no
        system message).
    examples: few-shot (text, label) pairs put in the prompt.
    calibration: for method "labels": "none", "batch" (each `predict` call's texts set the
        prior), "fit" or "em" (fitted on `X, y` at `fit`). A head's probabilities are fitted
        already: "none" only.
    layers: the head's candidate layers: "auto", "all", "6,12,24" or a list of layer numbers.
    pooling: "auto" (both), "last" or "mean": how each layer's hidden states are pooled.
    folds, random_state: the head's stratified cross-validation and its shuffle (random_state
        also seeds fine-tuning: the same seed and data give the same adapters).
    epochs, learning_rate, head_learning_rate, adapt_layers, rank, val_fraction, max_minutes:
        method "finetune"'s settings, as `train --finetune lora` takes them (`adapt_layers`
        None: the top 16 blocks, or every block of a smaller model).
    none_label: the label of the out-of-scope examples in `y` ("none of these"): learned as a class, so
        `predict` answers it for a text that fits no other label; `to_task` saves it as the task's none
        label (the CLI, the service and Ray then answer such a text with no label, abstained).
    batch_size, max_batch_tokens, truncate, dtype: as the CLI's options (None: the defaults).
    verbose: 0 silent; 1 tqdm bars over feature extraction and classification; 2 also each
        training step on stderr.

    Fitted attributes: `classes_` (labels as given in `y`, strings or integers), `task_`
    (the `task.Task` that predictions run: save it with `to_task`).
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        method: str = "head",
        labels: Sequence[Any] | None = None,
        system: str | None = None,
        template: str | None = None,
        examples: Sequence[tuple[str, str]] | None = None,
        calibration: str = "none",
        layers: str | Sequence[int] = "auto",
        pooling: str = "auto",
        folds: int = 5,
        random_state: int = 0,
        batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        truncate: str | None = None,
        dtype: str | None = None,
        verbose: int = 0,
        epochs: int = 8,
        learning_rate: float = 2e-5,
        head_learning_rate: float = 1e-4,
        adapt_layers: int | None = None,
        rank: int = 8,
        val_fraction: float = 0.0,
        max_minutes: float | None = None,
        none_label: Any = None,
    ):
        self.model = model
        self.method = method
        self.labels = labels
        self.system = system
        self.template = template
        self.examples = examples
        self.calibration = calibration
        self.layers = layers
        self.pooling = pooling
        self.folds = folds
        self.random_state = random_state
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.truncate = truncate
        self.dtype = dtype
        self.verbose = verbose
        self.epochs, self.learning_rate, self.head_learning_rate = epochs, learning_rate, head_learning_rate
        self.adapt_layers, self.rank, self.val_fraction, self.max_minutes = (
            adapt_layers,
            rank,
            val_fraction,
            max_minutes,
        )
        self.none_label = none_label

    # ------------------------------------------------------------------ scikit-learn's tags
    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False  # X is texts, not a numeric matrix
        tags.input_tags.string = True
        tags.input_tags.allow_nan = False
        tags.target_tags.required = True
        return tags

    def _more_tags(self) -> dict[str, Any]:  # scikit-learn before 1.6
        return {"X_types": ["string"], "requires_y": True}

    # ------------------------------------------------------------------ fit
    def fit(self, X: Any, y: Any = None) -> SLMClassifier:
        """Fit the task as `method` says (`methods.METHODS`: train the head, set up zero-shot label
        scoring with its calibration, take a model's own head, or fine-tune). `X`: texts (list, NumPy
        array, pandas Series, one-column DataFrame); `y`: each text's label, str or int."""
        method = self._check_params()
        task, self.classes_ = method.fit(self, texts_of(X), y)
        if self.none_label is not None:  # "none of these": one of the classes, saved as the task's none label
            name = str(label_key(self.none_label))
            if name not in task.labels:
                raise ValueError(
                    f"none_label={self.none_label!r} is not one of the classes {list(task.labels)[:8]}: "
                    "label the out-of-scope examples in y with it, or leave none_label unset"
                )
            task = replace(task, none={"label": name, "min_confidence": None})
        self.task_ = task
        self.__dict__.pop("_clf_cache", None)
        self.plan_ = self._plan()  # resolved once: what every prediction runs
        return self

    def _check_params(self) -> Method:
        """The parameters as `fit` takes them (scikit-learn stores them as given); the method's object."""
        if self.method not in METHODS:
            raise ValueError(
                f"method={self.method!r}: give 'head' (a learned head), 'labels' (zero-shot), 'model' "
                "(a sequence classifier's own head) or 'finetune' (LoRA adapters and a score head)"
            )
        if self.calibration not in ("none", "batch", "fit", "em"):
            raise ValueError(f"calibration={self.calibration!r}: give 'none', 'batch', 'fit' or 'em'")
        method = METHODS[self.method]
        method.check(self)
        if self.pooling not in ("auto", "last", "mean"):
            raise ValueError(f"pooling={self.pooling!r}: give 'auto', 'last' or 'mean'")
        method.check_parts(self)
        if isinstance(self.model, (bytes, bytearray)) or not isinstance(self.model, (str, Path)):
            raise ValueError(f"model={self.model!r}: give a model name or path (a str)")
        if isinstance(self.labels, (str, bytes)):
            raise ValueError(f"labels={self.labels!r}: give a list of labels, e.g. ['spam', 'ham']")
        check_all(self.get_params(), "{name}")  # the CLI's ranges: batch_size=0 or max_batch_tokens=nan refused
        return method

    def batching(self) -> dict[str, Any]:
        """The batching settings a fit and a prediction run with (None: the CLI's defaults)."""
        return {
            "batch_size": self.batch_size or DEFAULT_BATCH_SIZE,
            "max_batch_tokens": self.max_batch_tokens or "auto",
            "truncate": self.truncate,
        }

    def _plan(self) -> Plan:
        """The run the fitted task defines with the estimator's model, dtype and batching (`Task.plan`)."""
        return self.task_.plan(ModelRef(str(self.model), self.dtype), **self.batching())

    # ------------------------------------------------------------------ predict
    def _clf(self) -> Any:
        """The classifier the fitted plan defines, on the shared engine (made once per engine)."""
        check_is_fitted(self, "task_")
        plan = self.__dict__.get("plan_") or self._plan()  # a pickle or `from_task` made it anew
        assert plan.model is not None
        engine = shared_engine(plan.model.name, plan.model.dtype)
        clf = self.__dict__.get("_clf_cache")
        if clf is None or clf.engine is not engine:
            # A fitted head or prior on other weights is refused, naming both sha256.
            if self.task_.weights_sha256 and self.task_.pins_weights:
                self.task_.check_weights(engine.weights_sha256, str(self.model))
            clf = Classifier.from_plan(plan, engine)
            self._clf_cache = clf
        return clf

    def _log_proba(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """(probabilities, log-probabilities), (N, k) in `classes_` order."""
        check_is_fitted(self, "task_")
        texts = texts_of(X)
        clf = self._clf()
        lp = METHODS[self.method].log_proba(self, clf, texts)  # a head's maths on its cached features
        if lp is not None:
            return np.exp(lp), lp
        names = [str(c) for c in self.classes_.tolist()]  # the columns in classes_ order (the task's labels)
        preds = clf.classify(texts, progress=self.verbose > 0)
        probs = np.empty((len(texts), len(names)))
        logp = np.empty_like(probs)
        for p in preds:
            if not p.ok:
                raise ValueError(f"X row {p.index}: {p.error}")
            probs[p.index] = [p.probs[lab] for lab in names]
            if p.raw_probs is None:  # uncalibrated: the scores are the model's (or the head's) log-scores
                logp[p.index] = log_softmax(np.array([p.scores[lab] for lab in names]))
            else:
                logp[p.index] = np.log(np.maximum(probs[p.index], np.finfo(float).tiny))
        return probs, logp

    def predict_proba(self, X: Any) -> np.ndarray:
        """(N, k) probabilities, columns in `classes_` order; rows sum to 1."""
        return self._log_proba(X)[0]

    def predict_log_proba(self, X: Any) -> np.ndarray:
        return self._log_proba(X)[1]

    def decision_function(self, X: Any) -> np.ndarray:
        """The log-probabilities (N, k) in `classes_` order; with two classes scikit-learn's
        binary convention, log p(classes_[1]) - log p(classes_[0]) (N,)."""
        lp = self._log_proba(X)[1]
        return lp[:, 1] - lp[:, 0] if lp.shape[1] == 2 else lp

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of each text (an element of `classes_`)."""
        proba = self.predict_proba(X)  # first: NotFittedError before classes_ is read
        return self.classes_[np.argmax(proba, axis=1)]

    def transform(self, X: Any) -> np.ndarray:
        """The head's features of each text: its layers' hidden states, pooled as it reads
        them, side by side: (N, parts x hidden size) float32, to feed another model."""

        check_is_fitted(self, "task_")
        texts = texts_of(X)
        return METHODS[self.method].features(self, self._clf, texts).reshape(len(texts), -1).astype(np.float32)

    # ------------------------------------------------------------------ tasks and pickles
    def to_task(self, path: str | Path) -> Path:
        """Save the fitted task file (`mlx-slm classify --task`, serve, Ray and `from_task` take it)."""
        check_is_fitted(self, "task_")
        tuned = (self.task_.finetune or {}).get("tuned")
        if tuned is None:
            self.task_.save(path)
            return Path(path)
        fused = bool(self.task_.finetune.get("fused"))
        save_finetuned(self.task_, tuned, path, fused)  # the adapters beside the task, as train --finetune writes them
        return Path(path)

    @classmethod
    def from_task(cls, task: Any, **params: Any) -> SLMClassifier:
        """A fitted estimator from a task file (or `Task`): model, labels, prompt, head or
        calibration as saved. `params`: run settings (batch_size, truncate, verbose, ...).
        `classes_` are the task's labels (strings)."""
        t = task if isinstance(task, Task) else Task.load(task)
        kind = t.kind
        method = METHOD_OF_KIND.get(kind.name)
        if method is None:
            raise ValueError(f"the task scores with {kind.name!r}; the estimator fits {', '.join(METHOD_OF_KIND)}")
        t, params = METHODS[method].adopt(t, kind, params)  # the task as held, and its parameters
        est = cls(
            model=t.model,
            method=method,
            labels=list(t.labels),
            examples=[tuple(e) for e in t.examples] or None,
            calibration=t.calibration.method,
            **params,
        )
        est.task_ = t
        est.classes_ = np.asarray(t.labels)
        return est

    def __getstate__(self) -> dict[str, Any]:
        return _pickled(dict(super().__getstate__()))

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(_unpickled(dict(state)))


def _pickled(state: dict[str, Any]) -> dict[str, Any]:
    """The estimator's state as its pickle holds it: no weights (the task names them), the task
    as its dict, a fine-tuned task's adapters as their bytes (as their file holds them)."""
    state.pop("_clf_cache", None)
    state.pop("plan_", None)  # made again from the task (it holds the task, adapters and all)
    if "task_" in state:
        t = state["task_"]
        if t.finetune is not None:
            state["finetuned_"] = {**t.finetune, "tuned": t.finetune["tuned"].to_bytes()}
            t = replace(t, section=None)
        state["task_"] = t.to_dict()
    return state


def _unpickled(state: dict[str, Any]) -> dict[str, Any]:
    """`_pickled` undone: the task and its adapters read back (each checked as a file of theirs is)."""
    if isinstance(state.get("task_"), dict):
        state["task_"] = Task.from_dict(state["task_"], "the pickled SLMClassifier's task")
    tuned = state.pop("finetuned_", None)
    if tuned is not None:
        tuned["tuned"] = FineTuned.from_bytes(tuned["tuned"], "the pickled SLMClassifier's adapters")
        state["task_"] = replace(state["task_"], section=FineTunedSettings(tuned))
    return state
