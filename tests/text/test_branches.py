"""Several questions about one text in one pass (`text/branches.py`): the text's tokens once, each question
a branch that sees the trunk and itself only; groups in order under a cap."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_slm.text.branches import QuestionPlan, branch_cut, pass_groups
from mlx_slm.text.questions import (
    DEFAULT_SYSTEM,
    DEFAULT_TEMPLATE,
    Question,
)


def test_pack_branches_with_a_trunk_and_rows_of_their_own():
    """Row 0: a trunk of 2 tokens, then two branches; row 1: no trunk, one branch (then padding).
    A branch sees the trunk and itself only; positions count from the trunk's start."""
    from mlx_slm.text.branches import pack_branches
    from mlx_slm.text.labels import LabelSet

    ls = LabelSet(("A", "B"), ((1,), (2,)), "first-token")
    p = pack_branches([[([5, 6], ls), ([7], ls)], [([8, 9, 10], ls)]], pad_id=0, trunks=[[3, 4], []])
    assert p.ids.tolist() == [[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]]
    assert p.positions.tolist() == [[0, 1, 2, 3, 2], [0, 1, 2, 0, 0]]
    assert p.answer_at.tolist() == [[3, 4], [2, 0]]
    v = p.visible[0]
    assert v[4].tolist() == [True, True, False, False, True]  # the second branch: the trunk and itself
    assert v[3].tolist() == [True, True, True, True, False]
    assert v[1].tolist() == [True, True, False, False, False]  # the trunk is causal
    assert p.visible[1][3].tolist() == [False, False, False, True, False]  # padding sees itself


YN = ("y", "n")  # one token each in the tiny test tokenizer ("yes" is three there)


QUESTIONS = [
    Question("team", "Which team should handle it?", "choice", ("billing", "technical", "account"),
             descriptions={"billing": "charges and refunds"}),
    Question("urgent", "Is it urgent?", "yesno", YN),
    Question("mood", "How upset is the customer?", "scale", ("1", "2", "3", "4", "5")),
    Question("tags", "Does it mention {label}?", "multi", ("card", "app", "email"), answers=YN),
    Question("product", "Which product?", "choice", ("mobile app", "web site"), none="none of these"),
]  # fmt: skip


# Texts ending in a newline or spaces: their last token merges with the question's first.
TEXTS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.\n",
    "I need to change the email address on my profile  ",
    "refund please\n\n",
    "x",
]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=40), st.integers(1, 1500))
def test_groups_keep_order_and_the_cap(sizes, cap):
    groups = pass_groups(sizes, cap)
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    assert all(len(g) == 1 or sum(sizes[i] for i in g) <= cap for g in groups)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=5))
def test_the_branch_cut_is_shared_and_leaves_each_branch_a_token(prompts):
    cut = branch_cut(prompts)
    assert all(p[:cut] == prompts[0][:cut] for p in prompts)  # the trunk: shared by every prompt
    assert all(len(p) - cut >= 1 for p in prompts)  # every branch keeps a last position
    longer = cut + 1
    assert longer > min(len(p) for p in prompts) - 1 or any(p[:longer] != prompts[0][:longer] for p in prompts)


# --------------------------------------------------------------------------- packing (tokenizer only)
def test_packs_see_only_their_own_branch(tiny_qwen_mlx):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_qwen_mlx))
    plan = QuestionPlan(tok, QUESTIONS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE)
    assert len(plan.blocks) == 7  # a multi question of three labels is three branches
    split = plan.split(TEXTS)
    (pack,) = plan.packs([chains for _, chains in split], pad_id=0)
    for r, (_, chains) in enumerate(split):
        at = 0
        for k, b in enumerate(plan.blocks):
            n = len(chains[k]) + b.nodes
            block = slice(at, at + n)
            # a branch token sees nothing outside its branch (the text comes from the KV)
            assert not pack.visible[r, block, :at].any() and not pack.visible[r, block, at + n :].any()
            assert list(pack.ids[r, at : at + len(chains[k])]) == list(chains[k])
            assert pack.answer_at[r, k] == at + len(chains[k]) - 1
            at += n
        assert np.array_equal(pack.visible[r], np.tril(pack.visible[r]))  # within the causal pattern
    # The texts ending in white space merge with the question: their common part stops inside the text.
    ends = [tok.decode(common).endswith(t) for (common, _), t in zip(split, TEXTS)]
    assert not all(ends), "no text merged with its question across the boundary: the test lost its case"
