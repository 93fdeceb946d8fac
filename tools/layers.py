"""The floors of mlx_slm, read from its folders, and a check that every import runs down them.

Each floor is a folder of `mlx_slm/` (or a module beside them, like `ray.py`), and its
`__init__.py` docstring (a module's own docstring) says what it owns and, in one line,
what it may import:

    May import: ground, text, models.

That line is the one source of truth: this checker reads it, and a folder may import only
itself and the floors it names ("nothing" for the ground floor). The floors' order is what
those lines imply (a floor sits above everything it may import); a line that would let two
floors import each other is refused. Inside one folder the module-level imports must not form
a cycle, so every folder has a loading order too (a lazy import inside a function, like
`models/base.py` asking the package's registry for an architecture, may point back).

What counts as an import: every `import`/`from ... import` of an mlx_slm module in the source,
at module level or inside a function (a lazy import is still a dependency), except those under
`if TYPE_CHECKING:` (type hints only; nothing is loaded). The package root
(`mlx_slm/__init__.py`) holds the public names: it loads `ground.blas` first, and the public
names lazily by name, so it may import anything and nothing may import it.

It also holds the rooms' sizes (no file over 800 lines, no class over 300, no function over
90) and counts the conditions that branch on the scoring kind outside the kinds' own modules
(`kind_branches`): a report, not a failure; ARCHITECTURE.md names the few that are left.

Usage: python tools/layers.py [-v]  # prints the floors bottom to top, then every import that runs up,
                                    # every cycle, every oversized room; exit 1 if any; -v lists the
                                    # branches on the kind
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mlx_slm"
MAY = re.compile(r"^\s*May import:\s*(.+?)\.?\s*$", re.MULTILINE)
ROOT = "(root)"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """`mlx_slm/files/output/writers.py` -> "files.output.writers"; the package root is ""."""
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def floor_of(module: str) -> str:
    """The floor a module sits on: its top folder, or itself beside them; the root is ROOT."""
    return module.split(".")[0] if module else ROOT


def floors(package: Path = PACKAGE) -> tuple[dict[str, set[str]], list[str]]:
    """({floor: the floors it may import}, problems): each floor's "May import:" line, read from
    its folder's `__init__.py` docstring (or a module's own)."""
    declared: dict[str, set[str]] = {}
    problems: list[str] = []
    for path in sorted(package.iterdir()):
        if path.name.startswith((".", "__")) or path.name == "__pycache__":
            continue
        init = path / "__init__.py" if path.is_dir() else path
        if path.is_dir() and not init.is_file():
            continue
        if path.is_file() and path.suffix != ".py":
            continue
        name = path.stem if path.is_file() else path.name
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        m = MAY.search(doc)
        if m is None:
            problems.append(
                f"mlx_slm/{init.relative_to(package)}: its docstring says nothing of what it may import: "
                "add a line 'May import: ground, text.' (or 'May import: nothing.')"
            )
            continue
        words = m.group(1).strip()
        declared[name] = set() if words == "nothing" else {w.strip() for w in words.split(",") if w.strip()}
    for name, allowed in declared.items():
        for other in sorted(allowed - set(declared)):
            problems.append(f"{name}: 'May import' names {other!r}, which is no floor of mlx_slm")
    return declared, problems


def order(declared: dict[str, set[str]]) -> tuple[list[list[str]], list[str]]:
    """(the floors bottom to top, several where they stand side by side; problems): a floor sits
    above every floor it may import. Two floors that may reach each other are a problem."""
    level: dict[str, int] = {}
    problems: list[str] = []

    def depth(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            problems.append(f"floors that may import each other: {' -> '.join(path[path.index(name) :] + (name,))}")
            return 0
        if name not in level:
            below = [depth(d, path + (name,)) for d in declared.get(name, ()) if d in declared]
            level[name] = 1 + max(below, default=-1)
        return level[name]

    for name in sorted(declared):
        depth(name, ())
    tiers: dict[int, list[str]] = defaultdict(list)
    for name, lv in level.items():
        tiers[lv].append(name)
    return [sorted(tiers[k]) for k in sorted(tiers)], list(dict.fromkeys(problems))


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Ids of import nodes under `if TYPE_CHECKING:`."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip |= {id(n) for n in ast.walk(sub)}
    return skip


def imports_of(path: Path, package_dir: Path = PACKAGE) -> list[tuple[str, int, bool]]:
    """(imported mlx_slm module, line, at module level) for each runtime import in `path`."""
    return [(t, line, where == "top") for t, line, where in all_imports(path, package_dir) if where != "typing"]


def all_imports(path: Path, package_dir: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """(imported mlx_slm module, line, where) for every import in `path`: where is "top" (module
    level), "lazy" (inside a function) or "typing" (under `if TYPE_CHECKING:`)."""
    me = module_name(path, package_dir)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    package = [p for p in package if p]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                stem = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "mlx_slm" or node.module.startswith("mlx_slm.")):
                stem = node.module.removeprefix("mlx_slm").lstrip(".")
            else:
                continue
            # `from . import x` may name a module or a name in the package's __init__
            for a in node.names:
                sub = f"{stem}.{a.name}" if stem else a.name
                names.append(sub if _is_module(sub, package_dir) else stem)
        elif isinstance(node, ast.Import):
            names = [a.name.removeprefix("mlx_slm.") for a in node.names if a.name.startswith("mlx_slm.")]
        where = "typing" if id(node) in skip else "top" if id(node) in top else "lazy"
        out += [(n, node.lineno, where) for n in names]
    return out


def _is_module(name: str, package_dir: Path) -> bool:
    p = package_dir.joinpath(*name.split(".")) if name else package_dir
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def check(package: Path = PACKAGE) -> list[str]:
    """Each problem in a line: a floor without its 'May import' line, floors that may import each
    other, an import that runs up (to a floor its own does not name), a cycle."""
    declared, problems = floors(package)
    problems += order(declared)[1]
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(package.rglob("*.py")):
        me = module_name(path, package)
        a = floor_of(me)
        if a != ROOT and a not in declared:
            continue  # named above: no 'May import' line
        for target, line, where in all_imports(path, package):
            if target == me:
                continue
            if where != "lazy":  # a type hint's import is a circle too: the two modules know each other
                edges[me].add(target)
            if where == "typing" or a == ROOT:  # loads nothing; the root reaches the public names by name
                continue
            b = floor_of(target)
            if b == ROOT:
                problems.append(
                    f"mlx_slm/{path.relative_to(package)}:{line}: {me} imports the package root, which holds the "
                    "public names and may import anything: import what it needs from its floor instead"
                )
            elif a != b and b not in declared.get(a, set()):
                problems.append(
                    f"mlx_slm/{path.relative_to(package)}:{line}: {me} ({a}) imports {target} ({b}), which "
                    f"{a}'s 'May import' line does not name: pass what it needs down instead"
                )
    problems = list(dict.fromkeys(problems))  # one line per import statement
    problems += [f"import cycle: {' -> '.join(c)}" for c in _cycles(edges)]
    return problems


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


# How big a room may grow before it holds several households (issue 27's limits).
MAX_FILE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 800, 300, 90


def oversized(package: Path = PACKAGE) -> list[str]:
    """Each file, class or function over its limit, with its size."""
    out = []
    for path in sorted(package.rglob("*.py")):
        src = path.read_text(encoding="utf-8")
        where = f"mlx_slm/{path.relative_to(package)}"
        if len(src.splitlines()) > MAX_FILE_LINES:
            out.append(f"{where}: {len(src.splitlines())} lines (limit {MAX_FILE_LINES})")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                n = node.end_lineno - node.lineno + 1
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                if n > limit:
                    out.append(f"{where}:{node.lineno}: {node.name} is {n} lines (limit {limit})")
    return out


# Branches on the scoring kind (issue 34): a condition that reads which kind a task is (its
# questions, plan, learned head or heads, features-only flag, the estimator's method, or a mode
# compared with a kind's name) outside the kinds' own modules, which are where that belongs.
KIND_OWN = (
    "kinds/",
    *("text/questions.py", "text/branches.py", "text/answers.py", "text/heads.py", "text/labels.py"),
    "text/seqcls.py",  # the kinds' pure pieces
    *(
        "weights/adapters.py",
        "weights/finetune.py",
        "weights/adapted.py",
        "weights/head_starts.py",
        "weights/export.py",
    ),
    "models/",
)
KIND_NAMES = {"questions", "question", "plan", "head", "heads", "features_only"}
KIND_WORDS = {"head", "questions", "features", "seqcls", "rerank", "finetune"}


def _operands(test: ast.AST) -> list[ast.AST]:
    """The values a condition tests: itself, the parts of `and`/`or`/`not`, the sides of a comparison."""
    if isinstance(test, ast.BoolOp):
        return [x for v in test.values for x in _operands(v)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _operands(test.operand)
    if isinstance(test, ast.Compare):
        return [test, test.left, *test.comparators]
    return [test]


def _reads_kind(test: ast.AST) -> bool:
    for n in _operands(test):
        if isinstance(n, ast.Name) and n.id in KIND_NAMES:
            return True
        if isinstance(n, ast.Attribute) and n.attr in KIND_NAMES:
            return True
        if isinstance(n, ast.Compare) and any(
            isinstance(c, ast.Constant) and c.value in KIND_WORDS for c in [n.left, *n.comparators]
        ):
            return True
    return False


def kind_branches(package: Path = PACKAGE) -> list[str]:
    """Each condition (if, conditional expression, comprehension filter) that branches on the
    scoring kind outside the kinds' own modules (`KIND_OWN`): "file:line: condition"."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith(KIND_OWN):
            continue
        found = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []
            tests += node.ifs if isinstance(node, ast.comprehension) else []
            found += [(t.lineno, ast.unparse(t)[:90]) for t in tests if _reads_kind(t)]
        out += [f"mlx_slm/{rel}:{line}: {text}" for line, text in sorted(found)]
    return out


# The rule for an import inside a function (ARCHITECTURE.md): it says why on its line, after
# `# lazy:` (an optional extra, a heavy library only some paths need, a cycle it breaks).
LAZY_REASON = re.compile(r"#.*\blazy:\s*\S")


def lazy_imports(package: Path = PACKAGE) -> tuple[list[str], list[str]]:
    """(every import inside a function, those of them without a `# lazy: why` comment on one of
    the statement's lines), each as "file:line: the statement"."""
    every, silent = [], []
    for path in sorted(package.rglob("*.py")):
        src = path.read_text(encoding="utf-8")
        lines = src.splitlines()
        seen: set[int] = set()
        for fn in ast.walk(ast.parse(src)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                    seen.add(id(node))
                    where = f"mlx_slm/{path.relative_to(package).as_posix()}:{node.lineno}: {ast.unparse(node)}"
                    every.append(where)
                    if not any(LAZY_REASON.search(ln) for ln in lines[node.lineno - 1 : node.end_lineno]):
                        silent.append(where)
    return sorted(every), sorted(silent)


def main() -> int:
    declared, _ = floors()
    tiers, _ = order(declared)
    for i, tier in enumerate(tiers):
        print(f"floor {i}: {', '.join(tier)}", file=sys.stderr)
    problems = check() + oversized()
    for p in problems:
        print(p)
    n = sum(1 for _ in PACKAGE.rglob("*.py"))
    print(f"{n} modules on {len(tiers)} floors: {len(problems)} problem(s)", file=sys.stderr)
    branches = kind_branches()
    if "-v" in sys.argv[1:]:
        print("\n".join(branches))
    print(f"{len(branches)} branch(es) on the scoring kind outside kinds/ (-v lists them)", file=sys.stderr)
    every, silent = lazy_imports()
    if "-v" in sys.argv[1:]:
        print("\n".join(f"no '# lazy:' reason: {s}" for s in silent))
    print(
        f"{len(every)} import(s) inside functions, {len(silent)} without a '# lazy:' reason (-v lists them)",
        file=sys.stderr,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
