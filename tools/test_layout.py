"""The tests mirror the code: a check of where each test file sits.

The tests of `mlx_slm/<folder>/<module>.py` are in `tests/<folder>/test_<module>.py`, those of
a package's own `__init__.py` in `tests/<folder>/test_init.py` (`mlx_slm/ray.py` ->
`tests/test_ray.py`, `mlx_slm/kinds/__init__.py` -> `tests/kinds/test_init.py`). The tools and
the benchmarks are mirrored the same way under `tests/tools/` and `tests/benchmarks/`
(`tools/layers.py` -> `tests/tools/test_layers.py`). The one other home is the suites' folder,
`tests/suites/`: end-to-end suites that cross modules (real-weight parity, fuzzing, the manual,
third-party clients, soak); its `__init__.py` says what belongs there, and lists the modules
exempt from having a test file (trivial ones: a `__main__`, an `__init__` that only re-exports).

A test file conforms when it is a module's home or lives in the suites' folder. The check
fails (exit 1) when:
- fewer than 80 % of the test files conform;
- a test file is named for a review round or an issue (test_round8_..., test_issue33_...):
  a file is named for what it tests, the round stays in its docstring;
- a module of mlx_slm has no test file and is not exempt;
- an exemption names no module, or a module with a function or class of its own (no longer
  trivial: it needs its tests).

Usage: python tools/test_layout.py [-v]  # the share of conforming test files, the files that do
                                         # not conform, the modules without a test file; -v also
                                         # lists every test file with the module it mirrors
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each mirrored tree of the repository, and its folder under tests/.
TREES = {"mlx_slm": "", "tools": "tools", "benchmarks": "benchmarks"}
SUITES = "suites"
SHARE = 0.8
NUMBER = r"(\d+|one|two|three|four|five|six|seven|eight|nine|ten)"
ROUND = re.compile(rf"(^|_)(round|issue|r)_?{NUMBER}(_|$)", re.IGNORECASE)  # test_round8_jobs, test_issue_33
EXEMPT = re.compile(r"^Exempt\b(?s:.*?):[ \t]*\n((?:[ \t]+\S[^\n]*\n?)+)", re.MULTILINE)


def home(module: Path) -> Path:
    """The test file of a module (both relative to the repository): `mlx_slm/text/labels.py` ->
    `tests/text/test_labels.py`, `mlx_slm/kinds/__init__.py` -> `tests/kinds/test_init.py`."""
    tree, *parts = module.parts
    folder = Path("tests", TREES[tree], *parts[:-1])
    stem = Path(parts[-1]).stem
    return folder / f"test_{'init' if stem == '__init__' else stem}.py"


def modules(root: Path = ROOT, tree: str = "mlx_slm") -> list[Path]:
    """Every module of a tree (relative to `root`), `__init__.py` included."""
    base = root / tree
    if not base.is_dir():
        return []
    return sorted(
        p.relative_to(root)
        for p in base.rglob("*.py")
        if "__pycache__" not in p.parts
        and not any(part.startswith(".") for part in p.relative_to(base).parts)
        and (tree == "mlx_slm" or p.parent == base)  # tools/ and benchmarks/: their own files, not data folders
    )


def test_files(root: Path = ROOT) -> list[Path]:
    """Every test file under tests/ (relative to `root`)."""
    return sorted(p.relative_to(root) for p in (root / "tests").rglob("test_*.py") if "__pycache__" not in p.parts)


def exemptions(root: Path = ROOT) -> tuple[set[Path], list[str]]:
    """(the modules exempt from a test file, problems): the paths listed under a line that starts
    "Exempt" in the suites' `__init__.py` docstring; an exempt module must define no function or
    class."""
    init = root / "tests" / SUITES / "__init__.py"
    if not init.is_file():
        return set(), []
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    listed = {Path(p) for block in EXEMPT.findall(doc) for p in re.findall(r"mlx_slm/[\w/]+\.py", block)}
    problems = []
    for path in sorted(listed):
        if not (root / path).is_file():
            problems.append(f"{path}: exempt from a test file in tests/{SUITES}/__init__.py, but no such module")
            continue
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        defs = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        if defs:
            problems.append(f"{path}: exempt from a test file, but defines {', '.join(defs)}: it needs its tests")
    return listed, problems


@dataclass
class Layout:
    tests: list[Path] = field(default_factory=list)
    mirrors: dict[Path, Path] = field(default_factory=dict)  # test file -> the module it mirrors
    suites: list[Path] = field(default_factory=list)
    not_conforming: list[Path] = field(default_factory=list)
    round_named: list[Path] = field(default_factory=list)
    missing: list[Path] = field(default_factory=list)  # modules without a test file
    exempt: set[Path] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)  # exemptions that do not hold

    @property
    def share(self) -> float:
        return (len(self.mirrors) + len(self.suites)) / len(self.tests) if self.tests else 1.0

    @property
    def ok(self) -> bool:
        return self.share >= SHARE and not self.round_named and not self.missing and not self.problems


def layout(root: Path = ROOT) -> Layout:
    homes = {home(m): m for tree in TREES for m in modules(root, tree)}
    out = Layout(tests=test_files(root))
    out.exempt, out.problems = exemptions(root)
    for t in out.tests:
        if t in homes:
            out.mirrors[t] = homes[t]
        elif t.parts[:2] == ("tests", SUITES):
            out.suites.append(t)
        else:
            out.not_conforming.append(t)
        if ROUND.search(t.stem.removeprefix("test_")):
            out.round_named.append(t)
    have = set(out.tests)
    out.missing = [m for m in modules(root) if home(m) not in have and m not in out.exempt]
    return out


def why(test: Path, lay: Layout) -> str:
    """Why a test file does not conform: an aspect of a module beside its home, or no module at all."""
    stem = test.stem.removeprefix("test_")
    homes = {t.parent / t.stem.removeprefix("test_") for t in lay.mirrors}
    for i in range(stem.count("_"), 0, -1):
        head = stem.rsplit("_", i)[0]
        if test.parent / head in homes:
            return f"one aspect of the module whose tests are in {test.parent / ('test_' + head + '.py')}"
    return f"no module {stem} in its folder's mirror"


def main(argv: list[str]) -> int:
    lay = layout()
    if "-v" in argv:
        for t, m in sorted(lay.mirrors.items()):
            print(f"{t}  <-  {m}")
        for t in lay.suites:
            print(f"{t}  (suite)")
    for t in lay.not_conforming:
        print(f"not conforming: {t} ({why(t, lay)})")
    for t in lay.round_named:
        print(f"named for a round or an issue: {t}")
    for m in lay.missing:
        print(f"no test file: {m} (expected {home(m)})")
    for p in lay.problems:
        print(p)
    conforming = len(lay.mirrors) + len(lay.suites)
    print(
        f"{conforming}/{len(lay.tests)} test files conform ({lay.share:.0%}, at least {SHARE:.0%}): "
        f"{len(lay.mirrors)} mirror a module, {len(lay.suites)} in tests/{SUITES}/; "
        f"{len(lay.missing)} module(s) without a test file ({len(lay.exempt)} exempt)",
        file=sys.stderr,
    )
    return 0 if lay.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
