"""Learned heads: a linear classifier on the model's own hidden states.

One forward pass per text, stopped at the head's deepest layer (no later layers, no
vocabulary projection): the label count no longer changes the cost. The head reads one
or more parts, each a layer's hidden state pooled at the last prompt position or as the
mean over the text's part of the prompt, standardises them, and applies a linear map and
a softmax (`Head.log_probs`, plain numpy: classifying needs no scikit-learn). It is fitted
with scikit-learn as a shrinkage LDA (one covariance shared by all labels, Ledoit-Wolf
shrinkage: strong with a few examples per label) or a multinomial logistic regression.

`fit` chooses the parts and then the estimator by stratified k-fold cross-validation,
standardising inside each fold, and keeps the figures of every candidate: accuracy and
macro-F1, to set against the per-item seconds up to that layer (`Head.info["table"]`).
The head is saved in the task file (`task.py`): weights base64-encoded float64 with their
sha256, parts, standardisation, labels and the cross-validation table.
"""

from __future__ import annotations

import base64
import hashlib
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ground.errors import MissingExtra, UserError
from .labels import log_softmax
from .metrics import confusion, macro_f1

ESTIMATORS = ("lda", "logistic")  # the estimators; both give z = x @ coef.T + intercept, probs = softmax(z)
# "last": the hidden state at the last prompt position; "mean": the mean over the prompt's
# tokens after its shared head (the text and what follows it). Cross-validation chooses.
POOLINGS = ("last", "mean")
DEFAULT_FOLDS = 5
# Stage 1 compares the candidates with the shrinkage LDA (no strength to tune); stage 2 sets
# it against logistic regression at each C (scikit-learn's inverse L2 strength on
# standardised features) on the chosen candidate.
LAYER_C = 0.1
# One strength by default: on 77 labels a logistic fit costs seconds to tens of seconds per fold
# (a grid multiplies that), and the strengths tried on BANKING77 moved accuracy by ~1 point.
C_GRID = (LAYER_C,)
MAX_ITER = 500
MIN_SCALE = 1e-6  # a feature whose spread in the training data is under this is left unscaled


class HeadError(UserError, ValueError):
    """A head that cannot be trained or read as given; the message names the fix."""


def min_per_label(folds: int = DEFAULT_FOLDS) -> int:
    """Examples each label needs: one in every cross-validation fold."""
    return max(2, folds)


# --------------------------------------------------------------------------- the head
@dataclass(frozen=True, eq=False)
class Head:
    """A fitted head: z = ((x - mean) / scale) @ coef.T + intercept, probs = softmax(z).

    x is the hidden state after each of `layers` (Transformers' `hidden_states[l]`
    numbering), each pooled as the matching entry of `poolings` ("last" position or
    "mean", see `POOLINGS`; default all "last"), concatenated in that order: (len(layers) * D,)."""

    labels: tuple[str, ...]
    layers: tuple[int, ...]
    mean: np.ndarray  # (F,)
    scale: np.ndarray  # (F,)
    coef: np.ndarray  # (k, F)
    intercept: np.ndarray  # (k,)
    C: float = LAYER_C
    info: dict[str, Any] = field(default_factory=dict)
    poolings: tuple[str, ...] = ()
    estimator: str = "logistic"

    def __post_init__(self) -> None:
        object.__setattr__(self, "poolings", tuple(self.poolings) or ("last",) * len(self.layers))
        if len(self.poolings) != len(self.layers) or set(self.poolings) - set(POOLINGS):
            raise HeadError(
                f"head poolings {list(self.poolings)} must name one of {list(POOLINGS)} for each of the layers "
                f"{list(self.layers)}: train the head again"
            )
        if self.estimator not in ESTIMATORS:
            raise HeadError(f"head estimator {self.estimator!r} is not one of {list(ESTIMATORS)}: train the head again")
        k, f = len(self.labels), self.mean.shape[0]
        if self.coef.shape != (k, f) or self.scale.shape != (f,) or self.intercept.shape != (k,):
            raise HeadError(
                f"head shapes do not agree: {k} labels, mean {self.mean.shape}, scale {self.scale.shape}, "
                f"coef {self.coef.shape}, intercept {self.intercept.shape}: train the head again"
            )
        if not self.layers or f % len(self.layers):
            raise HeadError(f"head of {f} features cannot be split over layers {list(self.layers)}: train it again")

    @property
    def dim(self) -> int:
        """Hidden size of one layer."""
        return self.mean.shape[0] // len(self.layers)

    @property
    def parts(self) -> tuple[tuple[int, str], ...]:
        """(layer, pooling) of each feature block, in order."""
        return tuple(zip(self.layers, self.poolings))

    @property
    def name(self) -> str:
        return candidate_name(self.layers, self.poolings)

    @property
    def sha256(self) -> str:
        return _weights_sha256(self.mean, self.scale, self.coef, self.intercept)

    def vector(self, feats: np.ndarray) -> np.ndarray:
        """(B, len(layers), D) features as `Engine.features` gives them -> (B, F) float64."""
        feats = np.asarray(feats)
        if feats.ndim != 3 or feats.shape[1:] != (len(self.layers), self.dim):
            raise HeadError(
                f"the head takes features (batch, {len(self.layers)}, {self.dim}), got {feats.shape}: "
                "is this the model the head was trained on?"
            )
        return feats.reshape(feats.shape[0], -1).astype(np.float64)

    def logits(self, feats: np.ndarray) -> np.ndarray:
        x = (self.vector(feats) - self.mean) / self.scale
        return x @ self.coef.T + self.intercept

    def log_probs(self, feats: np.ndarray) -> np.ndarray:
        """(B, k) log-probabilities over `labels` (numpy only)."""

        return log_softmax(self.logits(feats), axis=-1)

    # ------------------------------------------------------------------ saving
    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.estimator,
            # one name when every part pools alike (the only form older heads have)
            "pooling": self.poolings[0] if len(set(self.poolings)) == 1 else list(self.poolings),
            "labels": list(self.labels),
            "layers": list(self.layers),
            "features": int(self.mean.shape[0]),
            "C": float(self.C),
            "dtype": "float64",
            "mean": _b64(self.mean),
            "scale": _b64(self.scale),
            "coef": _b64(self.coef),
            "intercept": _b64(self.intercept),
            "sha256": self.sha256,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "head") -> Head:
        """A head from its JSON object, checked: a `HeadError` names the field and the fix."""

        def bad(key: str, want: str) -> HeadError:
            return HeadError(f"{where}: field {key!r} must be {want}: train the head again (mlx-slm train)")

        if not isinstance(d, dict):
            raise HeadError(f"{where} must be an object (a trained head): train the head again (mlx-slm train)")
        pooling = d.get("pooling", "last")
        names = [pooling] if isinstance(pooling, str) else pooling
        # A missing or mistyped field is damage (train again); only a well-formed estimator (the
        # file's "kind") or pooling this version does not know is a newer head (upgrade).
        if not isinstance(d.get("kind"), str):
            raise bad("kind", f"one of {', '.join(map(repr, ESTIMATORS))}")
        if not isinstance(names, list) or not names or not all(isinstance(x, str) for x in names):
            raise bad("pooling", f"one of {', '.join(map(repr, POOLINGS))}, or a list of them")
        if d["kind"] not in ESTIMATORS or not all(x in POOLINGS for x in names):
            raise HeadError(
                f"{where} is a {d.get('kind')!r} head with {pooling!r} pooling; this mlx-slm reads "
                f"{' or '.join(map(repr, ESTIMATORS))} heads with {' or '.join(map(repr, POOLINGS))} pooling: upgrade "
                "mlx-slm, or train the head again"
            )
        labels = d.get("labels")
        if not isinstance(labels, list) or len(labels) < 2 or not all(isinstance(x, str) and x for x in labels):
            raise bad("labels", "a list of at least two non-empty strings")
        layers = d.get("layers")
        if (
            not isinstance(layers, list)
            or not layers
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in layers)
        ):
            raise bad("layers", "a non-empty list of layer numbers (1 or more)")
        nf = d.get("features")
        if isinstance(nf, bool) or not isinstance(nf, int) or nf < 1 or nf % len(layers):
            raise bad("features", f"a positive multiple of {len(layers)} (the layers' hidden size times their count)")
        c = d.get("C", LAYER_C)
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0:
            raise bad("C", "a positive number")
        if d.get("dtype", "float64") != "float64":
            raise bad("dtype", "'float64'")
        k = len(labels)
        arrays = {}
        for key, shape in (("mean", (nf,)), ("scale", (nf,)), ("coef", (k, nf)), ("intercept", (k,))):
            arrays[key] = _unb64(d.get(key), shape, f"{where}: field {key!r}")
        if not np.all(arrays["scale"] > 0):
            raise bad("scale", "positive everywhere")
        sha = _weights_sha256(*arrays.values())
        if d.get("sha256") != sha:
            raise HeadError(
                f"{where}: the weights do not match their sha256 (saved {str(d.get('sha256'))[:12]}..., "
                f"read {sha[:12]}...): the file was edited or damaged; train the head again"
            )
        info = d.get("info", {})
        if not isinstance(info, dict):
            raise bad("info", "an object")
        if not isinstance(pooling, str) and len(names) != len(layers):
            raise bad("pooling", f"one name, or a list of {len(layers)} names (one per layer)")
        poolings = tuple(names * len(layers) if isinstance(pooling, str) else names)
        return cls(
            tuple(labels), tuple(layers), C=float(c), info=info, poolings=poolings, estimator=d["kind"], **arrays
        )


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f8").tobytes()).decode("ascii")


def _unb64(s: Any, shape: tuple[int, ...], where: str) -> np.ndarray:
    n = int(np.prod(shape))
    if not isinstance(s, str):
        raise HeadError(f"{where} must be base64 text of {n} float64 values: train the head again")
    try:
        raw = base64.b64decode(s.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise HeadError(f"{where} is not valid base64: the file was damaged; train the head again") from None
    if len(raw) != 8 * n:
        raise HeadError(f"{where} holds {len(raw) // 8} values, not {n}: the file was damaged; train the head again")
    a = np.frombuffer(raw, dtype="<f8").astype(np.float64).reshape(shape)
    if not np.all(np.isfinite(a)):
        raise HeadError(f"{where} holds NaN or infinite values: train the head again")
    return a


def _weights_sha256(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype="<f8").tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- fitting
def standardiser(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of each feature over the rows of `x` (population std, as scikit-learn's
    StandardScaler; a feature with no spread keeps scale 1)."""
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < MIN_SCALE] = 1.0
    return mean, scale


def _sklearn() -> Any:
    try:
        import sklearn  # noqa: F401  # lazy: the train extra's, checked here to name the pip command
    except ImportError:
        raise MissingExtra("training a head needs scikit-learn: pip install 'mlx-slm[train]'") from None


def _two_rows(coef: np.ndarray, intercept: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn keeps one row for two classes: sigmoid(w.x + b) == softmax([-z/2, z/2])."""
    if k == 2 and coef.shape[0] == 1:
        return np.vstack([-coef[0] / 2, coef[0] / 2]), np.array([-intercept[0] / 2, intercept[0] / 2])
    return coef, intercept


def fit_linear(
    x: np.ndarray, y: np.ndarray, k: int, estimator: str = "logistic", C: float = LAYER_C, seed: int = 0
) -> tuple[np.ndarray, ...]:
    """(mean, scale, coef (k, F), intercept (k,)): standardise, then fit `estimator`: "lda"
    (`_lda`; `C` unused) or "logistic" (multinomial,
    L2, strength 1/C). Every label 0..k-1 must occur in `y`."""
    _sklearn()
    from sklearn.exceptions import ConvergenceWarning  # lazy: optional, slow
    from sklearn.linear_model import LogisticRegression  # lazy: optional, slow

    mean, scale = standardiser(x)
    z = (np.asarray(x, dtype=np.float64) - mean) / scale
    if estimator == "lda":
        return (mean, scale, *_lda(z, np.asarray(y), k))
    if estimator == "logistic":
        est = LogisticRegression(C=C, max_iter=MAX_ITER, random_state=seed)
    else:
        raise HeadError(f"head estimator {estimator!r} is not one of {list(ESTIMATORS)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(z, y)
    if list(est.classes_) != list(range(k)):
        raise HeadError(f"every label needs training examples; these have none: {sorted(set(range(k)) - set(y))}")
    coef, intercept = _two_rows(est.coef_.astype(np.float64), np.atleast_1d(est.intercept_).astype(np.float64), k)
    return mean, scale, coef, intercept


def _lda(z: np.ndarray, y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Shrinkage LDA on standardised z, as scikit-learn's (solver "lsqr", shrinkage "auto")
    computes it, in one pass: the shared covariance is the prior-weighted mean of each
    label's covariance shrunk by its own Ledoit-Wolf amount a_c toward mu_c I in standardised
    units, sum_c p_c ((1 - a_c) S_c + a_c mu_c D_c^2), D_c the label's standard deviations (1 where
    one is 0) and mu_c the share of features that vary in it; coef = means @ inv(cov), intercept =
    -means.coef/2 + log prior. (With ~10 examples a label, each a_c is large: the strong
    shrinkage that few examples need. scikit-learn builds every label's F x F matrix; the
    weighted sum below builds one.)"""
    from sklearn.covariance import ledoit_wolf_shrinkage  # lazy: optional, slow

    counts = np.bincount(y, minlength=k)
    if counts.min() == 0:
        raise HeadError(f"every label needs training examples; these have none: {np.flatnonzero(counts == 0).tolist()}")
    prior = counts / counts.sum()
    means = np.zeros((k, z.shape[1]))
    np.add.at(means, y, z)
    means /= counts[:, None]
    zc = z - means[y]  # each row centred on its label's mean
    w = np.zeros(len(y))
    diag = np.zeros(z.shape[1])
    for c in range(k):
        rows = zc[y == c]
        var = (rows**2).mean(axis=0)  # diag(S_c)
        sd2 = np.where(var > 0, var, 1.0)  # scikit-learn's StandardScaler: a scale of 1 where var is 0
        a = float(ledoit_wolf_shrinkage(rows / np.sqrt(sd2), assume_centered=True)) if len(rows) > 1 else 1.0
        w[y == c] = prior[c] * (1 - a) / len(rows)
        # Ledoit-Wolf's target is mu I in standardised units, mu the mean standardised variance: 1 for
        # a feature that varies in the label, 0 for one that does not (then mu < 1, and the target
        # still gives that feature a * mu, in its unit scale)
        diag += prior[c] * a * float(np.mean(var > 0)) * sd2
    cov = zc.T @ (zc * w[:, None])
    cov[np.diag_indices_from(cov)] += diag
    # cov is positive definite only where every feature varies within some label: with one example a
    # label (a fold of --folds on little data) or a feature constant within every label it is
    # singular, and the least-squares solve scikit-learn's "lsqr" solver itself uses answers (the
    # least-norm coef: such a feature weighs nothing), where `solve` would raise.
    try:
        coef = np.linalg.solve(cov, means.T).T  # (k, F)
    except np.linalg.LinAlgError:
        coef = None
    if coef is None or not np.isfinite(coef).all():
        from scipy import linalg  # lazy: scikit-learn's own dependency, loaded with it

        coef = linalg.lstsq(cov, means.T)[0].T
    intercept = -0.5 * np.einsum("kf,kf->k", means, coef) + np.log(prior)
    return coef, intercept


def folds_of(y: np.ndarray, folds: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified k-fold (train, test) index pairs, shuffled with `seed`."""
    from sklearn.model_selection import StratifiedKFold  # lazy: optional, slow

    skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return list(skf.split(np.zeros(len(y)), y))


def oof_logits(
    x: np.ndarray,
    y: np.ndarray,
    k: int,
    C: float,
    splits: Sequence[tuple[np.ndarray, np.ndarray]],
    seed: int = 0,
    estimator: str = "logistic",
) -> np.ndarray:
    """(N, k) out-of-fold logits: each row scored by a head fitted on the other folds."""
    z = np.zeros((len(y), k))
    for tr, te in splits:
        mean, scale, coef, intercept = fit_linear(x[tr], y[tr], k, estimator, C, seed)
        z[te] = ((x[te] - mean) / scale) @ coef.T + intercept
    return z


def cross_validate(
    x: np.ndarray,
    y: np.ndarray,
    k: int,
    C: float,
    splits: Sequence[tuple[np.ndarray, np.ndarray]],
    seed: int = 0,
    estimator: str = "logistic",
) -> dict[str, Any]:
    """Out-of-fold accuracy, macro-F1 and log-loss of a head fitted on each fold's rest."""
    return _scores(oof_logits(x, y, k, C, splits, seed, estimator), y, k)


def _scores(z: np.ndarray, y: np.ndarray, k: int) -> dict[str, Any]:
    lp = log_softmax(z, axis=-1)
    pred = lp.argmax(axis=1)
    return {
        "accuracy": float(np.mean(pred == y)),
        "macro_f1": float(macro_f1(confusion(y, pred, k))),
        "log_loss": float(-lp[np.arange(len(y)), y].mean()),
    }


def temperature(z: np.ndarray, y: np.ndarray) -> float:
    """The T > 0 that minimises the log-loss of softmax(z / T) (golden-section search on
    log T): a shrinkage LDA's logits, fitted where features outnumber examples, come out
    far too sharp; out-of-fold logits show by how much."""

    def nll(log_t: float) -> float:
        return float(-log_softmax(z / np.exp(log_t), axis=-1)[np.arange(len(y)), y].mean())

    lo, hi = np.log(0.5), np.log(1e4)  # soften freely; sharpen at most 2x (out-of-fold all right: no evidence)
    g = (np.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(60):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = nll(b)
    return float(np.exp((lo + hi) / 2))


@dataclass(frozen=True)
class Candidate:
    """One feature set cross-validation weighs: these (layer, pooling) parts side by side."""

    parts: tuple[tuple[int, str], ...]

    @classmethod
    def of(cls, layers: Sequence[int], pooling: str = "last") -> Candidate:
        return cls(tuple((int(x), pooling) for x in layers))

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(x for x, _ in self.parts)

    @property
    def poolings(self) -> tuple[str, ...]:
        return tuple(p for _, p in self.parts)

    @property
    def name(self) -> str:
        return candidate_name(self.layers, self.poolings)

    def __add__(self, other: Candidate) -> Candidate:
        return Candidate(self.parts + tuple(p for p in other.parts if p not in self.parts))


def candidate_name(layers: Sequence[int], poolings: Sequence[str] | str | None = None) -> str:
    """ "24", "23+24"; a mean-pooled part says so: "mean 6", "24+mean 6"."""
    if poolings is None or isinstance(poolings, str):
        poolings = [poolings or "last"] * len(layers)
    out, prev = [], "last"
    for x, p in zip(layers, poolings):  # a pooling is named where it changes: "mean 2+3", "24+mean 6"
        out.append(str(x) if p == prev else f"{p} {x}")
        prev = p
    return "+".join(out)


def head_input(features: dict[str, np.ndarray], feature_layers: Sequence[int], cand: Candidate | Head) -> np.ndarray:
    """(N, len(parts), D): the parts a candidate or head reads, from `features`
    ({pooling: (N, len(feature_layers), D)}, as `Classifier.features` gives them)."""
    cols = list(feature_layers)
    return np.stack([features[p][:, cols.index(x)] for x, p in cand.parts], axis=1)


def _best(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Best accuracy, then macro-F1, then the shallower, smaller, last-position candidate."""
    return max(
        rows,
        key=lambda r: (
            round(r["accuracy"], 9),
            round(r["macro_f1"], 9),
            -max(r["layers"]),
            -len(r["layers"]),
            all(p == "last" for p in r["poolings"]),
        ),
    )


@dataclass(frozen=True)
class Search:
    """How `fit` chooses a head, resolved once by the caller and read by both stages.

    `forced` restricts the choice to the candidates reading exactly those layers; `folds`
    and `seed` make the stratified splits; stage 1 scores every candidate with the first of
    `estimators`, with `combine` the best last-position candidate joined with the best
    mean-pooled one too; stage 2 scores every estimator (logistic regression at each of `Cs`)."""

    forced: tuple[int, ...] | None = None
    folds: int = DEFAULT_FOLDS
    Cs: Sequence[float] = C_GRID
    estimators: Sequence[str] = ESTIMATORS
    combine: bool = True
    seed: int = 0


def fit(
    features: dict[str, np.ndarray],
    feature_layers: Sequence[int],
    y: np.ndarray,
    labels: Sequence[str],
    candidates: Sequence[Candidate],
    search: Search = Search(),
    *,
    seconds_per_item: Callable[[Candidate], float] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> Head:
    """Choose the parts and the estimator by stratified cross-validation (`search` says how),
    then fit on all rows.

    features: {pooling: (N, len(feature_layers), D)} hidden states; y: gold label indices.
    Stage 1 scores every candidate (`_candidate_table`); the best wins (`_best`). Stage 2
    scores every estimator on the winner (`_estimator_table`). `seconds_per_item` goes into
    the table.
    """
    t0 = time.perf_counter()
    labels = tuple(labels)
    y = np.asarray(y, dtype=np.int64)
    counts = _label_counts(y, labels, search.folds)
    data = _Folds(
        features, tuple(feature_layers), y, len(labels), folds_of(y, search.folds, search.seed), search, progress
    )
    forced = search.forced
    table = _candidate_table(data, candidates, seconds_per_item)
    pool = table if forced is None else [r for r in table if tuple(r["layers"]) == tuple(forced)]
    if not pool:
        raise HeadError(f"layer {candidate_name(forced or ())} is not among the candidates: add it to --layers")
    best = _best(pool)
    chosen = Candidate(tuple(zip(best["layers"], best["poolings"])))
    x = data.x_of(chosen)
    stage2 = _estimator_table(data, x, chosen)
    won = stage2.rows[stage2.won]
    estimator, C = won["kind"], won["C"]
    # One temperature for the head's logits, fitted on its out-of-fold logits: accuracy is
    # untouched, and --min-confidence reads probabilities that mean what they say.
    T = temperature(stage2.logits[stage2.won], y)
    progress(f"fitting the head on all {len(y)} examples ({chosen.name}, {_estimator(estimator, C)}, T={T:.3g})")
    mean, scale, coef, intercept = fit_linear(x, y, len(labels), estimator, C, search.seed)
    coef, intercept = coef / T, intercept / T
    info = _fit_info(data, labels, counts, table, stage2, chosen, T, t0)
    return Head(
        labels,
        chosen.layers,
        mean,
        scale,
        coef,
        intercept,
        C=C,
        info=info,
        poolings=chosen.poolings,
        estimator=estimator,
    )


@dataclass(frozen=True)
class _Folds:
    """What both stages of one `fit` read: the features, the gold labels, the splits, the
    search settings and the progress printer, built once per fit."""

    features: dict[str, np.ndarray]
    feature_layers: tuple[int, ...]
    y: np.ndarray
    k: int
    splits: list[tuple[np.ndarray, np.ndarray]]
    search: Search
    progress: Callable[[str], None]

    def x_of(self, cand: Candidate) -> np.ndarray:
        """(N, F): the parts `cand` reads, side by side."""
        return head_input(self.features, self.feature_layers, cand).reshape(len(self.y), -1)


@dataclass(frozen=True)
class _Stage2:
    """`_estimator_table`'s result: a row per estimator, their out-of-fold logits, the winner's index."""

    rows: list[dict[str, Any]]
    logits: list[np.ndarray]
    won: int


def _label_counts(y: np.ndarray, labels: tuple[str, ...], folds: int) -> np.ndarray:
    """Examples per label; each needs `min_per_label(folds)` (one per fold), else a `HeadError`."""
    counts = np.bincount(y, minlength=len(labels))
    need = min_per_label(folds)
    if counts.min() < need:
        short = [f"{labels[i]!r} ({counts[i]})" for i in np.flatnonzero(counts < need)]
        raise HeadError(
            f"a head needs at least {need} examples per label (one per cross-validation fold); "
            f"too few for {', '.join(short[:10])}{' ...' if len(short) > 10 else ''}: add examples of those labels"
        )
    return counts


def _candidate_table(
    d: _Folds,
    candidates: Sequence[Candidate],
    seconds_per_item: Callable[[Candidate], float] | None,
) -> list[dict[str, Any]]:
    """Stage 1 of `fit`: one row per candidate, scored with the first estimator; with
    `combine`, the best last-position and best mean-pooled candidates side by side too."""
    table: list[dict[str, Any]] = []
    s = d.search
    first = s.estimators[0]

    def score(cand: Candidate) -> None:
        d.progress(f"cross-validating {cand.name} ({s.folds} folds)")
        row = {
            "layers": list(cand.layers),
            "poolings": list(cand.poolings),
            **cross_validate(d.x_of(cand), d.y, d.k, LAYER_C, d.splits, s.seed, first),
        }
        if seconds_per_item is not None:
            row["seconds_per_item"] = seconds_per_item(cand)
        table.append(row)

    for cand in candidates:
        score(cand)
    # one layer each: a pair on each side would double the features (and the cost) again
    pure = {p: [r for r in table if r["poolings"] == [p]] for p in POOLINGS}
    if s.combine and all(pure.values()):  # greedy: the best of each pooling, side by side
        both = Candidate.of(_best(pure["last"])["layers"]) + Candidate.of(_best(pure["mean"])["layers"], "mean")
        if s.forced is None or both.layers == tuple(s.forced):
            score(both)
    return table


def _estimator_table(d: _Folds, x: np.ndarray, chosen: Candidate) -> _Stage2:
    """Stage 2 of `fit`: every estimator (logistic at each of `Cs`) cross-validated on the
    chosen parts `x`."""
    reg, logits = [], []
    s = d.search
    for estimator in s.estimators:
        for C in s.Cs if estimator == "logistic" else (LAYER_C,):
            d.progress(f"cross-validating {_estimator(estimator, C)} on {chosen.name}")
            logits.append(oof_logits(x, d.y, d.k, C, d.splits, s.seed, estimator))
            reg.append({"kind": estimator, "C": C, **_scores(logits[-1], d.y, d.k)})
    i_won = max(
        range(len(reg)), key=lambda i: (round(reg[i]["accuracy"], 9), round(reg[i]["macro_f1"], 9), -reg[i]["log_loss"])
    )
    return _Stage2(reg, logits, i_won)


def _fit_info(
    d: _Folds,
    labels: tuple[str, ...],
    counts: np.ndarray,
    table: list[dict[str, Any]],
    stage2: _Stage2,
    chosen: Candidate,
    T: float,
    t0: float,
) -> dict[str, Any]:
    """The head's `info`: the data, both stages' tables and the choice (`t0`: when fit began).
    The saved key names ("kind" for the estimator) are the task file's and stay."""
    won = stage2.rows[stage2.won]
    return {
        "n": int(len(d.y)),
        "per_label": {lab: int(c) for lab, c in zip(labels, counts)},
        "folds": d.search.folds,
        "seed": d.search.seed,
        "forced": d.search.forced is not None,
        "table": table,
        "table_estimator": d.search.estimators[0],
        "regularisation": stage2.rows,
        "chosen": {
            "layers": list(chosen.layers),
            "poolings": list(chosen.poolings),
            "kind": won["kind"],
            "C": won["C"],
            "temperature": T,
            "accuracy": won["accuracy"],
            "macro_f1": won["macro_f1"],
            "log_loss": won["log_loss"],
            "log_loss_at_temperature": _scores(stage2.logits[stage2.won] / T, d.y, k=len(labels))["log_loss"],
        },
        "fit_seconds": round(time.perf_counter() - t0, 3),
    }


def _estimator(estimator: str, C: float) -> str:
    return f"{estimator} C={C:g}" if estimator == "logistic" else estimator


def format_table(head: Head) -> str:
    """The per-candidate cross-validation table (accuracy against speed), and the choice."""
    i = head.info
    chosen = head.name
    w = max(9, *(len(candidate_name(r["layers"], r.get("poolings"))) for r in i["table"]))
    lines = [f"{'layer':>{w}}  {'CV accuracy':>11}  {'CV macro-F1':>11}  {'s/item to here':>14}"]
    for r in i["table"]:
        s = r.get("seconds_per_item")
        name = candidate_name(r["layers"], r.get("poolings"))
        mark = "  <- chosen" if name == chosen else ""
        lines.append(
            f"{name:>{w}}  {r['accuracy']:>11.3f}  {r['macro_f1']:>11.3f}  {'' if s is None else f'{s:.4f}':>14}{mark}"
        )
    reg = ", ".join(
        f"{_estimator(r.get('kind', 'logistic'), r['C'])}: {r['accuracy']:.3f}" for r in i["regularisation"]
    )
    est = f"{_estimator(head.estimator, head.C)}, T={i['chosen'].get('temperature', 1.0):.3g}"
    lines.append(
        f"chosen: layer {chosen}{' (--layer)' if i.get('forced') else ''}, {est} ({reg}); {i['folds']}-fold CV accuracy "
        f"{i['chosen']['accuracy']:.3f}, macro-F1 {i['chosen']['macro_f1']:.3f} on {i['n']} examples"
    )
    lines.append(
        "(a number: the layer's state at the last prompt position; 'mean N': layer N's mean over the text's part "
        "of the prompt; 'a+b': side by side)"
    )
    return "\n".join(lines)
