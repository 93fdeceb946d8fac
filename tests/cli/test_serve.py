"""`mlx-slm serve` (`cli/serve.py`): the options it refuses before it loads anything (each a child
process: an option taken would serve until killed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_serve_refuses_warmup_without_a_warm_up_calibration(tiny_qwen_mlx):
    # a child process: an option taken would serve until killed
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(tiny_qwen_mlx), "--port", "0", "--warmup", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--warmup" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_serve_names_its_own_decision_option_when_it_refuses_a_batch_prior(tiny_qwen_mlx):
    """A server has no run of states to average over: --decision-calibrate batch is refused naming
    --decision-calibrate (not decide's --calibrate) and the way to fit the prior instead."""
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(tiny_qwen_mlx), "--port", "0"]
    r = subprocess.run([*cmd, "--decision-calibrate", "batch"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--decision-calibrate batch needs" in r.stderr, r.stderr
    assert "--fit-prior" in r.stderr and "use --decision-calibrate contextual" in r.stderr
    assert " --calibrate " not in r.stderr.replace("--decision-calibrate", "")


@pytest.mark.parametrize("option", ["--text-field", "--gold-field", "--pair-column"])
def test_serve_refuses_calibration_data_fields_without_calibration_data(tiny_qwen_mlx, option):
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(tiny_qwen_mlx), "--port", "0", option, "x"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and option in r.stderr and "--calibration-data" in r.stderr, r.stderr


pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


@pytest.mark.parametrize("name", ["", " a "])
def test_serve_refuses_the_name_before_loading(tiny_qwen_mlx, name):
    # a child process: a name taken would serve until killed
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--model", str(tiny_qwen_mlx), "--port", "0"]
    r = subprocess.run([*cmd, "--served-model-name", name], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--served-model-name" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_serve_with_a_task_of_other_weights_says_so_without_a_class_name(tmp_path, tiny_qwen_mlx):
    from mlx_slm.classifier.task import Task
    from mlx_slm.text.calibration import Calibrator

    t = tmp_path / "t.json"
    prior = Calibrator("fit", ("billing", "tech"), (-0.5, -0.9), n=10)
    Task(model=str(tiny_qwen_mlx), labels=["billing", "tech"], system="Route.", template="{text}",
         calibration=prior, weights_sha256="ab" * 32).save(t)  # fmt: skip
    cmd = [sys.executable, "-m", "mlx_slm.cli", "serve", "--task", str(t), "--port", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 2 and "does not carry over" in r.stderr, r.stderr
    assert "TaskError" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert f"the model loaded ({tiny_qwen_mlx}) has" in r.stderr, r.stderr


pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


ROOT = Path(__file__).resolve().parents[2]


def test_serve_exits_70_when_its_worker_dies(tiny_qwen_mlx):
    code = (
        "import sys\n"
        "import mlx_slm.service.scheduler as s\n"
        "def boom(self): raise RuntimeError('the worker loop broke')\n"
        "s.Scheduler.loop = boom\n"
        "from mlx_slm.cli import main\n"
        f"sys.argv = ['mlx-slm', 'serve', '--model', {str(tiny_qwen_mlx)!r}, '--port', '0', '--labels', 'a,b']\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 70, (r.returncode, r.stderr[-2000:])
    assert "the model worker stopped (RuntimeError: the worker loop broke)" in r.stderr
