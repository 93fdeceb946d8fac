"""The window and batch pipeline (`classifier/pipeline.py`): texts -> items -> batches -> `kind.score` ->
predictions; a non-finite probability is an error row, never a number."""

from __future__ import annotations

import json
import math

from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets

ROWS = tickets(30)


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


def _strict(text: str) -> list[dict]:
    """JSON lines as a strict parser reads them (NaN and Infinity are not JSON)."""

    def refuse(c):
        raise ValueError(f"{c} is not JSON")

    return [json.loads(x, parse_constant=refuse) for x in text.splitlines() if x.strip()]


def test_a_non_finite_probability_is_an_error_row_never_a_number(nan_seqcls, tmp_path):
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.load(str(nan_seqcls))
    preds = clf.classify(["hello there", "my bill is wrong"])
    assert all(p.error and "non-finite probability" in p.error for p in preds)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, (t, _) in enumerate(ROWS[:5])))
    out = tmp_path / "o.jsonl"
    r = run(["classify", inp, "--model", nan_seqcls, "-o", out, "--on-error", "skip", "-q"])
    assert r.exit_code == 0, r.output
    rows = _strict(out.read_text())
    assert len(rows) == 5 and all("non-finite probability" in x["error"] for x in rows)
    assert not any(isinstance(v, float) and not math.isfinite(v) for x in rows for v in x.values())
