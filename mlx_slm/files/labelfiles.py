"""Label files: `--labels-file`, a label a line (with an optional description), or JSONL objects.

Kept apart from `readers` (rows of texts): a label file is read whole, once, before any row.
"""

from __future__ import annotations

import json

from ..ground.textfiles import InputError, check_json_text, json_error, read_text_file


def read_labels_file(path: str) -> list[str]:
    """Labels from a file, one a line (only ``\\n`` or ``\\r\\n`` ends a line; blank lines and the
    whitespace around each label are dropped); bad UTF-8 is a `UserError` naming the line.
    Descriptions, if the file has them, are left out (see `read_label_descriptions`)."""
    return list(read_label_descriptions(path))


def read_label_descriptions(path: str) -> dict[str, str]:
    """Labels and their descriptions, in file order: `label<TAB>description` (or a bare label)
    a line, or JSONL objects `{"label": ..., "description": ...}` (description optional).

    A label without a description maps to "". Descriptions are for the prompt (the
    `{label_descriptions}` placeholder): scoring stays on the names."""
    what = "--labels-file"
    lines = read_text_file(path, what).split("\n")
    first = next((x.strip() for x in lines if x.strip()), "")
    out: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if first.startswith("{"):
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise InputError(f"{what} {path} line {n}: malformed JSON ({json_error(e)}): fix the line") from None
            check_json_text(obj, f"{what} {path}", line, n)
            if (
                not isinstance(obj, dict)
                or not isinstance(obj.get("label"), str)
                or not isinstance(obj.get("description", ""), str)
            ):
                raise InputError(
                    f'{what} {path} line {n}: a JSONL label is an object with a string "label" and an optional '
                    'string "description", e.g. {"label": "card arrival", "description": "the card has not come"}'
                )
            label, desc = obj["label"].strip(), obj.get("description", "").strip()
        else:
            label, _, desc = line.partition("\t")
            label, desc = label.strip(), desc.strip()
        if not label:
            raise InputError(f"{what} {path} line {n}: the label is empty: give it a name, or drop the line")
        if label in out:
            raise InputError(f"{what} {path} line {n}: label {label!r} is given twice")
        out[label] = desc
    if not out:
        raise InputError(f"{what} {path} holds no labels: give one label a line (label<TAB>description optional)")
    return out
