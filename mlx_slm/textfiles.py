"""Reading one text file a user named (a task, prompt, questions or labels file): UTF-8 with a BOM
dropped, a bad byte or an unreadable path named with the fix, JSON errors worded with their place.

This sits on the ground floor, below the pure pieces (`prompts`, `questions`, `task`) that read their
files through it, and below `io.py`, whose row readers share these rules.
"""

from __future__ import annotations

import json
import os

from .errors import UserError

BOM = b"\xef\xbb\xbf"


class InputError(UserError, ValueError):
    """A problem with the input as a whole (not one row) that the user must fix (exit 2)."""


def has_lone_surrogate(s: str) -> bool:
    """True if `s` holds a lone surrogate (a bad byte kept by surrogateescape, or a JSON \\ud800 escape):
    not UTF-8 text. The one check every reader and the service use."""
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def open_problem(path: str, e: OSError, what: str) -> str:
    """One line for a file that cannot be opened: what it is and what to do."""
    if isinstance(e, IsADirectoryError) or os.path.isdir(path):
        return f"{what} {path} is a folder, not a file: give the path of a file in it"
    if isinstance(e, FileNotFoundError):
        return f"{what} {path} does not exist: check the path"
    return f"{what} {path} cannot be read ({e.strerror or e}): check its permissions"


def read_text_file(path: str, what: str) -> str:
    """A whole UTF-8 text file (a UTF-8 BOM dropped); a `UserError` names the line of a bad byte.

    `what` names the file in messages, e.g. "--labels-file" or "task file"."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(open_problem(path, e, what)) from None
    data = data.removeprefix(BOM)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise InputError(
            f"{what} {path} line {line}: invalid UTF-8 (byte 0x{data[e.start]:02x} at column {col}): "
            "save the file as UTF-8"
        ) from None


def json_error(e: json.JSONDecodeError, line: bool = False) -> str:
    """A JSON parse error and where it is: "Expecting value at column 3". Some of the json
    module's messages end in "at" ("Unterminated string starting at"): no "at at" then."""
    where = f"line {e.lineno}, column {e.colno}" if line else f"column {e.colno}"
    return f"{e.msg} {where}" if e.msg.endswith(" at") else f"{e.msg} at {where}"
