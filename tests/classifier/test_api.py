"""The Python API (the texts it takes are in tests/text/test_inputs.py): `classify_frame`, progress
bars, a stream that yields each batch as it finishes; and the manual's Python blocks (README.md and docs/*.md) run as shown (on the tiny model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mlx_slm.classifier.classifier import Classifier

pd = pytest.importorskip("pandas")

TEXTS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "x",
    "I need to change the email address on my profile, it is old and I no longer use it at all.",
    "refund status please",
    "Why was I billed again?",
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clf(tiny_qwen_mlx):
    return Classifier.load(str(tiny_qwen_mlx), batch_size=2)


def test_classify_frame_columns(clf):
    df = pd.DataFrame({"id": ["a", "b", "c", "d"], "text": [TEXTS[0], "", None, TEXTS[1]]}, index=[10, 11, 12, 13])
    out = clf.classify_frame(df, text_column="text")
    assert list(out.index) == [10, 11, 12, 13] and "label" not in df.columns  # a copy
    assert list(out.columns) == ["id", "text", "label", "p_billing", "p_technical", "p_account", "truncated", "error"]
    want = clf.classify([TEXTS[0], TEXTS[1]])
    assert out.loc[10, "label"] == want[0].label and out.loc[13, "label"] == want[1].label
    assert abs(out.loc[10, "p_billing"] - want[0].probs["billing"]) < 1e-12
    assert str(out["p_billing"].dtype) == "float64" and str(out["truncated"].dtype) == "bool"
    assert "empty" in out.loc[11, "error"] and "string" in out.loc[12, "error"]
    assert pd.isna(out.loc[11, "p_billing"]) and pd.isna(out.loc[11, "label"])
    row_sums = out.loc[[10, 13], ["p_billing", "p_technical", "p_account"]].sum(axis=1)
    assert all(abs(s - 1) < 1e-9 for s in row_sums)


def test_classify_frame_names_a_prefix_that_is_not_a_string(clf):
    """Issue 26: prefix=5 raised a bare TypeError from inside (int + str)."""
    pd = pytest.importorskip("pandas")
    with pytest.raises(TypeError, match=r"classify_frame\(prefix=\.\.\.\) takes a string.*got int 5"):
        clf.classify_frame(pd.DataFrame({"text": ["hi"]}), prefix=5)


def test_classify_frame_calibration_and_abstain_columns(clf):
    df = pd.DataFrame({"text": TEXTS})
    out = clf.classify_frame(df, calibration="batch", min_confidence=0.99)
    for col in ("raw_p_billing", "raw_p_account", "calibration", "abstained"):
        assert col in out.columns
    ref = clf.classify(TEXTS, calibration="batch", min_confidence=0.99)
    assert list(out["label"]) == [p.label for p in ref]
    assert list(out["abstained"]) == [p.abstained for p in ref]
    assert set(out["calibration"]) == {"batch"}
    assert [round(v, 12) for v in out["raw_p_billing"]] == [round(p.raw_probs["billing"], 12) for p in ref]
    # a column already there is refused, and prefix= avoids it
    gold = pd.DataFrame({"text": TEXTS[:2], "label": ["billing", "technical"]})
    with pytest.raises(ValueError, match="prefix="):
        clf.classify_frame(gold)
    out = clf.classify_frame(gold, prefix="pred_")
    assert list(out["label"]) == ["billing", "technical"] and "pred_label" in out.columns
    with pytest.raises(KeyError, match="body"):
        clf.classify_frame(gold, text_column="body")
    with pytest.raises(TypeError, match="DataFrame"):
        clf.classify_frame(TEXTS)


def test_progress_bar_on_stderr(clf, capsys):
    got = clf.classify(TEXTS, progress=True)
    err = capsys.readouterr().err
    assert f"{len(TEXTS)}/{len(TEXTS)}" in err and "mlx-slm" in err
    assert [p.index for p in got] == list(range(len(TEXTS)))
    assert [p.label for p in got] == [p.label for p in clf.classify(TEXTS)]
    list(clf.classify_iter(TEXTS, progress=True))
    assert f"{len(TEXTS)}/{len(TEXTS)}" in capsys.readouterr().err
    clf.classify_frame(pd.DataFrame({"text": TEXTS}), progress=True)
    assert f"{len(TEXTS)}/{len(TEXTS)}" in capsys.readouterr().err


def test_unordered_stream_yields_each_batch_as_it_finishes(clf):
    """ordered=False hands out a batch's predictions before the next batch is computed."""
    texts = TEXTS + ["", "short", "a much longer ticket text that goes on and on about invoices and payments"]
    batches = []
    orig = clf.kind.score  # the kind scores each batch (pipeline.run_items calls it)

    def spy(*a, **k):
        out = orig(*a, **k)
        batches.append([p.index for p in out])
        return out

    clf.kind.score = spy
    try:
        seen_at = []  # how many batches had run when each prediction arrived
        preds = []
        for p in clf.classify_iter(texts, ordered=False):
            seen_at.append(len(batches))
            preds.append(p)
    finally:
        del clf.kind.score
    assert sorted(p.index for p in preds) == list(range(len(texts)))
    assert preds[0].index == 6 and preds[0].error  # the empty text: first, before any batch ran
    assert seen_at[0] == 0
    k = 1
    for i, b in enumerate(batches, 1):  # every batch's predictions arrive before the next batch runs
        assert [p.index for p in preds[k : k + len(b)]] == b and set(seen_at[k : k + len(b)]) == {i}
        k += len(b)
    assert len(batches) >= 3
    ordered = {p.index: p for p in clf.classify_iter(texts)}
    assert all(p.label == ordered[p.index].label and p.probs == ordered[p.index].probs for p in preds)


# ----------------------------------------------------------------------------- the manual's Python


def _python_blocks() -> list[tuple[str, str]]:
    """Every ```python block of the README and of the docs/ pages, with the page it is on."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [
        (str(page.relative_to(ROOT)), block)
        for page in pages
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    ]


def test_readme_python_blocks_run(tiny_qwen_mlx, tmp_path, monkeypatch, capsys):
    """Every ```python block of the README and docs/ (docs/classify.md's API block) runs as
    written, with the built-in model's name replaced by the tiny test model (the Ray Data block
    runs in tests/test_ray.py)."""
    from click.testing import CliRunner

    from mlx_slm.cli import main

    monkeypatch.chdir(tmp_path)
    inp = tmp_path / "sample.jsonl"
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    r = CliRunner().invoke(
        main, ["classify", str(inp), "--model", str(tiny_qwen_mlx), "-q", "-o", "o.jsonl", "--save-task", "task.json"]
    )
    assert r.exit_code == 0, r.output
    # The Ray Data block runs in tests/test_ray.py, the scikit-learn walk-through (its CSV, its
    # joblib file) in tests/sklearn/test_estimator.py, OpenAI's SDK against a server in tests/server/test_openai.py,
    # the decision clients (openai's decisions.create, typesafe-sdk) against a server in tests/server/test_decisions.py
    # and tests/server/test_systemone.py.
    skip = ("import ray", "import joblib", "openai.OpenAI(", "decisions.create(", "TypeSafeClient(")
    blocks = [(page, b) for page, b in _python_blocks() if not any(x in b for x in skip)]
    assert blocks, "the manual has no Python block"
    assert "docs/classify.md" in {page for page, _ in blocks}, "docs/classify.md holds the API block"
    for i, (page, block) in enumerate(blocks, 1):
        code = block.replace('"qwen2.5-coder-0.5b"', repr(str(tiny_qwen_mlx)))
        exec(compile(code, f"{page} python block {i}", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "billing" in out or "technical" in out or "account" in out
