"""`convert`, `doctor`, `models` and `bench` (`cli/misc.py`): the model cache and the machine."""

import json

import pytest

from tests.classify_run import run


@pytest.fixture(scope="session")
def doctor_run():
    """`mlx-slm doctor`, run once: what it prints does not depend on the tiny model the test is
    parametrized by (session-scoped: pytest runs the two parameters apart, in different module
    passes). Its matmul rate is timed on one 256 x 256 product instead of 1024 and 2048 ones
    four times (~1.8 s of CPU): the test reads the line's shape, not the rate."""
    from mlx_slm.ground import blas as _blas

    peak = _blas.matmul_peak
    mp = pytest.MonkeyPatch()
    mp.setattr(_blas, "matmul_peak", lambda: peak(sizes=(256,), reps=1))
    try:
        return run(["doctor"])
    finally:
        mp.undo()


def test_convert_command_and_doctor(tiny_hf, tmp_path, doctor_run):
    r = run(["convert", str(tiny_hf), "--out", str(tmp_path / "c"), "--dtype", "bfloat16"])
    assert r.exit_code == 0 and (tmp_path / "c" / "conversion.json").exists()
    rec = json.loads((tmp_path / "c" / "conversion.json").read_text())
    assert rec["dtype"] == "bfloat16" and len(rec["source_sha256"]["model.safetensors"]) == 64
    d = doctor_run
    assert d.exit_code == 0 and "GFLOP/s" in d.output and "compute dtype" in d.output
