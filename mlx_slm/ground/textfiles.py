"""Reading one text file a user named (a task, prompt, questions or labels file): UTF-8 with a BOM
dropped, a bad byte or an unreadable path named with the fix, JSON errors worded with their place.

This sits on the ground floor, below the pure pieces (`prompts`, `questions`, `task`) that read their
files through it, and below `files/readers.py`, whose row readers share these rules.
"""

from __future__ import annotations

import json
import os
import re
import sys

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


def not_utf8(s: str) -> str | None:
    """Where `s` stops being UTF-8 text, or None: "byte 0xff at position 3" for a byte kept by
    surrogateescape (an argument or file name the system could not decode), "a lone surrogate
    \\ud800 at position 3" for a JSON escape of half a pair."""
    if not has_lone_surrogate(s):
        return None
    i, c = next((i, c) for i, c in enumerate(s) if 0xD800 <= ord(c) <= 0xDFFF)
    if 0xDC80 <= ord(c) <= 0xDCFF:
        return f"byte 0x{ord(c) - 0xDC00:02x} at position {i + 1}"
    return f"a lone surrogate \\u{ord(c):04x} at position {i + 1}"


def text_problem(obj: object, depth: int = 0) -> str | None:
    """The first string (or key) in a parsed JSON value that is not UTF-8 text, worded by
    `not_utf8`, or None. Every reader of a user's JSON file asks this once per line or file."""
    if isinstance(obj, str):
        return not_utf8(obj)
    if depth > 200:  # json.loads refuses deeper nesting first
        return None
    items = obj.items() if isinstance(obj, dict) else ((None, x) for x in obj) if isinstance(obj, list) else ()
    for k, v in items:
        why = (not_utf8(k) if isinstance(k, str) else None) or text_problem(v, depth + 1)
        if why:
            return why
    return None


_ESCAPE = re.compile(r"\\u([dD][89abAB][0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def lone_escape_line(text: str) -> int:
    """The line of a JSON document's first escape of half a surrogate pair (1 if none is found:
    the caller knows one is there)."""
    for m in _ESCAPE.finditer(text):
        backslashes = len(text[: m.start()]) - len(text[: m.start()].rstrip("\\"))
        if backslashes % 2 == 0 and not (m.group(1) and m.group(2)):  # not itself escaped, not a pair
            return text.count("\n", 0, m.start()) + 1
    return 1


def check_json_text(obj: object, what: str, text: str, line: int | None = None) -> None:
    """Raise an `InputError` naming the file (`what`, with its path) and the line when a parsed
    JSON value holds text that is not UTF-8 (a lone surrogate escape such as "\\ud800"): it
    would reach a tokenizer, an output or a task file and fail there."""
    why = text_problem(obj)
    if why:
        at = line if line is not None else lone_escape_line(text)
        raise InputError(
            f"{what} line {at}: a string holds {why.replace('position', 'character')}, not valid "
            "Unicode text: fix the escape (a lone \\ud800 is half of a pair)"
        )


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


def json_error(e: BaseException, line: bool = False) -> str:
    """What `json.loads` refused, in words for a person, and where: "Expecting value at column 3"
    (some of the json module's messages end in "at": no "at at" then); the other faults it raises:
    text that is not UTF-8, nesting too deep, or an integer of more digits than Python converts
    (said as a number too long, not as Python's advice to call `sys.set_int_max_str_digits`)."""
    if isinstance(e, json.JSONDecodeError):
        where = f"line {e.lineno}, column {e.colno}" if line else f"column {e.colno}"
        return f"{e.msg} {where}" if e.msg.endswith(" at") else f"{e.msg} at {where}"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 (byte 0x{e.object[e.start]:02x} at byte {e.start})"
    return (
        f"a number too long to read (over {sys.get_int_max_str_digits()} digits): shorten it, or write it as a string"
    )
