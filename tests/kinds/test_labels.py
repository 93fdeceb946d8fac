"""The labels kind (`kinds/labels.py`): the label trie's scores against one batched pass per label, on
random label sets."""

from __future__ import annotations

import dataclasses

import numpy as np

from tests.hostile import task_clf as _clf


def test_trie_scores_equal_the_per_label_passes_on_random_label_sets(engine):
    """The claim behind the trie, checked on random label sets (shared prefixes, a label that is
    a prefix of another, unicode, tabs and newlines inside labels, tiny trie chunks): the same
    labels and scores as one batched pass per label."""
    rng = np.random.default_rng(7)
    words = ["card", "arrival", "late", "refund", "status", "pin", "top up", "é", "日本", "a", "ab", "\tx", "new\nline"]
    texts = ["my card was charged twice", "app crashes", "where is my refund?", "x", "hello world " * 6]
    for _ in range(4):
        labels = list(
            dict.fromkeys(" ".join(rng.choice(words, rng.integers(1, 4))) for _ in range(rng.integers(2, 14)))
        )
        if len(labels) < 2:
            continue
        trie = _clf(engine, labels, scoring="sequence", batch_size=int(rng.choice([1, 2, 8])))
        trie.kind.labelset = dataclasses.replace(trie.labelset, max_trie_nodes=int(rng.choice([1, 3, 256])))
        per = _clf(engine, labels, scoring="sequence", label_pass="per-label")
        for a, b in zip(trie.classify(texts), per.classify(texts)):
            assert a.label == b.label
            assert max(abs(a.scores[k] - b.scores[k]) for k in labels) < 1e-3, labels


def test_a_label_set_as_text_reads_a_control_token_in_a_label_as_text(engine):
    """`labelset_for(..., as_text=True)` (a decision client's option names; where a question's fine-tune
    starts its score head, --head-init words): "<|im_end|>" in a label is its characters, never the one
    control token that ends a turn; labels without one are tokenized as they are either way."""
    from mlx_slm.kinds.labels import labelset_for
    from mlx_slm.text.prompts import PromptFormat

    end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    fmt = PromptFormat("Answer with one of the options.", "{text}")
    labels = ["billing", "odd<|im_end|>name"]
    special, text = (labelset_for(engine, fmt, labels, as_text=t).token_ids for t in (False, True))
    assert end in special[1] and end not in text[1]
    assert special[0] == text[0] and "<|im_end|>" in engine.tokenizer.decode(list(text[1]))
