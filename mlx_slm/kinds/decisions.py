"""Decisions on an engine: a request's questions as branches after its state, several requests
(different states, different questions) in one batch.

Every question's full prompt (`text.decision_prompts.prompt_ids`: Transformers' generic decision
prompt as the one user message) is tokenized whole; the tokens all of a request's prompts share
(capped so that each question keeps at least its last token) are its *state part*, and what is
left of each prompt is that question's branch. Each row of a batch continues a base whose keys
and values are cached (the chat template's head, or the longest start of the state the
decider's state cache holds); the rest of its state (its *trunk*) runs causally at the start of
the first pass, and every question runs as a branch of the row's tree after it
(`branch_answers`: `branches.pack_branches`, then `questions.option_scores`, the very pieces the
questions kind runs), seeing the state and its own tokens only. So each question's scores are
exactly those of its prompt run alone, whatever else shares the batch. The trunk's keys and
values come back from that pass (`StateKV`): what later passes of many questions continue, and
what the state cache keeps. A long trunk runs on its own first (`encode_states`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache, StackedPrefix
from ..models import KV
from ..text import batching
from ..text.branches import MAX_PASS_TOKENS, _groups, pack_branches
from ..text.decision_prompts import (
    MARK,
    SPLIT,
    label_set,
    prompt_ids,
    render_chat,
    sentinel_tokenizer,
    template_prompts,
)
from ..text.decisions import (
    YES_NO,
    DecisionConfig,
    DecisionError,
    DecisionQuestion,
    DecisionRequest,
    render_user_message,
    text,
)
from ..text.labels import LabelSet
from ..text.prompts import PROBES, common_prefix, size_problem
from .questions import option_scores

# A question's prompt may be this many tokens shorter than the probe question's (`DecisionPlanner.
# state_tokens`): a state whose probe prompt is over the context by more is over it for every question.
STATE_SLACK = 64
LABEL_SETS = 256  # distinct label tuples whose `LabelSet`s a planner keeps (an LRU: a server lives long)


@dataclass
class DecisionItem:
    """One request, tokenized: its state part (`ids`), each question's own tokens (`chains`,
    None for a question over the context: an OpenAI refusal) and labels as the model reads
    them, and the token counts the usage reports."""

    index: int
    request: DecisionRequest
    ids: list[int]
    chains: list[list[int] | None]
    options: list[LabelSet | None]
    temperatures: list[float]
    input_tokens: int
    cost: int = 0  # tokens the request runs (its state part and its branches): the batch budget

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(self.ids)


class StateKV:
    """A state part's keys and values (batch 1, every key real), as a `PrefixCache` holds a
    prompt head's: what rows continue (`StackedPrefix`) and what the state cache keeps."""

    mask = None
    states = None

    def __init__(self, tokens: Sequence[int], kv: list[KV]):
        self.tokens: tuple[int, ...] = tuple(int(t) for t in tokens)
        self.kv = kv
        # Questions answered after this very state: a digest of (their own tokens, their labels'
        # tokens) -> option scores. A question asked again of the same state is the same
        # computation: not run again. Their bytes count in `nbytes` (the state cache's budget).
        self.scores: dict[bytes, np.ndarray] = {}
        self.scores_nbytes = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def array(self) -> np.ndarray:
        """Its tokens as an array (the state cache compares states by their start)."""
        return np.asarray(self.tokens, dtype=np.int64)

    def head(self, n: int) -> StateKV:
        """Its first `n` tokens' keys and values (a later state that starts the same way)."""
        return StateKV(self.tokens[:n], [(k[:, :, :n], v[:, :, :n]) for k, v in self.kv])

    def add_score(self, key: bytes, score: np.ndarray) -> int:
        """A question's answer kept (`key`: `answer_key`); the bytes it adds (0 if known)."""
        if key in self.scores:
            return 0
        self.scores[key] = score
        n = len(key) + np.asarray(score).nbytes
        self.scores_nbytes += n
        return n

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv) + self.scores_nbytes


class DecisionPlanner:
    """Requests to `DecisionItem`s on one tokenizer: each question's prompt, the split, the
    labels (one `LabelSet` per distinct label tuple, kept), the context checked."""

    def __init__(self, tokenizer: Any, config: DecisionConfig, max_length: int):
        self.tokenizer, self.config, self.max_length = tokenizer, config, max_length
        self._labels: OrderedDict[tuple[str, ...], LabelSet] = OrderedDict()
        self.probe = render_chat(tokenizer, "probe")  # a rendered prompt: what whole labels follow
        # A model folder's own decision template: its prompts encoded as Transformers encodes them.
        self.own = sentinel_tokenizer(tokenizer) if config.chat_template else None
        self.probe_q = DecisionQuestion("probe", "noul", "?", tuple(config.noul_options), (None, None), YES_NO)
        heads = [self.prompts(DecisionRequest(t, (self.probe_q,)))[0] for t in PROBES]
        # Every prompt starts with these tokens (the chat template's head): the shared base KV.
        self.head = common_prefix(heads)

    def prompts(self, request: DecisionRequest) -> list[list[int]]:
        """Each question's prompt, up to where its answer is read."""
        cfg = self.config
        if self.own is not None:
            return template_prompts(
                self.own, cfg.chat_template, request.state, request.questions, cfg.sanitize_control_tokens
            )
        users = [render_user_message(request.state, q) for q in request.questions]
        if not cfg.sanitize_control_tokens:  # as Transformers: the sentinels dropped, nothing else
            users = [u.replace(MARK, "").replace(SPLIT, "") for u in users]
        return prompt_ids(self.tokenizer, users, cfg.sanitize_control_tokens)

    def labels(self, labels: tuple[str, ...]) -> LabelSet:
        got = self._labels.get(labels)
        if got is None:
            got = self._labels[labels] = label_set(self.tokenizer, labels, self.probe)
            while len(self._labels) > LABEL_SETS:
                self._labels.popitem(last=False)
        else:
            self._labels.move_to_end(labels)
        return got

    def state_tokens(self, request: DecisionRequest) -> int:
        """The tokens of the state asked with the shortest question (the probe's "?"): the state
        tokenized once, before its questions' prompts (each holds the whole state again)."""
        return len(self.prompts(replace(request, questions=(self.probe_q,)))[0])

    def item(self, index: int, request: DecisionRequest) -> DecisionItem:
        """A request tokenized; a `DecisionError` (tokens_exceeded) when a System One request
        does not fit the context (an OpenAI one refuses the questions that do not)."""
        openai = request.api == "openai"
        if size_problem(self.tokenizer, text(request.state), self.max_length) is not None:
            # refused before tokenizing (a 100 MB state)
            return self._over(
                index, request, f"the state is far over the model's context of {self.max_length} tokens: shorten it"
            )
        if len(request.questions) > 1:  # the state tokenized once, not once a question, when it cannot fit
            n = self.state_tokens(request)
            if n > self.max_length + STATE_SLACK:
                return self._over(
                    index,
                    request,
                    f"the state needs about {n} tokens, over the model's context of {self.max_length}: shorten it",
                )
        prompts = self.prompts(request)
        options = [self.labels(tuple(q.labels)) for q in request.questions]
        fits = [len(p) + o.max_len - 1 <= self.max_length for p, o in zip(prompts, options)]
        if not all(fits) and not openai:
            n = max(len(p) + o.max_len - 1 for p, o in zip(prompts, options))
            raise DecisionError(
                ("body", "state"),
                f"the request needs {n} tokens (the state and its longest question), over the model's context of "
                f"{self.max_length}: shorten the state or the question",
                "tokens_exceeded",
            )
        if not any(fits):
            return self._over(index, request, "")
        live = [p for p, ok in zip(prompts, fits) if ok]
        cut = min(len(common_prefix(live)), min(len(p) for p in live) - 1)
        chains = [p[cut:] if ok else None for p, ok in zip(prompts, fits)]
        temps = [self.config.temperature_of(q.type) for q in request.questions]
        own = sum(len(c) for c in chains if c is not None)
        nodes = sum(sum(len(c) for c in o.trie) for o, ok in zip(options, fits) if ok)
        return DecisionItem(
            index,
            request,
            live[0][:cut],
            chains,
            [o if ok else None for o, ok in zip(options, fits)],
            temps,
            input_tokens=cut + own,
            cost=cut + own + nodes,
        )

    def _over(self, index: int, request: DecisionRequest, why: str) -> DecisionItem:
        """A request none of whose questions fits: System One refuses it, OpenAI refuses each question."""
        if request.api != "openai":
            raise DecisionError(("body", "state"), why or "over the model's context: shorten it", "tokens_exceeded")
        n = len(request.questions)
        return DecisionItem(index, request, [], [None] * n, [None] * n, [1.0] * n, input_tokens=0, cost=1)


# --------------------------------------------------------------------------- running


def encode_states(engine: Engine, rows: Sequence[tuple[Any, Sequence[int]]]) -> list[StateKV]:
    """Each row's state KV: `rows[r]` = (its cached base, a `PrefixCache`/`StateKV` or None, and
    the tokens after it), in one forward; the rows continue their own bases (`StackedPrefix`)."""
    bases = [b for b, _ in rows]
    rests = [list(t) for _, t in rows]
    if all(b is None for b in bases):
        pre, start = None, 0
    elif all(b is not None for b in bases):
        pre = StackedPrefix(bases)
        start = pre.lengths
    else:  # a row without a base among rows with one: each group on its own
        got: list[StateKV | None] = [None] * len(rows)
        for want in (True, False):
            idx = [i for i, b in enumerate(bases) if (b is not None) == want]
            for i, s in zip(idx, encode_states(engine, [rows[i] for i in idx])):
                got[i] = s
        return got  # type: ignore[return-value]
    batch = batching.pad(rests, np.arange(len(rows)), engine.pad_id, cache_len=start)
    with engine.lock:
        kv, _, _ = engine.encode(batch, pre)
        C = len(pre) if pre is not None else 0
        L = batch.ids.shape[1]
        out = []
        for r, (base, rest) in enumerate(rows):
            nb = len(base) if base is not None else 0
            keep = mx.array(
                np.concatenate([np.arange(C - nb, C), np.arange(C + L - len(rest), C + L)]).astype(np.int32)
            )
            row = [(mx.take(k[r : r + 1], keep, axis=2), mx.take(v[r : r + 1], keep, axis=2)) for k, v in kv]
            mx.eval(row)
            out.append(StateKV((tuple(base.tokens) if base is not None else ()) + tuple(rest), row))
        return out


def branch_answers(
    engine: Engine,
    items: Sequence[DecisionItem],
    states: Sequence[Any],
    known: Sequence[Mapping[int, np.ndarray]] | None = None,
    trunks: Sequence[Sequence[int]] | None = None,
) -> tuple[list[list[Any]], list[StateKV | None]]:
    """Each item's option scores per question (None for a refused one) from its questions run
    as branches after its state KV, every item a row of one batch, in passes of at most
    `MAX_PASS_TOKENS` branch tokens a row. `known[r]`: row r's questions already answered
    (the state cache's), by index: not run again. `trunks[r]`: the rest of row r's state
    after the KV `states[r]` holds (a base: the chat template's head, a cached start), run
    in the first pass before its branches (one forward, not two); its keys and values come
    back as row r's whole state (second value; None for a row that ran no trunk)."""
    out: list[list[Any]] = [[None] * len(it.chains) for it in items]
    whole: list[StateKV | None] = [None] * len(items)
    todo: list[list[int]] = []
    for r, it in enumerate(items):
        have = known[r] if known is not None else {}
        for k, sc in have.items():
            out[r][k] = sc
        todo.append([k for k, c in enumerate(it.chains) if c is not None and k not in have])
    rows_run = [r for r in range(len(items)) if todo[r]]
    if not rows_run:
        return out, whole
    groups = []
    for r in rows_run:
        it, ks = items[r], todo[r]
        sizes = [len(it.chains[k]) + sum(len(c) for c in it.options[k].trie) for k in ks]  # type: ignore[arg-type]
        groups.append([[ks[j] for j in g] for g in _groups(sizes, MAX_PASS_TOKENS)])
    bases = [states[r] for r in rows_run]
    run_trunks = [list(trunks[r]) if trunks is not None else [] for r in rows_run]
    for p in range(max(len(g) for g in groups)):
        stacked = StackedPrefix(bases)
        mine = [g[p] if p < len(g) else [] for g in groups]
        rows = [[(items[r].chains[k], items[r].options[k]) for k in ks] for r, ks in zip(rows_run, mine)]
        first = p == 0 and any(run_trunks)
        pack = pack_branches(rows, engine.pad_id, trunks=run_trunks if first else None)  # type: ignore[arg-type]
        with engine.lock:
            got_h = engine.continue_after(
                stacked.kv,
                stacked.mask,
                pack.ids,
                positions=stacked.lengths[:, None] + pack.positions,
                tree=pack.visible,
                return_kv=first,
            )
            h, kv = got_h if first else (got_h, None)
            got = option_scores(engine, h, pack, [[items[r].options[k] for k in ks] for r, ks in zip(rows_run, mine)])
            if first:  # each row's whole state: its base's keys, then its trunk's
                bases = _states_after(bases, run_trunks, kv, len(stacked))
                for i, r in enumerate(rows_run):
                    whole[r] = bases[i] if run_trunks[i] else None
        for i, (r, ks) in enumerate(zip(rows_run, mine)):
            for j, k in enumerate(ks):
                out[r][k] = got[i][j]
    return out, whole


def _states_after(bases: Sequence[Any], trunks: Sequence[Sequence[int]], kv: Any, C: int) -> list[Any]:
    """Each row's KV after a pass that ran its trunk (from the pass's (B, H, C + T, D) KV: the
    row's base keys at the end of the C cached ones, its trunk's at the start of the T new ones)."""
    out = []
    for r, (base, trunk) in enumerate(zip(bases, trunks)):
        if not trunk:
            out.append(base)
            continue
        nb = len(base)
        keep = mx.array(np.concatenate([np.arange(C - nb, C), C + np.arange(len(trunk))]).astype(np.int32))
        row = [(mx.take(k[r : r + 1], keep, axis=2), mx.take(v[r : r + 1], keep, axis=2)) for k, v in kv]
        mx.eval(row)
        out.append(StateKV(tuple(base.tokens) + tuple(trunk), row))
    return out


def base_of(engine: Engine, head: Sequence[int]) -> PrefixCache | None:
    """The chat template's head KV (the engine's prompt-head LRU), or None when it is empty."""
    if not head:
        return None
    cache, _ = engine.prefix(head)
    return cache
