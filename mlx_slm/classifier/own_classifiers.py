"""The decision questions a classifier of their own answers (`Method.classified`), each its own pass
over the state rather than a branch of the decision prompt: a question trained with its own
classifier (`train --decisions --head-prompt question | --finetune`, a classify task file beside the
decision task), or asked in the "prompt" style (the same prompt, untrained: the question as the system
message, the state as the user's, its options' names scored as `classify` scores labels).

`OwnClassifiers` builds each once on the decider's engine (a trained one by its file, checked as it
was trained; the prompt style's per question and option order, a bounded LRU: each holds its prompt
head's keys and values), runs each over the states that ask its question, and reads its answers back
in the question's own option order."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.engine import Engine
from ..kinds.decisions import DecisionItem
from ..text.decisions.errors import DecisionError
from ..text.decisions.methods import Method, orders, permuted, tuned_prompt
from ..text.decisions.questions import DecisionQuestion, text
from ..text.labels import LabelError
from ..text.prompts import PromptError
from ..weights.convert import sha256_file
from .classifier import Classifier
from .pipeline import NON_FINITE
from .plan import Plan

PROMPT_CLASSIFIERS = 64  # "prompt" style classifiers kept (question, option order): each holds its head's KV


class OwnClassifiers:
    """The classifiers of a decider's questions answered by their own (see the module docstring);
    safe to share between the threads of one decider (a lock guards the cache)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._lock = threading.Lock()
        # trained ones by task file, the prompt style's by ("prompt", question digest, option order)
        self._classifiers: OrderedDict[Any, tuple[Any, tuple[str, ...]]] = OrderedDict()

    def answer(self, items: Sequence[DecisionItem], raws: list[list[np.ndarray | None]]) -> list[int]:
        """The questions a classifier of their own answers (`Method.classified`: a trained one, or the
        "prompt" style's, in each of its option orders), into `raws`: each classifier run once over
        the states that ask its question (the question its cached prompt head, the state its text; a
        state it cannot answer stays None; a prompt style's orders averaged). Returns each item's
        tokens so read."""
        tokens, asked = [0] * len(items), dict[Any, list[tuple[int, int]]]()
        for r, it in enumerate(items):
            for k, (q, m) in enumerate(zip(it.request.questions, it.methods)):
                if it.over or not m.classified(q):
                    continue
                for order in [None] if m.tuned is not None else orders(q, m.asks(q)[1]):
                    asked.setdefault((m.tuned, q.digest if m.tuned is None else None, order), []).append((r, k))
        got: dict[tuple[int, int], list[np.ndarray | None]] = {}
        for key, where in asked.items():
            q, m = _asker(items, where[0])
            try:
                clf, labels = self._tuned(key[0], q, m) if key[0] is not None else self._prompted(q, key[2])
            except (PromptError, LabelError):  # the prompt style's question (or an option's name) over the context
                if key[0] is not None:
                    raise  # a trained classifier is checked when its task loads: a fault, not a refusal
                for at in where:
                    got.setdefault(at, []).append(None)
                continue
            preds = clf.classify([text(items[r].request.state) for r, _ in where])
            for (r, k), p in zip(where, preds):
                got.setdefault((r, k), []).append(_tuned_raw(p, labels))
                tokens[r] += p.n_tokens if p.error is None else 0  # a refused question ran nothing
        for (r, k), ps in got.items():  # a state over the context in either order: refused (None)
            raws[r][k] = None if any(p is None for p in ps) else np.mean(ps, axis=0)
        _refuse_whole(items, raws)
        return tokens

    def _tuned(self, path: str, q: DecisionQuestion, m: Method) -> tuple[Any, tuple[str, ...]]:
        """A question's tuned classifier (its task file, as trained), made once on this engine; its labels."""
        with self._lock:
            got = self._classifiers.get(path)
        if got is None:
            # a state may be empty (Transformers answers it): the classifier reads its prompt without one; the
            # state is a client's: "<|im_end|>" in it read as text, as every decision prompt reads it
            task = trained_with(path, q.key, m)
            with self.engine.lock:  # (its labels tokenized: the tokenizer is shared with the request threads)
                clf = Classifier.from_task(task, engine=self.engine, empty_ok=True, controls_as_text=True)
            labels = answers_options(path, clf.labels, q)
            got = (clf, labels)
            with self._lock:
                self._classifiers[path] = got
        return got

    def _prompted(self, q: DecisionQuestion, order: tuple[int, ...]) -> tuple[Any, tuple[str, ...]]:
        """The "prompt" style's classifier of `q` with its options listed in `order` (untrained: the
        names scored after the question as the system message, as `classify` scores labels), and the
        names in `q`'s own order (its answers are read by name, whatever order they were listed in).
        Kept per question and order, a bounded LRU (each holds its prompt head's keys and values)."""
        key = ("prompt", q.digest, order)
        with self._lock:
            got = self._classifiers.get(key)
            if got is not None:
                self._classifiers.move_to_end(key)
                return got
        shown = permuted(q, order, lambda _, names: tuple(names))  # names move with their options
        system, labels = tuned_prompt(shown, typed=False)
        # the state and the question are a client's: their control tokens read as text, as the decision prompt's
        plan = replace(Plan.of(labels, system, "{text}"), labels_filled=True, empty_ok=True, controls_as_text=True)
        with self.engine.lock:  # (its labels tokenized: the tokenizer is shared with the request threads)
            got = (Classifier(self.engine, plan=plan), tuned_prompt(q, typed=False)[1])
        with self._lock:
            self._classifiers[key] = got
            while sum(isinstance(k, tuple) for k in self._classifiers) > PROMPT_CLASSIFIERS:
                oldest = next(k for k in self._classifiers if isinstance(k, tuple))
                del self._classifiers[oldest]
        return got


def _refuse_whole(items: Sequence[DecisionItem], raws: list[list[np.ndarray | None]]) -> None:
    """A request refused whole when a question does not fit (System One's; `refusal="request"`) whose
    question answered by its own classifier did not fit (its state and prompt over the context, found
    only when it ran): a `DecisionError` (tokens_exceeded) naming it, as the decision prompt's are
    refused; the callers run each request of a batch alone again, so only that one is refused."""
    for it, raw in zip(items, raws):
        if it.over or it.request.refusal != "request":
            continue
        for q, m, p in zip(it.request.questions, it.methods, raw):
            if p is None and m.classified(q):
                raise DecisionError(
                    ("body", "questions", q.key),
                    f"the state and question {q.key!r} are over the model's context: shorten the state or the question",
                    "tokens_exceeded",
                )


def _tuned_raw(p: Any, labels: Sequence[str]) -> np.ndarray | None:
    """A tuned classifier's prediction as a raw answer over `labels`: None where it could not answer
    (over the context); NaN where its probabilities were not finite (refused by `_check_finite`)."""
    if p.error == NON_FINITE:
        return np.full(len(labels), np.nan)
    return None if p.error is not None else np.array([p.probs[x] for x in labels], dtype=np.float64)


def _asker(items: Sequence[DecisionItem], at: tuple[int, int]) -> tuple[DecisionQuestion, Method]:
    """The question `at` (item, question) and its method."""
    it, k = items[at[0]], at[1]
    return it.request.questions[k], it.methods[k]


def trained_with(path: str, key: str | None, m: Method) -> str:
    """`path`, a tuned question's classifier file, if it is the one question `key` was trained
    with (its sha256, where the task records it): a failed or another training run may have
    replaced it; refused, not used (`DecisionPlan.loaded` checks it before a run or a server starts)."""
    if not Path(path).is_file():
        raise DecisionError(
            (),
            f"the task's classifier for question {key!r}, {path}, is missing (a trained question's "
            "classifier is saved beside its task, and goes where the task goes): copy it beside the task, or "
            "train the task again",
        )
    want = (m.report or {}).get("classifier_sha256")
    if want is not None and sha256_file(Path(path)) != want:
        raise DecisionError(
            (),
            f"the task's classifier for question {key!r}, {path}, is not the one it was trained with (its "
            "sha256 differs: it was edited, or another training run replaced it): train the task again",
        )
    return path


def answers_options(path: str, labels: Sequence[str], q: DecisionQuestion) -> tuple[str, ...]:
    """The names a tuned question's classifier (`path`, answering `labels`) answers `q` with: its
    options' (`tuned_prompt`), or refused, the task at fault (`DecisionPlan.loaded` checks it
    before a run or a server starts)."""
    want = tuned_prompt(q)[1]
    if tuple(labels) != want:
        raise DecisionError(
            (),
            f"the task's classifier for question {q.key!r}, {path}, answers {list(labels)}, not its "
            f"options {list(want)}: train the task again",
        )
    return want
