"""Helpers shared by the hostile-input test files: the CLI in-process, what a refusal looks like, and
the real app on a loopback port (`LiveServer`).

Two styles, as the rounds that found the cases wrote them: `cli`/`refused`/`write` (exceptions
propagate; a refusal is one `error` line holding every word), and `invoke`/`model_cli`/
`write_input`/`refused_cleanly` (exceptions caught; a refusal is exit 2 with no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mlx_slm.cli import BUG_REPORT, main
from mlx_slm.text.workload import tickets

TEXTS = [t for t, _ in tickets(40)]


def cli(*args: str, input: str | None = None):
    r = CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)
    assert BUG_REPORT not in r.output and r.exit_code != 70, r.output
    return r


def refused(r, *words: str) -> None:
    """Exit 2 with one `mlx-slm: error:` line holding every word."""
    assert r.exit_code == 2, r.output
    line = next(ln for ln in r.output.splitlines() if "error" in ln.lower())
    for w in words:
        assert w in line, (w, line)


def write(p: Path, data: bytes | str) -> Path:
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


def invoke(args, input=None):
    """The CLI in-process; exceptions are caught, so a traceback shows as exit code 1/70."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def model_cli(model, *extra):
    return ["--model", str(model), "--labels", "a,b,c", "-q", *extra]


def write_input(path: Path, n: int = 24) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "text": TEXTS[i % len(TEXTS)]}) + "\n" for i in range(n)))
    return path


def refused_cleanly(r, *words):
    """Exit 2 with one clear line naming `words`, no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and "bug in mlx-slm" not in r.output, r.output
    for w in words:
        assert w in r.output, (w, r.output)


# A tiny task for the Python API's hostile cases (tests/conftest.py's `engine` fixture gives the engine).
LABELS = ["billing", "technical", "account"]
SYSTEM = "Route the ticket."
TEMPLATE = "Ticket: {text}\nCategory:"


def task_clf(engine, labels=LABELS, **kw):
    from mlx_slm.classifier.classifier import Classifier

    return Classifier(engine, labels, kw.pop("system", SYSTEM), kw.pop("template", TEMPLATE), **kw)


class LiveServer:
    """The real app under uvicorn on a loopback port, in a thread (as tests/server/test_app.py)."""

    def __init__(self, service):
        import threading

        import uvicorn

        from mlx_slm.server import bind_socket, create_app

        self.service = service
        self.sock = bind_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        cfg = uvicorn.Config(create_app(service), log_level="error", lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        import time

        import httpx

        self.thread.start()
        end = time.time() + 60
        while time.time() < end:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    def post(self, content: bytes, timeout: float = 30, headers: dict | None = None):
        import httpx

        return httpx.post(
            self.url + "/v1/classify",
            content=content,
            headers={"content-type": "application/json", **(headers or {})},
            timeout=timeout,
        )

    def metric(self, outcome: str) -> float:
        import httpx

        text = httpx.get(self.url + "/metrics").text
        key = f'mlx_slm_requests_total{{outcome="{outcome}",'
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(key))
