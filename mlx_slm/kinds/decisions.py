"""Decisions on an engine: a request's questions as branches after its state, several requests
(different states, different questions) in one batch.

Every question is asked as one or more *variants* (`Variant`): its method (`text.decisions.
methods`) says in which style (the letters of Transformers' generic prompt, or the options' own
names) and in how many option orders (1, or 2: forward and reversed), or that a trained head
reads it. Each variant's full prompt (`prompt_tokens.prompt_ids`) is tokenized whole; the tokens
all of a request's prompts share (capped so that each keeps at least its last token) are its
*state part*, and what is left of each prompt is that variant's branch. Each row of a batch
continues a base whose keys and values are cached (the chat template's head, or the longest
start of the state the decider's state cache holds); the rest of its state (its *trunk*) runs
causally at the start of the first pass, and every variant runs as a branch of the row's tree
after it (`branch_answers`: `branches.pack_branches`, then `questions.option_scores`, the very
pieces the questions kind runs; a head variant reads its branch's hidden states), seeing the
state and its own tokens only. So each variant's scores are exactly those of its prompt run
alone, whatever else shares the batch. The trunk's keys and values come back from that pass
(`StateKV`): what later passes continue, and what the state cache keeps. A long trunk runs on
its own first (`encode_states`).

A question that does not fit the model's context after its state is refused as the request
says (`DecisionRequest.refusal`, the route's or the run's choice): the whole request (a
`DecisionError` of type tokens_exceeded) or that question alone (its answer None).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache, StackedPrefix
from ..engine.state_cache import StateKV
from ..text import batching
from ..text.branches import MAX_PASS_TOKENS, branch_cut, pack_branches, pass_groups
from ..text.decisions.errors import DecisionError
from ..text.decisions.methods import Method, orders, permuted
from ..text.decisions.prompt import render_user_message, styled
from ..text.decisions.prompt_tokens import (
    drop_sentinels,
    label_set,
    prompt_ids,
    render_chat,
    sentinel_tokenizer,
    template_prompts,
)
from ..text.decisions.questions import YES_NO, DecisionQuestion, DecisionRequest, text
from ..text.decisions.settings import DecisionConfig
from ..text.heads import Head, head_input
from ..text.labels import LabelSet, softmax
from ..text.prompts import PROBES, common_prefix, size_problem
from .questions import After, option_scores

# A question's prompt may be this many tokens shorter than the probe question's (`DecisionPlanner.
# state_tokens`): a state whose probe prompt is over the context by more is over it for every question.
STATE_SLACK = 64
LABEL_SETS = 256  # distinct label tuples whose `LabelSet`s a planner keeps (an LRU: a server lives long)


@dataclass(frozen=True)
class Variant:
    """One branch of a request's tree: question `question` asked with its options shown in
    `order` (`order[i]`: the option shown i-th), read on `labels` (its label tokens, or a head's
    placeholder), or by a trained `head`, at the question type's `temperature`."""

    question: int
    order: tuple[int, ...]
    labels: LabelSet
    head: Head | None = None
    temperature: float = 1.0

    def probabilities(self, scores: np.ndarray) -> np.ndarray:
        """The variant's answer from its scores: the labels' softmax at the question type's
        temperature, or a head's own log-probabilities exponentiated."""
        return np.exp(scores) if self.head is not None else softmax(scores / self.temperature)

    def reader(self) -> bytes:
        """How the variant is read, as bytes (its labels' tokens, or its head): with its own
        tokens, what makes a cached answer the same computation."""
        own = [b"head:" + self.head.sha256.encode()] if self.head is not None else []
        return b"|".join([*own, *(np.asarray(t, dtype=np.int32).tobytes() for t in self.labels.token_ids)])


@dataclass
class DecisionItem:
    """One request, tokenized: its state part (`ids`), each variant's own tokens (`chains`, None
    for a variant over the context) and how it is read (`variants`), each question's method
    (`methods`), and the token counts the usage reports."""

    index: int
    request: DecisionRequest
    ids: list[int]
    chains: list[list[int] | None]
    variants: list[Variant]
    methods: list[Method]
    input_tokens: int
    cost: int = 0  # tokens the request runs (its state part and its branches): the batch budget
    over: bool = False  # the state over the context: no question is answered, not even a tuned one

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(self.ids)

    def refused(self, k: int) -> bool:
        """Question k did not fit (one of its variants is over the context): no answer."""
        return any(self.chains[j] is None for j, v in enumerate(self.variants) if v.question == k)


@dataclass(frozen=True)
class FeatureTap:
    """A head that reads nothing: a variant read by it gives its branch's hidden states after
    `layers` at its last token (len(layers), D), what a decision question's head is trained on
    (`Decider.features`): the very states a trained head reads when it answers."""

    layers: tuple[int, ...]
    labels: tuple[str, ...] = ("features",)

    @property
    def sha256(self) -> str:
        """What keys its answers in a state cache (`Variant.reader`): the layers it reads, so two taps
        of other layers are never answered from one another's."""
        return "feature-tap:" + ",".join(map(str, self.layers))

    @property
    def parts(self) -> tuple[tuple[int, str], ...]:
        return tuple((x, "last") for x in self.layers)

    def log_probs(self, x: np.ndarray) -> np.ndarray:
        return x


def head_labels(head: Head) -> LabelSet:
    """A head variant's placeholder labels (no trie: nothing scored by tokens)."""
    return LabelSet(tuple(head.labels), tuple((0,) for _ in head.labels), "first-token")


class DecisionPlanner:
    """Requests to `DecisionItem`s on one tokenizer: each variant's prompt, the split, the labels
    (one `LabelSet` per distinct label tuple, kept), the context checked."""

    def __init__(self, tokenizer: Any, config: DecisionConfig, max_length: int):
        self.tokenizer, self.config, self.max_length = tokenizer, config, max_length
        self._labels: OrderedDict[tuple[str, ...], LabelSet] = OrderedDict()
        self.probe = render_chat(tokenizer, "probe")  # a rendered prompt: what whole labels follow
        # A model folder's own decision template: its prompts encoded as Transformers encodes them.
        self.own = sentinel_tokenizer(tokenizer) if config.chat_template else None
        self.probe_q = DecisionQuestion("probe", "noul", "?", tuple(config.noul_options), (None, None), YES_NO)
        heads = [self.prompts(t, [self.probe_q], ["letters"])[0] for t in PROBES]
        # Every prompt starts with these tokens (the chat template's head): the shared base KV.
        self.head = common_prefix(heads)

    def prompts(self, state: Any, questions: Sequence[DecisionQuestion], styles: Sequence[str]) -> list[list[int]]:
        """Each question's prompt after `state`, in its style, up to where its answer is read (a
        model's own decision template renders every question its own way)."""
        cfg = self.config
        if self.own is not None:
            return template_prompts(self.own, cfg.chat_template, state, questions, cfg.sanitize_control_tokens)
        users = [render_user_message(state, q, s) for q, s in zip(questions, styles)]
        if not cfg.sanitize_control_tokens:  # as Transformers: the sentinels dropped, nothing else
            users = [drop_sentinels(u) for u in users]
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

    def _labels_of(self, q: DecisionQuestion, vq: DecisionQuestion, style: str) -> LabelSet:
        """The labels `vq` is read by; labels that cannot be read refused naming the question, and the
        model's decision.json where its labels are the ones read."""
        try:
            return self.labels(tuple(vq.labels))
        except DecisionError as e:
            own = style not in ("names", "prompt") and len(self.config.labels.get(q.type) or ()) >= len(q.options)
            where = f" (read by the labels of the model's decision.json for a {q.type})" if own else ""
            raise DecisionError(("body", "questions", q.key), f"question {q.key!r}{where}: {e.msg}") from None

    def state_tokens(self, state: Any) -> int:
        """The tokens of the state asked with the shortest question (the probe's "?"): the state
        tokenized once, before its questions' prompts (each holds the whole state again)."""
        return len(self.prompts(state, [self.probe_q], ["letters"])[0])

    def variants(self, q: DecisionQuestion, k: int, method: Method) -> list[tuple[DecisionQuestion, str, Variant]]:
        """Question k as it is asked: each variant's question (its options in the variant's order,
        its labels the style's), style and `Variant`; none for a question a classifier of its own
        answers (its own pass, `OwnClassifiers.answer`: a trained one, or the "prompt" style's, whose
        options are checked here as the names style's are)."""
        if method.classified(q):
            if method.tuned is None:
                self._labels_of(q, styled(q, "prompt"), "prompt")
            return []
        style, n = method.asks(q)
        if self.own is not None:
            style = "letters"  # a model's own template asks its way
        base = styled(q, style)

        def relabel(qtype: str, names: Sequence[str]) -> tuple[str, ...]:
            return tuple(names) if style == "names" else self.config.labels_for(qtype, names)

        temp = self.config.temperature_of(q.type)
        out = []
        for order in orders(base, n):
            vq = permuted(base, order, relabel)
            labels = head_labels(method.head) if method.head is not None else self._labels_of(q, vq, style)
            out.append((vq, style, Variant(k, order, labels, method.head, temp)))
        return out

    def item(self, index: int, request: DecisionRequest, methods: Sequence[Method] | None = None) -> DecisionItem:
        """A request tokenized, each question asked as its method says (default: the letters,
        once); a question that does not fit is refused as `request.refusal` says."""
        methods = list(methods) if methods is not None else [Method()] * len(request.questions)
        whole = request.refusal == "request"
        if size_problem(self.tokenizer, text(request.state), self.max_length) is not None:
            # refused before tokenizing (a 100 MB state)
            why = f"the state is far over the model's context of {self.max_length} tokens: shorten it"
            return self._over(index, request, methods, why)
        if len(request.questions) > 1:  # the state tokenized once, not once a question, when it cannot fit
            n = self.state_tokens(request.state)
            if n > self.max_length + STATE_SLACK:
                why = f"the state needs about {n} tokens, over the model's context of {self.max_length}: shorten it"
                return self._over(index, request, methods, why)
        asked = [v for k, q in enumerate(request.questions) for v in self.variants(q, k, methods[k])]
        if not asked:  # every question answered by its own classifier (its own pass): no branch here
            n = self.state_tokens(request.state)
            if n > self.max_length:  # no question's prompt fits after it: refused now (a 422, not a timeout's 413)
                why = f"the state needs about {n} tokens, over the model's context of {self.max_length}: shorten it"
                return self._over(index, request, methods, why)
            return DecisionItem(index, request, [], [], [], methods, input_tokens=0, cost=max(1, n))
        prompts = self.prompts(request.state, [vq for vq, _, _ in asked], [s for _, s, _ in asked])
        variants = [v for _, _, v in asked]
        fits = [len(p) + v.labels.max_len - 1 <= self.max_length for p, v in zip(prompts, variants)]
        if not all(fits) and whole:
            n = max(len(p) + v.labels.max_len - 1 for p, v in zip(prompts, variants))
            raise DecisionError(
                ("body", "state"),
                f"the request needs {n} tokens (the state and its longest question), over the model's context of "
                f"{self.max_length}: shorten the state or the question",
                "tokens_exceeded",
            )
        bad = {v.question for v, ok in zip(variants, fits) if not ok}
        fits = [ok and v.question not in bad for v, ok in zip(variants, fits)]
        if not any(fits):
            return self._over(index, request, methods, "")
        live = [p for p, ok in zip(prompts, fits) if ok]
        cut = branch_cut(live)
        chains = [p[cut:] if ok else None for p, ok in zip(prompts, fits)]
        own = sum(len(c) for c in chains if c is not None)
        nodes = sum(sum(len(c) for c in v.labels.trie) for v, ok in zip(variants, fits) if ok)
        return DecisionItem(
            index, request, live[0][:cut], chains, variants, methods, input_tokens=cut + own, cost=cut + own + nodes
        )

    def _over(self, index: int, request: DecisionRequest, methods: list[Method], why: str) -> DecisionItem:
        """A request none of whose questions fits: refused whole, or each question refused."""
        if request.refusal == "request":
            raise DecisionError(("body", "state"), why or "over the model's context: shorten it", "tokens_exceeded")
        variants = [Variant(k, (), LabelSet(("x",), ((0,),), "first-token")) for k in range(len(request.questions))]
        n = len(variants)
        return DecisionItem(index, request, [], [None] * n, variants, methods, input_tokens=0, cost=1, over=True)


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
    """Each item's scores per variant (its options' label scores, or a head variant's
    log-probabilities; None for a refused one) from its variants run as branches after its
    state KV, every item a row of one batch, in passes of at most `MAX_PASS_TOKENS` branch
    tokens a row. `known[r]`: row r's variants already answered (the state cache's), by index:
    not run again. `trunks[r]`: the rest of row r's state after the KV `states[r]` holds (a
    base: the chat template's head, a cached start), run in the first pass before its branches
    (one forward, not two); its keys and values come back as row r's whole state (second value;
    None for a row that ran no trunk)."""
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
        sizes = [len(it.chains[k]) + sum(len(c) for c in it.variants[k].labels.trie) for k in ks]  # type: ignore[arg-type]
        groups.append([[ks[j] for j in g] for g in pass_groups(sizes, MAX_PASS_TOKENS)])
    bases = [states[r] for r in rows_run]
    run_trunks = [list(trunks[r]) if trunks is not None else [] for r in rows_run]
    for p in range(max(len(g) for g in groups)):
        stacked = StackedPrefix(bases)
        mine = [g[p] if p < len(g) else [] for g in groups]
        variants = [[items[r].variants[k] for k in ks] for r, ks in zip(rows_run, mine)]
        rows = [[(items[r].chains[k], v.labels) for k, v in zip(ks, vs)] for r, ks, vs in zip(rows_run, mine, variants)]
        first = p == 0 and any(run_trunks)
        pack = pack_branches(rows, engine.pad_id, trunks=run_trunks if first else None)  # type: ignore[arg-type]
        layers = sorted({x for vs in variants for v in vs if v.head is not None for x in v.head.layers})
        with engine.lock:
            h, hidden, kv = After.prefix(stacked, len(rows_run)).run(engine, pack, layers, return_kv=first)
            got = option_scores(
                engine, h, pack, [[v.labels if v.head is None else None for v in vs] for vs in variants]
            )
            if hidden:
                _head_answers(hidden, pack, variants, got)
            if first:  # each row's whole state: its base's keys, then its trunk's
                bases = _states_after(bases, run_trunks, kv, len(stacked))
                for i, r in enumerate(rows_run):
                    whole[r] = bases[i] if run_trunks[i] else None
        for i, (r, ks) in enumerate(zip(rows_run, mine)):
            for j, k in enumerate(ks):
                out[r][k] = got[i][j]
    return out, whole


def _head_answers(
    hidden: dict[int, np.ndarray], pack: Any, variants: Sequence[Sequence[Variant]], got: list[list[Any]]
) -> None:
    """Each head variant's log-probabilities, from the hidden states after its layers ({layer:
    (B, T, D)} float32) at its branch's last token (what the head was trained on:
    `Decider.features`), into `got[i][j]`."""
    for i, vs in enumerate(variants):
        for j, v in enumerate(vs):
            if v.head is not None:
                at = int(pack.answer_at[i, j])
                layers = sorted(set(v.head.layers))
                feats = {"last": np.stack([hidden[x][i, at] for x in layers])[None]}
                got[i][j] = v.head.log_probs(head_input(feats, layers, v.head))[0]


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
