"""The window and batch pipeline (`classifier/pipeline.py`): texts -> items -> batches -> `kind.score` ->
predictions; a non-finite probability is an error row, never a number; an unordered stream yields
each batch as it finishes."""

from __future__ import annotations

import json
import math

from click.testing import CliRunner

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.cli import main
from mlx_slm.text.workload import tickets
from tests.conftest import TICKET_TEXTS as TEXTS

ROWS = tickets(30)


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


def _strict(text: str) -> list[dict]:
    """JSON lines as a strict parser reads them (NaN and Infinity are not JSON)."""

    def refuse(c):
        raise ValueError(f"{c} is not JSON")

    return [json.loads(x, parse_constant=refuse) for x in text.splitlines() if x.strip()]


def test_a_non_finite_probability_is_an_error_row_never_a_number(nan_seqcls, tmp_path):

    tiny_clf = Classifier.load(str(nan_seqcls))
    preds = tiny_clf.classify(["hello there", "my bill is wrong"])
    assert all(p.error and "non-finite probability" in p.error for p in preds)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, (t, _) in enumerate(ROWS[:5])))
    out = tmp_path / "o.jsonl"
    r = run(["classify", inp, "--model", nan_seqcls, "-o", out, "--on-error", "skip", "-q"])
    assert r.exit_code == 0, r.output
    rows = _strict(out.read_text())
    assert len(rows) == 5 and all("non-finite probability" in x["error"] for x in rows)
    assert not any(isinstance(v, float) and not math.isfinite(v) for x in rows for v in x.values())


def test_unordered_stream_yields_each_batch_as_it_finishes(tiny_clf):
    """ordered=False hands out a batch's predictions before the next batch is computed."""
    texts = TEXTS + ["", "short", "a much longer ticket text that goes on and on about invoices and payments"]
    batches = []
    orig = tiny_clf.kind.score  # the kind scores each batch (pipeline.run_items calls it)

    def spy(*a, **k):
        out = orig(*a, **k)
        batches.append([p.index for p in out])
        return out

    tiny_clf.kind.score = spy
    try:
        seen_at = []  # how many batches had run when each prediction arrived
        preds = []
        for p in tiny_clf.classify_iter(texts, ordered=False):
            seen_at.append(len(batches))
            preds.append(p)
    finally:
        del tiny_clf.kind.score
    assert sorted(p.index for p in preds) == list(range(len(texts)))
    assert preds[0].index == 6 and preds[0].error  # the empty text: first, before any batch ran
    assert seen_at[0] == 0
    k = 1
    for i, b in enumerate(batches, 1):  # every batch's predictions arrive before the next batch runs
        assert [p.index for p in preds[k : k + len(b)]] == b and set(seen_at[k : k + len(b)]) == {i}
        k += len(b)
    assert len(batches) >= 3
    ordered = {p.index: p for p in tiny_clf.classify_iter(texts)}
    assert all(p.label == ordered[p.index].label and p.probs == ordered[p.index].probs for p in preds)
