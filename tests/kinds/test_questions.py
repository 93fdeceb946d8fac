"""kinds/questions.py: several questions about each text in one forward a batch.

Each text's part that its question prompts share runs causally after the shared head's KV,
and every question's own tokens and its options' trie run as branches after it in the same
forward (`branches.pack_branches` with the text part as each row's trunk): one forward a
batch, not a text pass and then a branch pass. A plan of several passes continues after the
first pass's keys, seeing the text part and never another pass's branches. Every answer
equals the unpacked run, the question's own full prompt scored by the labels kind alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.engine.engine import Engine
from mlx_slm.text.questions import Question
from mlx_slm.text.workload import tickets
from tests.hostile import invoke, refused_cleanly, write

YN = ("y", "n")  # one token each in the tiny test tokenizer
QUESTIONS = [
    Question("team", "Which team should handle it?", "choice", ("billing", "technical", "account")),
    Question("urgent", "Is it urgent?", "yesno", YN),
    Question("mood", "How upset is the customer?", "scale", ("1", "2", "3", "4", "5")),
    Question("tags", "Does it mention {label}?", "multi", ("card", "app"), answers=YN),
    Question("product", "Which product?", "choice", ("mobile app", "web site"), none="none of these"),
]
TEXTS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.\n",
    "refund please\n\n",
    "x",
    "I need to change the email address on my profile and the app will not let me do it at all",
]
TOL = 1e-5  # float32 sums in another order


@pytest.fixture(scope="module")
def engine(tiny_qwen_mlx) -> Engine:
    return Engine.load(str(tiny_qwen_mlx), "float32")


def _unpacked(engine: Engine, q: Question, texts: list[str]) -> list[dict]:
    """The question's answers from its own full prompt(s), one labels-kind run per block."""
    per_block = []
    for b in Classifier(engine, questions=[q]).kind.plan.blocks:
        clf = Classifier(engine, list(b.options.labels), b.fmt.system, b.fmt.template)
        per_block.append([np.array([p.scores[k] for k in clf.labels]) for p in clf.classify(texts)])
    return [q.answer([scores[r] for scores in per_block]) for r in range(len(texts))]


def _assert_close(got: list, want: list, names: list[str]) -> None:
    for p, w in zip(got, want):
        for name in names:
            a, b = p.answers[name], w[name] if isinstance(w, dict) and name in w else w
            assert a.get("label") == b.get("label") and a.get("labels") == b.get("labels"), (name, a, b)
            assert max(abs(a["probs"][k] - b["probs"][k]) for k in a["probs"]) <= TOL, (name, a, b)


def _forwards(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shapes of the forwards the engine runs after a KV (`encode`'s are counted apart)."""
    seen: list[tuple[int, ...]] = []
    cont, enc = Engine.continue_after, Engine.encode

    def continue_after(self, kv, cache_mask, ids, **kw):  # type: ignore[no-untyped-def]
        seen.append(tuple(np.shape(ids)))
        return cont(self, kv, cache_mask, ids, **kw)

    def encode(self, *a, **kw):  # type: ignore[no-untyped-def]
        seen.append(("encode",))  # type: ignore[arg-type]
        return enc(self, *a, **kw)

    monkeypatch.setattr(Engine, "continue_after", continue_after)
    monkeypatch.setattr(Engine, "encode", encode)
    return seen


def test_one_forward_a_batch_gives_the_unpacked_answers(engine, monkeypatch):
    clf = Classifier(engine, questions=QUESTIONS, batch_size=2, max_batch_tokens=None)
    clf.classify(TEXTS[:1])  # the shared head's KV cached: not counted below
    seen = _forwards(engine, monkeypatch)
    run = clf.run(TEXTS)
    got = list(run)
    assert len(seen) == run.stats.batches == 3 and ("encode",) not in seen  # one forward a batch
    monkeypatch.undo()
    for q in QUESTIONS:
        want = _unpacked(engine, q, TEXTS)
        _assert_close(got, [{q.name: w} for w in want], [q.name])
    # What ran: each text part once (after the cached head) and every branch; the rest is padding.
    plan, items = clf.kind.plan, clf.prepare(TEXTS)
    text = sum(len(it.ids) - len(plan.head) for it in items)
    branches = sum(len(c) + plan.blocks[b].nodes for it in items for b, c in enumerate(it.chains))
    st = run.stats
    assert st.processed_tokens - st.padding_tokens == text + branches
    assert st.label_tokens == st.processed_tokens - text


def test_several_passes_and_no_prefix_cache_give_the_same_answers(engine, monkeypatch):
    one = Classifier(engine, questions=QUESTIONS).classify(TEXTS)
    split = Classifier(engine, questions=QUESTIONS, max_batch_tokens=None)  # one batch
    n = len(split.kind.plan.blocks)
    split.kind.plan.groups = [[0, 1], list(range(2, n - 1)), [n - 1]]  # three passes over one text part
    seen = _forwards(engine, monkeypatch)
    several = split.classify(TEXTS)
    assert len(seen) == 3 and ("encode",) not in seen
    monkeypatch.undo()
    bare = Classifier(engine, questions=QUESTIONS, use_prefix_cache=False).classify(TEXTS)
    names = [q.name for q in QUESTIONS]
    _assert_close(several, [p.answers for p in one], names)
    _assert_close(bare, [p.answers for p in one], names)


def test_a_question_no_text_fits_is_one_usage_error(tiny_qwen_mlx, tmp_path):
    q = write(tmp_path / "q.jsonl", json.dumps({"name": "big", "question": "why " * 25_000, "labels": ["a", "b"]}))
    out = tmp_path / "o.jsonl"
    data = write(tmp_path / "in.jsonl", "".join(json.dumps({"text": t}) + "\n" for t, _ in tickets(5)))
    r = invoke(["classify", data, "--questions", q, "--model", tiny_qwen_mlx, "-o", out])
    refused_cleanly(r, "question 'big'", "over the model's context of 1024", "shorten the question")
    assert not out.exists() and r.output.count("error") == 1
