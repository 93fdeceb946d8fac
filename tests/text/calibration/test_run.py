"""How a run calibrates (`text/calibration/run.py`): `CalibrationSpec`, the one value every front end
passes, and `Calibration`, which applies it and abstains on the probabilities as written."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_slm.text.calibration import (
    CalibrationError,
    Calibrator,
    fit_batch,
)


def test_calibration_spec_one_value_for_every_form():
    from mlx_slm.text.calibration import CalibrationSpec

    labels = ("a", "b")
    prior = fit_batch(np.log(np.array([[0.7, 0.3], [0.6, 0.4]])), labels)
    base = replace(prior, method="fit")
    # The task file's JSON, as before: "none", "batch", a prior's dict, {"method": "em", "base": ...}.
    for spec, js in [
        (CalibrationSpec.of("none"), "none"),
        (CalibrationSpec.of("batch", warmup=64), "batch"),
        (CalibrationSpec.of(prior), prior.to_dict()),
        (CalibrationSpec("em", base=base), {"method": "em", "base": base.to_dict()}),
    ]:
        assert spec.to_dict() == js
        assert CalibrationSpec.from_dict(js, spec.warmup) == spec
    assert CalibrationSpec.of("batch", warmup=64).record() == {"method": "batch", "warmup": 64}
    assert CalibrationSpec.of("em").needs_data and CalibrationSpec.of("fit").needs_data
    assert not CalibrationSpec("em", base=base).needs_data and CalibrationSpec("em", base=base).fitted
    assert not CalibrationSpec.of(Calibrator.identity(labels)).applies
    with pytest.raises(CalibrationError):
        CalibrationSpec.of("bogus")
    with pytest.raises(CalibrationError, match="needs fitting first"):
        CalibrationSpec.of("em").run(labels)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=5),
    st.integers(0, 4),
    st.floats(-4e-7, 4e-7),
)
def test_abstain_is_decided_on_the_probabilities_as_written(weights, pick, nudge):
    """A reader of any output recomputes the decision: abstained == (max(probs) < bar), with the
    bar taken from a written probability, nudged below the sixth decimal (a machine's last bits)."""
    from mlx_slm.text.calibration import Calibration
    from mlx_slm.text.predictions import Prediction

    w = np.asarray(weights) + 1e-3
    labels = [f"l{i}" for i in range(len(w))]
    p = w / w.sum()
    pred = Prediction(
        0, labels[int(np.argmax(p))], dict(zip(labels, p.tolist())), dict(zip(labels, np.log(p).tolist()))
    )
    bar = round(float(p[pick % len(p)]) + nudge, 6)  # a threshold a user copied from a written file
    (out,) = Calibration("none", labels, min_confidence=min(bar, 1.0))(iter([pred]))
    assert all(v == round(v, 6) for v in out.probs.values())
    assert out.abstained == (max(out.probs.values()) < min(bar, 1.0))
    assert (out.label is None) == out.abstained
