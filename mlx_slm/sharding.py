"""Shards of one input for several processes or machines, and the merge of their outputs.

`mlx-slm classify IN -o part-I.jsonl --shard I/N` classifies a contiguous slice of IN,
chosen so that every shard holds about the same number of tokens (the slices finish
together) and cut only where a local run's window starts: every item is batched with
the same neighbours as in a single-process run, so the merged parts equal that run's
output byte for byte. Any scheduler can hand out the shards (mlx.launch, a loop over
ssh, a CI matrix); each part is resumable on its own (`--resume`).

`mlx-slm merge part-*.jsonl -o all.jsonl` checks the parts' records (same input and
settings, every shard present once and complete, their row ranges tiling the input)
and the ids against the input where it can be read, then joins them in input order.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import UserError


class ShardError(UserError, ValueError):
    """A bad --shard, or parts that do not make up one complete output."""


def parse_shard(spec: str) -> tuple[int, int]:
    """'I/N' (0 <= I < N) as (I, N)."""
    try:
        i_s, n_s = spec.split("/")
        i, n = int(i_s), int(n_s)
    except ValueError:
        raise ShardError(f"--shard {spec!r}: give it as I/N, e.g. 0/4 (shards count from 0)") from None
    if n < 1 or not 0 <= i < n:
        raise ShardError(f"--shard {spec!r}: I must be 0..N-1 and N at least 1 (e.g. 0/4 ... 3/4)")
    return i, n


def plan_shards(token_counts: Sequence[int | None], window: int, n: int) -> list[tuple[int, int]]:
    """Row ranges [start, end) for n shards, tiling all rows in order.

    `token_counts` has one entry per input row: the text's token count, or None for a
    row that is an error row (it is not classified and weighs nothing). Cuts fall only
    at the start of a window (every `window` classified rows), and a window goes to the
    shard its token midpoint falls in; with fewer windows than shards, some shards are
    empty.
    """
    if n < 1 or window < 1:
        raise ValueError("n and window must be at least 1")
    valid_rows = [r for r, c in enumerate(token_counts) if c is not None]
    starts = valid_rows[::window]  # the row opening each window
    weights = []
    for k in range(len(starts)):
        chunk = valid_rows[k * window : (k + 1) * window]
        weights.append(sum(max(1, token_counts[r] or 0) for r in chunk))  # type: ignore[operator]
    total = sum(weights)
    # bounds[s]: the first window of shard s (windows before it belong to earlier shards).
    bounds = [0]
    cum = 0.0
    k = 0
    for s in range(1, n):
        while k < len(weights) and (cum + weights[k] / 2) * n < s * total:
            cum += weights[k]
            k += 1
        bounds.append(k)
    bounds.append(len(weights))
    rows = len(token_counts)

    def row_of(w: int) -> int:
        return starts[w] if w < len(starts) else rows

    cuts = [0] + [row_of(b) for b in bounds[1:-1]] + [rows]
    return [(cuts[s], cuts[s + 1]) for s in range(n)]


def shard_settings(index: int, count: int, rng: tuple[int, int], input_rows: int) -> dict[str, Any]:
    """What a part's manifest records about its shard (and `merge` checks)."""
    return {"index": index, "count": count, "rows": list(rng), "input_rows": input_rows}


# --------------------------------------------------------------------------- merge


def _records(path: str, fmt: str) -> tuple[bytes, list[bytes]]:
    """A part's header (CSV/TSV) and its rows as raw bytes, each with its line end."""
    data = Path(path).read_bytes()
    if fmt == "jsonl":
        lines = data.splitlines(keepends=True)
        if lines and not lines[-1].endswith(b"\n"):
            raise ShardError(f"{path}: the last row is cut short (an interrupted part): finish it with --resume")
        return b"", lines
    # CSV/TSV: a record may span lines (quoted newlines); split at record ends.
    text = data.decode("utf-8")
    if text and not text.endswith("\n"):
        raise ShardError(f"{path}: the last row is cut short (an interrupted part): finish it with --resume")
    out: list[bytes] = []
    pos = 0
    f = io.StringIO(text, newline="")
    reader = csv.reader(f, delimiter="\t" if fmt == "tsv" else ",")
    for _ in reader:
        end = f.tell()
        out.append(text[pos:end].encode("utf-8"))
        pos = end
    if not out:
        return b"", []
    return out[0], out[1:]


def _fields(rec: bytes, fmt: str, header: bytes) -> dict[str, Any]:
    if fmt == "jsonl":
        return json.loads(rec)
    delim = "\t" if fmt == "tsv" else ","
    cols = next(csv.reader(io.StringIO(header.decode("utf-8"), newline=""), delimiter=delim))
    vals = next(csv.reader(io.StringIO(rec.decode("utf-8"), newline=""), delimiter=delim))
    return dict(zip(cols, vals))


def merge_parts(parts: Sequence[str], output: str, check_input: bool = True) -> dict[str, Any]:
    """Join shard outputs into `output` in input order, after checking they make one whole.

    Returns what was merged (parts, rows, error rows, whether ids were checked against
    the input). Nothing is written unless every check passes.
    """
    from .output import _EXTENSIONS as _EXT
    from .output import read_manifest

    if not parts:
        raise ShardError("merge: name the parts to join (the -o files of each --shard run)")
    found: dict[int, tuple[str, dict[str, Any]]] = {}
    common: dict[str, Any] | None = None
    count = None
    for p in parts:
        if not Path(p).is_file():
            raise ShardError(f"merge: {p} does not exist")
        m = read_manifest(p)
        if m is None:
            raise ShardError(f"merge: {p} has no {Path(p).name}.mlx-slm.json record: it is not a part of a --shard run")
        s = dict(m["settings"])
        sh = s.pop("shard", None)
        if not sh:
            raise ShardError(f"merge: {p} was not written with --shard (it is a whole output already)")
        if not m.get("complete"):
            raise ShardError(f"merge: {p} (shard {sh['index']}/{sh['count']}) is unfinished: finish it with --resume")
        if count is None:
            count, common = sh["count"], s
        elif sh["count"] != count:
            raise ShardError(f"merge: {p} is shard {sh['index']}/{sh['count']}, the others are of /{count}")
        else:
            assert common is not None
            diff = sorted(k for k in set(common) | set(s) if common.get(k) != s.get(k) and k != "model")
            if diff:
                raise ShardError(
                    f"merge: {p} was made with other settings than {found[min(found)][0]} ({', '.join(diff[:4])}): "
                    "the parts are not of one run"
                )
        if sh["index"] in found:
            raise ShardError(f"merge: shard {sh['index']}/{count} is given twice ({found[sh['index']][0]} and {p})")
        found[sh["index"]] = (p, {**sh, "rows_written": m.get("rows"), "fitted": m.get("fitted_calibrator")})
    assert count is not None and common is not None
    missing = [i for i in range(count) if i not in found]
    if missing:
        raise ShardError(f"merge: shard(s) {', '.join(f'{i}/{count}' for i in missing)} missing")
    fmt = common.get("output_format", "jsonl")
    ext = Path(output).suffix.lower()
    if ext in _EXT and _EXT[ext] != fmt:
        raise ShardError(
            f"merge: the parts are {fmt.upper()}, but -o {output} says {_EXT[ext].upper()}: name it .{fmt}"
        )
    # A prior fitted on each shard's own warm-up would give each part other labels than one run.
    priors = {json.dumps(found[i][1]["fitted"], sort_keys=True) for i in found}
    if len(priors) > 1:
        raise ShardError("merge: the parts were calibrated with different fitted priors: they are not of one run")
    expect_start = 0
    pieces: list[bytes] = []
    header = b""
    errors = 0
    ids: list[Any] = []
    total = found[0][1]["input_rows"]
    for i in range(count):
        p, sh = found[i]
        start, end = sh["rows"]
        if start != expect_start or sh["input_rows"] != total:
            raise ShardError(f"merge: {p} covers input rows {start}..{end} where {expect_start}.. was due")
        h, recs = _records(p, fmt)
        if len(recs) != end - start:
            raise ShardError(
                f"merge: {p} holds {len(recs)} rows for input rows {start}..{end - 1} ({end - start}): "
                "it was changed or cut; run that shard again with --resume"
            )
        if fmt != "jsonl":
            if header and h and h != header:
                raise ShardError(f"merge: {p} has another header than the first part")
            header = header or h
        for r in recs:
            rec = _fields(r, fmt, header)
            ids.append(rec.get("id"))
            errors += bool(rec.get("error"))
        pieces.extend(recs)
        expect_start = end
    if expect_start != total:
        raise ShardError(f"merge: the parts cover {expect_start} of the input's {total} rows")
    checked = False
    inp = common.get("input")
    if check_input and inp and inp != "-" and Path(inp).is_file():
        _check_ids(inp, common, ids, fmt)
        checked = True
    tmp = f"{output}.partial"
    with open(tmp, "wb") as f:
        f.write(header)
        for piece in pieces:
            f.write(piece)
    os.replace(tmp, output)
    return {"parts": count, "rows": len(pieces), "error_rows": errors, "ids_checked": checked, "format": fmt}


def _check_ids(inp: str, settings: dict[str, Any], ids: list[Any], fmt: str) -> None:
    """Every input row's id, in order, once: the strongest check that nothing was lost."""
    from .io import read_rows
    from .output import same_id

    text_field, id_field, text_column, id_column = settings["fields"]
    n = 0
    for n, row in enumerate(
        read_rows(inp, settings.get("input_format"), text_field, id_field, text_column, id_column), 1
    ):
        if n > len(ids):
            raise ShardError(f"merge: the input {inp} has more rows than the parts ({len(ids)})")
        if not same_id(ids[n - 1], row.id, fmt):
            raise ShardError(
                f"merge: row {n} of the parts has id {ids[n - 1]!r} where input line {row.line} has id {row.id!r}"
            )
    if n != len(ids):
        raise ShardError(f"merge: the parts hold {len(ids)} rows but the input {inp} has {n}")
