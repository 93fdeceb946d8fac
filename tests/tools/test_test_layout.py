"""The tests mirror the code: `tools/test_layout.py` on the real tree (at least 80 % of the test files
mirror a module or sit in tests/suites/, none is named for a round or an issue, every module of
mlx_slm has a test file or a documented exemption), and on toy trees, where it is shown to find each
break."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("mlx_slm_test_layout", ROOT / "tools" / "test_layout.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


layout = _tool()


def test_the_tests_mirror_the_code():
    lay = layout.layout()
    assert lay.round_named == [], lay.round_named
    assert lay.missing == [], f"modules without a test file: {[str(m) for m in lay.missing]}"
    assert lay.problems == [], lay.problems
    assert lay.share >= layout.SHARE, f"{lay.share:.0%} of the test files conform: {lay.not_conforming}"
    assert lay.ok


def test_the_command_says_so_and_exits_0():
    r = subprocess.run([sys.executable, "tools/test_layout.py"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test files conform" in r.stderr and "0 module(s) without a test file" in r.stderr


def _tree(root: Path, files: list[str], suites_doc: str = "") -> Path:
    for name in files:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("def f():\n    pass\n" if name.endswith("defs.py") else "")
    if suites_doc:
        (root / "tests" / "suites").mkdir(parents=True, exist_ok=True)
        (root / "tests" / "suites" / "__init__.py").write_text(f'"""{suites_doc}"""\n')
    return root


def test_a_module_is_mirrored_by_its_folder_and_name(tmp_path):
    assert layout.home(Path("mlx_slm/text/labels.py")) == Path("tests/text/test_labels.py")
    assert layout.home(Path("mlx_slm/kinds/__init__.py")) == Path("tests/kinds/test_init.py")
    assert layout.home(Path("mlx_slm/__init__.py")) == Path("tests/test_init.py")
    assert layout.home(Path("mlx_slm/ray.py")) == Path("tests/test_ray.py")
    assert layout.home(Path("tools/layers.py")) == Path("tests/tools/test_layers.py")
    assert layout.home(Path("benchmarks/soak.py")) == Path("tests/benchmarks/test_soak.py")


def test_the_checker_finds_a_round_a_stray_file_and_a_module_without_tests(tmp_path):
    root = _tree(
        tmp_path,
        [
            "mlx_slm/__init__.py",
            "mlx_slm/text/__init__.py",
            "mlx_slm/text/labels.py",
            "mlx_slm/text/batching.py",
            "tests/test_init.py",
            "tests/text/test_labels.py",
            "tests/text/test_labels_trie.py",
            "tests/text/test_round8_text.py",
            "tests/suites/test_fuzz.py",
        ],  # fmt: skip
        suites_doc="Suites.\n\nExempt (re-exports only):\n    mlx_slm/text/__init__.py\n",
    )
    lay = layout.layout(root)
    assert lay.round_named == [Path("tests/text/test_round8_text.py")]
    assert lay.missing == [Path("mlx_slm/text/batching.py")]
    assert lay.exempt == {Path("mlx_slm/text/__init__.py")} and lay.problems == []
    assert lay.suites == [Path("tests/suites/test_fuzz.py")]
    assert lay.not_conforming == [Path("tests/text/test_labels_trie.py"), Path("tests/text/test_round8_text.py")]
    assert lay.share == 3 / 5 and not lay.ok
    assert "one aspect of the module whose tests are in tests/text/test_labels.py" in layout.why(
        Path("tests/text/test_labels_trie.py"), lay
    )


def test_an_exemption_must_name_a_trivial_module(tmp_path):
    root = _tree(
        tmp_path,
        ["mlx_slm/__init__.py", "mlx_slm/text/__init__.py", "mlx_slm/text/defs.py", "tests/test_init.py"],
        suites_doc="Suites.\n\nExempt:\n    mlx_slm/text/__init__.py\n    mlx_slm/text/defs.py\n    mlx_slm/gone.py\n",
    )
    lay = layout.layout(root)
    assert any("mlx_slm/text/defs.py: exempt from a test file, but defines f" in p for p in lay.problems)
    assert any("mlx_slm/gone.py" in p and "no such module" in p for p in lay.problems)
    assert lay.missing == [] and not lay.ok  # exempt, but the exemption does not hold


def test_names_of_rounds_and_issues_are_found_and_words_that_hold_them_are_not():
    for stem in ("round7_jobs", "round8", "issue33", "jobs_round_7", "r8_server", "hostile_round_seven"):
        assert layout.ROUND.search(stem), stem
    for stem in ("rounding", "surround", "issues_file", "prefix_cache", "readers", "r_squared", "qwen2"):
        assert not layout.ROUND.search(stem), stem
