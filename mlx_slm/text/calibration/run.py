"""How a run calibrates (`CalibrationSpec`, the one value every front end passes) and the
per-run state a spec makes (`Calibration`: the prior fitted on the warm-up, abstain)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..labels import log_softmax
from .calibrator import DEFAULT_WARMUP, METHODS, CalibrationError, Calibrator, written
from .fitters import fit_batch, fit_em


# ---------------------------------------------------------------------------- the spec and one run
@dataclass(frozen=True)
class CalibrationSpec:
    """How a run calibrates: the one value the CLI, task files, Ray, the service and the
    Python API pass around (`of` makes it from any of their forms).

    `method` is one of `METHODS`. `prior`: a fitted `Calibrator` applied to every item as
    it is (a saved prior, or the one an interrupted run fitted). `base`: for ``em``, the
    offsets fitted on labelled data, on which each input's own label mix is re-estimated.
    Without either, ``batch``/``em`` fit their prior on each input's first `warmup`
    answered items, and ``fit``/``em`` still need labelled data (`needs_data`).
    """

    method: str = "none"
    prior: Calibrator | None = None
    base: Calibrator | None = None
    warmup: int = DEFAULT_WARMUP

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise CalibrationError(f"calibration {self.method!r} is not one of {', '.join(METHODS)}")
        if self.prior is not None and self.prior.method != self.method:
            raise CalibrationError(f"a {self.prior.method!r} prior given as calibration {self.method!r}")
        if self.base is not None and (self.method != "em" or self.prior is not None):
            raise CalibrationError("a base calibrator goes with calibration 'em' (and no fitted prior)")

    @classmethod
    def of(cls, value: CalibrationSpec | Calibrator | str, *, warmup: int | None = None) -> CalibrationSpec:
        """The spec for a method name, a fitted `Calibrator` (applied as is) or a spec;
        `warmup` replaces the spec's own when given."""
        if isinstance(value, CalibrationSpec):
            spec = value
        elif isinstance(value, Calibrator):
            spec = cls(value.method, prior=value)
        elif value in METHODS:
            spec = cls(value)
        else:
            raise CalibrationError(
                f"calibration must be one of {', '.join(METHODS)}, a fitted Calibrator or a CalibrationSpec, "
                f"not {value!r}"
            )
        return spec if warmup is None or warmup == spec.warmup else replace(spec, warmup=warmup)

    # -- the task file's "calibration" field (warm-up is a field of its own there)
    def to_dict(self) -> str | dict[str, Any]:
        """The field's JSON: "none", "batch", a fitted prior's dict, or {"method": "em", "base": ...}."""
        if self.prior is not None:
            return self.prior.to_dict()
        if self.base is not None:
            return {"method": "em", "base": self.base.to_dict()}
        return self.method

    @classmethod
    def from_dict(cls, d: Any, warmup: int = DEFAULT_WARMUP) -> CalibrationSpec:
        """Read `to_dict` back; a malformed calibrator is a `CalibrationError`."""
        if isinstance(d, dict) and d.get("method") == "em" and "base" in d:
            return cls("em", base=Calibrator.from_dict(d["base"]), warmup=warmup)
        if isinstance(d, dict):
            return cls.of(Calibrator.from_dict(d), warmup=warmup)
        return cls.of(d, warmup=warmup)

    def record(self) -> str | dict[str, Any]:
        """The run record's (manifest's) form: what `--resume` compares, warm-up included."""
        if self.prior is not None:
            return self.prior.to_dict()
        if self.base is not None:
            return {"method": "em", "base": self.base.to_dict(), "warmup": self.warmup}
        return self.method if self.method == "none" else {"method": self.method, "warmup": self.warmup}

    @property
    def applies(self) -> bool:
        """Whether probabilities change at all (an identity prior is ``none`` too)."""
        return self.method != "none"

    @property
    def fitted(self) -> bool:
        """Holds parameters fitted on some model's scores (they hold for those weights only)."""
        return self.prior is not None or self.base is not None

    @property
    def per_input(self) -> bool:
        """``batch``/``em`` without a fixed prior: each input's warm-up fits its own."""
        return self.prior is None and self.method in ("batch", "em")

    @property
    def needs_data(self) -> bool:
        """``fit``, or ``em`` without a base: labelled data must be fitted first."""
        return self.prior is None and (self.method == "fit" or (self.method == "em" and self.base is None))

    @property
    def calibrator(self) -> Calibrator | None:
        """The fitted parameters held: the prior, or em's base."""
        return self.prior or self.base

    def fixed(self) -> CalibrationSpec:
        """What can be applied batch by batch, with no warm-up: the prior, else ``none``."""
        if self.prior is not None and self.applies:
            return self
        return CalibrationSpec(warmup=self.warmup)

    def fit_prior(self, log_probs: np.ndarray, labels: Sequence[str]) -> Calibrator:
        """``batch``/``em``: the prior fitted on one input's warm-up log-probabilities."""
        return fit_batch(log_probs, labels) if self.method == "batch" else fit_em(log_probs, labels, base=self.base)

    def run(
        self,
        labels: Sequence[str],
        min_confidence: float | None = None,
        on_fit: Callable[[Calibrator], None] | None = None,
        none_label: str | None = None,
    ) -> Calibration:
        """The per-run state for one stream of predictions (`none_label`: the label that means
        "none of these": answered as no label, abstained)."""
        return Calibration(self, labels, min_confidence=min_confidence, on_fit=on_fit, none_label=none_label)


class Calibration:
    """Calibrates (and optionally abstains on) a stream of raw predictions, for one run.

    A spec with a `prior` applies it as is. ``batch`` (Zhou et al. 2023) and ``em`` with
    a base (Saerens et al. 2002) hold back the first `warmup` answered items, fit the
    prior on them (`calibrator`, with `on_fit` told), then calibrate every item, them
    included, with that one prior. The fitted prior lives here, never on the shared
    classifier, and an object serves one run. Predictions come back as new objects;
    raw probabilities stay on each (`raw_probs`).
    """

    def __init__(
        self,
        spec: CalibrationSpec | Calibrator | str,
        labels: Sequence[str],
        *,
        min_confidence: float | None = None,
        on_fit: Callable[[Calibrator], None] | None = None,
        none_label: str | None = None,
    ):
        spec = CalibrationSpec.of(spec)
        if spec.needs_data:
            raise CalibrationError(
                f"calibration {spec.method!r} needs fitting first: use 'none', 'batch', 'em' with a base, or a "
                "Calibrator (calibration.fit_labelled for 'fit')"
            )
        if spec.prior is not None:
            spec.prior.check_labels(labels)
        if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
            raise CalibrationError(f"min_confidence must be between 0 and 1, got {min_confidence}")
        self.spec, self.method, self.base = spec, spec.method, spec.base
        self.calibrator: Calibrator | None = spec.prior if spec.applies else None
        self.labels, self.warmup, self.min_confidence = tuple(labels), max(2, spec.warmup), min_confidence
        self.on_fit, self.fitted_here, self._used = on_fit, False, False
        if none_label is not None and none_label not in self.labels:
            raise CalibrationError(f"the none label {none_label!r} is not one of the labels {list(self.labels)[:8]}")
        self.none_label = none_label

    def __call__(self, preds: Iterable[Any]) -> Iterator[Any]:
        if self._used:
            raise RuntimeError("a Calibration serves one run: make a new one for the next stream")
        self._used = True
        it = iter(preds)
        if self.spec.per_input:
            held: list[Any] = []
            answered = 0
            for p in it:
                held.append(p)
                answered += p.ok
                if answered >= self.warmup:
                    break
            ok = [p for p in held if p.ok]
            if len(ok) >= 2:
                self.calibrator = self.spec.fit_prior(self._log_probs(ok), self.labels)
                self.fitted_here = True
                if self.on_fit is not None:
                    self.on_fit(self.calibrator)
            yield from (self._finish(p) for p in held)
        yield from (self._finish(p) for p in it)

    def result(self) -> CalibrationSpec:
        """The spec this run leaves for later inputs (what `--save-task` writes): the prior
        it applied or fitted, or for ``em`` its base (each input re-estimates its own mix)."""
        if self.method == "em" and self.base is not None:
            return CalibrationSpec("em", base=self.base, warmup=self.spec.warmup)
        if self.calibrator is None:
            return CalibrationSpec(warmup=self.spec.warmup)
        return CalibrationSpec.of(self.calibrator, warmup=self.spec.warmup)

    def _log_probs(self, preds: Sequence[Any]) -> np.ndarray:
        return log_softmax(np.array([[p.scores[lab] for lab in self.labels] for p in preds]))

    def _finish(self, p: Any) -> Any:
        if not p.ok:
            return p
        if self.calibrator is not None:
            probs = self.calibrator.probs(self._log_probs([p]))[0]
            p = replace(
                p,
                raw_probs=p.probs,
                probs={lab: float(x) for lab, x in zip(self.labels, probs)},
                label=self.labels[int(np.argmax(probs))],
            )
        if self.min_confidence is not None or self.none_label is not None:
            # decided on the probabilities as written (see PROB_DIGITS), never on bits a reader cannot see
            p = replace(p, probs=written(p.probs))
            in_scope = [v for lab, v in p.probs.items() if lab != self.none_label]
            unsure = self.min_confidence is not None and max(in_scope) < self.min_confidence
            if unsure or (self.none_label is not None and p.label == self.none_label):
                p = replace(p, label=None, abstained=True)  # "none of these": no label, said in the record
        return p
