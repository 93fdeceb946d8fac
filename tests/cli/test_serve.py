"""`mlx-slm serve` (`cli/serve.py`): the options it refuses before it loads anything (each a child
process: an option taken would serve until killed)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_serve_refuses_warmup_without_a_warm_up_calibration(tiny_qwen_mlx):
    # a child process: an option taken would serve until killed
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(tiny_qwen_mlx), "--port", "0", "--warmup", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--warmup" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("option", ["--text-field", "--gold-field", "--pair-column"])
def test_serve_refuses_calibration_data_fields_without_calibration_data(tiny_qwen_mlx, option):
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(tiny_qwen_mlx), "--port", "0", option, "x"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and option in r.stderr and "--calibration-data" in r.stderr, r.stderr
