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
