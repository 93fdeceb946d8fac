"""`--resume` after a torn or edited output or manifest: refused with a clear error, or resumed
to the same bytes as a whole run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostile import cli, refused, write


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_resume_after_a_torn_or_edited_output_or_manifest(tiny_qwen_mlx, tmp_path, fmt):
    inp = write(
        tmp_path / "in.jsonl", "".join(json.dumps({"id": f"t{i}", "text": f"item {i} x"}) + "\n" for i in range(6))
    )
    out = tmp_path / f"out.{fmt}"
    args = ["classify", str(inp), "-o", str(out), "--model", str(tiny_qwen_mlx), "-q", "--window", "2"]
    r = cli(*args)
    assert r.exit_code == 0, r.output
    whole = out.read_bytes()
    manifest = Path(str(out) + ".mlx-slm.json")
    man = json.loads(manifest.read_text())
    man["complete"], man["rows"] = False, None  # as an interrupted run leaves it
    lines = whole.split(b"\n")
    edits = {
        "torn 0xff": b"\n".join(lines[:3]) + b"\n\xff\xfe garbage\n",
        "blank line": b"\n".join(lines[:2]) + b"\n\n" + b"\n".join(lines[2:]),
        "one field": b"\n".join(lines[:2]) + b"\nx\n",
        "deep": b"\n".join(lines[:2]) + b"\n" + b"[" * 50_000 + b"\n",
    }
    for what, data in edits.items():
        write(out, data)
        manifest.write_text(json.dumps(man))
        refused(cli(*args, "--resume"), str(out), "start again without --resume")
        assert out.read_bytes() == data, what  # refused: left untouched
    for bad in ({"manifest_version": "2"}, {"complete": "yes"}, {"rows": -1}, {"fitted_calibrator": [1]}):
        write(out, whole)
        manifest.write_text(json.dumps({**man, **bad}))
        refused(cli(*args, "--resume"), str(manifest), "not a readable mlx-slm manifest", next(iter(bad)))
    manifest.write_bytes(b"\xff{")
    refused(cli(*args, "--resume"), "not a readable mlx-slm manifest")
    write(out, whole)
    manifest.write_text(json.dumps(man))
    r = cli(*args, "--resume")
    assert r.exit_code == 0 and out.read_bytes() == whole, r.output


# ----------------------------------------------------------------- several rows a unit (a rerank query's)


def _grouped(tmp_path, units):
    """A grouped output: each unit (id, rows, alone) gives `rows` rows naming it in `query_id`."""
    out = tmp_path / "g.jsonl"
    lines = []
    for uid, n, alone in units:
        lines += (
            [{"query_id": uid, "line": 1, "error": "bad"}]
            if alone
            else [{"query_id": uid, "rank": k} for k in range(n)]
        )
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out, out.read_bytes().splitlines(keepends=True)


class _Unit:
    def __init__(self, uid, alone=False):
        self.id, self.error = uid, ("bad" if alone else None)


def _plan(out, units, window, complete=None):
    """`plan_group_resume`, its units to run again followed by those it did not reach."""
    from mlx_slm.files.output import plan_group_resume

    it = iter(units)
    keep, rows, errors, redo = plan_group_resume(str(out), "query_id", it, lambda u: (u.id, u.error is not None), window, complete)  # fmt: skip
    return keep, rows, errors, redo + list(it)


def test_a_grouped_output_keeps_its_finished_windows_of_units(tmp_path):
    """Windows of two units that run (an error rides along); the last unit found may be cut short,
    so its window runs again; a complete run keeps everything."""
    spec = [(1, 2, False), (2, 3, False), (None, 1, True), (3, 2, False), (4, 1, False)]
    units = [_Unit(u, a) for u, _, a in spec]
    out, lines = _grouped(tmp_path, spec)
    keep, rows, errors, redo = _plan(out, units, 2, complete=len(lines))
    assert (keep, rows, errors, redo) == (len(b"".join(lines)), 9, 1, [])
    for cut_rows, kept_units in ((0, 0), (2, 0), (5, 0), (6, 3), (7, 3), (8, 3), (9, 3)):
        out.write_bytes(b"".join(lines[:cut_rows]) + b'{"query_id": ')  # and a torn row
        keep, rows, errors, redo = _plan(out, units, 2)
        kept_rows = sum(n for _, n, _ in spec[:kept_units])
        assert (keep, rows, redo) == (len(b"".join(lines[:kept_rows])), kept_rows, units[kept_units:]), cut_rows
        assert errors == (1 if kept_units >= 3 else 0)
    # the error unit found last is whole in its one row: with its window finished, everything found is kept
    out.write_bytes(b"".join(lines[:6]))
    assert _plan(out, units, 2)[1:3] == (6, 1)


def test_a_grouped_output_of_other_units_is_refused(tmp_path):
    out, lines = _grouped(tmp_path, [(1, 2, False), (7, 1, False)])
    with pytest.raises(Exception, match="row 3 has query_id 7 where the input has 2: it is not the output"):
        _plan(out, [_Unit(1), _Unit(2)], 2)
    with pytest.raises(Exception, match="rows past the input's last unit"):
        _plan(out, [_Unit(1)], 2)
    out.write_bytes(b'{"query_id": 1}\n[1]\n')
    with pytest.raises(Exception, match="row 2 is not an mlx-slm output record"):
        _plan(out, [_Unit(1), _Unit(2)], 2)
