"""Small file helpers shared by the modules that write records (manifest, task, conversion)."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: str | os.PathLike, doc: Any) -> None:
    """Write JSON through a temporary file and a rename: readers see the old or the new, never half."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, p)
