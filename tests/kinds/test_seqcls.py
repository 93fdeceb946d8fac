"""The `seqcls` kind end to end against Transformers: tiny random Qwen2/Llama/Qwen3
`*ForSequenceClassification` checkpoints (3 labels softmax, 4 labels multi-label, one label;
half without id2label), texts and (text, pair) items of varied length in padded batches of
several sizes, through the Python API and through `mlx-slm classify` on JSONL, CSV
(`--pair-column`) and Parquet (`text_pair`) files: every item's answer equal and its
probabilities within 1e-4 of `AutoModelForSequenceClassification` with the
text-classification pipeline's own encoding and probabilities (`reference.SeqClsReference`,
Transformers in this process, each item alone)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.cli import main
from mlx_slm.engine.engine import Engine
from mlx_slm.parity.reference import SeqClsReference
from mlx_slm.text.workload import tickets

TOL = 1e-4
MULTI = "multi_label_classification"
# (arch, num_labels, problem_type, id2label): each architecture single-label, multi-label and one
# label, half without id2label (as tests/models/test_seqcls.py makes them: the same tiny models).
CASES = [
    (arch, n, pt, (i + j) % 2 == 0)
    for i, arch in enumerate(["qwen2", "llama", "qwen3"])
    for j, (n, pt) in enumerate([(3, None), (4, MULTI), (1, None)])
]
_T = [t for t, _ in tickets(40)]
# Texts of varied length (a 3-token one and a long one), every third with a second text.
ITEMS: list = [
    (t[: 8 + (i * 37) % 160], _T[-1 - i][: 5 + (i * 11) % 60]) if i % 3 == 0 else t[: 8 + (i * 37) % 160]
    for i, t in enumerate(_T[:13])
] + ["ok", ("refund", "card declined")]


def _name(case) -> str:
    arch, n, pt, named = case
    return f"{arch}-{n}-{'multi' if pt else 'unset'}-{'named' if named else 'plain'}"


def split(items):
    texts = [x[0] if isinstance(x, tuple) else x for x in items]
    pairs = [x[1] if isinstance(x, tuple) else None for x in items]
    return texts, pairs


class Case:
    """A tiny sequence classifier, converted, and Transformers' answers to `ITEMS`."""

    def __init__(self, case, models):
        arch, n, pt, named = self.case = case
        self.mlx = models.seqcls_mlx(arch, n, pt, named)
        self.ref = SeqClsReference(models.seqcls_hf(arch, n, pt, named), threads=1)
        self.labels = self.ref.labels
        self.form = "score" if n == 1 else "multi" if pt == MULTI else "label"
        self.ids, self.logits, self.probs = self.ref.classify(*split(ITEMS))

    def check(self, i: int, label, labels, probs: dict, logit=None, score=None, threshold: float = 0.5) -> None:
        """One item's answer as we gave it against Transformers' (probabilities to `TOL`)."""
        want = self.probs[i]
        got = np.array([probs[lab] for lab in self.labels])
        assert np.abs(got - want).max() <= TOL, (i, got, want)
        if self.form == "label":
            assert label == self.labels[int(np.argmax(want))] and labels is None
        elif self.form == "multi":
            assert labels == [lab for lab, p in zip(self.labels, want) if p >= threshold] and label is None
        else:
            assert label == self.labels[0] and abs(score - want[0]) <= TOL and abs(logit - self.logits[i, 0]) <= TOL


@pytest.fixture(scope="module", params=CASES, ids=_name)
def case(request, tiny_arch) -> Case:
    return Case(request.param, tiny_arch)


@pytest.mark.parametrize("batch", [(1, None), (4, 64), (32, 512)], ids=["alone", "small-batches", "one-batch"])
def test_python_api_equals_transformers_on_every_item(case, batch):
    clf = Classifier(Engine.load(str(case.mlx)), batch_size=batch[0], max_batch_tokens=batch[1])
    assert clf.spec.name == "seqcls" and clf.labels == case.labels and clf.mode == "seqcls"
    run = clf.run(ITEMS)
    preds = list(run)
    if batch[0] > 1:  # the items really ran in padded batches
        assert run.stats.padding_tokens > 0 and run.stats.batches < len(ITEMS)
    # our encoding is the pipeline's (the trailing pad ids it reads past dropped)
    assert [it.ids for it in clf.prepare(ITEMS)] == [clf.spec.head.prompt_ids(x) for x in case.ids]
    for i, p in enumerate(preds):
        assert p.ok and p.index == i and p.n_tokens == len(case.ids[i])
        case.check(i, p.label, p.labels, p.probs, next(iter(p.scores.values())), p.value)
        assert np.abs(np.array([p.scores[lab] for lab in case.labels]) - case.logits[i]).max() <= TOL


@pytest.mark.parametrize("multi", [c for c in CASES if c[2] == MULTI], ids=_name)
def test_a_multi_label_threshold_sets_the_answer(multi, tiny_arch):
    case = Case(multi, tiny_arch)
    engine = Engine.load(str(case.mlx))
    for threshold in (0.0, 0.3, 0.7, 1.0):
        for i, p in enumerate(Classifier(engine, threshold=threshold).classify(ITEMS)):
            case.check(i, p.label, p.labels, p.probs, threshold=threshold)


def _write(path, fmt: str) -> list[str]:
    """ITEMS as an input file of format `fmt`; the classify options that read its pairs."""
    texts, pairs = split(ITEMS)
    if fmt == "jsonl":
        rows = [{"id": i, "text": t, **({"text_pair": p} if p else {})} for i, (t, p) in enumerate(zip(texts, pairs))]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return []
    if fmt == "csv":
        import csv

        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "text", "hypothesis"])
            w.writerows([i, t, p or ""] for i, (t, p) in enumerate(zip(texts, pairs)))
        return ["--pair-column", "hypothesis"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts, "text_pair": pairs}), str(path))
    return []


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_classify_files_with_pairs_equal_transformers(case, fmt, tmp_path):
    inp = tmp_path / f"in.{fmt}"
    extra = _write(inp, fmt)
    out = tmp_path / "out.jsonl"
    args = ["classify", str(inp), "--model", str(case.mlx), "-o", str(out), "-q", "--batch-size", "4", *extra]
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [str(rec["id"]) for rec in recs] == [str(i) for i in range(len(ITEMS))]
    for i, rec in enumerate(recs):
        probs = rec.get("probs") or {case.labels[0]: rec["score"]}
        case.check(i, rec.get("label"), rec.get("labels"), probs, rec.get("logit"), rec.get("score"))
    manifest = json.loads((tmp_path / "out.jsonl.mlx-slm.json").read_text())["settings"]
    assert manifest["form"] == case.form and manifest["seqcls"]["labels"] == list(case.labels)


# --------------------------------------------------------------------------- prompts of one's own


def test_a_chat_prompt_is_opt_in_and_places_the_pair(tiny_arch):
    """--template opts a sequence classifier in to a chat prompt (Transformers then runs our
    ids: the same head, the same numbers); a pair needs {pair} in it, or it is an error row
    naming the fix, the other rows classified."""
    path = tiny_arch.seqcls_mlx("qwen2", 3)
    engine = Engine.load(str(path))
    ref = SeqClsReference(tiny_arch.seqcls_hf("qwen2", 3), threads=1)
    clf = Classifier(engine, template="Premise: {text}\nHypothesis: {pair}", system=None, batch_size=3)
    items = [("I was charged twice", "a refund"), ("app crashes", "a bug report"), ("x", "y z")]
    ids = [it.ids for it in clf.prepare(items)]
    assert ids != [engine.model.seqcls.prompt_ids(x) for x in ref.classify(*split(items))[0]]  # not the bare pair
    for p, x in zip(clf.classify(items), ids):
        want = ref.probabilities(ref.logits(x))
        assert np.abs(np.array([p.probs[lab] for lab in ref.labels]) - want).max() <= TOL
    one = Classifier(engine, template="Ticket: {text}", system=None)
    got = one.classify(["a text alone", ("a text", "and a pair")])
    assert got[0].ok and not got[1].ok and "{pair}" in got[1].error and "text_pair" in got[1].error
    both = Classifier(engine, template="A: {text}\nB: {pair}", system=None).classify(["no pair here"])
    assert "holds {pair}, but the item has no second text" in both[0].error


def test_a_model_without_a_pad_token_runs_in_batches(tiny_arch, tmp_path):
    """No pad_token_id in its config and no pad token in its tokenizer (Transformers refuses
    such a model a batch of more than one): rows are padded with id 0 under the attention
    mask, which no row attends to, and the score is read at each row's last token, so every
    item equals Transformers on it alone."""
    import shutil

    from mlx_slm.weights.convert import convert

    src = tmp_path / "hf"
    shutil.copytree(tiny_arch.seqcls_hf("llama", 3, None, False), src)
    for name, key in (("config.json", "pad_token_id"), ("tokenizer_config.json", "pad_token")):
        cfg = json.loads((src / name).read_text())
        cfg.pop(key, None)
        if name == "config.json":
            cfg[key] = None
        (src / name).write_text(json.dumps(cfg))
    engine = Engine.load(str(convert(src, tmp_path / "mlx", dtype="float32", progress=None)))
    assert engine.tokenizer.pad_token_id is None and engine.model.seqcls.pad_token_id is None
    ref = SeqClsReference(src, threads=1)
    _, _, probs = ref.classify(*split(ITEMS))
    run = Classifier(engine, batch_size=8).run(ITEMS)
    for p, want in zip(run, probs):
        assert np.abs(np.array([p.probs[lab] for lab in ref.labels]) - want).max() <= TOL
    assert run.stats.padding_tokens > 0


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_TEXT, st.none() | _TEXT), min_size=1, max_size=7))
def test_any_texts_and_pairs_score_as_transformers(tiny_arch, items):
    """Open-ended texts and pairs (braces, newlines, any script, empty pairs) in one padded
    batch: each as the pipeline encodes and scores it alone; an empty text is an error item."""
    path = tiny_arch.seqcls_mlx("qwen2", 3)
    ref = SeqClsReference(tiny_arch.seqcls_hf("qwen2", 3), threads=1)
    clf = Classifier(Engine.load(str(path)), batch_size=4)
    given_items = [(t, p) if p is not None else t for t, p in items]
    for (t, p), got in zip(items, clf.classify(given_items)):
        if not t.strip():
            assert not got.ok and "empty text" in got.error
            continue
        ids, _, probs = ref.classify([t], [p])
        assert got.ok and got.n_tokens == len(clf.spec.head.prompt_ids(ids[0]))
        assert np.abs(np.array([got.probs[lab] for lab in ref.labels]) - probs[0]).max() <= TOL
