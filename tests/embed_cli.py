"""What the embed job's and command's tests share: three texts (and an empty one, and a broken line,
in the input file), the CLI runner, a tiny sentence-transformers folder and the vectors to expect.
The fixtures reach tests/cli and tests/jobs through their conftest.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlx_slm.classifier.embedder import Embedder
from mlx_slm.cli import main
from mlx_slm.engine.engine import Engine

TEXTS = ["refund please", "The app crashes when I open settings", "x"]


def run(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


@pytest.fixture(scope="module")
def folder(tiny_arch):
    return tiny_arch.st_mlx(pooling="mean")


@pytest.fixture
def inp(tmp_path):
    p = tmp_path / "in.jsonl"
    rows = [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)]
    rows.insert(1, {"id": "empty", "text": ""})
    p.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    return p


def want(folder, **kw):
    """The vectors of TEXTS from the embedder itself: what the files must hold."""
    return Embedder(Engine.load(str(folder))).encode(TEXTS, **kw)
