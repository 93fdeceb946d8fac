"""The options classify, eval, train and serve share (`cli/options.py`): an option nothing would read is
refused by name."""

from __future__ import annotations

import json

import pytest

from tests.hostile import invoke, refused_cleanly

# ----------------------------------------------------------------------------- options nothing reads


def _input(tmp_path):
    p = tmp_path / "in.jsonl"
    rows = [{"id": i, "text": f"ticket {i}", "label": ("billing", "tech")[i % 2]} for i in range(4)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("option", ["--gold-field", "--gold-column"])
def test_classify_refuses_a_gold_field_nothing_reads(tmp_path, tiny_qwen_mlx, option):
    inp = _input(tmp_path)
    r = invoke(["classify", inp, "--model", tiny_qwen_mlx, "--labels", "billing,tech", option, "label", "-q"])
    refused_cleanly(r, "--gold-field", "--calibration-data")
    ok = invoke(["classify", inp, "--model", tiny_qwen_mlx, "--labels", "billing,tech", "--calibrate", "fit",
                 "--calibration-data", inp, option, "label", "-q"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
