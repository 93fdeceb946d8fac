"""`Decider`: typed decisions (System One, OpenAI) on an engine, the Python API and what the
service and `mlx-slm decide` call.

    decider = Decider.load("smollm2-135m")
    (result,) = decider.decide([parse_systemone(body, decider.config)])
    result.probabilities  # one array per question, in its options' order (result.raw: before any prior)

A call's requests run together, in batches of several requests (different states, different
questions): each request's state once, and each of its questions as a branch after it, the
state and its questions in one forward (`kinds.decisions`). The raw probabilities are
Transformers' generic decision path's: the label logits at the last position, divided by the
question type's temperature (the model folder's decision.json), softmaxed.

How each question is answered beyond that is its *method* (`text.decisions.methods`), all off
unless asked: the options' own names instead of letters, both option orders averaged, a prior
divided out (a run's batch prior, given per call as `priors`; a contextual one, found here from
content-free states and kept per question), a bias and temperature fitted on gold answers, or a
trained head. A task's methods are bound to their questions by digest (`Methods.for_question`):
`decide`, `--ray`, `eval` and `serve` all rely on that one rule. Each result keeps the raw
answer (`raw`) and says per question what was applied (`applied`).

A bounded LRU of recent states' keys and values (`engine.state_cache`) lets a state asked again
run only its questions (see `StateCache`); a question asked again of a cached state is answered
from the cache too (`answer_cache=False` runs it again, to measure the KV reuse alone).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.engine import Engine
from ..engine.state_cache import STATE_CACHE, STATE_CACHE_BYTES, StateCache, StateKV
from ..ground.errors import ModelError
from ..kinds.base import require_lm_head
from ..kinds.decisions import DecisionItem, DecisionPlanner, FeatureTap, base_of, branch_answers, encode_states
from ..kinds.head import check_head
from ..text import batching
from ..text.calibration import CalibrationError, Calibrator
from ..text.decisions.errors import DecisionError
from ..text.decisions.files import questions_of
from ..text.decisions.methods import FILLERS, Method, Methods, order_back
from ..text.decisions.openai import parse_openai
from ..text.decisions.questions import DecisionQuestion, DecisionRequest
from ..text.decisions.settings import DecisionConfig
from ..text.decisions.systemone import parse_systemone
from .own_classifiers import OwnClassifiers
from .pipeline import NON_FINITE, default_max_batch_tokens

# A state's rest (after its cached start) up to this many tokens runs in the same forward as its
# questions (a tree pass, dense over its tokens); a longer one runs on its own first (causal).
FUSED_TRUNK = 512
CALL_TOKENS = 4096  # the requests' tokens one decide call takes (`Decider.call_tokens`)
BATCH_SIZE = 16  # requests a forward runs at once
CONTEXTUAL_PRIORS = 1024  # questions whose contextual prior a decider keeps


@dataclass(frozen=True)
class DecisionResult:
    """One request's answer: each question's probabilities over its options (in `q.options`
    order; None for a question refused as over the context), the raw ones before any prior or
    fit (`raw`: the style's, order-averaged; the same arrays when nothing was applied), what was
    applied to each (`applied`: `Method.record`, with a `note` where a fitted question's id was
    asked with other words), the input tokens (the state part once, each question's own) and
    those that came from the state cache."""

    request: DecisionRequest
    probabilities: tuple[np.ndarray | None, ...]
    input_tokens: int
    cached_tokens: int = 0
    raw: tuple[np.ndarray | None, ...] = ()
    applied: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class DeciderSettings:
    """A `Decider`'s settings, the keywords `Decider(...)` takes, resolved once into one value.

    state_cache / state_cache_bytes: recent states whose keys and values are kept, and at most
    this much of them; methods: how each question is answered (saved ones by digest, and the
    run's default: `text.decisions.methods.Methods`); calibration / calibration_questions: a
    task of before's temperatures by question key and the questions they were fitted for (read
    into `methods`); batch_size, max_batch_tokens (None: `pipeline.default_max_batch_tokens`)
    and max_length (None: the engine's) bound a forward; answer_cache False runs a cached
    state's questions again (to measure the KV reuse alone)."""

    state_cache: int = STATE_CACHE
    state_cache_bytes: int = STATE_CACHE_BYTES
    methods: Methods = field(default_factory=Methods)
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
        self.methods = _methods_of(s, self.config)
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
        self._contextual: OrderedDict[tuple[str, str, int], Calibrator] = OrderedDict()
        self.own = OwnClassifiers(engine)  # the questions answered by a classifier of their own
        self._contextual_lock = threading.Lock()
        with engine.lock:
            self.planner = DecisionPlanner(engine.tokenizer, self.config, self.max_length)
            for head in self.methods.heads:
                check_head(head, engine)

    @classmethod
    def load(
        cls,
        model: str | Path,
        *,
        decision_config: DecisionConfig | None = None,
        dtype: str | None = None,
        **kw: Any,
    ) -> Decider:
        """A model by name, path or hub id (`Engine.load`); its decision settings as
        `DecisionConfig.of_model` finds them unless `decision_config` is given."""
        engine = Engine.load(model, dtype=dtype)
        if decision_config is None:
            decision_config = DecisionConfig.of_model(model, engine.path)
        return cls(engine, decision_config, **kw)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def method(self, q: DecisionQuestion) -> tuple[Method, str | None]:
        """How `q` is answered here, and a note when a fitted question's id was asked otherwise."""
        return self.methods.for_question(q)

    # ------------------------------------------------------------------ preparing
    def prepare(self, requests: Sequence[DecisionRequest | Mapping[str, Any]]) -> list[DecisionItem]:
        """Each request tokenized (its state part, each question's variants, its cost in tokens);
        a `DecisionError` (tokens_exceeded) for a request refused whole over the context. A request
        may be given as its body (a dict: OpenAI's when it has "input", else System One's)."""
        reqs = [self.request(r) for r in requests]
        with self.engine.lock:
            return [self.planner.item(i, r, [self.method(q)[0] for q in r.questions]) for i, r in enumerate(reqs)]

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
    def decide(
        self, requests: Sequence[DecisionRequest | Mapping[str, Any]], priors: Mapping[str, Calibrator] | None = None
    ) -> list[DecisionResult]:
        """Every request's answers, in input order (see `prepare` for what is refused). `priors`:
        a run's batch prior per question digest (`decide --calibrate batch`), divided out of the
        questions whose method asks for one."""
        return self.run_items(self.prepare(requests), priors)

    def run_items(
        self, items: Sequence[DecisionItem], priors: Mapping[str, Calibrator] | None = None
    ) -> list[DecisionResult]:
        """Prepared items run in batches: their states once (from the state cache where it has
        them), then every question's variants as branches; results in the items' order."""
        scores = self.scores(items)
        raws = [self.raw_answers(it, sc) for it, (sc, _) in zip(items, scores)]
        tuned = self.own.answer(items, raws)
        _check_finite(items, raws)
        return [
            self.finish(DecisionResult(it.request, tuple(raw), it.input_tokens + extra, c, tuple(raw)), priors)
            for it, raw, (_, c), extra in zip(items, raws, scores, tuned)
        ]

    def scores(self, items: Sequence[DecisionItem]) -> list[tuple[list[Any], int]]:
        """Each item's scores per variant (None: refused) and its tokens from the state cache."""
        out: list[tuple[list[Any], int] | None] = [None] * len(items)
        live = [i for i, it in enumerate(items) if it.ids]
        for i, it in enumerate(items):
            if not it.ids:  # every question over the context (refused) or answered by its tuned classifier
                out[i] = ([None] * len(it.chains), 0)
        costs = [items[i].cost for i in live]
        for idx in batching.plan(costs, self.batch_size, self.max_batch_tokens, sort=True):
            group = [items[live[j]] for j in idx]
            for j, got in zip(idx, self._run_batch(group)):
                out[live[j]] = got
        return out  # type: ignore[return-value]

    def raw_answers(self, it: DecisionItem, scores: Sequence[Any]) -> list[np.ndarray | None]:
        """Each question's raw probabilities from its variants' scores: the letters' (or names')
        softmax at the question type's temperature, back in the question's option order, averaged
        over its orders; a head's own probabilities."""
        per: list[list[np.ndarray]] = [[] for _ in it.request.questions]
        for v, s in zip(it.variants, scores):
            if s is None:
                continue
            p = v.probabilities(np.asarray(s, dtype=np.float64))
            per[v.question].append(order_back(p, v.order) if v.order else p)
        return [
            None if it.refused(k) or not ps else (ps[0] if len(ps) == 1 else np.mean(ps, axis=0))
            for k, ps in enumerate(per)
        ]

    def finish(self, result: DecisionResult, priors: Mapping[str, Calibrator] | None = None) -> DecisionResult:
        """`result`'s final answers from its raw ones: each question's method applied (with the run's
        batch `priors` by digest, or the question's contextual prior where its method asks), and what
        was applied said. A run that finds its batch prior after answering its first states (`decide
        --calibrate batch`) finishes those results again once the prior is known."""
        probs, applied = [], []
        for q, p in zip(result.request.questions, result.raw):
            m, note = self.method(q)
            prior = (priors or {}).get(q.digest) if m.prior == "batch" else None
            if m.prior == "contextual" and p is not None:  # a saved method's prior is "none": it keeps its own
                prior = self.contextual_prior(q, m)
            final = None if p is None else m.answer(p, prior)
            probs.append(final)
            said = (
                replace(m, prior="none") if m.prior == "batch" and prior is None else m
            )  # no prior given: raw, said so
            rec = said.record(prior, q, final)
            applied.append({**rec, "note": note} if note else rec)
        return replace(result, probabilities=tuple(probs), applied=tuple(applied))

    def features(self, states: Sequence[Any], q: DecisionQuestion, layers: Sequence[int]) -> list[np.ndarray | None]:
        """Each state's hidden states after `layers` at `q`'s answer position ((len(layers), D);
        None for a state that does not fit): what a head trained for `q` reads (`train
        --decisions`), taken by the same branch pass that answers it."""
        tap = Method(head=FeatureTap(tuple(sorted(set(layers)))))  # type: ignore[arg-type]
        reqs = [DecisionRequest(st, (q,), refusal="question") for st in states]
        with self.engine.lock:
            items = [self.planner.item(i, r, [tap]) for i, r in enumerate(reqs)]
        return [None if sc[0] is None else np.asarray(sc[0], dtype=np.float32) for sc, _ in self.scores(items)]

    def contextual_prior(self, q: DecisionQuestion, m: Method) -> Calibrator:
        """`q`'s answer to content-free states (`methods.FILLERS`), averaged: the prior a
        contextual calibration divides out (Zhao et al. 2021). Found once per question, style and
        orders, and kept (a bounded LRU)."""
        key = (q.digest, *m.asks(q))
        with self._contextual_lock:
            got = self._contextual.get(key)
            if got is not None:
                self._contextual.move_to_end(key)
                return got
        plain = replace(m, prior="none", calibrator=None, head=None, key=None, digest=None)
        reqs = [DecisionRequest(f, (q,), refusal="question") for f in FILLERS]
        with self.engine.lock:
            items = [self.planner.item(i, r, [plain]) for i, r in enumerate(reqs)]
        raws = [self.raw_answers(it, sc) for it, (sc, _) in zip(items, self.scores(items))]
        self.own.answer(items, raws)  # the "prompt" style's: its own classifier's answers
        ps = [p for raw in raws for p in raw if p is not None]
        if not ps:
            raise DecisionError(("calibrate",), f"question {q.key!r} does not fit the model's context even alone")
        cal = _contextual(q, ps)
        with self._contextual_lock:
            self._contextual[key] = cal
            while len(self._contextual) > CONTEXTUAL_PRIORS:
                self._contextual.popitem(last=False)
        return cal

    @staticmethod
    def _variant_key(it: DecisionItem, k: int) -> bytes:
        """A variant's own tokens and how it is read (its labels' tokens, or its head) as a
        digest: after the same state (an exact hit), the same key is the same computation."""
        h = hashlib.blake2b(digest_size=16)
        h.update(np.asarray(it.chains[k], dtype=np.int32).tobytes())
        h.update(it.variants[k].reader())
        return h.digest()

    def _known(self, it: DecisionItem, state: StateKV | None) -> dict[int, np.ndarray]:
        """The variants of `it` the cached state (its very tokens) has answered already."""
        if state is None or not state.scores or not self.answer_cache or state.tokens != tuple(it.ids):
            return {}
        got = {}
        for k, c in enumerate(it.chains):
            if c is not None:
                sc = state.scores.get(self._variant_key(it, k))
                if sc is not None:
                    got[k] = sc
        return got

    def _remember(self, it: DecisionItem, state: StateKV | None, scores: list[Any], known: Mapping[int, Any]) -> None:
        if state is None or self.states.entries <= 0 or not self.answer_cache or state.tokens != tuple(it.ids):
            return
        for k, sc in enumerate(scores):
            if sc is not None and k not in known:
                self.states.remember(state, self._variant_key(it, k), sc)

    def _run_batch(self, items: list[DecisionItem]) -> list[tuple[list[Any], int]]:
        """One batch: each state from the cache, or run after the longest start the cache holds
        of it (else the chat template's head), in the same forward as its first questions; then
        every variant not answered before as a branch. Each item's scores and cached tokens."""
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
            if len(known[r]) == sum(c is not None for c in it.chains):  # every variant answered before
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
        for it, st, sc, kn in zip(items, states, scores, known):
            self._remember(it, st, sc, kn)
        return list(zip(scores, cached))


def _check_finite(items: Sequence[DecisionItem], raws: Sequence[Sequence[np.ndarray | None]]) -> None:
    """A request whose raw answer to a question holds NaN or infinity (weights that overflow in
    float16, or hold non-finite values) is refused, naming the question: never answered, nor
    divided by a prior, as if it were a probability."""
    for it, raw in zip(items, raws):
        for q, p in zip(it.request.questions, raw):
            if p is not None and not np.all(np.isfinite(p)):
                raise DecisionError(("body", "questions", q.key), f"question {q.key!r}: {NON_FINITE}")


def _contextual(q: DecisionQuestion, ps: Sequence[np.ndarray]) -> Calibrator:
    """`q`'s contextual prior: the mean of its answers to content-free states (finite, else refused)."""
    mean = np.mean(ps, axis=0)
    if not np.all(np.isfinite(mean)):
        raise DecisionError(("calibrate",), f"question {q.key!r}'s contextual prior: {NON_FINITE}")
    try:
        return Calibrator("contextual", q.answer_names(), tuple(np.log(np.maximum(mean, 1e-12)).tolist()), 1.0, len(ps))
    except CalibrationError as e:  # options apart only in spaces: a prior is kept by option name
        raise DecisionError(("calibrate",), f"question {q.key!r}'s contextual prior: {e}") from None


def _methods_of(s: DeciderSettings, config: DecisionConfig) -> Methods:
    """The settings' methods, with a task of before's temperatures (by key, for the questions they
    were fitted for) read into them: one rule for every front end (`Methods.for_question`)."""
    if not s.calibration:
        return s.methods
    own = s.calibration_questions
    if own is None:
        raise DecisionError(
            ("calibration",),
            "calibration temperatures need the questions they were fitted for: "
            "give calibration_questions (a task's questions)",
        )
    if not (isinstance(own, (tuple, list)) and all(isinstance(q, DecisionQuestion) for q in own)):
        own = questions_of(own, config)
    old = Methods.from_record(None, s.calibration, own, "calibration")
    return Methods({**s.methods.saved, **old.saved}, s.methods.default)
