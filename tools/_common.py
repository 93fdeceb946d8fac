"""What the development tools share: a tiny random model built once, a free port, a wait for /health."""

from __future__ import annotations

import socket
import time
from pathlib import Path


def tiny_model(workdir: Path) -> Path:
    """A tiny random qwen2 checkpoint (tests/conftest.make_tiny) converted once into `workdir`."""
    model = workdir / "model-mlx"
    if not model.exists():
        from conftest import make_tiny

        from mlx_slm.weights.convert import convert

        convert(make_tiny(workdir / "model-hf", "qwen2"), model, dtype="float32", progress=None)
    return model


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_healthy(url: str, tries: int = 1200) -> None:
    """Until `url`/health answers 200 (the model loaded and warmed up)."""
    import httpx

    for _ in range(tries):
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url}/health never answered 200")
