"""Small file helpers shared by the modules that write records (manifest, task, conversion)."""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any

from .safefs import write_json_atomic as _write


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: str | os.PathLike, doc: Any) -> None:
    """Write JSON through a temporary file and a rename: readers see the old or the new, never half.

    The temporary file has a random name made exclusively in the same folder, and a link
    at `path` is refused (mlx_slm.ground.safefs)."""

    _write(path, doc)
