"""Calibration and abstain per question, for a run that asks several questions per text.

Each zero-shot question is biased its own way (a small model says "billing" to most
tickets, "no" to most yes/no statements): `batch` calibration (Zhou et al. 2023) fits one
prior per question (per branch: every label of a `multi` question has its own yes/no prior)
on the run's first `warmup` answered texts, and divides it out of every answer, them
included. A learned head's probabilities are fitted on labelled data already: left as they
are. `min_confidence` abstains per question (choice, yes/no, scale, head): the answer's
`label` becomes null and `abstained` true, decided on the probabilities as written
(`calibration.PROB_DIGITS`). Raw probabilities stay in each calibrated answer (`raw_probs`).

The same interface as `calibration.Calibration` (one object per run, called on the stream
of raw predictions), so the file job, the service and the Python API run either.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .calibration import CalibrationError, CalibrationSpec, Calibrator, fit_batch, written
from .questions import Question

KINDS = ("none", "batch")  # fit/em need labelled data per question: not yet
TINY = 1e-300  # a probability that underflowed to 0 stays a (very small) log-probability


def block_log_probs(q: Question, answer: dict[str, Any]) -> list[np.ndarray]:
    """Each branch's options' log-probabilities, read back from an answer (the inverse of
    `Question.answer` up to a constant per branch)."""
    if q.type.many:
        return [np.log(np.maximum([p, 1.0 - p], TINY)) for p in (answer["probs"][lab] for lab in q.labels)]
    p = np.array([answer["probs"][lab] for lab in q.labels], dtype=np.float64)
    if q.none:  # the options' mass without the none option's, then the none option
        p = np.append(p * (1.0 - answer["abstain"]), answer["abstain"])
    return [np.log(np.maximum(p, TINY))]


def _options(q: Question) -> list[tuple[str, ...]]:
    return [options for _, options in q.blocks()]


class QuestionCalibration:
    """Calibrates and abstains per question over one run's predictions (see the module docstring)."""

    def __init__(
        self,
        spec: CalibrationSpec | str,
        questions: Sequence[Question],
        *,
        min_confidence: float | None = None,
    ):
        spec = CalibrationSpec.of(spec)
        if spec.method not in KINDS or spec.fitted:
            raise CalibrationError(
                f"calibration {spec.method!r} with several questions is not supported yet: use 'batch' (a prior per "
                "question from the input itself) or 'none'"
            )
        if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
            raise CalibrationError(f"min_confidence must be between 0 and 1, got {min_confidence}")
        self.spec, self.method, self.questions = spec, spec.method, tuple(questions)
        self.min_confidence, self.warmup = min_confidence, max(2, spec.warmup)
        self.priors: dict[str, list[Calibrator]] = {}  # question name -> a prior per branch
        self.fitted_here, self.n, self._used = False, 0, False

    @property
    def calibrator(self) -> Any:
        return None  # several priors, one per question: see `priors`

    def __call__(self, preds: Iterable[Any]) -> Iterator[Any]:
        if self._used:
            raise RuntimeError("a QuestionCalibration serves one run: make a new one for the next stream")
        self._used = True
        it = iter(preds)
        if self.method == "batch":
            held: list[Any] = []
            for p in it:
                held.append(p)
                if sum(x.ok for x in held) >= self.warmup:
                    break
            self._fit([p for p in held if p.ok])
            yield from (self._finish(p) for p in held)
        yield from (self._finish(p) for p in it)

    def _fit(self, ok: list[Any]) -> None:
        if len(ok) < 2:
            return
        for q in self.questions:
            if not q.type.calibrates:  # a head question's probabilities are fitted already
                continue
            per_item = [block_log_probs(q, p.answers[q.name]) for p in ok]
            self.priors[q.name] = [
                fit_batch(np.array([lps[b] for lps in per_item]), options) for b, options in enumerate(_options(q))
            ]
        self.fitted_here, self.n = True, len(ok)

    def _finish(self, p: Any) -> Any:
        if not p.ok or (not self.priors and self.min_confidence is None):
            return p
        answers = dict(p.answers)
        for q in self.questions:
            a = answers[q.name]
            if q.name in self.priors:
                lps = [c.apply(lp) for c, lp in zip(self.priors[q.name], block_log_probs(q, a))]
                a = {**q.answer(lps), "raw_probs": a["probs"]}
            if self.min_confidence is not None and q.type.abstains:
                a = {**a, "probs": written(a["probs"])}
                if max(a["probs"].values()) < self.min_confidence:
                    a = {**a, "label": None, "abstained": True}
            answers[q.name] = a
        return replace(p, answers=answers)

    def result(self) -> CalibrationSpec:
        """What a saved task keeps: the method and warm-up (each input fits its own priors)."""
        return self.spec

    def record(self) -> dict[str, Any]:
        """The priors this run fitted, per question (the manifest's)."""
        return {name: [c.to_dict() for c in cs] for name, cs in self.priors.items()}
