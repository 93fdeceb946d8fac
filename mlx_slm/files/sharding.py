"""Shards of one input for several processes or machines, and the merge of their outputs.

`mlx-slm classify IN -o part-I.jsonl --shard I/N` classifies a contiguous slice of IN,
chosen so that every shard holds about the same number of tokens (the slices finish
together) and cut only where a local run's window starts: every item is batched with
the same neighbours as in a single-process run, so the merged parts equal that run's
output byte for byte. Any scheduler can hand out the shards (mlx.launch, a loop over
ssh, a CI matrix); each part is resumable on its own (`--resume`).

`mlx-slm merge part-*.jsonl -o all.jsonl` checks the parts' records (same input and
settings, every shard present once and complete, their row ranges tiling the input),
each part's bytes against the sha256 its run recorded on completion, and the ids and
the sha256 of the input where it can be read, then joins them in input order.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..ground.errors import UserError
from ..ground.safefs import atomic_writer
from .output import _EXTENSIONS as _EXT
from .output import (
    ParquetRows,
    RecordError,
    columns_of,
    input_sha256,
    read_manifest,
    read_records,
    require_pyarrow,
    same_id,
)
from .output.writers import column_type
from .readers import ReadSpec, read_rows


class ShardError(UserError, ValueError):
    """A bad --shard, or parts that do not make up one complete output."""


def parse_shard(spec: str) -> tuple[int, int]:
    """'I/N' (0 <= I < N, ASCII digits) as (I, N)."""
    m = re.fullmatch(r"([0-9]{1,30})/([0-9]{1,30})", spec)
    if m is None:
        raise ShardError(f"--shard {spec!r}: give it as I/N, e.g. 0/4 (shards count from 0)")
    i, n = int(m[1]), int(m[2])
    if n < 1 or not 0 <= i < n:
        raise ShardError(f"--shard {spec!r}: I must be 0..N-1 and N at least 1 (e.g. 0/4 ... 3/4)")
    return i, n


def check_shard_count(n: int, rows: int, where: str) -> None:
    """Refuse more shards than the input has rows (each shard would be all but empty)."""
    if n > max(rows, 1):
        raise ShardError(
            f"--shard .../{n}: {where} has only {rows} row(s); use at most {max(rows, 1)} shards "
            "(a shard holds whole windows of rows)"
        )


class _Windows:
    """The windows of an input (a cut may fall only where one starts) and their token weights."""

    def __init__(self, token_counts: Sequence[int | None], window: int):
        if window < 1:
            raise ValueError("window must be at least 1")
        valid_rows = [r for r, c in enumerate(token_counts) if c is not None]
        self.starts = valid_rows[::window]  # the row opening each window
        self.rows = len(token_counts)
        # Twice each window's token midpoint (integers: exact however large N is).
        self.mid2: list[int] = []
        cum = 0
        for k in range(len(self.starts)):
            chunk = valid_rows[k * window : (k + 1) * window]
            w = sum(max(1, token_counts[r] or 0) for r in chunk)  # type: ignore[operator]
            self.mid2.append(2 * cum + w)
            cum += w
        self.total = cum

    def cut(self, s: int, n: int) -> int:
        """The first row of shard s of n: windows whose token midpoint falls before s/n of the
        tokens belong to earlier shards."""
        if s <= 0:
            return 0
        if s >= n:
            return self.rows
        # mid2 * n < 2 * s * total  <=>  mid2 < ceil(2 * s * total / n)   (integers)
        k = bisect.bisect_left(self.mid2, -(-2 * s * self.total // n))
        return self.starts[k] if k < len(self.starts) else self.rows


def shard_range(token_counts: Sequence[int | None], window: int, n: int, i: int) -> tuple[int, int]:
    """Row range [start, end) of shard i of n (see `plan_shards`), in O(rows), whatever n is."""
    if n < 1 or not 0 <= i < n:
        raise ValueError("need 0 <= i < n")
    w = _Windows(token_counts, window)
    return w.cut(i, n), w.cut(i + 1, n)


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
    w = _Windows(token_counts, window)
    cuts = [w.cut(s, n) for s in range(n + 1)]
    return [(cuts[s], cuts[s + 1]) for s in range(n)]


def shard_settings(index: int, count: int, rng: tuple[int, int], input_rows: int) -> dict[str, Any]:
    """What a part's manifest records about its shard (and `merge` checks)."""
    return {"index": index, "count": count, "rows": list(rng), "input_rows": input_rows}


# --------------------------------------------------------------------------- merge


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shard_record(p: str, sh: Any) -> dict[str, Any]:
    """A part's `shard` record, checked field by field (a hand-edited manifest is refused)."""
    if not isinstance(sh, dict):
        raise ShardError(f"merge: {p}: its manifest's shard record is not an object: run that shard again")
    for key in ("index", "count", "input_rows"):
        if not _int(sh.get(key)) or sh[key] < 0:
            raise ShardError(
                f"merge: {p}: its manifest's shard record has no valid {key!r} "
                f"({f'found {sh[key]!r}' if key in sh else 'it is missing'}): the manifest was changed; "
                "run that shard again"
            )
    rows = sh.get("rows")
    if not (isinstance(rows, list) and len(rows) == 2 and all(_int(r) for r in rows) and 0 <= rows[0] <= rows[1]):
        raise ShardError(
            f"merge: {p}: its manifest's shard record has no valid 'rows' (found {rows!r}): "
            "the manifest was changed; run that shard again"
        )
    if not sh["index"] < sh["count"]:
        raise ShardError(f"merge: {p}: shard {sh['index']}/{sh['count']} in its manifest is not a shard")
    return sh


def merge_parts(parts: Sequence[str], output: str, check_input: bool = True) -> dict[str, Any]:
    """Join shard outputs into `output` in input order, after checking they make one whole.

    Returns what was merged (parts, rows, error rows, whether ids were checked against
    the input). Nothing is written unless every check passes: each part's bytes must
    match the sha256 its run recorded on completion, and the input (when it can be read
    here) the sha256 the parts recorded.
    """

    if not parts:
        raise ShardError("merge: name the parts to join (the -o files of each --shard run)")
    found, common, count = _read_parts(parts)
    fmt, out_fmt = _formats(common, output)
    table_rows = _parquet_rows(common) if out_fmt == "parquet" else None
    group = common.get("grouped_by")  # several rows an input row (a rerank query's), each naming it here
    # A prior fitted on each shard's own warm-up would give each part other labels than one run.
    priors = {json.dumps(found[i][1]["fitted"], sort_keys=True) for i in found}
    if len(priors) > 1:
        raise ShardError("merge: the parts were calibrated with different fitted priors: they are not of one run")
    header, pieces, ids, errors = _join_parts(found, count, fmt, table_rows, group)
    checked = check_input and _check_input(common, ids, fmt)
    with atomic_writer(output, "wb", "-o") as f:
        if table_rows is not None:
            table_rows.write(f)
        else:
            f.write(header)
            for piece in pieces:
                f.write(piece)
    return {"parts": count, "rows": len(pieces), "error_rows": errors, "ids_checked": checked, "format": out_fmt}


_Parts = dict[int, tuple[str, dict[str, Any]]]  # shard index -> (part path, its shard record and more)


def _read_parts(parts: Sequence[str]) -> tuple[_Parts, dict[str, Any], int]:
    """Every part's manifest, checked to be one complete shard of one run (the same input
    content and settings), none missing or given twice: (parts by index, the common
    settings, the shard count)."""
    found: _Parts = {}
    common: dict[str, Any] | None = None
    count = 0
    for p in parts:
        m, s, sh = _read_part(p)
        if common is None:
            count, common = sh["count"], s
        elif sh["count"] != count:
            raise ShardError(f"merge: {p} is shard {sh['index']}/{sh['count']}, the others are of /{count}")
        else:
            _check_same_run(p, found[min(found)][0], common, s)
        if sh["index"] in found:
            raise ShardError(f"merge: shard {sh['index']}/{count} is given twice ({found[sh['index']][0]} and {p})")
        found[sh["index"]] = (
            p,
            {
                **sh,
                "rows_written": m.get("rows"),
                "fitted": m.get("fitted_calibrator"),
                "sha256": m.get("output_sha256"),
            },
        )
    assert common is not None
    missing = [i for i in range(count) if i not in found]
    if missing:
        shown = ", ".join(f"{i}/{count}" for i in missing[:10]) + (
            f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        )
        raise ShardError(f"merge: shard(s) {shown} missing")
    return found, common, count


def _read_part(p: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """One part's manifest, its settings without the shard record, and that record (checked)."""

    if not Path(p).is_file():
        raise ShardError(f"merge: {p} does not exist" + (" as a file" if Path(p).exists() else ""))
    m = read_manifest(p)
    if m is None:
        raise ShardError(f"merge: {p} has no {Path(p).name}.mlx-slm.json record: it is not a part of a --shard run")
    s = dict(m["settings"])
    sh = s.pop("shard", None)
    if not sh:
        raise ShardError(f"merge: {p} was not written with --shard (it is a whole output already)")
    sh = _shard_record(p, sh)
    if not m.get("complete"):
        raise ShardError(f"merge: {p} (shard {sh['index']}/{sh['count']}) is unfinished: finish it with --resume")
    return m, s, sh


def _check_same_run(p: str, first: str, common: dict[str, Any], s: dict[str, Any]) -> None:
    """A part made from other input content, or with other settings, than the first is refused."""
    old_sha, new_sha = common.get("input_sha256"), s.get("input_sha256")
    if old_sha != new_sha:
        raise ShardError(
            f"merge: {p} was made from other input content than {first} (input_sha256 {str(new_sha)[:12]}..., "
            f"{first} recorded {str(old_sha)[:12]}...): the input was changed between the shards' runs; "
            "run every shard again on one input"
        )
    diff = sorted(k for k in set(common) | set(s) if common.get(k) != s.get(k) and k != "model")
    if diff:
        raise ShardError(
            f"merge: {p} was made with other settings than {first} ({', '.join(diff[:4])}): the parts are not of one run"
        )


def _formats(common: dict[str, Any], output: str) -> tuple[str, str]:
    """The parts' format and the merged output's (Parquet parts merge only into Parquet)."""

    fmt = common.get("output_format", "jsonl")
    if fmt not in ("jsonl", "csv", "tsv", "parquet"):
        raise ShardError(f"merge: the parts' manifests give output_format {fmt!r}: the manifests were changed")
    ext = Path(output).suffix.lower()
    if ext not in _EXT:  # as classify refuses it: a name that says no format is not guessed
        raise ShardError(
            f"merge: -o {output}: unknown output extension {ext or '(none)'!r}: name it .{fmt} (the parts' format)"
            + ("" if fmt == "parquet" else " or .parquet")
        )
    if fmt == "parquet" and ext in _EXT and _EXT[ext] != "parquet":
        raise ShardError(f"merge: the parts are Parquet, but -o {output} says {_EXT[ext].upper()}: name it .parquet")
    if ext in _EXT and _EXT[ext] not in (fmt, "parquet"):
        raise ShardError(
            f"merge: the parts are {fmt.upper()}, but -o {output} says {_EXT[ext].upper()}: name it .{fmt} "
            "(or .parquet)"
        )
    return fmt, ("parquet" if _EXT.get(ext) == "parquet" or fmt == "parquet" else fmt)


def _parquet_rows(common: dict[str, Any]) -> Any:
    """An empty `ParquetRows` with the columns of the parts' run."""

    form = common.get("form")
    if form in ("embeddings", "rerank"):
        what = "embed" if form == "embeddings" else "rerank"
        raise ShardError(
            f"merge: the parts are of `mlx-slm {what}`, which writes Parquet only whole (or not at all): "
            "join them into .jsonl"
        )
    require_pyarrow()
    labels, questions = common.get("labels"), common.get("questions")
    if questions is not None:
        if not (isinstance(questions, list) and all(isinstance(q, dict) and "name" in q for q in questions)):
            raise ShardError(
                f"merge: the parts' manifests give no valid 'questions' ({questions!r}): they were changed"
            )
    elif not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise ShardError(f"merge: the parts' manifests give no valid 'labels' ({labels!r}): they were changed")
    return ParquetRows(columns_of(common))


def _join_parts(
    found: _Parts, count: int, fmt: str, table_rows: Any, group: str | None = None
) -> tuple[bytes, list[bytes], list[Any], int]:
    """The parts' rows in input order, each part checked (its range, row count, checksum and
    records): (the header, each row's bytes, the ids (`group`: the field naming each row's
    input row), the number of error rows)."""
    expect_start, errors, header = 0, 0, b""
    pieces: list[bytes] = []
    ids: list[Any] = []
    total = found[0][1]["input_rows"]
    for i in range(count):
        p, sh = found[i]
        start, end = sh["rows"]
        if start != expect_start or sh["input_rows"] != total:
            raise ShardError(f"merge: {p} covers input rows {start}..{end} where {expect_start}.. was due")
        h, recs = _checked_part(p, sh, (i, count), fmt, group)
        if fmt != "jsonl":
            if header and h and h != header:
                raise ShardError(f"merge: {p} has another header than the first part")
            header = header or h
        for r in recs:
            if r.problem:
                raise ShardError(
                    f"merge: {p} row {r.row} is not an mlx-slm output record ({r.problem[:120]}): "
                    "the part was changed by something else; run that shard again"
                )
            ids.append(r.fields.get(group or "id"))
            errors += bool(r.fields.get("error"))
            if table_rows is not None:
                table_rows.add(r.fields if fmt not in ("csv", "tsv") else _typed_csv_record(r.fields))
        pieces.extend(r.raw for r in recs)
        expect_start = end
    if expect_start != total:
        raise ShardError(f"merge: the parts cover {expect_start} of the input's {total} rows")
    return header, pieces, ids, errors


def _checked_part(
    p: str, sh: dict[str, Any], shard: tuple[int, int], fmt: str, group: str | None
) -> tuple[bytes, list[Any]]:
    """A part's header and rows, once its row count and its bytes' sha256 match its record (a
    grouped part: the rows its run recorded writing)."""
    start, end = sh["rows"]
    i, count = shard
    try:
        data = Path(p).read_bytes()
    except OSError as e:
        raise ShardError(f"merge: cannot read {p} ({e.strerror})") from None
    h, recs = _part_records(p, fmt, data, lenient=group is not None)
    if group is not None and len(recs) != sh["rows_written"]:
        raise ShardError(
            f"merge: {p} holds {len(recs)} rows where its run wrote {sh['rows_written']}: "
            "it was changed or cut; run that shard again"
        )
    if group is None and len(recs) != end - start:
        raise ShardError(
            f"merge: {p} holds {len(recs)} rows for input rows {start}..{end - 1} ({end - start}): "
            "it was changed or cut; run that shard again with --resume"
        )
    recorded = sh["sha256"]
    if recorded is not None:
        got = hashlib.sha256(data).hexdigest()  # the part's exact bytes, header included
        if got != recorded:
            raise ShardError(
                f"merge: {p} (shard {i}/{count}) was changed after its run completed: its rows' sha256 is "
                f"{got[:12]}..., its manifest recorded {str(recorded)[:12]}...; run that shard again "
                "(mlx-slm classify ... --shard) rather than editing a part"
            )
    return h, recs


def _check_input(common: dict[str, Any], ids: list[Any], fmt: str) -> bool:
    """The input, when it can be read here, has the parts' ids and the sha256 they recorded;
    False when it cannot be read (nothing checked)."""

    inp = common.get("input")
    if not (isinstance(inp, str) and inp != "-" and Path(inp).is_file()):
        return False
    _check_ids(inp, common, ids, fmt)
    recorded = common.get("input_sha256")
    if recorded is not None:
        got, _ = input_sha256(inp)
        if got != recorded:
            raise ShardError(
                f"merge: the input {inp} was changed after the parts were made (input_sha256 {str(got)[:12]}..., "
                f"the parts recorded {str(recorded)[:12]}...): run the shards again on it, or merge with "
                "--no-input-check to join the parts of the old input"
            )
    return True


def _part_records(path: str, fmt: str, data: bytes, lenient: bool = False) -> tuple[bytes, list[Any]]:
    """A part's header (CSV/TSV) and its rows (`output.Record`: exact bytes, fields), split
    but not yet checked: merge checks the row count and the checksum first."""

    name = "Parquet" if fmt == "parquet" else fmt.upper()
    if fmt != "parquet" and data and not data.endswith(b"\n"):
        raise ShardError(f"merge: {path}: the last row is cut short (an interrupted part): finish it with --resume")
    try:
        recs = list(read_records(path, fmt, data, lenient=lenient, strict_csv=True))
    except RecordError as e:
        raise ShardError(f"merge: {path} is not an mlx-slm {name} output ({e.why}): run that shard again") from None
    if any(r.torn for r in recs):  # a row ending inside quotes
        raise ShardError(f"merge: {path}: the last row is cut short (an interrupted part): finish it with --resume")
    if fmt in ("jsonl", "parquet") or not recs:
        return b"", recs
    if recs[0].problem:
        raise ShardError(f"merge: {path} is not an mlx-slm {name} output ({recs[0].problem}): run that shard again")
    return recs[0].raw, recs[1:]


def _typed_csv_record(rec: dict[str, str]) -> dict[str, Any]:
    """A CSV/TSV row's fields with their types back, for a Parquet output, by the Parquet writer's
    own rule (`column_type`: a question's columns too): probabilities as floats, flags as booleans,
    `line` as an integer, '' as null (a flag: False). CSV ids are strings."""

    out: dict[str, Any] = {}
    for k, v in rec.items():
        kind = "string" if k == "id" else column_type(k)
        if v == "":
            out[k] = False if kind == "bool" else None
        else:
            out[k] = {"float": float, "bool": lambda s: s == "True", "int": int}.get(kind, str)(v)
    return out


def _check_ids(inp: str, settings: dict[str, Any], ids: list[Any], fmt: str) -> None:
    """Every input row's id, in order, once: the strongest check that nothing was lost."""

    fields = settings.get("fields")
    if not (isinstance(fields, list) and len(fields) == 4 and all(f is None or isinstance(f, str) for f in fields)):
        raise ShardError(f"merge: the parts' manifests give no valid 'fields' ({fields!r}): the manifests were changed")
    text_field, id_field, text_column, id_column = fields
    n = 0
    read = ReadSpec(settings.get("input_format"), text_field, id_field, text_column, id_column)
    if settings.get("grouped_by"):
        _check_group_ids(inp, read, ids, settings["grouped_by"])
        return
    for n, row in enumerate(read_rows(inp, read), 1):
        if n > len(ids):
            raise ShardError(f"merge: the input {inp} has more rows than the parts ({len(ids)})")
        if not same_id(ids[n - 1], row.id, fmt):
            raise ShardError(
                f"merge: row {n} of the parts has id {ids[n - 1]!r} where input line {row.line} has id {row.id!r}"
            )
    if n != len(ids):
        raise ShardError(f"merge: the parts hold {len(ids)} rows but the input {inp} has {n}")


def _check_group_ids(inp: str, read: ReadSpec, ids: list[Any], key: str) -> None:
    """Every input row's id, in order, on its rows: a row with an id on every row of a run of it
    (ids are unique), a row without one (an error) on one row alone."""
    r = 0
    for row in read_rows(inp, read):
        if r >= len(ids):
            raise ShardError(f"merge: the input {inp} has more rows than the parts hold (input line {row.line})")
        if not same_id(ids[r], row.id, "jsonl"):
            raise ShardError(
                f"merge: row {r + 1} of the parts has {key} {ids[r]!r} where input line {row.line} has id {row.id!r}"
            )
        r += 1
        while row.id is not None and r < len(ids) and same_id(ids[r], row.id, "jsonl"):
            r += 1
    if r != len(ids):
        raise ShardError(f"merge: the parts hold {len(ids) - r} rows past the input {inp}'s last row")
