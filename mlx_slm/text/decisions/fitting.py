"""A decision question's method learned from the user's own rows, and every way of answering it
scored side by side (what `eval --decisions` reports). Pure numpy on raw answers: `probs` (n, k),
one row per state, in the question's option order, and `gold` (n,), each state's gold option.

* `corrected`: the raw answers divided by a batch prior (the mean raw answer over the first
  `warmup` states, as `decide --calibrate batch` finds it) or a contextual one (the answer to
  content-free states), scored beside the raw ones;
* `fit_question`: a bias per option and a temperature (`calibration.fit_labelled`: the gold's
  log-loss, L2-regularised, stratified k-fold figures), fitted on each way of asking the question
  (prompt style x option orders) the caller ran; the way chosen is the one with the best
  cross-validated accuracy (then log-loss; then the plainer way); the fit is kept only where that
  choice, itself cross-validated (`choice_accuracy`, nested: each fold answered by the way whose
  fit was best cross-validated on the other folds alone, as fitted on them), beats the raw answers:
  each state is answered by a way chosen and a fit learned without its label, so the figure a fit
  is kept on is not merely the best of several noisy ones;
* `prior_of`: the batch prior of a sample of the user's states (no gold): `eval --fit-prior`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...ground.errors import UserError
from ..calibration import INPUT_FLOOR, CalibrationError, Calibrator, fit_batch, fit_labelled, stratified_folds
from ..labels import LabelError, validate
from ..metrics import confusion, ece, macro_f1
from .metrics import brier, log_loss

Way = tuple[str, int]  # how a question is asked: (prompt style, option orders)
# ties go to the plainer way
PLAIN_FIRST = (("letters", 1), ("names", 1), ("letters", 2), ("names", 2), ("prompt", 1), ("prompt", 2))
ORDER = {w: i for i, w in enumerate(PLAIN_FIRST)}


class FitError(UserError, ValueError):
    """A question that cannot be fitted on the rows given; the message names the question and the fix."""


def log_of(probs: Any) -> np.ndarray:
    """Log-probabilities, a 0 floored as every calibrator reads it (a calibrator's input)."""
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(np.asarray(probs, dtype=np.float64)), INPUT_FLOOR)


def apply(cal: Calibrator | None, probs: np.ndarray) -> np.ndarray:
    """`probs` with `cal` applied (None: as they are)."""
    return probs if cal is None else np.exp(cal.apply(log_of(probs)))


def figures(probs: np.ndarray, gold: np.ndarray, binary: bool = False) -> dict[str, float]:
    """Accuracy, macro-F1, the top probability's ECE, Brier and log-loss of answers against gold."""
    p, g = np.asarray(probs, dtype=np.float64), np.asarray(gold, dtype=np.int64)
    top = p.argmax(axis=1)
    k = p.shape[1]
    return {
        "accuracy": float(np.mean(top == g)),
        "macro_f1": float(macro_f1(confusion(g, top, k))),
        "ece": float(ece(p.max(axis=1), top == g)),
        "brier": float(brier(p, g, binary)),
        "log_loss": float(log_loss(p, g)),
    }


def constant(probs: np.ndarray) -> bool:
    """Every answer is the same (each option's log-probability within 1e-9, so that saturated but
    different answers are told apart): the model does not tell the states apart for this question."""
    p = np.asarray(probs, dtype=np.float64)
    return len(p) > 1 and bool(np.all(np.ptp(log_of(p), axis=0) <= 1e-9))


def _same_answers(probs: np.ndarray, what: str, learned: str) -> FitError:
    first = ", ".join(f"{x:.4g}" for x in np.asarray(probs, dtype=np.float64)[0])
    return FitError(
        f"{what}the model gave every one of the {len(probs)} states the same answer ({first}): {learned} from "
        "answers that do not vary changes nothing but their scale; check the model (a broken or untrained "
        "checkpoint?), its --dtype and the question, or give states that differ"
    )


def batch_prior(probs: np.ndarray, labels: Sequence[str], warmup: int, what: str = "") -> Calibrator:
    """The batch prior of the first `warmup` answers (at least as many as the options; refused
    where they are all the same: dividing them out would make each of them uniform)."""
    every = np.asarray(probs, dtype=np.float64)
    p = every[:warmup]
    if len(p) < len(labels):
        fix = "give more states"
        if warmup < len(labels):  # the warm-up itself is too short, however many states there are
            fix = f"raise --warmup to {len(labels)} or more" + (
                "" if len(every) >= len(labels) else " and give more states"
            )
        raise FitError(
            f"{what}a prior over {len(labels)} options needs at least {len(labels)} states, got {len(p)} "
            f"(--warmup {warmup}, {len(every)} states answered): {fix}"
        )
    if constant(p):
        raise _same_answers(p, what, "a prior learned")
    try:
        return fit_batch(log_of(p), labels)
    except CalibrationError as e:
        raise FitError(f"{what}{e}") from None


def priors_apply(labels: Sequence[str]) -> bool:
    """Whether a prior or a fit can be kept over these options (by name: two apart only in spaces
    cannot; the letters style still answers such a question, raw)."""
    try:
        validate(labels)
    except LabelError:
        return False
    return True


def corrected(
    probs: np.ndarray,
    gold: np.ndarray,
    labels: Sequence[str],
    warmup: int,
    contextual: Calibrator | None = None,
    binary: bool = False,
    states: np.ndarray | None = None,
) -> dict[str, dict[str, float]]:
    """The raw answers' figures beside those of the same answers divided by a batch prior (the
    first `warmup` of `states`: every state's raw answer, labelled or not, in input order, as
    `decide --calibrate batch` finds it; default `probs`) and by `contextual` (when given)."""
    out = {"raw": figures(probs, gold, binary)}
    seen = probs if states is None else np.asarray(states, dtype=np.float64)
    if len(seen) >= len(labels) and not constant(seen[:warmup]) and priors_apply(labels):
        out["batch"] = figures(apply(batch_prior(seen, labels, warmup), probs), gold, binary)
    if contextual is not None:
        out["contextual"] = figures(apply(contextual, probs), gold, binary)
    return out


@dataclass(frozen=True)
class Fitted:
    """A question's fit: the way chosen (`style`, `permute`), its calibrator (fitted on every row),
    and the table of every way tried (`table`: raw and cross-validated figures), or a `note` where
    the ways could not be compared (too few rows of an option for cross-validation)."""

    style: str
    permute: int
    calibrator: Calibrator
    table: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None
    raw_accuracy: float | None = None  # the plain way's raw answers, unfitted (no fit: an honest figure as it is)
    choice_cv: float | None = None  # choosing the way, cross-validated (`choice_accuracy`)

    @property
    def beats_raw(self) -> bool:
        """Whether the fit's cross-validated accuracy (of the choice of way, where several were
        compared) is above the raw answers' (a fit that is not, or that could not be cross-validated,
        is not kept: the question stays raw, the report says so)."""
        cv = self.choice_cv if self.choice_cv is not None else self.calibrator.info.get("cv_accuracy_calibrated")
        return cv is not None and (self.raw_accuracy is None or bool(cv > self.raw_accuracy))

    def report(self) -> dict[str, Any]:
        return {
            "chosen": {"style": self.style, "permute": self.permute},
            "raw_accuracy": self.raw_accuracy,
            "kept": self.beats_raw,
            "cv_accuracy": self.calibrator.info.get("cv_accuracy_calibrated"),
            "cv_accuracy_of_choice": self.choice_cv,
            "cv_log_loss": self.calibrator.info.get("cv_logloss_calibrated"),
            "temperature": self.calibrator.temperature,
            "n": self.calibrator.n,
            "ways": self.table,
            **({"note": self.note} if self.note else {}),
        }


def fit_question(
    runs: Mapping[Way, np.ndarray],
    gold: np.ndarray,
    labels: Sequence[str],
    key: str,
    folds: int = 5,
    seed: int = 0,
) -> Fitted:
    """Fit a bias per option and a temperature on each way's raw answers, and keep the way with
    the best cross-validated accuracy (see the module docstring). Every option needs a gold row
    (two, for the ways to be compared by cross-validation)."""
    gold = np.asarray(gold, dtype=np.int64)
    k = len(labels)
    support = np.bincount(gold, minlength=k)
    if len(gold) < k or support.min() == 0:
        missing = [labels[c] for c in range(k) if support[c] == 0]
        raise FitError(
            f"--fit: question {key!r} has {k} options and {len(gold)} labelled row(s)"
            + (f"; no row's gold answer is {', '.join(map(repr, missing[:5]))}" if missing else "")
            + ": a bias per option is learned from rows of every option. Label more states (two or more per "
            "option), or learn only a prior from unlabelled states (--fit-prior)"
        )
    fits: dict[Way, Calibrator] = {}
    table = []
    flat = [w for w, p in runs.items() if constant(p)]  # a way whose answers do not vary: nothing to learn from it
    if len(flat) == len(runs):
        raise _same_answers(next(iter(runs.values())), f"--fit: question {key!r}: ", "a fit learned")
    given, runs = runs, {w: p for w, p in runs.items() if w not in flat}
    for way, probs in runs.items():
        try:
            cal = fit_labelled(log_of(probs), gold, labels, temperature="auto", folds=folds, seed=seed)
        except CalibrationError as e:
            raise FitError(f"--fit: question {key!r}: {e}") from None
        fits[way] = cal
        info = cal.info
        table.append(
            {
                "style": way[0],
                "permute": way[1],
                "raw_accuracy": float(np.mean(np.asarray(probs).argmax(axis=1) == gold)),
                "cv_accuracy": info.get("cv_accuracy_calibrated"),
                "cv_log_loss": info.get("cv_logloss_calibrated"),
            }
        )
    comparable = all(fits[w].info.get("cv_accuracy_calibrated") is not None for w in fits)
    if comparable:
        best = _best(fits)
        note = None
        choice = choice_accuracy(runs, gold, labels, fits, folds, seed)
    else:
        best = min(fits, key=lambda w: ORDER.get(w, 99))
        choice = None
        note = next(c.info.get("cv_note") for c in fits.values() if c.info.get("cv_note")) + (
            ": the ways could not be compared" if len(fits) > 1 else ""
        )
    if flat:
        left = "left out (the same answer for every state): " + ", ".join(f"{w[0]} x{w[1]}" for w in flat)
        note = f"{note}; {left}" if note else left
    plain = ("letters", 1) if ("letters", 1) in given else next(iter(given))  # what the user gets unfitted
    raw_acc = float(np.mean(np.asarray(given[plain]).argmax(axis=1) == gold))
    got = Fitted(best[0], best[1], fits[best], table, note, raw_acc, choice)
    if not got.beats_raw:
        why = f"no fitted way beat the raw answers ({raw_acc:.4f} right, unfitted): the question is kept raw"
        if fits[best].info.get("cv_accuracy_calibrated") is None:  # nothing shows the fit is better: not kept
            why = "the fit could not be cross-validated (label two or more states per option): the question is kept raw"
        got = Fitted(best[0], best[1], fits[best], table, f"{note}; {why}" if note else why, raw_acc, choice)
    return got


def _best(fits: Mapping[Way, Calibrator]) -> Way:
    """The way whose fit is the most right cross-validated (then the lower log-loss; then the plainer)."""

    def rank(w: Way) -> tuple[float, float, int]:
        info = fits[w].info
        return (-info["cv_accuracy_calibrated"], info["cv_logloss_calibrated"], ORDER.get(w, 99))

    return min(fits, key=rank)


def choice_accuracy(
    runs: Mapping[Way, np.ndarray],
    gold: np.ndarray,
    labels: Sequence[str],
    fits: Mapping[Way, Calibrator],
    folds: int = 5,
    seed: int = 0,
) -> float | None:
    """Choosing the way, cross-validated and nested: each fold's held-out rows answered by the way
    whose fit, cross-validated on the other folds alone, was the most right there, as fitted on those
    folds (nothing that answers a fold saw its labels), so that the figure a fit is kept on is not
    merely the best of several noisy ones. One way: its own cross-validated figure; None: no folds.
    Where the other folds hold too few rows of an option to compare the ways, the plainer way answers."""
    if len(fits) == 1:
        return next(iter(fits.values())).info.get("cv_accuracy_calibrated")
    used = {c.info.get("folds") for c in fits.values()}
    if len(used) != 1 or any(c.info.get("cv_accuracy_calibrated") is None for c in fits.values()):
        return None  # (no folds: an option with one row)
    gold = np.asarray(gold, dtype=np.int64)
    fold = stratified_folds(gold, len(labels), int(used.pop()), seed)  # the fits' own folds
    right = 0
    for f in range(int(fold.max()) + 1):
        tr, te = fold != f, fold == f
        inner = {w: fit_labelled(log_of(runs[w])[tr], gold[tr], labels, "auto", folds, seed) for w in fits}
        if all(c.info.get("cv_accuracy_calibrated") is not None for c in inner.values()):
            best = _best(inner)
        else:
            best = min(inner, key=lambda w: ORDER.get(w, 99))
        right += int(np.sum(np.argmax(inner[best].apply(log_of(runs[best])[te]), axis=1) == gold[te]))
    return right / len(gold)


def prior_of(probs: np.ndarray, labels: Sequence[str], key: str, warmup: int) -> Calibrator:
    """`eval --fit-prior`: the batch prior of the user's own states (no gold), saved in a task."""
    return batch_prior(probs, labels, warmup, f"--fit-prior: question {key!r}: ")
