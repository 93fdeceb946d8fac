"""`SLMClassifier`: mlx-slm as a scikit-learn classifier, for notebooks and model selection.

    est = SLMClassifier(model="qwen2.5-coder-0.5b").fit(texts, y)   # a learned head
    est.predict(new_texts); est.predict_proba(new_texts)            # columns in classes_ order
    cross_val_score(est, texts, y, cv=5); joblib.dump(est, "est.joblib")

It is a thin shell over the library: `fit` runs `train.train_head` (method "head", the
same cross-validated choice of parts and estimator as `mlx-slm train`), fine-tunes LoRA
adapters and a score head (method "finetune", `tuning.finetune_texts`, as `mlx-slm train
--finetune lora`) or builds a zero-shot label-scoring `Classifier` (method "labels", with
`Classifier.fit_calibration` when calibration is "fit" or "em"), and keeps the result as a
`task.Task`: the same task file the CLI, the service and Ray take (`to_task`, `from_task`).
Predictions come from `Classifier.classify` on that task.

Why the weights live outside the estimator: scikit-learn clones an estimator for every
fold and every grid candidate, and pickles it to save it. The loaded model (hundreds of
MB) is held once per process in a cache keyed by the model and its weights' sha256
(`shared_engine`), shared by every clone; a pickle holds the task (labels, prompt, head,
calibration, the model's name and its weights' sha256), and the first prediction after
loading finds the model by that name or path and refuses other weights, naming both
hashes. A fine-tuned estimator's pickle holds its adapters too (the safetensors bytes
`FineTuned.save` writes: a few MB, against the model's hundreds), so it needs no file
beside it; `to_task` writes them beside the task file, as `train --finetune` does.

May import: ground, text, models, weights, engine, kinds, classifier, jobs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

try:
    from sklearn.base import BaseEstimator, ClassifierMixin
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted
except ImportError as e:  # pragma: no cover - the extra is missing
    from .ground.errors import MissingExtra

    raise MissingExtra("mlx_slm.sklearn needs scikit-learn: pip install 'mlx-slm[sklearn]'") from e

from .ground.notices import notice
from .kinds.finetune import FineTunedSettings
from .kinds.head import HeadSettings
from .weights.registry import DEFAULT_MODEL

# The estimator's own prompt defaults (not the CLI's ticket-specific ones): they name the
# labels ({labels} is filled with them), whatever the task.
DEFAULT_SYSTEM = "Classify the text. Answer with exactly one of: {labels}."
DEFAULT_TEMPLATE = "Text: {text}\nLabel:"
METHODS = ("head", "labels", "model", "finetune")
# a task's scoring kind -> the method that fits it
METHOD_OF_KIND = {"head": "head", "labels": "labels", "seqcls": "model", "finetune": "finetune"}
# The estimator's fine-tuning parameters, as `finetune.FinetuneSettings` names them.
TUNING = {"epochs": "epochs", "learning_rate": "learning_rate", "head_learning_rate": "head_learning_rate",
          "adapt_layers": "layers", "rank": "rank", "val_fraction": "val_fraction", "max_minutes": "max_minutes",
          "random_state": "seed"}  # fmt: skip

__all__ = [
    "DEFAULT_SYSTEM",
    "DEFAULT_TEMPLATE",
    "FEATURES",
    "FeatureCache",
    "SLMClassifier",
    "clear_engines",
    "shared_engine",
]


# --------------------------------------------------------------------------- one engine per process
_ENGINES: dict[tuple[str, str | None], Any] = {}  # (model as given, dtype) -> Engine
_LOCK = threading.Lock()


def shared_engine(model: str | Path, dtype: str | None = None) -> Any:
    """The process's one loaded `Engine` for `model` (a name or path) in `dtype`.

    Loaded on first use (under a lock: clones fitted in threads wait for one load, not
    several), then shared by every estimator and clone. Two names for the same weights
    share one engine too: after a load, an engine already held with the same weights
    sha256 and dtype is kept and the new one dropped."""
    from .engine.engine import Engine

    key = (str(model), dtype)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = Engine.load(model, dtype)
            same = [
                e
                for e in _ENGINES.values()
                if e.weights_sha256 is not None
                and e.weights_sha256 == engine.weights_sha256
                and e.compute_dtype == engine.compute_dtype
            ]
            engine = same[0] if same else engine
            _ENGINES[key] = engine
        return engine


def clear_engines() -> None:
    """Forget the loaded engines and the features computed on them (their memory goes once
    no estimator holds a classifier on them)."""
    with _LOCK:
        _ENGINES.clear()
    FEATURES.clear()


# --------------------------------------------------------------------------- features, once per text
FEATURE_CACHE_BYTES = 1 << 30  # hidden states kept: 300 texts x 8 layers x 2 poolings x 896 floats is 17 MB


class FeatureCache:
    """The hidden states already computed, per (engine, prompt, text) and (layer, pooling).

    Model selection fits one estimator many times on overlapping texts: the folds of
    `cross_val_score` share most of their training texts, and every `GridSearchCV`
    candidate sees the same folds. The forward pass is the cost; the head's fit on its
    features is cheap. So the estimator asks here first, and runs only the texts (or the
    parts) not seen yet: each text runs about once however many folds and candidates
    there are. Keys hold the engine itself (identity), the prompt as the classifier
    renders it (system, template, examples, truncation, context): another prompt is
    another text. Least recently used texts go past `max_bytes`. A cached text's
    numbers come from the batch it first ran in; batching changes them only in float
    rounding (left padding and RoPE offsets keep each row's maths its own)."""

    def __init__(self, max_bytes: int = FEATURE_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._rows: OrderedDict[tuple[Any, ...], dict[tuple[int, str], np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._rows)

    def features(
        self,
        clf: Any,
        texts: Sequence[str],
        layers: Sequence[int],
        poolings: Sequence[str],
        window: int = 1024,
        progress: bool = False,
    ) -> tuple[dict[str, np.ndarray], list[str | None], Any]:
        """As `Classifier.features` returns them; the run's `Stats` count the texts run now."""
        from .text.predictions import Stats

        layers, poolings = list(layers), tuple(poolings)
        f = clf.format
        prompt = (clf.engine, f.system, f.template, f.examples, clf.truncate, clf.max_length)
        parts = [(x, p) for p in poolings for x in layers]
        with self._lock:
            held = [self._rows.get((prompt, t)) for t in texts]
            for t, h in zip(texts, held):
                if h is not None:
                    self._rows.move_to_end((prompt, t))
        todo = [i for i, h in enumerate(held) if h is None or any(k not in h for k in parts)]
        errors: list[str | None] = [None] * len(texts)
        st = Stats()
        if todo:
            got, errs, st = clf.features([texts[i] for i in todo], layers, window, poolings, progress=progress)
            with self._lock:
                for j, i in enumerate(todo):
                    if errs[j] is not None:
                        errors[i] = errs[j]
                        continue
                    entry = self._rows.setdefault((prompt, texts[i]), {})
                    for c, x in enumerate(layers):
                        for p in poolings:
                            if (x, p) not in entry:
                                entry[(x, p)] = got[p][j, c].copy()  # a copy: the batch's array can go
                                self._bytes += entry[(x, p)].nbytes
                    held[i] = entry
                while self._bytes > self.max_bytes and len(self._rows) > 1:
                    _, old = self._rows.popitem(last=False)
                    self._bytes -= sum(a.nbytes for a in old.values())
        dim = int(clf.model.args.hidden_size)
        out = {p: np.full((len(texts), len(layers), dim), np.nan, dtype=np.float32) for p in poolings}
        for i, h in enumerate(held):
            if errors[i] is None and h is not None:
                for c, x in enumerate(layers):
                    for p in poolings:
                        out[p][i, c] = h[(x, p)]
        return out, errors, st


FEATURES = FeatureCache()


# --------------------------------------------------------------------------- input checks
def _is_frame(x: Any) -> bool:
    return type(x).__name__ == "DataFrame" and hasattr(x, "columns") and hasattr(x, "iloc")


def _missing(x: Any) -> bool:
    from .text.inputs import missing

    return missing(x)


def _column(x: Any, what: str) -> list[Any]:
    """A list, 1-D array, pandas Series, one-column DataFrame or (n, 1) array as a list."""
    if x is None:
        raise ValueError(f"{what} is None: give a sequence (a list, a NumPy array or a pandas Series)")
    if isinstance(x, (str, bytes, bytearray)):
        raise ValueError(
            f"{what} is one {type(x).__name__}: give a sequence of them, e.g. [{x[:30]!r}] (one item a row)"
        )
    if _is_frame(x):
        if x.shape[1] != 1:
            raise ValueError(
                f"{what} is a DataFrame of {x.shape[1]} columns: select the one column it should be "
                "(df['text']), or let a ColumnTransformer pass that column"
            )
        x = x.iloc[:, 0]
    if hasattr(x, "to_numpy") and not isinstance(x, np.ndarray):  # a pandas Series (keeps None/NaN as they are)
        x = x.to_numpy(dtype=object)
    if hasattr(x, "toarray"):
        raise ValueError(f"{what} is a sparse matrix: give texts (a list, a NumPy array or a pandas Series)")
    if isinstance(x, np.ndarray):
        if x.ndim == 2 and x.shape[1] == 1:
            x = x[:, 0]
        if x.ndim != 1:
            raise ValueError(f"{what} has shape {x.shape}: give one item a row (a 1-D array, or a single column)")
        return x.tolist()
    try:
        return list(x)
    except TypeError:
        raise ValueError(
            f"{what} must be a sequence (a list, a NumPy array, a pandas Series), not {type(x).__name__}"
        ) from None


def _texts(X: Any) -> list[str]:
    """X as a list of non-empty str; anything else is a `ValueError` naming the row."""
    texts = _column(X, "X")
    if not texts:
        raise ValueError("X holds no texts (0 rows): give at least one")
    for i, t in enumerate(texts):
        if isinstance(t, (bytes, bytearray)):
            raise ValueError(f"X row {i} is bytes, not text: decode it first (e.g. x.decode('utf-8'))")
        if _missing(t):
            raise ValueError(f"X row {i}: the text is missing (None/NaN): fill it in, or drop the row")
        if not isinstance(t, str):
            raise ValueError(f"X row {i} is {type(t).__name__} {t!r:.40}, not a text (str): X holds texts")
        if not t.strip():
            raise ValueError(f"X row {i}: the text is empty: give it some text, or drop the row")
    return [str(t) for t in texts]


def _targets(y: Any, n: int) -> np.ndarray:
    """y as a 1-D array of labels (strings or integers), one per text."""
    if y is None:
        raise ValueError("requires y to be passed, but the target y is None: give each text its label")
    got = _column(y, "y")
    if len(got) != n:
        raise ValueError(f"X has {n} texts but y has {len(got)} labels: give one label per text")
    for i, v in enumerate(got):
        if isinstance(v, (bytes, bytearray)):
            raise ValueError(f"y row {i} is bytes: give labels as str (decode them) or integers")
        if _missing(v):
            raise ValueError(f"y row {i}: the label is missing (None/NaN): give every text its label, or drop the row")
        if isinstance(v, (list, tuple, dict, set, np.ndarray)):
            raise ValueError(f"y row {i} is a {type(v).__name__}: one label per text (multi-label is not supported)")
    kinds = {"str" if isinstance(v, str) else type(v).__name__ for v in got}
    if "str" in kinds and len(kinds) > 1:
        raise ValueError(
            f"y mixes label types ({', '.join(sorted(kinds))}): give every label as str, or every one as int"
        )
    arr = np.asarray(got)
    check_classification_targets(arr)  # floats with fractions: "Unknown label type: continuous"
    return arr


# --------------------------------------------------------------------------- the estimator
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
        val_fraction: float = 0.1,
        max_minutes: float | None = None,
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
        """Train the head (method "head") or set up zero-shot label scoring (method
        "labels", fitting "fit"/"em" calibration on `X, y`). `X`: texts (list, NumPy array,
        pandas Series, one-column DataFrame); `y`: each text's label, str or int."""
        from .classifier.classifier import Classifier
        from .classifier.task import Task
        from .jobs.train import train_head
        from .text.calibration import CalibrationSpec
        from .text.prompts import PromptFormat, check_examples, fill_labels
        from .weights.convert import versions

        _check_params(self)
        texts = _texts(X)
        if self.method == "model":  # the checkpoint's own head: nothing to train
            return _fit_own_head(self, texts, y)
        classes, names, gold = _classes(self, y, len(texts))
        system = DEFAULT_SYSTEM if self.system is None else (self.system or None)
        system = fill_labels(system, names)
        template = DEFAULT_TEMPLATE if self.template is None else self.template
        examples = check_examples(self.examples, names)  # as the CLI's --examples: pairs, known labels
        PromptFormat(system, template, examples)  # a template without {text} is refused now, not at predict
        engine = shared_engine(self.model, self.dtype)
        batching = _batching(self)
        show = self.verbose > 0
        head, tuned, spec = None, None, CalibrationSpec.of(self.calibration)
        if self.method == "finetune":
            assert gold is not None
            tuned = _finetune(self, engine, texts, gold, names, system, template, batching)
        elif self.method == "head":
            assert gold is not None
            log = (lambda m: notice(f"mlx-slm: {m}")) if self.verbose > 1 else None
            head = train_head(
                engine,
                texts,
                gold,
                classes=names,
                system=system,
                template=template,
                examples=examples,
                layers=self.layers if isinstance(self.layers, str) else [int(x) for x in self.layers],
                folds=self.folds,
                seed=self.random_state,
                poolings=("last", "mean") if self.pooling == "auto" else (self.pooling,),
                progress=show,
                log=log,
                extract=FEATURES.features,
                **batching,
            )
        elif spec.needs_data:
            assert gold is not None
            clf = Classifier(engine, names, system, template, examples=examples, **batching)
            spec = clf.fit_calibration(texts, gold, spec, progress=show)
        self.task_ = Task(
            model=str(self.model),
            labels=tuple(names),
            system=system,
            template=template,
            examples=examples,
            calibration=spec,
            weights_sha256=engine.weights_sha256,
            versions=versions(),
            section=HeadSettings(head)
            if head is not None
            else None
            if tuned is None
            else FineTunedSettings(in_memory(tuned)),
        )
        self.classes_ = classes
        self.__dict__.pop("_clf_cache", None)
        return self

    # ------------------------------------------------------------------ predict
    def _clf(self) -> Any:
        """The classifier the fitted task defines, on the shared engine (made once per engine)."""
        from .classifier.classifier import Classifier

        check_is_fitted(self, "task_")
        engine = shared_engine(self.model, self.dtype)
        clf = self.__dict__.get("_clf_cache")
        if clf is None or clf.engine is not engine:
            # from_task refuses a fitted head or prior on other weights, naming both sha256.
            if self.task_.weights_sha256 and self.task_.pins_weights:
                self.task_.check_weights(engine.weights_sha256, str(self.model))
            clf = Classifier.from_task(self.task_, engine=engine, **_batching(self))
            self._clf_cache = clf
        return clf

    def _log_proba(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """(probabilities, log-probabilities), (N, k) in `classes_` order."""
        from .text.labels import log_softmax

        check_is_fitted(self, "task_")
        texts = _texts(X)
        clf = self._clf()
        if clf.head is not None:  # the head's maths on its features (cached), as the head kind does it
            lp = clf.head.log_probs(self._head_input(clf, texts))
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
        if self.task_.head is None:
            raise ValueError("transform gives a learned head's features: fit with method='head'")
        texts = _texts(X)
        return self._head_input(self._clf(), texts).reshape(len(texts), -1).astype(np.float32)

    def _head_input(self, clf: Any, texts: list[str]) -> np.ndarray:
        """(N, parts, D): the head's parts of each text's hidden states, from the feature cache."""
        from .text.heads import head_input

        head = clf.head
        layers, poolings = sorted(set(head.layers)), tuple(sorted(set(head.poolings)))
        feats, errors, _ = FEATURES.features(clf, texts, layers, poolings, progress=self.verbose > 0)
        for i, e in enumerate(errors):
            if e is not None:
                raise ValueError(f"X row {i}: {e}")
        return head_input(feats, layers, head)

    # ------------------------------------------------------------------ tasks and pickles
    def to_task(self, path: str | Path) -> Path:
        """Save the fitted task file (`mlx-slm classify --task`, serve, Ray and `from_task` take it)."""
        check_is_fitted(self, "task_")
        tuned = (self.task_.finetune or {}).get("tuned")
        if tuned is None:
            self.task_.save(path)
            return Path(path)
        from .jobs.finetune import save_finetuned

        fused = bool(self.task_.finetune.get("fused"))
        save_finetuned(self.task_, tuned, path, fused)  # the adapters beside the task, as train --finetune writes them
        return Path(path)

    @classmethod
    def from_task(cls, task: Any, **params: Any) -> SLMClassifier:
        """A fitted estimator from a task file (or `Task`): model, labels, prompt, head or
        calibration as saved. `params`: run settings (batch_size, truncate, verbose, ...).
        `classes_` are the task's labels (strings)."""
        from .classifier.task import Task

        t = task if isinstance(task, Task) else Task.load(task)
        kind = t.kind
        method = METHOD_OF_KIND.get(kind.name)
        if method is None:
            raise ValueError(f"the task scores with {kind.name!r}; the estimator fits {', '.join(METHOD_OF_KIND)}")
        if method == "finetune":  # the adapters read once, held in memory (and in pickles), the settings they had
            t = replace(t, section=FineTunedSettings(in_memory(kind.tuned, kind.fused)))
            done = kind.tuned.settings
            params = {**{k: done[v] for k, v in TUNING.items() if v in done}, **params}
        own = method == "model"  # a sequence classifier's own head: its prompt is the text itself
        est = cls(
            model=t.model,
            method=method,
            labels=list(t.labels),
            system=None if own else t.system or "",
            template=None if own else t.template,
            examples=[tuple(e) for e in t.examples] or None,
            calibration=t.calibration.kind,
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
    if "task_" in state:
        t = state["task_"]
        if t.finetune is not None:
            state["finetuned_"] = {**t.finetune, "tuned": t.finetune["tuned"].to_bytes()}
            t = replace(t, section=None)
        state["task_"] = t.to_dict()
    return state


def _unpickled(state: dict[str, Any]) -> dict[str, Any]:
    """`_pickled` undone: the task and its adapters read back (each checked as a file of theirs is)."""
    from .classifier.task import Task
    from .weights.adapters import FineTuned

    if isinstance(state.get("task_"), dict):
        state["task_"] = Task.from_dict(state["task_"], "the pickled SLMClassifier's task")
    tuned = state.pop("finetuned_", None)
    if tuned is not None:
        tuned["tuned"] = FineTuned.from_bytes(tuned["tuned"], "the pickled SLMClassifier's adapters")
        state["task_"] = replace(state["task_"], section=FineTunedSettings(tuned))
    return state


def in_memory(tuned: Any, fused: bool = False) -> dict[str, Any]:
    """A task's 'finetune' section holding the adapters themselves (`kinds.finetune` takes
    either), until `to_task` saves them."""
    return {"tuned": tuned, "adapters": None, "sha256": None, "fused": fused, "objective": tuned.objective,
            "layers": list(tuned.lora.layers), "rank": tuned.lora.rank}  # fmt: skip


def _finetune(
    est: SLMClassifier, engine: Any, texts: list[str], gold: list[str], names: list[str], system: str | None,
    template: str, batching: dict[str, Any],
) -> Any:  # fmt: skip
    """method="finetune": the adapters and score head, trained as `train --finetune lora` trains them."""
    from .jobs.finetune import finetune_texts, progress_bar
    from .weights.finetune import FinetuneSettings

    settings = FinetuneSettings(**{v: getattr(est, k) for k, v in TUNING.items()})
    counts = {n: gold.count(n) for n in names}
    short = [f"{n!r} has {c}" for n, c in counts.items() if c < (2 if est.val_fraction > 0 else 1)]
    if short:
        raise ValueError(
            f"y: too few examples for fine-tuning: {'; '.join(short[:8])}. val_fraction={est.val_fraction:g} holds "
            "out at least one example of each label and trains on the rest, so each needs 2: add examples, or set "
            "val_fraction=0 (no early stopping)"
            if est.val_fraction > 0
            else f"y: too few examples for fine-tuning: {'; '.join(short[:8])}: a fine-tuned classifier learns each "
            "label from its examples; add examples of those labels, or leave them out of labels"
        )
    update, close = progress_bar(est.verbose == 0)
    try:
        return finetune_texts(engine, texts, gold, names, system, template, settings, where=lambda i: f"X row {i}",
                              progress=update, **batching)  # fmt: skip
    finally:
        close()


def _key(v: Any) -> Any:
    """A label as compared with `labels=`: numpy scalars as Python values."""
    return v.item() if isinstance(v, np.generic) else v


# Module functions rather than methods: they keep SLMClassifier to its scikit-learn API.
def _check_params(self: SLMClassifier) -> None:
    """The parameters as `fit` takes them (scikit-learn stores them as given)."""
    if self.method not in METHODS:
        raise ValueError(
            f"method={self.method!r}: give 'head' (a learned head), 'labels' (zero-shot), 'model' "
            "(a sequence classifier's own head) or 'finetune' (LoRA adapters and a score head)"
        )
    if self.calibration not in ("none", "batch", "fit", "em"):
        raise ValueError(f"calibration={self.calibration!r}: give 'none', 'batch', 'fit' or 'em'")
    if self.method == "model" and (self.system is not None or self.template is not None or self.examples):
        raise ValueError(
            "method='model' scores the text as the model's tokenizer encodes it (its own head, as "
            "Transformers feeds it): leave system, template and examples unset"
        )
    if self.method in ("head", "finetune") and self.calibration != "none":
        raise ValueError(
            f"calibration applies to method='labels'; a {'head' if self.method == 'head' else 'fine-tuned model'}'s "
            "probabilities are fitted on the labelled data already: leave calibration='none'"
        )
    if self.method == "finetune" and self.examples:
        raise ValueError("method='finetune' learns from X and y themselves: leave examples unset")
    if self.pooling not in ("auto", "last", "mean"):
        raise ValueError(f"pooling={self.pooling!r}: give 'auto', 'last' or 'mean'")
    for name in ("layers", "pooling"):  # the learned head's hidden states: no other method reads them
        if self.method != "head" and not (isinstance(getattr(self, name), str) and getattr(self, name) == "auto"):
            raise ValueError(
                f"{name}={getattr(self, name)!r} chooses a learned head's hidden states (method='head'); method="
                f"{self.method!r} reads none"
                + {"finetune": " (adapt_layers= sets how many top blocks it adapts)"}.get(self.method, "")
                + f": leave {name}='auto'"
            )
    if isinstance(self.model, (bytes, bytearray)) or not isinstance(self.model, (str, Path)):
        raise ValueError(f"model={self.model!r}: give a model name or path (a str)")
    if isinstance(self.labels, (str, bytes)):
        raise ValueError(f"labels={self.labels!r}: give a list of labels, e.g. ['spam', 'ham']")
    from .ground.ranges import check_all  # the CLI's ranges: batch_size=0 or max_batch_tokens=nan refused

    check_all(self.get_params(), "{name}")


def _batching(est: SLMClassifier) -> dict[str, Any]:
    """The batching settings a fit and a prediction run with (None: the CLI's defaults)."""
    from .classifier.pipeline import DEFAULT_BATCH_SIZE

    return {
        "batch_size": est.batch_size or DEFAULT_BATCH_SIZE,
        "max_batch_tokens": est.max_batch_tokens or "auto",
        "truncate": est.truncate,
    }


def _classes(est: SLMClassifier, y: Any, n: int) -> tuple[np.ndarray, list[str], list[str] | None]:
    """`fit`'s classes (`labels=` or the sorted values of `y`), their names as text, and each
    of the `n` texts' gold label as text (None: zero-shot labels without `y`)."""
    zero_shot_without_y = est.method == "labels" and y is None and est.labels is not None
    if zero_shot_without_y:
        if est.calibration in ("fit", "em"):
            raise ValueError(f"calibration={est.calibration!r} is fitted on labelled texts: give y")
        classes = np.asarray(list(est.labels))
        gold = None
    else:
        y_arr = _targets(y, n)
        classes = np.unique(y_arr) if est.labels is None else np.asarray(list(est.labels))
        if est.labels is not None:
            known = {_key(c) for c in classes}
            for i, v in enumerate(y_arr.tolist()):
                if _key(v) not in known:
                    raise ValueError(
                        f"y row {i}: label {v!r} is not in labels={list(classes.tolist())[:8]}: add it to "
                        "labels, or drop the row"
                    )
        if len(classes) < 2:
            raise ValueError(
                f"y has one class ({classes[0]!r}): a classifier needs examples of at least two classes"
                if len(classes)
                else "y has no class: give labelled texts"
            )
        gold = [str(v) for v in y_arr.tolist()]
    names = [str(c) for c in classes.tolist()]
    if len(set(names)) != len(names):
        raise ValueError(f"labels {names[:8]} repeat once written as text: give distinct labels")
    return classes, names, gold


def _fit_own_head(est: SLMClassifier, texts: list[str], y: Any) -> SLMClassifier:
    """`fit` with method "model": a sequence-classification checkpoint's own head, used as it
    is (its labels the classes; `y` checked against them and fitting the calibration)."""
    from .classifier.classifier import Classifier
    from .classifier.task import Task
    from .text.calibration import CalibrationSpec
    from .weights.convert import versions

    engine = shared_engine(est.model, est.dtype)
    head = getattr(engine.model, "seqcls", None)
    if head is None:
        raise ValueError(
            f"method='model' uses a sequence-classification checkpoint's own head, but {est.model} is a causal LM "
            "(no score head): use method='labels' (zero-shot) or 'head' (a learned head)"
        )
    spec = CalibrationSpec.of(est.calibration)
    clf = Classifier(engine, **_batching(est))
    if clf.spec.record_shape().form != "label":
        what = "a multi-label head (a sigmoid per label: several labels a text)" if head.multi_label else (
            "a one-output head (a score, not a class)")  # fmt: skip
        raise ValueError(
            f"method='model': {est.model} is {what}, and a scikit-learn classifier gives one class a text: use "
            "mlx_slm.Classifier for its predictions"
        )
    own = list(head.labels)
    names = own if est.labels is None else [str(_key(c)) for c in est.labels]
    if sorted(names) != sorted(own):
        raise ValueError(
            f"labels={names[:8]}: the model's own labels are {own[:8]} (its head's rows): give them (in any order), "
            "or leave labels unset"
        )
    gold = None
    if y is not None or spec.needs_data:
        got = _targets(y, len(texts))
        for i, v in enumerate(got.tolist()):
            if not isinstance(v, str) or v not in own:
                raise ValueError(
                    f"y row {i}: label {v!r} is not one of the model's own labels {own[:8]}: a sequence "
                    "classifier's labels are its id2label (fix y, or drop the row)"
                )
        gold = [str(v) for v in got.tolist()]
    if spec.needs_data:
        assert gold is not None
        spec = clf.fit_calibration(texts, gold, spec, progress=est.verbose > 0)
    est.task_ = Task(
        model=str(est.model),
        system=None,
        template="{text}",
        calibration=spec,
        weights_sha256=engine.weights_sha256,
        versions=versions(),
        **clf.spec.task_kwargs(clf.mode),
    )
    est.classes_ = np.asarray(names)
    est.__dict__.pop("_clf_cache", None)
    return est
