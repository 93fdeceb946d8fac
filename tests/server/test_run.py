"""Running the app (`server/run.py`): binding the socket first (a port in use is one line and exit 2),
uvicorn, and SIGTERM as a drain. Hostile round seven (issue 47), the server's side: a worker stuck on a long micro-batch is
visible (/metrics shows the work in flight, /health answers 503 "stalled" past the request
timeout), and SIGTERM then drains and exits 0 (the worker joined before the interpreter exits:
a thread left inside MLX made it abort, "terminate called without an active exception", 134).

`mlx-slm serve` runs as a real subprocess on 127.0.0.1; its forward is made long by a patch that
runs MLX work (not a sleep: the abort needed a thread inside MLX) once a flag file exists."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mlx_slm.ground.errors import UserError
from tests.hostile import cli, refused

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]

# Each batch scored while FLAG exists first runs ~SECONDS of MLX matmuls (the worker inside MLX).
CHILD = """
import os, sys, time
import mlx_slm  # noqa: F401 (its BLAS before mlx.core)
import mlx.core as mx
import mlx_slm.kinds.labels as L
FLAG, SECONDS = sys.argv[1], float(sys.argv[2])
score = L.LabelsKind.score
def slow(self, *a, **k):
    if os.path.exists(FLAG):
        end = time.perf_counter() + SECONDS
        x = mx.ones((512, 512))
        while time.perf_counter() < end:
            mx.eval(x @ x)
    return score(self, *a, **k)
L.LabelsKind.score = slow
from mlx_slm.cli import main
sys.argv = ["mlx-slm", "serve", *sys.argv[3:]]
main()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model: Path, flag: Path, seconds: float, *args: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-c", CHILD, str(flag), str(seconds), "--model", str(model), "--labels", "a,b"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    end = time.time() + 240
    while time.time() < end and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the server did not start: {proc.communicate()[1][-2000:]}")


def _gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return next(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " "))


@pytest.mark.slow
def test_a_stuck_worker_is_seen_and_sigterm_drains_and_exits_0(tiny_qwen_mlx, tmp_path):
    flag = tmp_path / "slow"
    proc, url = _serve(tiny_qwen_mlx, flag, 6.0, "--request-timeout", "2", "--drain-timeout", "1")
    try:
        flag.touch()  # from now on every batch holds the worker ~6 s in MLX
        got: dict[str, httpx.Response] = {}
        t = threading.Thread(
            target=lambda: got.setdefault("r", httpx.post(url + "/v1/classify", json={"text": "x y"}, timeout=60))
        )
        t.start()
        while _gauge(url, "mlx_slm_running_items") < 1:  # the worker took it
            time.sleep(0.05)
        assert _gauge(url, "mlx_slm_worker_busy_seconds") >= 0
        t.join()
        assert got["r"].status_code == 504, got["r"].text  # the request timed out at 2 s ...
        assert _gauge(url, "mlx_slm_running_items") == 1  # ... and /metrics shows the work still running
        assert _gauge(url, "mlx_slm_inflight_requests") == 0
        health = httpx.get(url + "/health", timeout=5)
        while health.status_code == 200 and _gauge(url, "mlx_slm_running_items") == 1:
            time.sleep(0.1)  # past the request timeout: no longer "ok"
            health = httpx.get(url + "/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "stalled", health.text
        assert "over the request timeout of 2 s" in health.json()["error"]

        # A second request is in the queue, another one computing: SIGTERM now.
        t2 = threading.Thread(
            target=lambda: got.setdefault("q", httpx.post(url + "/v1/classify", json={"text": "z"}, timeout=60))
        )
        t2.start()
        while _gauge(url, "mlx_slm_queue_items") < 1 and _gauge(url, "mlx_slm_running_items") < 1:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        t2.join()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    assert "terminate called" not in err and "Traceback" not in err, err[-3000:]
    assert got["q"].status_code in (503, 504), got["q"].text  # answered: aborted by the drain, or timed out


pytest.importorskip("starlette")


def test_port_in_use_is_one_line_and_exit_2(tmp_path):
    from mlx_slm.server import bind_socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}: the port is in use"):
            bind_socket("127.0.0.1", port)
        r = cli("serve", "--port", str(port), "--model", "no-such-model")
        refused(r, f"127.0.0.1:{port}", "in use", "--port")
    finally:
        holder.close()
