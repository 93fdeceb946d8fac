"""`classify --shard I/N` and `mlx-slm merge` (`files/sharding.py`, issue 14): shards balanced by
tokens, cut at window starts, planned in time independent of N, merged back into exactly the
single-process output (a questions run's CSV parts into the same Parquet); merge refuses any set of
parts that is not one whole, and an -o extension classify refuses."""

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_slm.cli import main
from mlx_slm.files.output import manifest_path
from mlx_slm.files.sharding import ShardError, parse_shard, plan_shards, shard_range
from mlx_slm.text.workload import tickets
from tests import hostile
from tests.classify_run import cli, run
from tests.hostile import invoke, refused_cleanly, write
from tests.hostile import refused_cleanly as refused

TEXTS = [t for t, _ in tickets(120)]


def write_input(path: Path, n: int = 120, bad_every: int = 0) -> Path:
    lines = []
    for i in range(n):
        if bad_every and i % bad_every == 3:
            lines.append('{"id": "broken", "text": ')  # malformed: an error row, never dropped
        elif bad_every and i % bad_every == 5:
            lines.append(json.dumps({"id": f"t{i}", "text": ""}))
        else:
            lines.append(json.dumps({"id": f"t{i}", "text": TEXTS[i % len(TEXTS)][: 20 + 7 * (i % 13)]}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------- pure planning


def test_parse_shard():
    assert parse_shard("0/1") == (0, 1)
    assert parse_shard("3/4") == (3, 4)
    for bad in ("4/4", "-1/2", "1", "a/b", "1/0", "1/2/3"):
        with pytest.raises(ShardError, match="I/N|0..N-1"):
            parse_shard(bad)


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.one_of(st.none(), st.integers(0, 500)), max_size=200),
    window=st.integers(1, 40),
    n=st.integers(1, 9),
)
def test_plan_shards_tiles_the_input_at_window_starts_and_balances_tokens(counts, window, n):
    ranges = plan_shards(counts, window, n)
    assert len(ranges) == n
    assert ranges[0][0] == 0 and ranges[-1][1] == len(counts)
    for (a, b), (c, _) in zip(ranges, ranges[1:]):
        assert a <= b == c  # contiguous, in order, every row once
    valid = [r for r, c in enumerate(counts) if c is not None]
    starts = set(valid[::window]) | {len(counts)}
    for a, b in ranges[1:]:
        assert a in starts or a == b  # a non-empty shard opens a window (a local run's restart point)
    # Each shard's weight is within one window of an even split (the midpoint rule).
    w = {r: max(1, counts[r] or 0) for r in valid}
    windows = [valid[k : k + window] for k in range(0, len(valid), window)]
    biggest = max((sum(w[r] for r in win) for win in windows), default=0)
    total = sum(w.values())
    for a, b in ranges:
        got = sum(w[r] for r in range(a, b) if r in w)
        assert abs(got - total / n) <= biggest + 1e-9


def test_plan_shards_balances_by_tokens_not_rows():
    counts = [100] * 10 + [10] * 100  # ten long rows, then a hundred short ones
    (a0, b0), (a1, b1) = plan_shards(counts, 1, 2)
    assert (b0 - a0) < (b1 - a1)  # the long rows make shard 0 short in rows
    assert abs(sum(counts[a0:b0]) - sum(counts[a1:b1])) <= 100


# --------------------------------------------------------------------------- CLI: shards + merge


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_merged_shards_equal_the_single_process_output(tiny_qwen_mlx, tmp_path, fmt):
    inp = write_input(tmp_path / "in.jsonl", 120, bad_every=17)
    whole = tmp_path / f"whole.{fmt}"
    assert run(["classify", str(inp), "-o", str(whole), "--window", "16", *cli(tiny_qwen_mlx)]).exit_code == 1
    parts = []
    for i in range(3):
        part = tmp_path / f"part-{i}.{fmt}"
        r = run(["classify", str(inp), "-o", str(part), "--window", "16", "--shard", f"{i}/3", *cli(tiny_qwen_mlx)])
        assert r.exit_code in (0, 1), r.output
        m = json.loads(manifest_path(str(part)).read_text())
        assert m["complete"] and m["settings"]["shard"]["index"] == i
        parts.append(str(part))
    sizes = [len(Path(p).read_bytes()) for p in parts]
    assert all(s > 0 for s in sizes)
    merged = tmp_path / f"merged.{fmt}"
    r = run(["merge", *reversed(parts), "-o", str(merged)])  # any order on the command line
    assert r.exit_code == 0, r.output
    assert merged.read_bytes() == whole.read_bytes()


def test_a_resumed_shard_still_merges_to_the_whole(tiny_qwen_mlx, tmp_path):
    inp = write_input(tmp_path / "in.jsonl", 80)
    whole = tmp_path / "whole.jsonl"
    run(["classify", str(inp), "-o", str(whole), "--window", "8", *cli(tiny_qwen_mlx)])
    parts = [str(tmp_path / f"p{i}.jsonl") for i in range(2)]
    for i, p in enumerate(parts):
        run(["classify", str(inp), "-o", p, "--window", "8", "--shard", f"{i}/2", *cli(tiny_qwen_mlx)])
    # Interrupt shard 1 after it wrote some rows: cut the file mid-row, mark it unfinished.
    data = Path(parts[1]).read_bytes()
    Path(parts[1]).write_bytes(data[: len(data) // 2 + 3])
    m = json.loads(manifest_path(parts[1]).read_text())
    m["complete"], m["rows"] = False, None
    manifest_path(parts[1]).write_text(json.dumps(m))
    r = CliRunner().invoke(main, ["merge", *parts, "-o", str(tmp_path / "m.jsonl")])
    assert r.exit_code == 2 and "unfinished" in r.output and "--resume" in r.output
    r = run(["classify", str(inp), "-o", parts[1], "--window", "8", "--shard", "1/2", "--resume", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 0, r.output
    assert run(["merge", *parts, "-o", str(tmp_path / "m.jsonl")]).exit_code == 0
    assert (tmp_path / "m.jsonl").read_bytes() == whole.read_bytes()


@pytest.fixture()
def two_parts(tiny_qwen_mlx, tmp_path):
    inp = write_input(tmp_path / "in.jsonl", 40)
    parts = [str(tmp_path / f"p{i}.jsonl") for i in range(2)]
    for i, p in enumerate(parts):
        r = run(["classify", str(inp), "-o", p, "--window", "4", "--shard", f"{i}/2", *cli(tiny_qwen_mlx)])
        assert r.exit_code == 0
    return inp, parts


def _merge(*args):
    return CliRunner().invoke(main, ["merge", *args])


def test_merge_refuses_a_missing_or_repeated_shard(two_parts, tmp_path):
    _, (p0, p1) = two_parts
    out = str(tmp_path / "m.jsonl")
    r = _merge(p0, "-o", out)
    assert r.exit_code == 2 and "shard(s) 1/2 missing" in r.output
    r = _merge(p0, p0, p1, "-o", out)
    assert r.exit_code == 2 and "given twice" in r.output
    assert not Path(out).exists()


def test_merge_refuses_a_part_with_a_row_removed(two_parts, tmp_path):
    _, (p0, p1) = two_parts
    lines = Path(p1).read_text().splitlines(keepends=True)
    Path(p1).write_text("".join(lines[:3] + lines[4:]))
    r = _merge(p0, p1, "-o", str(tmp_path / "m.jsonl"))
    assert r.exit_code == 2 and "holds" in r.output and "rows" in r.output
    assert not (tmp_path / "m.jsonl").exists()


def test_merge_refuses_parts_of_other_settings_or_a_whole_output(two_parts, tiny_qwen_mlx, tmp_path):
    inp, (p0, p1) = two_parts
    other = str(tmp_path / "other1.jsonl")
    r = run(["classify", str(inp), "-o", other, "--window", "4", "--shard", "1/2", "--no-sort", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 0
    r = _merge(p0, other, "-o", str(tmp_path / "m.jsonl"))
    assert r.exit_code == 2 and "other settings" in r.output and "sort" in r.output
    whole = str(tmp_path / "whole.jsonl")
    run(["classify", str(inp), "-o", whole, *cli(tiny_qwen_mlx)])
    r = _merge(p0, whole, "-o", str(tmp_path / "m.jsonl"))
    assert r.exit_code == 2 and "not written with --shard" in r.output


def test_merge_checks_ids_against_the_input(two_parts, tmp_path):
    inp, (p0, p1) = two_parts
    lines = inp.read_text().splitlines(keepends=True)
    lines[30] = json.dumps({"id": "changed", "text": "x"}) + "\n"
    inp.write_text("".join(lines))
    r = _merge(p0, p1, "-o", str(tmp_path / "m.jsonl"))
    assert r.exit_code == 2 and "'changed'" in r.output
    r = _merge(p0, p1, "-o", str(tmp_path / "m.jsonl"), "--no-input-check")
    assert r.exit_code == 0 and "ids not checked" in r.output


def test_merge_never_writes_over_a_part_or_the_input(two_parts):
    inp, (p0, p1) = two_parts
    before = Path(p0).read_bytes()
    r = _merge(p0, p1, "-o", p0)
    assert r.exit_code == 2 and Path(p0).read_bytes() == before
    r = _merge(p0, p1, "-o", str(inp))
    assert r.exit_code == 2


def test_shard_usage_errors(tiny_qwen_mlx, tmp_path):
    inp = write_input(tmp_path / "in.jsonl", 10)
    r = CliRunner().invoke(main, ["classify", str(inp), "--shard", "0/2", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "needs -o FILE" in r.output
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(tmp_path / "o.jsonl"), "--shard", "2/2"])
    assert r.exit_code == 2 and "0..N-1" in r.output
    for cal in (["--calibrate", "batch"], ["--calibrate", "em", "--calibration-data", str(inp)]):
        r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(tmp_path / "o.jsonl"), "--shard", "0/2", *cal])
        assert r.exit_code == 2 and "different prior on each shard" in r.output
    assert not (tmp_path / "o.jsonl").exists()


def test_more_shards_than_windows_leaves_some_empty_and_still_merges(tiny_qwen_mlx, tmp_path):
    inp = write_input(tmp_path / "in.jsonl", 10)
    whole = tmp_path / "whole.jsonl"
    run(["classify", str(inp), "-o", str(whole), *cli(tiny_qwen_mlx)])  # one window of 1024
    parts = [str(tmp_path / f"p{i}.jsonl") for i in range(3)]
    for i, p in enumerate(parts):
        assert run(["classify", str(inp), "-o", p, "--shard", f"{i}/3", *cli(tiny_qwen_mlx)]).exit_code == 0
    assert sorted(len(Path(p).read_bytes()) > 0 for p in parts) == [False, False, True]  # one window, one shard
    assert run(["merge", *parts, "-o", str(tmp_path / "m.jsonl")]).exit_code == 0
    assert (tmp_path / "m.jsonl").read_bytes() == whole.read_bytes()


def test_merge_refuses_parts_of_an_edited_input_and_a_wrong_output_format(two_parts, tiny_qwen_mlx, tmp_path):
    inp, (p0, p1) = two_parts
    r = _merge(p0, p1, "-o", str(tmp_path / "m.csv"))
    assert r.exit_code == 2 and "the parts are JSONL" in r.output
    r = _merge(p0, p1, "-o", "-")
    assert r.exit_code == 2 and "give -o a path" in r.output
    # The same size, the same ids, one text changed; shard 1 run again on it.
    data = inp.read_text()
    i = data.index('"text": "') + len('"text": "')
    inp.write_text(data[:i] + ("X" if data[i] != "X" else "Y") + data[i + 1 :])
    r = run(["classify", str(inp), "-o", p1, "--window", "4", "--shard", "1/2", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 0
    r = _merge(p0, p1, "-o", str(tmp_path / "m.jsonl"))
    assert r.exit_code == 2 and "input_sha256" in r.output


# --------------------------------------------------------------------------- Parquet output


def _mixed_ids_input(path: Path) -> Path:
    rows = [
        {"id": 1, "text": TEXTS[0]},
        {"id": "1", "text": TEXTS[1]},  # another id than the integer 1
        {"text": TEXTS[2]},  # no id: its line number, 3
        {"id": "t4", "text": ""},  # an error row
        {"id": 7, "text": TEXTS[3]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n", encoding="utf-8")
    return path


def test_parquet_output_round_trips_through_pandas_with_typed_columns(tiny_qwen_mlx, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    inp = _mixed_ids_input(tmp_path / "in.jsonl")
    pq_out, jl_out = tmp_path / "out.parquet", tmp_path / "out.jsonl"
    assert run(["classify", str(inp), "-o", str(pq_out), *cli(tiny_qwen_mlx)]).exit_code == 1
    assert run(["classify", str(inp), "-o", str(jl_out), *cli(tiny_qwen_mlx)]).exit_code == 1
    df = pd.read_parquet(pq_out)
    want = [json.loads(line) for line in jl_out.read_text().splitlines()]
    assert list(df.columns) == ["id", "id_is_int", "label", "p_a", "p_b", "p_c", "truncated", "line", "error"]
    import pyarrow.parquet as pq

    schema = pq.read_schema(pq_out)
    types = {n: str(schema.field(n).type) for n in schema.names}
    assert types == {
        "id": "string",
        "id_is_int": "bool",
        "label": "string",
        **{f"p_{lab}": "double" for lab in "abc"},
        "truncated": "bool",
        "line": "int64",
        "error": "string",
    }
    ids = [int(v) if flag else v for v, flag in zip(df["id"], df["id_is_int"])]
    assert ids[:3] + ids[4:5] == [1, "1", 3, 7] and pd.isna(ids[5])  # typed: 1 and "1" stay apart
    for (_, row), rec in zip(df.iterrows(), want):
        if "error" in rec:
            assert row["error"] == rec["error"] and pd.isna(row["p_a"]) and row["line"] == rec["line"]
        else:
            assert row["label"] == rec["label"] and pd.isna(row["error"])
            assert abs(row["p_b"] - rec["probs"]["b"]) < 1e-12
    m = json.loads(manifest_path(str(pq_out)).read_text())
    assert m["complete"] and m["settings"]["output_format"] == "parquet" and m["rows"] == 6
    # All-integer ids: an int64 column, no id_is_int.
    only_ints = tmp_path / "ints.jsonl"
    only_ints.write_text("".join(json.dumps({"id": i, "text": TEXTS[i]}) + "\n" for i in range(4)))
    assert run(["classify", str(only_ints), "-o", str(tmp_path / "i.parquet"), *cli(tiny_qwen_mlx)]).exit_code == 0
    di = pd.read_parquet(tmp_path / "i.parquet")
    assert str(di["id"].dtype) == "int64" and list(di["id"]) == [0, 1, 2, 3] and "id_is_int" not in di.columns


def test_parquet_refuses_resume_and_stdout(tiny_qwen_mlx, tmp_path):
    pytest.importorskip("pyarrow")
    inp = write_input(tmp_path / "in.jsonl", 6)
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(out), "--resume", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "--resume does not work with Parquet" in r.output and ".jsonl" in r.output
    r = CliRunner().invoke(main, ["classify", str(inp), "--output-format", "parquet", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 2 and "-o FILE.parquet" in r.output
    r = CliRunner().invoke(main, ["classify", "--help"])
    text = " ".join(r.output.split())
    assert ".parquet" in text and "CSV/TSV ids are strings" in text and "Not for .parquet" in text


@pytest.mark.parametrize("part_fmt", ["jsonl", "csv", "parquet"])
def test_merge_into_parquet(tiny_qwen_mlx, tmp_path, part_fmt):
    pd = pytest.importorskip("pandas")
    inp = write_input(tmp_path / "in.jsonl", 30, bad_every=11)
    whole = tmp_path / "whole.parquet"
    assert run(["classify", str(inp), "-o", str(whole), "--window", "4", *cli(tiny_qwen_mlx)]).exit_code == 1
    parts = []
    for i in range(2):
        p = str(tmp_path / f"p{i}.{part_fmt}")
        r = run(["classify", str(inp), "-o", p, "--window", "4", "--shard", f"{i}/2", *cli(tiny_qwen_mlx)])
        assert r.exit_code == 1 or r.exit_code == 0, r.output
        parts.append(p)
    merged = tmp_path / "m.parquet"
    r = run(["merge", *parts, "-o", str(merged)])
    assert r.exit_code == 0, r.output
    a, b = pd.read_parquet(whole), pd.read_parquet(merged)
    if part_fmt == "csv":  # CSV ids are strings, and so is the id column merged from CSV parts
        assert [None if pd.isna(v) else v for v in b["id"]] == [None if pd.isna(v) else str(v) for v in a["id"]]
        a, b = a.drop(columns=["id"]), b.drop(columns=["id"])
    pd.testing.assert_frame_equal(a, b)
    if part_fmt == "parquet":
        r = _merge(*parts, "-o", str(tmp_path / "m.jsonl"))
        assert r.exit_code == 2 and "Parquet" in r.output


_BIG = 1 << 63  # one past int64's largest


@pytest.mark.parametrize("out_fmt", ["jsonl", "csv", "tsv", "parquet"])
def test_ids_of_every_size_and_type_reach_every_output_format_and_merge_exactly(tiny_qwen_mlx, tmp_path, out_fmt):
    """Issue 26: an integer id beyond int64 made a Parquet run die at its writer after all the
    work (exit 70, no rows). Ids int64 cannot hold go to a string column with `id_is_int`; bool
    and float ids are error rows (id null); every format and merge keep every id exactly."""
    if out_fmt == "parquet":
        pytest.importorskip("pyarrow")
    from mlx_slm.files.output import read_records

    ids = [_BIG, -_BIG - 1, _BIG - 1, -_BIG, 10**40, "s", "1", 1, True, 1.5]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": TEXTS[k]}) + "\n" for k, i in enumerate(ids)))
    want = [i if not isinstance(i, (bool, float)) else None for i in ids]
    if out_fmt in ("csv", "tsv"):  # CSV ids are strings
        want = ["" if i is None else str(i) for i in want]
    whole = tmp_path / f"whole.{out_fmt}"
    r = run(["classify", str(inp), "-o", str(whole), "--window", "2", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 1, r.output  # the bool and float ids are error rows, the rest classified
    assert [x.fields["id"] for x in read_records(str(whole), out_fmt) if x.row > 0] == want
    parts = []
    for i in range(2):
        p = str(tmp_path / f"p{i}.{out_fmt}")
        r = run(["classify", str(inp), "-o", p, "--window", "2", "--shard", f"{i}/2", *cli(tiny_qwen_mlx)])
        assert r.exit_code in (0, 1), r.output
        parts.append(p)
    merged = tmp_path / f"m.{out_fmt}"
    assert run(["merge", *parts, "-o", str(merged)]).exit_code == 0
    assert merged.read_bytes() == whole.read_bytes() or out_fmt == "parquet"
    assert [x.fields["id"] for x in read_records(str(merged), out_fmt) if x.row > 0] == want
    if out_fmt != "parquet":  # merged into Parquet from text parts: the same ids, typed as the parts had them
        pytest.importorskip("pyarrow")
        pq_merged = tmp_path / "m.parquet"
        assert run(["merge", *parts, "-o", str(pq_merged)]).exit_code == 0
        assert [x.fields["id"] for x in read_records(str(pq_merged), "parquet")] == [
            None if i == "" else i for i in want
        ]


def test_parquet_id_column_is_int64_only_when_every_integer_fits(tmp_path):
    pa = pytest.importorskip("pyarrow")
    from mlx_slm.files.output import ParquetRows, csv_columns, parquet_records

    for ids, typ, flag in (
        ([1, -(1 << 63), (1 << 63) - 1], pa.int64(), False),
        ([1, 1 << 63], pa.string(), True),
        ([-(1 << 63) - 1, None], pa.string(), True),
        (["a", None], pa.string(), False),
    ):
        rows = ParquetRows(csv_columns(["x"]))
        for i in ids:
            rows.add({"id": i, "label": "x", "probs": {"x": 1.0}})
        t = rows.table()
        assert t.schema.field("id").type == typ and ("id_is_int" in t.schema.names) == flag
        assert [r["id"] for r in parquet_records(t)] == ids


def test_merge_names_the_part_made_from_other_input_content(two_parts, tiny_qwen_mlx, tmp_path):
    """Each part's manifest pins the input's sha256: parts of two contents of one file are
    refused, even with --no-input-check, naming the part and the way out."""
    inp, (p0, p1) = two_parts
    data = inp.read_text()
    i = data.index('"text": "') + len('"text": "')
    inp.write_text(data[:i] + ("X" if data[i] != "X" else "Y") + data[i + 1 :])
    r = run(["classify", str(inp), "-o", p1, "--window", "4", "--shard", "1/2", *cli(tiny_qwen_mlx)])
    assert r.exit_code == 0
    r = _merge(p0, p1, "-o", str(tmp_path / "m.jsonl"), "--no-input-check")
    assert r.exit_code == 2 and f"{p1} was made from other input content than {p0}" in r.output
    assert "run every shard again" in r.output and not (tmp_path / "m.jsonl").exists()


def test_merge_checks_a_grouped_part_query_by_query(tmp_path):
    """Parts whose rows are grouped by their input row (`grouped_by`: a rerank query's ranking): each
    part holds the rows its run recorded, and each input row's id is on its run of rows."""
    from mlx_slm.files.output import write_manifest
    from mlx_slm.files.sharding import merge_parts, shard_settings

    inp = tmp_path / "q.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "query": "q", "documents": ["a", "b"]}) + "\n" for i in range(4)))
    rows = [[{"query_id": i, "index": k, "rank": k + 1} for k in range(2)] for i in range(4)]
    common = {"form": "rerank", "grouped_by": "query_id", "input": str(inp), "input_format": "jsonl"}
    common["fields"] = ["query", "id", None, None]

    def part(i, units, lines=None):
        p = tmp_path / f"p{i}.jsonl"
        got = lines if lines is not None else [r for u in units for r in rows[u]]
        p.write_text("".join(json.dumps(r) + "\n" for r in got))
        shard = shard_settings(i, 2, (units[0], units[-1] + 1), 4)
        write_manifest(str(p), {**common, "shard": shard}, complete=True, rows=len(got))
        return str(p)

    parts = [part(0, [0, 1]), part(1, [2, 3])]
    got = merge_parts(parts, str(tmp_path / "all.jsonl"))
    assert got["rows"] == 8 and got["ids_checked"]
    assert (tmp_path / "all.jsonl").read_text() == "".join(json.dumps(r) + "\n" for u in rows for r in u)
    wrong = [*rows[2][:1], {"query_id": 9, "index": 1, "rank": 2}, *rows[3]]
    with pytest.raises(ShardError, match="row 6 of the parts has query_id 9 where input line 4 has id 3"):
        merge_parts([parts[0], part(1, [2, 3], wrong)], str(tmp_path / "all.jsonl"))
    p1 = part(1, [2, 3])
    with open(p1, "a") as f:
        f.write(json.dumps(rows[3][0]) + "\n")
    with pytest.raises(ShardError, match="holds 5 rows where its run wrote 4"):
        merge_parts([parts[0], p1], str(tmp_path / "all.jsonl"))


QUESTIONS = [
    {"name": "team", "question": "Which team?", "labels": ["billing", "technical"]},
    {"name": "size", "question": "How big?", "kind": "scale", "levels": ["1", "2", "3"]},
]


@pytest.fixture
def qrun(tiny_qwen_mlx, tmp_path):
    data = write(
        tmp_path / "in.jsonl", "".join(json.dumps({"id": i, "text": t}) + "\n" for i, (t, _) in enumerate(tickets(16)))
    )
    q = write(tmp_path / "q.jsonl", "".join(json.dumps(x) + "\n" for x in QUESTIONS))
    return ["classify", data, "--model", tiny_qwen_mlx, "--questions", q, "--min-confidence", "0.6", "-q",
            "--window", "4"]  # fmt: skip


def test_a_questions_runs_csv_parts_merge_into_the_same_parquet_as_one_run(qrun, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    for fmt in ("csv", "tsv"):
        parts = [tmp_path / f"part{i}.{fmt}" for i in range(2)]
        for i, p in enumerate(parts):
            assert invoke([*qrun, "-o", p, "--shard", f"{i}/2", "--on-error", "skip"]).exit_code == 0
        r = invoke(["merge", *parts, "-o", tmp_path / f"all-{fmt}.parquet"])
        assert r.exit_code == 0, r.output
        assert invoke([*qrun, "-o", tmp_path / "one.parquet"]).exit_code == 0
        merged, one = pq.read_table(tmp_path / f"all-{fmt}.parquet"), pq.read_table(tmp_path / "one.parquet")
        assert merged.schema.field("team.p_billing").type == one.schema.field("team.p_billing").type  # float64
        assert merged.schema.field("size.expected").type == one.schema.field("size.expected").type
        assert merged.schema.field("team.abstained").type == one.schema.field("team.abstained").type  # bool
        assert merged.drop(["id"]).equals(one.drop(["id"]))  # CSV ids are strings; everything else equal
        assert merged.column("id").to_pylist() == [str(i) for i in one.column("id").to_pylist()]


@pytest.mark.parametrize("name", ["all.weird", "all", "all.jsonl.bak"])
def test_merge_refuses_an_output_extension_classify_refuses(name, qrun, tmp_path):
    parts = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    for i, p in enumerate(parts):
        assert invoke([*qrun, "-o", p, "--shard", f"{i}/2"]).exit_code == 0
    r = invoke(["merge", *parts, "-o", tmp_path / name])
    refused_cleanly(r, "unknown output extension", "name it .jsonl")
    assert not (tmp_path / name).exists()
    assert invoke([*qrun, "-o", tmp_path / name]).exit_code == 2  # classify refuses the same name


def _old_plan_shards(token_counts, window, n):
    """The planner before issue 18 (O(N)): the new one must cut exactly where it did."""
    valid_rows = [r for r, c in enumerate(token_counts) if c is not None]
    starts = valid_rows[::window]
    weights = [
        sum(max(1, token_counts[r] or 0) for r in valid_rows[k * window : (k + 1) * window]) for k in range(len(starts))
    ]
    total, bounds, cum, k = sum(weights), [0], 0.0, 0
    for s in range(1, n):
        while k < len(weights) and (cum + weights[k] / 2) * n < s * total:
            cum += weights[k]
            k += 1
        bounds.append(k)
    bounds.append(len(weights))
    cuts = [0] + [starts[b] if b < len(starts) else len(token_counts) for b in bounds[1:-1]] + [len(token_counts)]
    return [(cuts[s], cuts[s + 1]) for s in range(n)]


def test_shards_are_bounded_by_the_input_and_planned_in_time_independent_of_n(tiny_qwen_mlx, tmp_path):
    import random

    rng = random.Random(18)
    for _ in range(300):
        counts = [None if rng.random() < 0.1 else rng.randint(1, 60) for _ in range(rng.randint(0, 40))]
        window, n = rng.randint(1, 6), rng.randint(1, 12)
        plan = plan_shards(counts, window, n)
        assert plan == _old_plan_shards(counts, window, n)
        assert [shard_range(counts, window, n, i) for i in range(n)] == plan
    counts = [rng.randint(1, 60) for _ in range(5000)]
    t = time.perf_counter()
    for n, i in ((10**7, 0), (10**20, 10**20 - 1), (10**7, 5 * 10**6)):
        shard_range(counts, 16, n, i)
    assert time.perf_counter() - t < 1.0

    inp = hostile.write_input(tmp_path / "in.jsonl", 10)
    for spec in ("99999999999999999999/100000000000000000000", "0/10000000", "0/11"):
        t = time.perf_counter()
        r = invoke(["classify", inp, "-o", tmp_path / "o.jsonl", "--shard", spec, *cli(tiny_qwen_mlx)])
        refused(r, "only 10 row(s)", "at most 10 shards")
        assert time.perf_counter() - t < 10
    refused(invoke(["classify", inp, "-o", tmp_path / "o.jsonl", "--shard", "0/1_0"]), "give it as I/N")
    assert not (tmp_path / "o.jsonl").exists()
    assert invoke(["classify", inp, "-o", tmp_path / "o.jsonl", "--shard", "9/10", *cli(tiny_qwen_mlx)]).exit_code == 0
