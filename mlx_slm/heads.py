"""Learned heads: a linear classifier on the model's own hidden state at the last prompt position.

One forward pass per text, stopped at the head's layer (no later layers, no vocabulary
projection): the label count no longer changes the cost. The head is a multinomial
logistic regression on the standardised hidden state of one layer (or of two layers
side by side), fitted with scikit-learn; inference is plain numpy
(`Head.log_probs`), so classifying needs no scikit-learn.

`fit` chooses the layer (and the regularisation strength) by stratified k-fold
cross-validation, standardising inside each fold, and keeps the figures of every
candidate: accuracy and macro-F1 by layer, to set against the per-item seconds up to
that layer (`Head.info["table"]`). The head is saved in the task file (`task.py`):
weights base64-encoded float64 with their sha256, layers, standardisation, labels and
the cross-validation table.
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

from .errors import MissingExtra, UserError

KIND = "logistic"
# "last": the hidden state at the last prompt position; "mean": the mean over the prompt's
# tokens after its shared head (the text and what follows it). Cross-validation chooses.
POOLINGS = ("last", "mean")
DEFAULT_FOLDS = 5
# Stage 1 compares the candidate layers at one strength; stage 2 tunes the strength on the
# chosen one. C is scikit-learn's inverse L2 strength on standardised features.
LAYER_C = 0.1
C_GRID = (0.01, 0.1, 1.0)
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
    numbering), pooled by `pooling` ("last" position or "mean", see `POOLINGS`),
    concatenated in that order: (len(layers) * D,)."""

    labels: tuple[str, ...]
    layers: tuple[int, ...]
    mean: np.ndarray  # (F,)
    scale: np.ndarray  # (F,)
    coef: np.ndarray  # (k, F)
    intercept: np.ndarray  # (k,)
    C: float = LAYER_C
    info: dict[str, Any] = field(default_factory=dict)
    pooling: str = "last"

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise HeadError(f"head pooling {self.pooling!r} is not one of {list(POOLINGS)}: train the head again")
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
        from .labels import log_softmax

        return log_softmax(self.logits(feats), axis=-1)

    # ------------------------------------------------------------------ saving
    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "pooling": self.pooling,
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
        if d.get("kind") != KIND or d.get("pooling", "last") not in POOLINGS:
            raise HeadError(
                f"{where} is a {d.get('kind')!r} head with {d.get('pooling')!r} pooling; this mlx-slm reads "
                f"{KIND!r} heads with {' or '.join(map(repr, POOLINGS))} pooling: upgrade mlx-slm, or train the head again"
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
        return cls(tuple(labels), tuple(layers), C=float(c), info=info, pooling=d.get("pooling", "last"), **arrays)


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
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise MissingExtra("training a head needs scikit-learn: pip install 'mlx-slm[train]'") from None
    return LogisticRegression


def fit_logistic(x: np.ndarray, y: np.ndarray, k: int, C: float, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(mean, scale, coef (k, F), intercept (k,)): standardise, then multinomial logistic
    regression (L2, strength 1/C). Every label 0..k-1 must occur in `y`."""
    LogisticRegression = _sklearn()
    from sklearn.exceptions import ConvergenceWarning

    mean, scale = standardiser(x)
    z = (np.asarray(x, dtype=np.float64) - mean) / scale
    lr = LogisticRegression(C=C, max_iter=MAX_ITER, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        lr.fit(z, y)
    if list(lr.classes_) != list(range(k)):
        raise HeadError(f"every label needs training examples; these have none: {sorted(set(range(k)) - set(y))}")
    coef, intercept = lr.coef_.astype(np.float64), lr.intercept_.astype(np.float64)
    if k == 2:  # scikit-learn keeps one row for two classes: sigmoid(w.x + b) == softmax([-z/2, z/2])
        coef = np.vstack([-coef[0] / 2, coef[0] / 2])
        intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
    return mean, scale, coef, intercept


def folds_of(y: np.ndarray, folds: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified k-fold (train, test) index pairs, shuffled with `seed`."""
    from sklearn.model_selection import StratifiedKFold

    skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return list(skf.split(np.zeros(len(y)), y))


def cross_validate(
    x: np.ndarray, y: np.ndarray, k: int, C: float, splits: Sequence[tuple[np.ndarray, np.ndarray]], seed: int = 0
) -> dict[str, Any]:
    """Out-of-fold accuracy, macro-F1 and log-loss of a head fitted on each fold's rest."""
    from .evaluate import confusion, macro_f1

    pred = np.zeros(len(y), dtype=np.int64)
    nll = np.zeros(len(y))
    for tr, te in splits:
        mean, scale, coef, intercept = fit_logistic(x[tr], y[tr], k, C, seed)
        h = Head(tuple(str(i) for i in range(k)), (1,), mean, scale, coef, intercept)
        lp = h.log_probs(x[te][:, None, :])
        pred[te] = lp.argmax(axis=1)
        nll[te] = -lp[np.arange(len(te)), y[te]]
    return {
        "accuracy": float(np.mean(pred == y)),
        "macro_f1": float(macro_f1(confusion(y, pred, k))),
        "log_loss": float(nll.mean()),
    }


@dataclass(frozen=True)
class Candidate:
    """One feature set cross-validation weighs: these layers side by side, pooled so."""

    layers: tuple[int, ...]
    pooling: str = "last"

    @property
    def name(self) -> str:
        return candidate_name(self.layers, self.pooling)


def candidate_name(layers: Sequence[int], pooling: str = "last") -> str:
    """ "24", "23+24"; a mean-pooled candidate says so: "24 mean"."""
    return "+".join(str(x) for x in layers) + ("" if pooling == "last" else f" {pooling}")


def fit(
    features: dict[str, np.ndarray],
    feature_layers: Sequence[int],
    y: np.ndarray,
    labels: Sequence[str],
    candidates: Sequence[Candidate],
    *,
    forced: tuple[int, ...] | None = None,
    folds: int = DEFAULT_FOLDS,
    Cs: Sequence[float] = C_GRID,
    layer_C: float = LAYER_C,
    seed: int = 0,
    seconds_per_item: dict[Candidate, float] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> Head:
    """Choose the candidate (layers and pooling) and C by stratified `folds`-fold
    cross-validation, then fit on all rows.

    features: {pooling: (N, len(feature_layers), D)} hidden states; y: gold label indices.
    Stage 1 scores every candidate at `layer_C`; the best accuracy (then macro-F1, then the
    earlier, cheaper layer, then last-position pooling) wins; `forced` restricts the choice
    to the candidates of those layers. Stage 2 scores `Cs` on the winner.
    `seconds_per_item` (per candidate) goes into the table.
    """
    t0 = time.perf_counter()
    labels = tuple(labels)
    k = len(labels)
    y = np.asarray(y, dtype=np.int64)
    counts = np.bincount(y, minlength=k)
    need = min_per_label(folds)
    if counts.min() < need:
        short = [f"{labels[i]!r} ({counts[i]})" for i in np.flatnonzero(counts < need)]
        raise HeadError(
            f"a head needs at least {need} examples per label (one per cross-validation fold); "
            f"too few for {', '.join(short[:10])}{' ...' if len(short) > 10 else ''}: add examples of those labels"
        )
    feature_layers = list(feature_layers)
    splits = folds_of(y, folds, seed)

    def x_of(cand: Candidate) -> np.ndarray:
        cols = [feature_layers.index(layer) for layer in cand.layers]
        return features[cand.pooling][:, cols, :].reshape(len(y), -1)

    table = []
    for cand in candidates:
        progress(f"cross-validating layer {cand.name} ({folds} folds)")
        row = {
            "layers": list(cand.layers),
            "pooling": cand.pooling,
            **cross_validate(x_of(cand), y, k, layer_C, splits, seed),
        }
        if seconds_per_item and cand in seconds_per_item:
            row["seconds_per_item"] = seconds_per_item[cand]
        table.append(row)
    pool = table
    if forced is not None:
        pool = [r for r in table if tuple(r["layers"]) == tuple(forced)]
        if not pool:
            raise HeadError(f"layer {candidate_name(forced)} is not among the candidates: add it to --layers")
    best = max(
        pool,
        key=lambda r: (
            round(r["accuracy"], 9),
            round(r["macro_f1"], 9),
            -max(r["layers"]),
            -len(r["layers"]),
            r["pooling"] == "last",
        ),
    )
    chosen = Candidate(tuple(best["layers"]), best["pooling"])
    x = x_of(chosen)
    reg = []
    for C in Cs:
        if C == layer_C:
            reg.append({"C": C, **{m: best[m] for m in ("accuracy", "macro_f1", "log_loss")}})
            continue
        progress(f"cross-validating C={C:g} on layer {chosen.name}")
        reg.append({"C": C, **cross_validate(x, y, k, C, splits, seed)})
    best_c = max(reg, key=lambda r: (round(r["accuracy"], 9), round(r["macro_f1"], 9), -r["log_loss"]))
    C = best_c["C"]
    progress(f"fitting the head on all {len(y)} examples (layer {chosen.name}, C={C:g})")
    mean, scale, coef, intercept = fit_logistic(x, y, k, C, seed)
    info = {
        "n": int(len(y)),
        "per_label": {lab: int(c) for lab, c in zip(labels, counts)},
        "folds": folds,
        "seed": seed,
        "forced": forced is not None,
        "table": table,
        "regularisation": reg,
        "chosen": {
            "layers": list(chosen.layers),
            "pooling": chosen.pooling,
            "C": C,
            "accuracy": best_c["accuracy"],
            "macro_f1": best_c["macro_f1"],
        },
        "fit_seconds": round(time.perf_counter() - t0, 3),
    }
    return Head(labels, chosen.layers, mean, scale, coef, intercept, C=C, info=info, pooling=chosen.pooling)


def format_table(head: Head) -> str:
    """The per-candidate cross-validation table (accuracy against speed), and the choice."""
    i = head.info
    chosen = (tuple(i["chosen"]["layers"]), i["chosen"].get("pooling", "last"))
    lines = [f"{'layer':>9}  {'CV accuracy':>11}  {'CV macro-F1':>11}  {'s/item to here':>14}"]
    for r in i["table"]:
        s = r.get("seconds_per_item")
        pooling = r.get("pooling", "last")
        mark = "  <- chosen" if (tuple(r["layers"]), pooling) == chosen else ""
        lines.append(
            f"{candidate_name(r['layers'], pooling):>9}  {r['accuracy']:>11.3f}  {r['macro_f1']:>11.3f}  "
            f"{'' if s is None else f'{s:.4f}':>14}{mark}"
        )
    reg = ", ".join(f"C={r['C']:g}: {r['accuracy']:.3f}" for r in i["regularisation"])
    lines.append(
        f"chosen: layer {candidate_name(*chosen)}{' (--layer)' if i.get('forced') else ''}, C={head.C:g} "
        f"({reg}); {i['folds']}-fold CV accuracy {i['chosen']['accuracy']:.3f}, macro-F1 "
        f"{i['chosen']['macro_f1']:.3f} on {i['n']} examples"
    )
    if any(r.get("pooling", "last") != "last" for r in i["table"]):
        lines.append("(a layer alone: the last prompt position; 'mean': the mean over the text's part of the prompt)")
    return "\n".join(lines)
