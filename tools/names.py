"""Names that resolve: every code name the words of the house give -- a docstring or comment in
mlx_slm/ or tools/, a docs/ page, README.md, ARCHITECTURE.md -- names a module, file, function,
class or attribute that exists now (issue 48, point 8). A rename that leaves `io.read_rows` in a
docstring is found, with the file and line, instead of sending the next reader looking
(tests/tools/test_names.py fails on it).

What counts as a code name (strict where the words look like code, silent on prose):
- a dotted path `mlx_slm.a.b`, anywhere;
- a file `x.py` or `folder/x.py` (a line number after it allowed): some file under mlx_slm/,
  tests/, tools/, benchmarks/ or the root ends with that path;
- a dotted name `a.b.c` in a docstring or comment, or inside backticks on a page: `a` is a
  module of the package (by its last parts: `records`, `output.writers`, `text.records`; a plain
  module's own names, a folder's public ones), a class or function defined in it
  (`Classifier.load`), Python's builtins or standard library (imported and checked: `io.read_rows`
  fails), `self` inside a class (its attributes), a file of tests/, tools/ or benchmarks/
  (`conftest.make_tiny`), or a name some code binds (a variable: `clf.run` is not checked
  further, unless its name is a module's one letter off: `job.classify`). A first part that is
  none of these is a module that is gone. Other libraries (`mx.`, `np.`, `torch.`, ...), data
  keys (`score.weight`) and prose (`e.g.`) are skipped by name (`FOREIGN`, `NOT_CODE`, `PROSE`);
- a bare `CamelCase` or `snake_case` name in backticks: some name the package binds, or a word of
  its strings (a field, an option), or another library's (`FOREIGN_NAMES`, `FOREIGN_WORDS`);
- on a page, the Python examples' imports from mlx_slm and the attributes they use of its
  classes: `clf = Classifier.load(...)` makes `clf.classify_frame` mean
  `Classifier.classify_frame`, there and in the prose after it.

The package is read, not imported (ast): no model, no MLX, a few seconds. The attributes of a
class are its methods, its class-level names and annotations, the `self.x` it assigns and those
of its bases; past a value whose type the source does not say, the rest of a path is not checked.

Usage: python tools/names.py  # every name that does not resolve, with its file and line; exit 1 if any
"""

from __future__ import annotations

import ast
import builtins
import importlib
import io
import re
import sys
import tokenize
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mlx_slm"
CODE_DIRS = ("mlx_slm", "tests", "tools", "benchmarks")
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]

# Other libraries' names, by the first part of a dotted name (their modules and usual aliases):
# not checked here. The standard library is not listed: it is imported and checked.
FOREIGN = {
    *("mx", "mlx", "nn", "optim", "np", "numpy", "torch", "F", "transformers", "tokenizers", "hf_hub"),
    *("huggingface_hub", "safetensors", "gguf", "jinja2", "click", "mlx_lm", "pd", "pandas", "pa", "pq"),
    *("pyarrow", "ray", "sklearn", "scipy", "starlette", "uvicorn", "httpx", "zstandard", "zstd", "tqdm"),
    *("sentence_transformers", "accelerate", "pytest", "hypothesis", "cohere", "openai", "typesafe_sdk"),
    *("jevcompat", "matplotlib", "plt", "llama_cpp", "fastapi", "pydantic", "requests", "psutil", "ruff"),
    *("setuptools", "pip", "uv", "brew", "git", "github", "huggingface", "hf", "HF_HOME", "Qwen", "SmolLM2"),
    *("joblib", "backports", "compression"),  # compression.zstd: Python 3.14's, backports.zstd before it
}
# Other libraries' classes a bare `CamelCase` name may mean.
FOREIGN_NAMES = {
    *("DataFrame", "Series", "Dataset", "ActorPoolStrategy", "BaseEstimator", "ClassifierMixin", "Pipeline"),
    *("GridSearchCV", "LogisticRegression", "AutoTokenizer", "AutoModel", "AutoModelForCausalLM", "Starlette"),
    *("AutoModelForSequenceClassification", "SentenceTransformer", "PreTrainedTokenizer", "TokenizerWrapper"),
    *("CrossEncoder", "JSONResponse", "Request", "Response", "StreamingResponse", "CliRunner", "Context"),
    *("BatchEncoding", "ThreadPoolExecutor", "ProcessPoolExecutor", "KeyboardInterrupt", "SIGTERM", "SIGINT"),
    *("GGUF", "BLAS", "CBLAS", "OpenBLAS", "LoRA", "DoRA", "RoPE", "KV", "LRU", "JSONL", "CSV", "TSV", "UTF"),
    *("Qwen2ForSequenceClassification", "GenericForSequenceClassification", "Qwen3Model", "LlamaModel"),
    *("Gemma3TextModel", "Transformer", "BatchKVCache", "BadRequestError", "DecisionsToolRunner"),
    *("Literal", "UnprocessableEntityError", "NotFittedError"),
}
# Other projects' snake_case names in backticks (Transformers', pandas', mlx-lm's architectures)
# and a misspelling quoted on purpose.
FOREIGN_WORDS = {"mark_control_tokens", "raise_exception", "to_csv", "ernie4_5", "seed_oss", "qwen2_moe"}
FOREIGN_WORDS |= {"min_confidance"}
# Other projects' files named in the words (Transformers' modelling code, llama.cpp's converter).
FOREIGN_FILES = {"modeling_gemma3.py", "convert_hf_to_gguf.py", "confidence_metrics.py"}
# Dotted names that are not code: keys in a checkpoint, a GGUF header or a saved config, fields of
# a JSON answer or of another API's client, a file's name pattern, maths. A name equal to one of
# these, or under it (`usage.prompt_tokens`), is skipped.
NOT_CODE = {
    *("score.weight", "score.bias", "general.architecture", "mlx_slm.prompt", "mlx_slm.none", "W.T"),
    *("team", "mood", "usage", "input_tokens_details", "response_format", "structured_outputs", "client"),
    *("decisions.create", "intents", "OUT"),
}
# Prose that looks dotted: abbreviations and such.
PROSE = {"e.g", "i.e", "etc", "vs", "cf", "approx", "a.k.a", "llama.cpp"}


# -- the package, read ---------------------------------------------------------------------------


@dataclass
class Symbol:
    """A name a module binds: "module", "class", "function", "import" (of mlx_slm: then `target`),
    "foreign" (an import of another library) or "value"."""

    kind: str
    module: str
    target: str = ""  # for an import: "module" or "module.name"
    attrs: set[str] = field(default_factory=set)  # for a class: its own attributes
    bases: list[str] = field(default_factory=list)  # for a class: its bases as written
    returns: dict[str, str] = field(default_factory=dict)  # for a class: its methods' return types


@dataclass(eq=False)
class Package:
    modules: dict[str, dict[str, Symbol]]  # "text.records" -> {name: Symbol}
    packages: set[str]  # modules that are folders (`__init__.py`)
    exports: dict[str, set[str]]  # a module's `__all__`: the names it re-exports on purpose
    classes: dict[str, list[Symbol]]  # class name -> every class of that name
    defined: set[str]  # every name defined at any level (classes, functions, top-level values)
    bound: set[str]  # every name any code binds: parameters, locals, attributes, imports
    attributes: set[str]  # every attribute of every class
    words: set[str]  # every word of the package's string constants (field names, options, keys)
    files: list[str]  # every .py file of the repository, as a posix path from the root


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve_from(me: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute mlx_slm module (without "mlx_slm.") an ImportFrom names, or "" when foreign."""
    if node.level:
        base = me.split(".") if is_package else me.split(".")[:-1]
        base = [p for p in base if p]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join(base + ([node.module] if node.module else [])) or "."
    if node.module and (node.module == "mlx_slm" or node.module.startswith("mlx_slm.")):
        return node.module.removeprefix("mlx_slm").lstrip(".") or "."
    return ""


def _class_symbol(module: str, node: ast.ClassDef) -> Symbol:
    attrs: set[str] = set()
    returns: dict[str, str] = {}
    for sub in node.body:
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.returns is not None:
            returns[sub.name] = ast.unparse(sub.returns).strip("'\"")
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            attrs.add(sub.name)
        elif isinstance(sub, ast.Assign):
            attrs |= {n.id for t in sub.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)) and isinstance(sub.target, ast.Name):
            attrs.add(sub.target.id)
    for sub in ast.walk(node):  # self.x = ..., object.__setattr__(self, "x", ...), __slots__
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"):
            if isinstance(sub.ctx, ast.Store):
                attrs.add(sub.attr)
        elif isinstance(sub, ast.Call) and ast.unparse(sub.func).endswith("__setattr__") and len(sub.args) >= 2:
            if isinstance(sub.args[1], ast.Constant) and isinstance(sub.args[1].value, str):
                attrs.add(sub.args[1].value)
    return Symbol("class", module, attrs=attrs, bases=[ast.unparse(b) for b in node.bases], returns=returns)


@cache
def _parsed(path: Path) -> tuple[str, ast.Module, list[ast.AST]]:
    """A file's source, its tree and every node of it (walked once)."""
    src = path.read_text(encoding="utf-8")
    tree = ast.parse(src)
    return src, tree, list(ast.walk(tree))


def _bound_names(nodes: list[ast.AST]) -> set[str]:
    out: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
    return out


@cache
def package() -> Package:
    modules: dict[str, dict[str, Symbol]] = {}
    packages: set[str] = set()
    exports: dict[str, set[str]] = {}
    classes: dict[str, list[Symbol]] = defaultdict(list)
    defined: set[str] = set()
    bound: set[str] = set()
    words: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        me = module_name(path)
        is_package = path.name == "__init__.py"
        if is_package:
            packages.add(me)
        _, tree, nodes = _parsed(path)
        bound |= _bound_names(nodes)
        words |= {
            w for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str) for w in WORD.findall(n.value)
        }
        names: dict[str, Symbol] = {}
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                sym = _class_symbol(me, node)
                classes[node.name].append(sym)
                defined.add(node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(node.name)
        for node in _module_level(tree.body):
            if isinstance(node, ast.ClassDef):
                names[node.name] = [s for s in classes[node.name] if s.module == me][-1]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names[node.name] = Symbol("function", me)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                if ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target) == "__all__":
                    exports[me] = {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)}
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            names.setdefault(n.id, Symbol("value", me))
                            defined.add(n.id)
            elif isinstance(node, ast.ImportFrom):
                src = _resolve_from(me, is_package, node)
                for a in node.names:
                    if src:
                        sub = a.name if src == "." else f"{src}.{a.name}"
                        names[a.asname or a.name] = Symbol("import", me, target=sub)
                    else:
                        names[a.asname or a.name] = Symbol("foreign", me)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("mlx_slm."):
                        names[a.asname or a.name.split(".")[0]] = Symbol("import", me, target=a.name[8:])
                    else:
                        names[a.asname or a.name.split(".")[0]] = Symbol("foreign", me)
        if me == "":  # the root's public names, imported on first use (`_HOMES`)
            homes = next(
                n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_HOMES"
            )
            for k, v in zip(homes.keys, homes.values):
                names[k.value] = Symbol("import", me, target=f"{v.value}.{k.value}")
        modules[me] = names
    for me in modules:  # a folder's modules are its attributes
        if "." in me or me:
            parent, _, leaf = me.rpartition(".")
            modules.setdefault(parent, {}).setdefault(leaf, Symbol("module", me, target=me))
    files = [
        p.relative_to(ROOT).as_posix()
        for d in CODE_DIRS
        for p in (ROOT / d).rglob("*.py")
        if "__pycache__" not in p.parts
    ] + [p.name for p in ROOT.glob("*.py")]
    attributes = {a for syms in classes.values() for s in syms for a in s.attrs}
    return Package(modules, packages, exports, classes, defined, bound, attributes, words, files)


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that bind module-level names, into `if`/`try` blocks (not functions)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out += _module_level(node.body) + _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            out += _module_level(node.body) + _module_level(node.orelse) + _module_level(node.finalbody)
            for h in node.handlers:
                out += _module_level(h.body)
    return out


# -- resolving one name --------------------------------------------------------------------------


def modules_named(first: list[str], pkg: Package) -> list[tuple[str, int]]:
    """The package's modules a dotted name's first parts may mean: (module, parts used), longest
    first. `records` -> text.records and files.output.records; `output.writers` ->
    files.output.writers; `mlx_slm.text` -> text; a floor's name -> that floor."""
    if first and first[0] == "mlx_slm":
        rest = first[1:]
        for k in range(len(rest), -1, -1):
            if ".".join(rest[:k]) in pkg.modules:
                return [(".".join(rest[:k]), k + 1)]
        return []
    out = []
    for k in range(len(first), 0, -1):
        want = ".".join(first[:k])
        out += [(m, k) for m in pkg.modules if m and (m == want or m.endswith("." + want))]
        if out:
            return out
    return out


def _attr_of_module(module: str, name: str, pkg: Package) -> Symbol | None:
    """The symbol `module.name` is. A plain module's imports do not count (`embeddings.Embedder`
    names where Embedder lives, and it does not live there), a folder's do (its public names)."""
    sym = pkg.modules.get(module, {}).get(name)
    if sym is None:
        return None
    if sym.kind == "import" and module not in pkg.packages and module and name not in pkg.exports.get(module, ()):
        return None
    return sym


def _follow(sym: Symbol, pkg: Package, depth: int = 0) -> Symbol | None:
    """An import's definition (a module, or a name in a module); other symbols are themselves."""
    if sym.kind != "import" or depth > 10:
        return sym
    if sym.target in pkg.modules:
        return Symbol("module", sym.target, target=sym.target)
    mod, _, name = sym.target.rpartition(".")
    nxt = pkg.modules.get(mod, {}).get(name)
    return None if nxt is None else _follow(nxt, pkg, depth + 1)


def class_has(sym: Symbol, attr: str, pkg: Package, seen: frozenset = frozenset()) -> bool:
    """Whether a class (or a base of it) has `attr`; a base from another library may have anything."""
    if attr in sym.attrs or attr.startswith("__"):
        return True
    for base in sym.bases:
        name = base.split("[")[0].split(".")[-1]
        if name in ("object", "Generic", "Protocol") or (name, sym.module) in seen:
            continue
        found = [c for c in pkg.classes.get(name, [])]
        if not found:
            return True  # a base from elsewhere (Exception, Enum, NamedTuple, a library's class)
        if any(class_has(c, attr, pkg, seen | {(name, sym.module)}) for c in found):
            return True
    return False


def _walk(sym: Symbol | None, rest: list[str], pkg: Package) -> bool:
    """Whether the attributes `rest` resolve from `sym`."""
    sym = _follow(sym, pkg) if sym is not None else None
    if sym is None:
        return False
    if not rest:
        return True
    if sym.kind == "module":
        return _walk(_attr_of_module(sym.target, rest[0], pkg), rest[1:], pkg)
    if sym.kind == "class":
        return class_has(sym, rest[0], pkg)  # past a class's attribute, the type is not known
    if sym.kind == "function":
        return rest[0].startswith("__")
    return True  # a value: its type is not read here


def resolve(name: str, pkg: Package | None = None, cls: str | None = None) -> str | None:
    """None when the dotted `name` (or file path) names something that exists, else why not.
    `cls` is the class a docstring or comment sits in (for `self.x`)."""
    pkg = pkg or package()
    name = name.rstrip("().:")
    if re.search(r"\.py(:\d+)?$", name) or "/" in name:
        return _file(re.sub(r":\d+$", "", name), pkg)
    parts = name.split(".")
    if any(name == k or name.startswith(k + ".") for k in NOT_CODE | PROSE) or parts[0] in FOREIGN | FOREIGN_NAMES:
        return None
    if parts[0] in REPO_DIRS:
        return _repo_module(parts, pkg)
    if parts[0] in ("self", "cls"):
        syms = pkg.classes.get(cls or "", [])
        if not syms or len(parts) < 2 or any(class_has(s, parts[1], pkg) for s in syms):
            return None
        return f"{cls} has no attribute {parts[1]}"
    mods = modules_named(parts, pkg)
    if mods:
        for module, used in mods:
            if _walk(Symbol("module", module, target=module), parts[used:], pkg):
                return None
        used = mods[0][1]
        if parts[0] != "mlx_slm" and parts[0] in pkg.bound and parts[used] in pkg.attributes:
            return None  # a variable named as a module is (`run.truncate`: a RunSettings's field)
        return f"{'.'.join(parts[:used])} ({', '.join(m or 'mlx_slm' for m, _ in mods)}) has no {parts[used]}"
    if parts[0] == "mlx_slm":
        return f"no module mlx_slm.{parts[1]}"
    if parts[0] in pkg.classes:
        syms = pkg.classes[parts[0]]
        if len(parts) < 2 or any(class_has(s, parts[1], pkg) for s in syms):
            return None
        return f"class {parts[0]} ({', '.join(s.module for s in syms)}) has no attribute {parts[1]}"
    tops = [
        m for m, names in pkg.modules.items() if parts[0] in names and names[parts[0]].kind not in ("import", "foreign")
    ]
    if tops:
        sym = pkg.modules[tops[0]][parts[0]]
        return None if _walk(sym, parts[1:], pkg) else f"{parts[0]} ({tops[0]}) has no {parts[1]}"
    std = _python(parts)
    if std is not None:
        return None if std else f"Python's {parts[0]} has no {'.'.join(parts[1:])}"
    if parts[0] in _repo_stems(pkg):
        return _repo_module(parts, pkg)
    if parts[0] in pkg.bound:
        return _near_module(parts, pkg)  # a variable, whose type is not known here, unless a module was meant
    return f"no module, class or name {parts[0]} in mlx_slm"


def _near_module(parts: list[str], pkg: Package) -> str | None:
    """A variable's name one letter off a module's, whose path resolves from that module, is the
    module's old name (`job.classify` for `jobs.classify`): why; else None."""
    first = parts[0]
    for near in (first + "s", first[:-1] if first.endswith("s") else ""):
        mods = modules_named([near, *parts[1:]], pkg) if near else []
        if any(_walk(Symbol("module", m, target=m), [near, *parts[1:]][k:], pkg) for m, k in mods):
            return f"no module {first} ({near}.{'.'.join(parts[1:])} is)"
    return None


REPO_DIRS = ("benchmarks", "tests", "tools")


def _file(path: str, pkg: Package) -> str | None:
    """A `x.py` or `folder/x.py` some file of the repository ends with (a folder, `kinds/`: not checked)."""
    if not path.endswith(".py") or path.rsplit("/", 1)[-1] in FOREIGN_FILES:
        return None
    if any(f == path or f.endswith("/" + path) for f in pkg.files):
        return None
    return f"no file {path} in {', '.join(CODE_DIRS)}"


@cache
def _repo_stems(pkg: Package) -> frozenset[str]:
    """The module names of tests/, tools/ and benchmarks/ files (`conftest`, `layers`, `harness`)."""
    return frozenset(Path(f).stem for f in pkg.files if f.startswith(REPO_DIRS) and not f.endswith("__init__.py"))


def _repo_module(parts: list[str], pkg: Package) -> str | None:
    """`benchmarks.rerank`, `tests.hostile`, `conftest.make_tiny`: a file of the repository and a
    name it defines at the top. A one-letter capital is a placeholder (`benchmarks.X`)."""
    if any(len(p) == 1 and p.isupper() for p in parts):
        return None
    if parts[0] in REPO_DIRS:
        for k in range(len(parts), 1, -1):
            f = "/".join(parts[:k]) + ".py"
            if f in pkg.files:
                path, rest = ROOT / f, parts[k:]
                break
        else:
            return f"no file {'/'.join(parts[:2])}.py"
    else:
        path = ROOT / next(f for f in pkg.files if f.startswith(REPO_DIRS) and Path(f).stem == parts[0])
        rest = parts[1:]
    if not rest:
        return None
    if rest[0] in _bound_names(_parsed(path)[2]):  # defined, imported or assigned at any level: lenient here
        return None
    return f"{path.relative_to(ROOT)} has no {rest[0]}"


def _python(parts: list[str]) -> bool | None:
    """Whether a path in Python's builtins or standard library resolves (None: neither)."""
    if hasattr(builtins, parts[0]):
        return _has_chain(getattr(builtins, parts[0]), parts[1:])
    if parts[0] not in sys.stdlib_module_names or parts[0] in ("antigravity", "this", "turtle", "tkinter"):
        return None  # not Python's, or a module that acts when imported (a browser, a print, a window)
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return None
    for i, p in enumerate(parts[1:], 1):
        if hasattr(obj, p):
            obj = getattr(obj, p)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ImportError:
            return False
    return True


def _has_chain(obj: object, rest: list[str]) -> bool:
    for p in rest:
        if not hasattr(obj, p):
            return False
        obj = getattr(obj, p)
    return True


def resolve_bare(name: str, pkg: Package | None = None) -> str | None:
    """None when a bare `CamelCase` or `snake_case` name is one the package binds (or a library's,
    or a module's, or a word of the package's strings: a field or option name), else why not."""
    pkg = pkg or package()
    name = name.removesuffix("()")
    if name in pkg.defined or name in pkg.bound or name in FOREIGN_NAMES | FOREIGN | FOREIGN_WORDS:
        return None
    if hasattr(builtins, name) or name in {m.rsplit(".", 1)[-1] for m in pkg.modules}:
        return None
    if name in pkg.words or name in _repo_names(pkg):
        return None
    return f"no class, function or name {name} in mlx_slm"


@cache
def _repo_names(pkg: Package) -> frozenset[str]:
    """Every name the tests' shared fixtures (conftest.py) and the tools bind (`tiny_arch`, `make_tiny`)."""
    shared = [f for f in pkg.files if f.startswith("tools/") or f.endswith("conftest.py")]
    return frozenset(n for f in shared for n in _bound_names(_parsed(ROOT / f)[2]))


# -- the words -----------------------------------------------------------------------------------

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
DOTTED = re.compile(rf"(?<![\w./:-])((?:{IDENT}/)*{IDENT}(?:\.{IDENT})+)(?:\(\))?(?::\d+)?(?![\w/-])")
PATHS = re.compile(rf"(?<![\w./:-])((?:[\w.-]+/)+{IDENT}\.py|{IDENT}\.py)(?::\d+)?(?![\w/])")
BARE = re.compile(r"`([A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*|[A-Z][a-z][a-z0-9]+|[a-z][a-z0-9]*_[a-z0-9_]*)(?:\(\))?`")
WORD = re.compile(r"\w+")
SPAN = re.compile(r"`([^`\n]+)`")
URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+|\b[\w.-]+\.(?:com|org|io|ai|co|dev|net)\b\S*")


@dataclass(frozen=True)
class Ref:
    where: str  # "path:line"
    name: str
    cls: str | None = None
    bare: bool = False


def names_in(text: str, code_only: bool) -> list[tuple[int, str, bool]]:
    """(line offset, name, bare) for each code name in `text`. `code_only`: a page's prose, where
    only backticked names, `mlx_slm.` paths and `.py` files count."""
    out: list[tuple[int, str, bool]] = []
    for i, line in enumerate(text.splitlines()):
        line = URL.sub(" ", line)
        chunks = SPAN.findall(line) if code_only else [line]
        for chunk in chunks:
            out += [(i, m, False) for m in DOTTED.findall(chunk)]
        if code_only:
            out += [(i, m, False) for m in re.findall(r"(?<![\w.])(mlx_slm(?:\.\w+)+)", SPAN.sub(" ", line))]
            out += [(i, m, False) for m in PATHS.findall(SPAN.sub(" ", line))]
        out += [(i, m, True) for m in BARE.findall(line)]
    return [(i, n, bare) for i, n, bare in out if _looks_like_code(n)]


ALIAS = re.compile(r"\b(?:(?<!from )(mlx_slm(?:\.\w+)*) as (\w+)|from (mlx_slm(?:\.\w+)*) import (\w+) as (\w+))")


def aliases(text: str) -> dict[str, str]:
    """The names an example binds to mlx_slm modules (`import mlx_slm.ray as mr`: mr -> mlx_slm.ray)."""
    out = {}
    for m in ALIAS.finditer(text):
        if m.group(1):
            out[m.group(2)] = m.group(1)
        else:
            out[m.group(5)] = f"{m.group(3)}.{m.group(4)}"
    return out


def _unalias(name: str, alias: dict[str, str]) -> str:
    first, dot, rest = name.partition(".")
    return alias[first] + dot + rest if first in alias else name


def _looks_like_code(name: str) -> bool:
    """A dotted name of code: not a file of data (`model.safetensors`), a version or a host."""
    if "/" in name and not name.endswith(".py"):
        return False
    last = name.rsplit(".", 1)[-1]
    if "." in name and last.lower() in {
        *("json", "jsonl", "csv", "tsv", "txt", "md", "parquet", "safetensors", "gguf", "bin", "yaml", "toml"),
        *("log", "sh", "html", "png", "svg", "lock", "cfg", "ini", "zst", "gz", "npy", "npz", "pt", "pth", "model"),
        "jinja",
    }:
        return False
    return True


def _docstring_nodes(tree: ast.Module):
    """(node, enclosing class name) for the module, each class and each function."""
    stack: list[tuple[ast.AST, str | None]] = [(tree, None)]
    while stack:
        node, cls = stack.pop()
        yield node, cls
        for sub in ast.iter_child_nodes(node):
            if isinstance(sub, ast.ClassDef):
                stack.append((sub, sub.name))
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stack.append((sub, cls))
            elif isinstance(sub, (ast.If, ast.Try, ast.With)):
                stack.append((sub, cls))


def _class_at(nodes: list[ast.AST]) -> dict[int, str]:
    """line -> the innermost class whose body holds it."""
    at: dict[int, str] = {}
    for node in nodes:
        if isinstance(node, ast.ClassDef):
            for ln in range(node.lineno, node.end_lineno + 1):
                at[ln] = node.name  # walk is outer first: the inner class wins
    return at


def refs_in_module(path: Path) -> list[Ref]:
    """A module's names: in its docstrings (the module's, each class's and function's) and its
    comments (a `noqa` code is no name), each with its line and the class it sits in."""
    src, tree, nodes = _parsed(path)
    rel = path.relative_to(ROOT).as_posix()
    cls_at = _class_at(nodes)
    out: list[Ref] = []
    for node, cls in _docstring_nodes(tree):
        body = getattr(node, "body", None)
        if not body or not isinstance(body[0], ast.Expr) or not isinstance(body[0].value, ast.Constant):
            continue
        doc = body[0].value
        if not isinstance(doc.value, str):
            continue
        alias = aliases(doc.value)
        for i, name, bare in names_in(doc.value, code_only=False):
            out.append(Ref(f"{rel}:{doc.lineno + i}", _unalias(name, alias), cls, bare))
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            text = re.sub(r"^\s*noqa(:\s*[A-Z0-9, ]+)?", "", tok.string.lstrip("#"))
            for _, name, bare in names_in(text, code_only=False):
                out.append(Ref(f"{rel}:{tok.start[0]}", name, cls_at.get(tok.start[0]), bare))
    return out


def _returned(cls: str, method: str | None, pkg: Package) -> str | None:
    """The class `cls(...)` (method None) or `cls.method(...)` gives, where the source says so."""
    if method is None:
        return cls
    for sym in pkg.classes.get(cls, []):
        ann = sym.returns.get(method, "").split("|")[0].strip()
        if ann in ("Self", f"type[{cls}]") or ann == cls:
            return cls
        if ann in pkg.classes:
            return ann
    return None


def imported_classes(text: str, pkg: Package) -> dict[str, str]:
    """The classes of mlx_slm a page's examples import by name (`from mlx_slm import Classifier`)."""
    found = re.finditer(r"from mlx_slm(?:\.[\w.]+)? import \(?([\w, ]+)", text)
    names = {n.strip() for m in found for n in m.group(1).split(",")}
    return {n: n for n in names if n in pkg.classes}


def bind(line: str, types: dict[str, str], pkg: Package) -> None:
    """What an example's line binds to a class of mlx_slm, by what it is given: `clf =
    Classifier.load(...)` (clf: Classifier), `run = clf.run(texts)` (run: Run, the method's
    return annotation); any other assignment forgets the name. The page's `clf.classify_frame`
    is then `Classifier.classify_frame`."""
    m = re.match(r"\s*(\w+) = (\w+)(?:\.(\w+))?(\()?", line)
    if not m:
        return
    var, head, method, call = m.groups()
    cls = types.get(head)
    got = _returned(cls, None if head == cls else method, pkg) if cls and call else None
    if head == cls and method and method not in _constructors(cls, pkg):
        got = None  # a class's other attribute: not known here
    if got is None:
        types.pop(var, None)
    else:
        types[var] = got


def _constructors(cls: str, pkg: Package) -> set[str]:
    """The class methods of `cls` that return one (`load`, `from_task`), by their annotation."""
    return {
        m
        for s in pkg.classes.get(cls, [])
        for m, ann in s.returns.items()
        if ann.split("|")[0].strip() in (cls, "Self")
    }


def _typed(name: str, types: dict[str, str]) -> str:
    first, dot, rest = name.partition(".")
    return f"{types[first]}.{rest}" if dot and first in types and types[first] != first else name


def refs_in_page(path: Path) -> list[Ref]:
    """A page's names: in its prose, backticked names, `mlx_slm.` paths and `.py` files; in its
    Python blocks, what they import from mlx_slm and the attributes they use of its classes (a
    variable's class from `example_types`), which the prose's backticked names use too."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    alias = aliases(text)
    pkg = package()
    types = imported_classes(text, pkg)
    out: list[Ref] = []
    in_code, lang = False, ""
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"\s*```(\w*)", line)
        if fence:
            in_code, lang = (not in_code), fence.group(1)
            continue
        if in_code:
            m = re.match(r"\s*from (mlx_slm(?:\.\w+)*) import \(?([\w, ]+)", line)
            if m and lang in ("python", "py", ""):
                out += [Ref(f"{rel}:{n}", f"{m.group(1)}.{a.split(' as ')[0].strip()}") for a in m.group(2).split(",")]
            out += [Ref(f"{rel}:{n}", p) for p in re.findall(r"(?<![\w.])(mlx_slm(?:\.\w+)+)", line)]
            out += [Ref(f"{rel}:{n}", p) for p in PATHS.findall(line) if lang in ("bash", "sh", "shell", "console")]
            if lang in ("python", "py"):
                code = re.sub(r"#.*|\"[^\"]*\"|'[^']*'", "", line)
                uses = re.findall(r"(?<![\w.])(\w+)\.(\w+)", code)
                out += [Ref(f"{rel}:{n}", f"{types[v]}.{a}") for v, a in uses if v in types]
                bind(line, types, pkg)
            continue
        for _, name, bare in names_in(line, code_only=True):
            out.append(Ref(f"{rel}:{n}", _typed(_unalias(name, alias), types), None, bare))
    return out


# Modules whose words leave with them: jobs/setup.py is being replaced (issue 48, Deliver 1), and
# its three stale names (`job.py`, `io.read_rows` twice) with it. The lead empties this at the merge.
GOING = {"mlx_slm/jobs/setup.py"}


def all_refs() -> list[Ref]:
    code = [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "tools").glob("*.py"))]
    mine = [
        p for p in code if p.relative_to(ROOT).as_posix() not in GOING | {"tools/names.py"}
    ]  # it quotes stale names
    refs = [r for p in mine for r in refs_in_module(p)]
    return refs + [r for p in PAGES for r in refs_in_page(p)]


def unresolved(refs: list[Ref] | None = None) -> list[str]:
    pkg = package()
    out = []
    for r in all_refs() if refs is None else refs:
        why = resolve_bare(r.name, pkg) if r.bare else resolve(r.name, pkg, r.cls)
        if why:
            out.append(f"{r.where}: `{r.name}`: {why}")
    return list(dict.fromkeys(out))


def main() -> int:
    bad = unresolved()
    print("\n".join(bad))
    print(f"{len(bad)} name(s) of {len(all_refs())} do not resolve", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
