"""Texts to tokenized items: the prompt preparation a `Classifier` runs on each window.

Render each prompt with the chat template, tokenize in batches, and flag what cannot
run (a missing or empty text, a prompt over the context) as an item error, or cut it as
`truncate` says. With several questions, `branches.QuestionPlan.split` gives each text's
shared tokens and each question's own. The functions read the classifier's settings at
call time (a label set or format set on it later is what they use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .inputs import missing
from .labels import LabelError, LabelSet
from .predictions import Item
from .prompts import PromptError, PromptFormat, render, size_problem, tokenize

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .classifier import Classifier


def prepare(clf: Classifier, texts: Sequence[str], start: int) -> list[Item]:
    """One item per text, tokenized, with an error for a text that cannot be classified.
    The caller holds the engine's lock (the tokenizer is not thread-safe)."""
    items = check_texts(clf.format_error, texts, start)
    if clf.truncate is None:  # a text far over the context by its size alone: refused before tokenizing
        for it, t in zip(items, texts):
            it.error = it.error or size_problem(clf.tokenizer, t, clf.max_length)
    good = [(it, t) for it, t in zip(items, texts) if it.error is None]
    if clf.plan is not None:
        for (item, _), (common, chains) in zip(good, clf.plan.split([t for _, t in good])):
            item.ids, item.chains = common, chains
            n = clf.plan.longest(common, chains)
            if n > clf.max_length:
                item.error = (
                    f"the longest question's prompt is {n} tokens with its answer, over the model's context "
                    f"of {clf.max_length}: shorten the text"
                )
        return items
    return tokenize_items(clf, good, items)


def check_texts(format_error: str | None, texts: Sequence[str], start: int) -> list[Item]:
    """One item per text, with an error for a text that cannot be classified (missing, empty)."""
    items = [Item(start + i, []) for i in range(len(texts))]
    for item, text in zip(items, texts):
        if format_error is not None:
            item.error = format_error
        elif not isinstance(text, str):
            item.error = (
                "the text is missing (None/NaN, not a string): give the item some text, or drop the row"
                if missing(text)
                else f"text must be a string, got {type(text).__name__}"
            )
        elif not text.strip():
            item.error = "empty text: give the item some text, or drop the row"
    return items


def tokenize_items(clf: Classifier, good: list[tuple[Item, str]], items: list[Item]) -> list[Item]:
    tok = clf.tokenizer
    ids = tokenize(tok, [render(tok, clf.format, t) for _, t in good])
    extra = clf.label_extra  # label tokens run after the prompt in sequence mode
    for (item, text), seq in zip(good, ids):
        item.ids = seq
        if len(seq) + extra > clf.max_length:
            if clf.truncate is None:
                item.error = (
                    f"prompt is {len(seq)} tokens, over the model's context of {clf.max_length}: "
                    "shorten the text, or pass --truncate head|tail|middle"
                )
            else:
                try:
                    item.ids = truncate(tok, clf.format, clf.truncate, text, clf.max_length - extra)
                    item.truncated = True
                except ValueError as e:
                    item.error = str(e)
    return items


def truncate(tok: Any, fmt: PromptFormat, mode: str, text: str, limit: int) -> list[int]:
    """The prompt of `text` cut (mode head, tail or middle) to at most `limit` tokens."""
    text_ids = tok(text, add_special_tokens=False)["input_ids"]
    overhead = len(tokenize(tok, [render(tok, fmt, text)])[0]) - len(text_ids)
    keep = limit - overhead - 4  # a small margin: re-tokenizing at the cut may merge differently
    while keep > 0:
        if mode == "head":
            kept = tok.decode(text_ids[:keep])
        elif mode == "tail":
            kept = tok.decode(text_ids[-keep:])
        else:
            a = keep // 2
            kept = tok.decode(text_ids[:a]) + " ... " + tok.decode(text_ids[len(text_ids) - (keep - a) :])
        ids = tokenize(tok, [render(tok, fmt, kept)])[0]
        if len(ids) <= limit:
            return ids
        keep -= max(4, len(ids) - limit)
    raise ValueError("the template alone is longer than the model's context")


def format_error(
    tok: Any, fmt: PromptFormat, labelset: LabelSet, label_extra: int, max_length: int
) -> LabelError | PromptError | None:
    """Why no text can run (the fixed part of every prompt, with one text token and the
    label, is over the context), or None. Checked before any forward pass is paid for. A
    label too long is the labels' fault (a front end names that field): a `LabelError`."""
    fixed = len(tokenize(tok, [render(tok, fmt, "x")])[0])  # one text token included
    if fixed + label_extra <= max_length:
        return None
    parts = "the system prompt, template and examples" if fmt.examples else "the system prompt and template"
    longest = max(range(len(labelset.labels)), key=lambda k: len(labelset.token_ids[k]))
    if fixed <= max_length:  # the prompt fits alone: the label is what does not
        return LabelError(
            f"label {labelset.labels[longest][:60]!r} is {labelset.max_len} tokens: with the "
            f"prompt ({fixed - 1} tokens) it is over the model's context of {max_length}: shorten the label"
        )
    return PromptError(
        f"{parts} alone are {fixed - 1} tokens, over the model's context of "
        f"{max_length}: shorten --system or --template" + (" or use fewer --examples" if fmt.examples else "")
    )
