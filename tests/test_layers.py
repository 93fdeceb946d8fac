"""The floors hold: every import in mlx_slm runs down or along them (tools/layers.py), every
module sits on a floor, no file, class or function outgrows its limit, and ARCHITECTURE.md's
floor table names the same modules as the checker."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _layers():
    spec = importlib.util.spec_from_file_location("mlx_slm_layers", ROOT / "tools" / "layers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


layers = _layers()


def test_no_import_runs_up_a_floor_and_no_cycle():
    assert layers.check() == []


def test_no_room_is_oversized():
    assert layers.oversized() == []


def _write(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "mlx_slm"
    for name, text in files.items():
        p = pkg / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return pkg


def test_the_checker_finds_an_upward_import_a_stray_module_and_cycles(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "__init__.py": "from . import _blas\n",
            "_blas.py": "",
            "errors.py": "def f():\n    from .cli import main\n",  # lazy, still a dependency: up
            "labels.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .classifier import C\n",
            "classifier.py": "from .labels import x\nfrom . import engine\n",
            "engine.py": "from mlx_slm.labels import y\n",
            "cli/__init__.py": "from ..errors import UserError\n",
            "newthing.py": "",
            "output/__init__.py": "from .a import A\n",
            "output/a.py": "from . import b\n",
            "output/b.py": "from .a import A\n",
        },
    )
    problems = layers.check(pkg)
    text = "\n".join(problems)
    assert "errors.py:2: errors (ground) imports cli (front ends)" in text
    assert "labels (pure pieces) imports classifier" not in text  # TYPE_CHECKING imports load nothing: no climb
    # ... but two modules that name each other, even for type hints only, are one circle (issue 34)
    assert "import cycle: classifier -> engine -> labels -> classifier" in text
    assert "newthing: on no floor" in text
    assert "import cycle: output.a -> output.b -> output.a" in text
    assert len(problems) == 4


def _architecture_floors() -> list[tuple[str, set[str]]]:
    """(floor name, modules) from ARCHITECTURE.md's table; names inside parentheses are parts of a package."""
    rows = []
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        m = re.match(r"\| (\d+)\. ([^|]+) \| ([^|]+) \|", line)
        if m:
            cell = re.sub(r"\([^()]*\)", "", m.group(3))
            names = {n.removesuffix(".py").removesuffix("/") for n in re.findall(r"`([^`]+)`", cell)}
            rows.append((m.group(2).strip(), names))
    return rows


def test_architecture_md_names_the_same_floors():
    documented = _architecture_floors()
    expected = [(name, set(mods) - {""}) for name, mods in layers.FLOORS]
    assert documented == expected


@pytest.mark.parametrize("path", sorted((ROOT / "mlx_slm").glob("*.py")) + sorted((ROOT / "mlx_slm").glob("*/")))
def test_every_top_level_module_is_on_a_floor(path):
    name = path.stem if path.suffix == ".py" else path.name
    if name in ("__init__", "__pycache__"):
        return
    assert name in layers.FLOOR_OF, f"{name}: add it to tools/layers.py FLOORS and ARCHITECTURE.md"


def test_the_size_check_names_an_oversized_function(tmp_path):
    body = "def long():\n" + "    x = 1\n" * 90 + "\n\ndef short():\n    return 1\n"
    pkg = _write(tmp_path, {"__init__.py": "", "errors.py": body})
    assert layers.oversized(pkg) == ["mlx_slm/errors.py:1: long is 91 lines (limit 90)"]


def test_notes_have_one_printer():
    """Every note the package prints goes through `notices.notice` (one line on stderr, flushed):
    no other module prints to stderr itself."""
    import ast

    found = []
    for path in sorted((ROOT / "mlx_slm").rglob("*.py")):
        if path.name == "notices.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                if any(k.arg == "file" and "stderr" in ast.unparse(k.value) for k in node.keywords):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], f"print to stderr outside notices.py: {found}; use mlx_slm.notices.notice"
