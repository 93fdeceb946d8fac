import numpy as np
import pytest
from transformers import AutoTokenizer

from mlx_slm.classifier import Classifier
from mlx_slm.model import load_model
from mlx_slm.reference import Reference
from mlx_slm.workload import tickets

TEXTS = [t for t, _ in tickets(24)]


def make(path, labels, **kw):
    return Classifier(load_model(path), AutoTokenizer.from_pretrained(str(path)), labels, **kw)


LABELSETS = {"first-token": ["a", "b", "c"], "sequence": ["ab", "ac", "b", "a"]}


@pytest.mark.parametrize("mode", ["first-token", "sequence"])
def test_fast_path_equals_one_at_a_time(tiny_mlx, mode):
    slow = make(tiny_mlx, LABELSETS[mode], batch_size=1, use_prefix_cache=False)
    fast = make(tiny_mlx, LABELSETS[mode], batch_size=8, max_batch_tokens=400)
    assert slow.mode == fast.mode == mode
    a, b = slow.classify(TEXTS), fast.classify(TEXTS)
    assert [p.index for p in b] == list(range(len(TEXTS)))  # input order
    assert [p.label for p in a] == [p.label for p in b]
    for x, y in zip(a, b):
        for lab in x.probs:
            assert abs(x.probs[lab] - y.probs[lab]) < 1e-5
    assert fast.stats.prefix_saved_tokens > 0 and fast.stats.batches < slow.stats.batches
    assert len({p.label for p in a}) > 1  # the random model must not be constant
    if mode == "sequence":  # a shared first token and a multi-token label
        assert fast.labelset.token_ids[0][0] == fast.labelset.token_ids[3][0] and len(fast.labelset.token_ids[0]) > 1


@pytest.mark.parametrize("mode", ["first-token", "sequence"])
def test_matches_transformers_reference(tiny_mlx, mode):
    clf = make(tiny_mlx, LABELSETS[mode])
    preds = clf.classify(TEXTS[:8])
    ref = Reference(tiny_mlx)
    for p, item in zip(preds, clf.prepare(TEXTS[:8])):
        s, _ = ref.label_scores(item.ids, clf.labelset)
        probs = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        assert clf.labels[int(np.argmax(s))] == p.label
        np.testing.assert_allclose([p.probs[lab] for lab in clf.labels], probs, atol=1e-5)


def test_every_switch_gives_the_same_labels(tiny_qwen_mlx):
    labels = LABELSETS["first-token"]
    base = [p.label for p in make(tiny_qwen_mlx, labels).classify(TEXTS)]
    for kw in (dict(sort=False), dict(use_prefix_cache=False), dict(max_batch_tokens=None, batch_size=32),
               dict(max_batch_tokens=64)):
        assert [p.label for p in make(tiny_qwen_mlx, labels, **kw).classify(TEXTS)] == base, kw


def test_prefix_cache_unchanged_after_batches(tiny_qwen_mlx):
    clf = make(tiny_qwen_mlx, LABELSETS["sequence"])
    before = [(np.array(k), np.array(v)) for k, v in clf.prefix.kv]
    clf.classify(TEXTS)
    for (k0, v0), (k1, v1) in zip(before, clf.prefix.kv):
        np.testing.assert_array_equal(k0, np.array(k1))
        np.testing.assert_array_equal(v0, np.array(v1))


def test_classify_iter_streams_in_order_across_windows(tiny_qwen_mlx):
    clf = make(tiny_qwen_mlx, LABELSETS["first-token"])
    whole = clf.classify(TEXTS)
    streamed = list(clf.classify_iter(iter(TEXTS), window=5))
    assert [p.index for p in streamed] == list(range(len(TEXTS)))
    assert [p.label for p in streamed] == [p.label for p in whole]


def test_bad_items_become_error_predictions(tiny_qwen_mlx):
    clf = make(tiny_qwen_mlx, LABELSETS["first-token"], max_length=150)
    long = " ".join(["word"] * 200)
    preds = clf.classify(["fine", "   ", long])
    assert preds[0].ok and "empty" in preds[1].error and "--truncate" in preds[2].error


@pytest.mark.parametrize("side", ["head", "tail", "middle"])
def test_truncation_marks_rows(tiny_qwen_mlx, side):
    clf = make(tiny_qwen_mlx, LABELSETS["first-token"], max_length=150, truncate=side)
    long = " ".join(f"w{i}" for i in range(200))
    p = clf.classify([long])[0]
    assert p.ok and p.truncated and p.n_tokens <= 150


def test_token_accounting(tiny_qwen_mlx):
    clf = make(tiny_qwen_mlx, LABELSETS["first-token"], batch_size=4, max_batch_tokens=None)
    clf.classify(TEXTS[:8])
    st, p = clf.stats, len(clf.prefix)
    lengths = [len(it.ids) for it in clf.prepare(TEXTS[:8])]
    assert st.prompt_tokens == sum(lengths)
    assert st.prefix_saved_tokens == 8 * p - p  # net of computing the prefix once
    assert st.processed_tokens == p + sum(lengths) - 8 * p + st.padding_tokens


def test_public_api_import():
    from mlx_slm import Classifier as C, Prediction

    assert C is Classifier and Prediction.__name__ == "Prediction"
