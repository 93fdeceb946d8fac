"""Where a sentence-transformers folder keeps its files, as a conversion sees them.

`modules.json` lists the folder's modules, each read from its `path`: the Transformer module's
(the backbone: config.json, weights, tokenizer, `sentence_bert_config.json`) is the folder
itself ("") in today's layout or a subfolder (`0_Transformer/`, as sentence-transformers 2.x
saved it, and still loads); the Pooling module's is its own folder (`1_Pooling/config.json`),
never the root, whose config.json is the backbone's (sentence-transformers refuses a Pooling
module at ""). This module says where those files are (`backbone_dir`, `module_dir`), every file
the modules read (`module_files`: what a conversion fingerprints, so an edited
`1_Pooling/config.json` converts again), what a conversion copies beside the weights, in
today's layout (`copy_sentence_transformers`), and which of the user's files a converted cache
entry's came from (`user_folder`: so messages name the user's folder, not the cache copy).
How the folder pools is `classifier.embedder.read_pooling`'s to say.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from ..ground.errors import ModelError

MODULES = "modules.json"
# The folder's own files beside modules.json: the Transformer module's settings (in its own
# folder), sentence-transformers' settings and named prompts (at the root).
TRANSFORMER_CONFIG = "sentence_bert_config.json"
SETTINGS = "config_sentence_transformers.json"
RECORD = "conversion.json"  # convert.RECORD (not imported: convert imports this module)


def read_modules(src: Path) -> list[Any] | None:
    """modules.json's list of modules; None when the folder has none (not a sentence-transformers
    folder) or it is not a list of them (`read_pooling` refuses that by name; a conversion reads
    the folder as a plain model then)."""
    f = src / MODULES
    if not f.is_file():
        return None
    try:
        got = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return got if isinstance(got, list) else None


def module_kind(m: Any) -> str:
    """A module's class name (`Transformer`, `Pooling`, ...) from its `type`; "" when it names none."""
    t = m.get("type") if isinstance(m, dict) else None
    return t.rsplit(".", 1)[-1] if isinstance(t, str) else ""


def module_dir(src: Path, rel: Any) -> Path | None:
    """The folder a module's `path` names: `src` itself for "" or "."; `src/rel` for a relative
    path that stays inside `src` (no `..`, not absolute, no backslash); None for anything else."""
    if not isinstance(rel, str) or "\\" in rel or "\x00" in rel:
        return None
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts:
        return None
    return src.joinpath(*p.parts) if p.parts else src


def _transformer(modules: list[Any]) -> dict[str, Any] | None:
    return next((m for m in modules if module_kind(m) == "Transformer"), None)


def transformer_dir(src: Path) -> Path:
    """The folder the Transformer module reads (its weights, tokenizer, `sentence_bert_config.json`):
    `src` itself, or the subfolder modules.json names (`0_Transformer`); `src` for a folder
    without modules.json. A path that leaves the folder is a `ModelError` naming it and the fix."""
    modules = read_modules(src)
    t = _transformer(modules) if modules else None
    if t is None:
        return src
    got = module_dir(src, t.get("path", ""))
    if got is None:
        raise ModelError(
            f"{src / MODULES}: the Transformer module's path {t.get('path')!r} is not a folder inside {src}: "
            "set it to \"\" (the backbone's files at the folder's root) or to the subfolder holding them "
            '(e.g. "0_Transformer")'
        )
    return got


def backbone_dir(src: Path) -> Path:
    """The folder holding the backbone's config.json, weights and tokenizer (`transformer_dir`).
    A Transformer module in a subfolder without a config.json is a `ModelError` naming the path
    and the fix (sentence-transformers would not load it either)."""
    got = transformer_dir(src)
    if got != src and not (got / "config.json").is_file():
        t = _transformer(read_modules(src) or [])
        raise ModelError(
            f"{src / MODULES}: the Transformer module's path {t.get('path') if t else ''!r} holds no config.json "
            f"(no backbone at {got}): set the path to the folder holding the backbone's config.json, weights and "
            'tokenizer ("" when they are at the folder\'s root)'
        )
    return got


def module_files(src: Path) -> list[str]:
    """Every file the folder's modules read from their own subfolders (`1_Pooling/config.json`,
    a Transformer's `0_Transformer/*`, a Dense module's weights), relative to `src` in `/`
    form, hidden files aside: what a conversion fingerprints beside the root's files."""
    modules = read_modules(src)
    names: set[str] = set()
    root = src.resolve()
    for m in modules or []:
        d = module_dir(src, m.get("path", "") if isinstance(m, dict) else None)
        if d is None or d == src or not d.is_dir() or not d.resolve().is_relative_to(root):
            continue
        for f in d.rglob("*"):
            rel = f.relative_to(src)
            if f.is_file() and not any(part.startswith(".") for part in rel.parts):
                names.add(rel.as_posix())
    return sorted(names)


def copy_sentence_transformers(src: Path, out: Path) -> dict[str, str]:
    """Copy a sentence-transformers folder's configuration from `src` into the conversion `out`,
    in today's layout (the Transformer module at the root, where the converted weights are):
    modules.json (a Transformer's subfolder path rewritten to ""), the Transformer module's
    `sentence_bert_config.json` (from its own folder), `config_sentence_transformers.json`, and
    the JSON files of every other module's folder. Returns {name in `out`: name in `src`} of each
    file copied; nothing when `src` has no modules.json. Weights in a module's folder (a Dense
    layer) are not copied: `read_pooling` refuses such a module by name."""
    if not (src / MODULES).is_file():
        return {}
    try:
        modules = json.loads((src / MODULES).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"{src / MODULES} is not valid JSON ({e}): fix or remove it") from None
    copied: dict[str, str] = {}
    tdir = transformer_dir(src)

    def copy(frm: Path, name: str) -> None:
        if frm.is_file() and not frm.is_symlink():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(frm, out / name)
            copied[name] = frm.relative_to(src).as_posix()

    if tdir != src and isinstance(modules, list):
        t = _transformer(modules)
        rewritten = [dict(m, path="") if m is t else m for m in modules]
        (out / MODULES).write_text(json.dumps(rewritten, indent=2) + "\n", encoding="utf-8")
        copied[MODULES] = MODULES
    else:
        copy(src / MODULES, MODULES)
    copy(tdir / TRANSFORMER_CONFIG, TRANSFORMER_CONFIG)
    copy(src / SETTINGS, SETTINGS)
    for m in modules if isinstance(modules, list) else []:
        rel = m.get("path") if isinstance(m, dict) else None
        d = module_dir(src, rel)
        if d is None or d == src or d == tdir or not d.is_dir() or d.is_symlink():
            continue  # the Transformer's folder, the root, or a path that is no folder inside it
        rel_dir = d.relative_to(src).as_posix()
        (out / rel_dir).mkdir(parents=True, exist_ok=True)  # a Normalize module's folder is empty
        for f in sorted(d.glob("*.json")):
            copy(f, f.relative_to(src).as_posix())
    return copied


def user_folder(path: Path, cache: Path) -> tuple[Path, dict[str, str]]:
    """The folder a user knows the converted folder `path` by, and {name in `path`: name there}:
    for a cache entry (inside `cache`) converted from a local folder, that folder and the names
    its conversion recorded (`copy_sentence_transformers`); else `path` itself, name for name."""
    try:
        inside = path.resolve().is_relative_to(cache.resolve())
        record = json.loads((path / RECORD).read_text(encoding="utf-8")) if inside else None
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or record.get("source_kind") != "hf" or not record.get("source_path"):
        return path, {}
    names = record.get("sentence_transformers_files")
    return Path(str(record["source_path"])), names if isinstance(names, dict) else {}
