"""The floors hold: every floor (a folder of mlx_slm, or a module beside them) says in its
docstring what it may import, every import keeps to that (tools/layers.py reads the lines), no
file, class or function outgrows its limit, and ARCHITECTURE.md's map names every floor."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


FLOORS_OF_A_TOY = {
    "__init__.py": "from .ground import blas\n",
    "ground/__init__.py": '"""Ground.\n\nMay import: nothing.\n"""\n',
    "ground/blas.py": "",
    "ground/errors.py": "def f():\n    from ..cli import main\n",  # lazy, still a dependency: up
    "text/__init__.py": '"""Text.\n\nMay import: ground.\n"""\n',
    "text/labels.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine.core import C\n",
    "engine/__init__.py": '"""Engine.\n\nMay import: ground, text.\n"""\n',
    "engine/core.py": "from ..text.labels import x\nfrom . import other\n",
    "engine/other.py": "from mlx_slm.text.labels import y\nfrom .core import z\n",
    "cli/__init__.py": '"""The CLI.\n\nMay import: ground, text, engine.\n"""\nfrom ..ground.errors import UserError\n',
    "cli/version.py": "from .. import __version__\n",  # the root: the public names only
    "newthing/__init__.py": '"""A floor that says nothing of its imports."""\n',
}


def test_the_checker_finds_an_upward_import_a_mute_floor_and_cycles(tmp_path):
    pkg = _write(tmp_path, FLOORS_OF_A_TOY)
    problems = layers.check(pkg)
    text = "\n".join(problems)
    assert "ground/errors.py:2: ground.errors (ground) imports cli (cli)" in text
    assert "text.labels (text) imports engine" not in text  # TYPE_CHECKING imports load nothing: no climb
    assert "import cycle: engine.core -> engine.other -> text.labels -> engine.core" in text  # a type hint counts
    assert "mlx_slm/newthing/__init__.py: its docstring says nothing of what it may import" in text
    assert "cli.version imports the package root" in text
    assert len(problems) == 4, problems


def test_the_floors_are_read_from_the_folders_in_order(tmp_path):
    pkg = _write(tmp_path, {k: v for k, v in FLOORS_OF_A_TOY.items() if not k.startswith("newthing")})
    declared, problems = layers.floors(pkg)
    assert problems == []
    assert declared == {"ground": set(), "text": {"ground"}, "engine": {"ground", "text"},
                        "cli": {"ground", "text", "engine"}}  # fmt: skip
    assert layers.order(declared) == ([["ground"], ["text"], ["engine"], ["cli"]], [])


def test_floors_that_may_import_each_other_are_refused(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": '"""A.\n\nMay import: b.\n"""\n',
            "b/__init__.py": '"""B.\n\nMay import: a, nowhere.\n"""\n',
        },
    )
    problems = layers.check(pkg)
    assert any(p.startswith("floors that may import each other: a -> b -> a") for p in problems), problems
    assert "b: 'May import' names 'nowhere', which is no floor of mlx_slm" in problems


def _architecture_map() -> set[str]:
    """The floors ARCHITECTURE.md's map names: the lines of its first code block, the folder tree."""
    block = (ROOT / "ARCHITECTURE.md").read_text().split("```", 2)[1]
    return {m.rstrip("/").removesuffix(".py") for m in re.findall(r"^\s*([a-z_]+/|[a-z_]+\.py)\s", block, re.M)}


def test_architecture_md_maps_every_floor():
    declared, _ = layers.floors()
    assert set(declared) <= _architecture_map()


@pytest.mark.parametrize("path", sorted((ROOT / "mlx_slm").glob("*.py")) + sorted((ROOT / "mlx_slm").glob("*/")))
def test_every_floor_says_what_it_may_import(path):
    name = path.stem if path.suffix == ".py" else path.name
    if name in ("__init__", "__main__", "__pycache__"):
        return
    declared, _ = layers.floors()
    assert name in declared, f"{name}: its docstring needs a line 'May import: ...' (tools/layers.py reads it)"


def test_the_size_check_names_an_oversized_function(tmp_path):
    body = "def long():\n" + "    x = 1\n" * 90 + "\n\ndef short():\n    return 1\n"
    pkg = _write(tmp_path, {"__init__.py": "", "ground/errors.py": body})
    assert layers.oversized(pkg) == ["mlx_slm/ground/errors.py:1: long is 91 lines (limit 90)"]


def test_layers_counts_the_branches_on_the_kind(tmp_path):
    """tools/layers.py reports the conditions that branch on the kind outside kinds/."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import layers

    pkg = tmp_path / "mlx_slm"
    (pkg / "kinds").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kinds" / "__init__.py").write_text("def f(x):\n    if x.questions:\n        return 1\n")
    (pkg / "job.py").write_text(
        "def f(clf, t):\n    if clf.questions is not None:\n        return 1\n"
        "    y = 2 if t.head is None else 3\n    if t.kind.name == 'head':\n        return y\n"
        "    if t.size > 3:\n        return 0\n"
    )
    found = layers.kind_branches(pkg)
    assert [f.split(": ", 1)[0] for f in found] == ["mlx_slm/job.py:2", "mlx_slm/job.py:4", "mlx_slm/job.py:5"]
