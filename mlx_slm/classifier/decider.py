"""`Decider`: typed decisions (System One, OpenAI) on an engine, the Python API and what the
service and `mlx-slm decide` call.

    decider = Decider.load("smollm2-135m")
    (result,) = decider.decide([parse_systemone(body, decider.config)])
    result.probabilities  # one array per question, in its options' order

A call's requests run together, in batches of several requests (different states, different
questions): each request's state once, and each of its questions as a branch after it, the
state and its questions in one forward (`kinds.decisions`). Probabilities are Transformers' generic decision path's: the label logits
at the last position, divided by the question type's temperature (the model folder's
decision.json), softmaxed; a per-question calibration (a temperature by question key, fitted
by `eval --decisions --fit`) divides them further, and is off unless given. It applies to a
question only when the asked question is the one it was fitted for (`calibration_questions`:
the same key and the same question), so a client reusing a key for another question, or an
unnamed OpenAI question ("#0"), gets raw answers; `decide`, `--ray` and `serve` all rely on
this one rule (`Decider.temperature`).

A bounded LRU of recent states' keys and values (`state_cache` entries, `state_cache_bytes`
at most) lets a state asked again run only its questions: the state part a request shares
with the cached one that starts the longest way like it (the same state asked with other
questions, or a conversation grown under one OpenAI `prompt_cache_key`, whose last state is
tried first) is not run again. A question asked again of a cached state (the same prompt and
labels, so the same computation) is answered from the cache too (`answer_cache=False` runs it
again, to measure the KV reuse alone): looked up on an exact state hit only, keyed by a
digest of the question's own tokens and its labels', their bytes counted in the budget, and
kept when the same state is put again. `DecisionResult.cached_tokens` counts both.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.engine import Engine
from ..ground.errors import ModelError
from ..kinds.base import require_lm_head
from ..kinds.decisions import (
    DecisionItem,
    DecisionPlanner,
    StateKV,
    base_of,
    branch_answers,
    encode_states,
)
from ..text import batching
from ..text.decisions import (
    DecisionConfig,
    DecisionError,
    DecisionQuestion,
    DecisionRequest,
    parse_openai,
    parse_systemone,
    questions_of,
)
from ..text.labels import softmax
from .pipeline import default_max_batch_tokens

STATE_CACHE = 64  # recent states whose keys and values are kept
STATE_CACHE_BYTES = 512 * 2**20  # and at most this much of them
MAX_SCORES_PER_STATE = 1024  # questions' answers kept with a cached state
# A state's rest (after its cached start) up to this many tokens runs in the same forward as its
# questions (a tree pass, dense over its tokens); a longer one runs on its own first (causal).
FUSED_TRUNK = 512
CALL_TOKENS = 4096  # the requests' tokens one decide call takes (`Decider.call_tokens`)
BATCH_SIZE = 16  # requests a forward runs at once


@dataclass(frozen=True)
class DecisionResult:
    """One request's answer: each question's probabilities over its options (in `q.options`
    order, after the temperatures), None for a question refused as over the context (OpenAI's
    refusal); the input tokens (the state part once, each question's own) and those that came
    from the state cache."""

    request: DecisionRequest
    probabilities: tuple[np.ndarray | None, ...]
    input_tokens: int
    cached_tokens: int = 0


class StateCache:
    """The bounded LRU of recent states' KV, found by their tokens (the longest shared start;
    OpenAI's prompt_cache_key's last state first among equals). Thread-safe; `entries` 0 is off."""

    def __init__(self, entries: int = STATE_CACHE, max_bytes: int = STATE_CACHE_BYTES):
        self.entries, self.max_bytes = int(entries), int(max_bytes)
        self._by_tokens: OrderedDict[tuple[int, ...], StateKV] = OrderedDict()
        self._by_key: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._by_tokens)

    def get(self, tokens: Sequence[int], cache_key: str | None = None, floor: int = 0) -> tuple[StateKV | None, int]:
        """(a cached state, how many of `tokens` it holds): the state itself, else the one that
        shares the longest start with it (more than `floor` tokens; below the whole state, so a
        token is left to run), the cache_key's last state first among equals; (None, 0) if none."""
        if self.entries <= 0:
            return None, 0
        key = tuple(tokens)
        with self._lock:
            hit = self._by_tokens.get(key)
            if hit is not None:
                self._by_tokens.move_to_end(key)
                self.hits += 1
                return hit, len(key)
            first = self._by_key.get(cache_key) if cache_key is not None else None
            order = ([first] if first in self._by_tokens else []) + [k for k in reversed(self._by_tokens) if k != first]
            best, n = None, floor
            want = np.asarray(key, dtype=np.int64)
            for k in order:
                if len(k) <= n or k[: n + 1] != key[: n + 1]:  # cannot beat the best so far
                    continue
                m = min(_shared(self._by_tokens[k].array, want), len(key) - 1)
                if m > n:
                    best, n = k, m
            if best is None:
                self.misses += 1
                return None, 0
            self._by_tokens.move_to_end(best)
            self.hits += 1
            return self._by_tokens[best], n

    def put(self, state: StateKV, cache_key: str | None = None) -> None:
        if self.entries <= 0 or state.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._by_tokens.get(state.tokens)
            if old is not None:
                self._bytes -= old.nbytes
                if old is not state:  # the same state run again: its questions' answers kept
                    for k, v in old.scores.items():
                        if len(state.scores) < MAX_SCORES_PER_STATE:
                            state.add_score(k, v)
            self._bytes += state.nbytes
            self._by_tokens[state.tokens] = state
            self._by_tokens.move_to_end(state.tokens)
            if cache_key is not None:
                self._by_key[cache_key] = state.tokens
                self._by_key.move_to_end(cache_key)
                while len(self._by_key) > 4 * self.entries:
                    self._by_key.popitem(last=False)
            self._evict()

    def remember(self, state: StateKV, key: bytes, score: np.ndarray) -> None:
        """A question's answer kept with `state`, counted in the budget when the state is cached."""
        with self._lock:
            if len(state.scores) >= MAX_SCORES_PER_STATE:
                return
            n = state.add_score(key, score)
            if self._by_tokens.get(state.tokens) is state:
                self._bytes += n
                self._evict()

    def _evict(self) -> None:
        while len(self._by_tokens) > self.entries or self._bytes > self.max_bytes:
            _, old = self._by_tokens.popitem(last=False)
            self._bytes -= old.nbytes

    def clear(self) -> None:
        with self._lock:
            self._by_tokens.clear()
            self._by_key.clear()
            self._bytes = 0


def applied_temperatures(
    asked: Sequence[DecisionQuestion], fitted: Sequence[DecisionQuestion], temperatures: Mapping[str, float]
) -> dict[str, float]:
    """The one rule for a task's temperatures: by key, only for an asked question that is the very
    question they were fitted for (`fitted`: the same key and the same question). Another question
    under a fitted key (a client's reuse of a name, an unnamed OpenAI question's "#0") stays raw."""
    own = {q.key: q for q in fitted}
    return {q.key: float(temperatures[q.key]) for q in asked if q.key in temperatures and own.get(q.key) == q}


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two sequences share."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


@dataclass(frozen=True)
class DeciderSettings:
    """A `Decider`'s settings, the keywords `Decider(...)` takes, resolved once into one value.

    state_cache / state_cache_bytes: recent states whose keys and values are kept, and at most
    this much of them; calibration: a temperature per question key, with calibration_questions
    the questions they were fitted for (a task's: parsed, or its raw JSON); batch_size,
    max_batch_tokens (None: `pipeline.default_max_batch_tokens`) and max_length (None: the
    engine's) bound a forward; answer_cache False runs a cached state's questions again (to
    measure the KV reuse alone)."""

    state_cache: int = STATE_CACHE
    state_cache_bytes: int = STATE_CACHE_BYTES
    calibration: Mapping[str, float] | None = None
    calibration_questions: Any = None
    batch_size: int = BATCH_SIZE
    max_batch_tokens: int | None = None
    max_length: int | None = None
    answer_cache: bool = True


class Decider:
    """Decision requests answered on an engine (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        config: DecisionConfig | None = None,
        settings: DeciderSettings | None = None,
        **options: Any,
    ):
        """`options`: any `DeciderSettings` field by name (`Decider(engine, state_cache=0)`), over
        `settings` when both are given; a name it does not have is a TypeError that says so."""
        s = replace(settings or DeciderSettings(), **options)
        require_lm_head(engine)  # the labels' logits: a model with a score head of its own refuses, saying so
        if not getattr(engine.model, "supports_tree", False):
            raise ModelError(
                f"decisions need one of our architectures (each question a branch of a tree after its state); "
                f"{engine.path} runs through mlx-lm's class: use a Qwen2/Qwen3/Llama/Gemma 3 model"
            )
        self.engine = engine
        self.config = config or DecisionConfig()
        self.calibration = dict(s.calibration or {})
        for key, t in self.calibration.items():
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t > 0 and np.isfinite(t)):
                raise DecisionError(
                    ("calibration", key),
                    f"question {key!r}'s calibration temperature must be a positive number, got {t!r}",
                )
        # The questions the temperatures were fitted for (a task's: parsed, or its raw JSON), by key.
        own = s.calibration_questions
        if own is not None and not (
            isinstance(own, (tuple, list)) and all(isinstance(q, DecisionQuestion) for q in own)
        ):
            own = questions_of(own, self.config)
        if self.calibration and own is None:
            raise DecisionError(
                ("calibration",),
                "calibration temperatures need the questions they were fitted for: "
                "give calibration_questions (a task's questions)",
            )
        self._fitted = tuple(own or ())
        # The pipeline's budget (rows x their longest request's tokens): 512 on the CPU, where larger
        # batches measured no faster per token (a batch of 12 four-question requests: 12 s at 512, 20 s at 4,096).
        batch_size = s.batch_size
        max_batch_tokens = default_max_batch_tokens() if s.max_batch_tokens is None else s.max_batch_tokens
        if int(batch_size) < 1 or int(max_batch_tokens) < 1:
            raise DecisionError(
                (), f"batch_size and max_batch_tokens are at least 1, got {batch_size}, {max_batch_tokens}"
            )
        self.batch_size, self.max_batch_tokens = int(batch_size), int(max_batch_tokens)
        # What one `decide` call is meant to take (a service gathering requests for it): it cuts
        # them into batches of `max_batch_tokens` itself.
        self.call_tokens = max(self.max_batch_tokens, CALL_TOKENS)
        self.max_length = int(s.max_length or engine.max_length)
        self.states = StateCache(s.state_cache, s.state_cache_bytes)
        self.answer_cache = bool(s.answer_cache)
        with engine.lock:
            self.planner = DecisionPlanner(engine.tokenizer, self.config, self.max_length)

    def temperature(self, q: DecisionQuestion) -> float:
        """The calibration temperature of an asked question (`applied_temperatures`), else 1 (raw)."""
        return self.temperatures((q,)).get(q.key, 1.0)

    def temperatures(self, questions: Sequence[DecisionQuestion]) -> dict[str, float]:
        """The temperatures that apply to these asked questions, by key (what a run records)."""
        return applied_temperatures(questions, self._fitted, self.calibration)

    @classmethod
    def load(
        cls,
        model: str | Path,
        *,
        decision_config: DecisionConfig | None = None,
        dtype: str | None = None,
        **kw: Any,
    ) -> Decider:
        """A model by name, path or hub id (`Engine.load`); its folder's decision.json and
        decision_template.jinja unless `decision_config` is given."""
        engine = Engine.load(model, dtype=dtype)
        if decision_config is None:
            path = engine.path
            decision_config = DecisionConfig.from_folder(path if path is not None and Path(path).is_dir() else None)
        return cls(engine, decision_config, **kw)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    # ------------------------------------------------------------------ preparing
    def prepare(self, requests: Sequence[DecisionRequest | Mapping[str, Any]]) -> list[DecisionItem]:
        """Each request tokenized (its state part, each question's tokens, its cost in tokens);
        a `DecisionError` (tokens_exceeded) for a System One request over the context. A request
        may be given as its body (a dict: OpenAI's when it has "input", else System One's)."""
        reqs = [self.request(r) for r in requests]
        with self.engine.lock:
            return [self.planner.item(i, r) for i, r in enumerate(reqs)]

    def request(self, r: DecisionRequest | Mapping[str, Any]) -> DecisionRequest:
        """A request as given, or read from its body (checked, with this model's decision settings)."""
        if isinstance(r, DecisionRequest):
            if not r.questions:
                raise DecisionError(("body", "questions"), "no questions given: ask at least one", "too_short")
            return r
        if isinstance(r, Mapping):
            body = {"model": "local", **r}
            return parse_openai(body, self.config) if "input" in body else parse_systemone(body, self.config)
        raise TypeError(f"a decision request is a DecisionRequest or its body (a dict), got {type(r).__name__}")

    # ------------------------------------------------------------------ running
    def decide(self, requests: Sequence[DecisionRequest | Mapping[str, Any]]) -> list[DecisionResult]:
        """Every request's answers, in input order (see `prepare` for what is refused)."""
        return self.run_items(self.prepare(requests))

    def run_items(self, items: Sequence[DecisionItem]) -> list[DecisionResult]:
        """Prepared items run in batches: their states once (from the state cache where it has
        them), then every question as a branch; results in the items' order."""
        results: list[DecisionResult | None] = [None] * len(items)
        live = [i for i, it in enumerate(items) if it.ids]
        for i, it in enumerate(items):
            if not it.ids:  # every question over the context: refused
                results[i] = DecisionResult(it.request, tuple(None for _ in it.chains), 0, 0)
        costs = [items[i].cost for i in live]
        for idx in batching.plan(costs, self.batch_size, self.max_batch_tokens, sort=True):
            group = [items[live[j]] for j in idx]
            for j, res in zip(idx, self._run_batch(group)):
                results[live[j]] = res
        return results  # type: ignore[return-value]

    @staticmethod
    def _question_key(it: DecisionItem, k: int) -> bytes:
        """A question's own tokens and its labels' as a digest: after the same state (an exact
        hit), the same key is the same computation."""
        h = hashlib.blake2b(digest_size=16)
        h.update(np.asarray(it.chains[k], dtype=np.int32).tobytes())
        for ids in it.options[k].token_ids:  # type: ignore[union-attr]
            h.update(b"|" + np.asarray(ids, dtype=np.int32).tobytes())
        return h.digest()

    def _known(self, it: DecisionItem, state: StateKV | None) -> dict[int, np.ndarray]:
        """The questions of `it` the cached state (its very tokens) has answered already."""
        if state is None or not state.scores or not self.answer_cache or state.tokens != tuple(it.ids):
            return {}
        got = {}
        for k, c in enumerate(it.chains):
            if c is not None:
                sc = state.scores.get(self._question_key(it, k))
                if sc is not None:
                    got[k] = sc
        return got

    def _remember(self, it: DecisionItem, state: StateKV | None, scores: list[Any], known: Mapping[int, Any]) -> None:
        if state is None or self.states.entries <= 0 or not self.answer_cache or state.tokens != tuple(it.ids):
            return
        for k, sc in enumerate(scores):
            if sc is not None and k not in known:
                self.states.remember(state, self._question_key(it, k), sc)

    def _run_batch(self, items: list[DecisionItem]) -> list[DecisionResult]:
        """One batch: each state from the cache, or run after the longest start the cache holds
        of it (else the chat template's head), in the same forward as its first questions; then
        every question not answered before as a branch."""
        states: list[Any] = [None] * len(items)
        trunks: list[list[int]] = [[] for _ in items]
        cached = [0] * len(items)
        known: list[dict[int, np.ndarray]] = [{} for _ in items]
        bare: list[int] = []  # rows with no cached start at all (a model without a chat template head)
        template_head = base_of(self.engine, self.planner.head)  # the chat template's start, its KV
        for r, it in enumerate(items):
            entry, n = self.states.get(it.ids, it.request.cache_key, len(self.planner.head))
            known[r] = self._known(it, entry)
            own = sum(len(it.chains[k]) for k in known[r])  # type: ignore[arg-type]
            if len(known[r]) == sum(c is not None for c in it.chains):  # every question answered before
                cached[r] = it.input_tokens
                continue
            cached[r] = n + own
            if entry is not None:
                base: Any = entry if n == len(it.ids) else entry.head(n)
            elif (
                template_head is not None
                and len(it.ids) >= len(template_head)
                and tuple(it.ids[: len(template_head)]) == template_head.tokens
            ):
                base = StateKV(template_head.tokens, template_head.kv)
            else:
                bare.append(r)
                continue
            if len(it.ids) - len(base) > FUSED_TRUNK:  # a long rest runs causally on its own first
                bare.append(r)
            states[r], trunks[r] = base, it.ids[len(base) :]
        if bare:  # their states run first, in one forward, after their bases (if any)
            rows = [(states[r], trunks[r] if states[r] is not None else items[r].ids) for r in bare]
            for r, st in zip(bare, encode_states(self.engine, rows)):
                states[r], trunks[r] = st, []
                self.states.put(st, items[r].request.cache_key)
        scores, whole = branch_answers(self.engine, items, states, known, trunks)
        for r, st in enumerate(whole):
            if st is not None:
                states[r] = st
                self.states.put(st, items[r].request.cache_key)
        out = []
        for it, st, sc, kn, c in zip(items, states, scores, known, cached):
            self._remember(it, st, sc, kn)
            probs = []
            for q, s, t in zip(it.request.questions, sc, it.temperatures):
                if s is None:
                    probs.append(None)
                    continue
                probs.append(softmax(np.asarray(s, dtype=np.float64) / (t * self.temperature(q))))
            out.append(DecisionResult(it.request, tuple(probs), it.input_tokens, c))
        return out
