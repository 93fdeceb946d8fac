"""The labels' own tokens after the prompt: the zero-shot kind, and the default.

* first-token: every label is one distinct token, so the label-row logits at the last
  prompt position decide (the vocabulary's normalizer is the same for every label of a
  row, and cancels in the softmax over labels).
* sequence: a label of several tokens, or labels that share a first token: each label's
  score is its first-token logit plus the exact log-probabilities of its later tokens,
  computed by extending the row's own KV with the labels' token trie, all labels in one
  pass (`trie_logprobs`; see `labels.build_trie`), or one batched pass per label
  (`continuation_logprobs`, for a model without tree masks).

Scores are log-probabilities up to one constant per row; `probs` (their softmax) are exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.engine import Engine
from ..engine.prefix_cache import PrefixCache
from ..models import KV
from ..text.batching import Batch
from ..text.calibration import CalibrationSpec
from ..text.labels import MODES, LabelError, LabelSet, TrieChunk, build_labelset, check_none_label, softmax
from ..text.labels import validate as validate_labels
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import PromptFormat, check_examples, render
from .base import KindArgs, KindSpec, OnePrompt, RunSettings, count, prediction, require_lm_head, task_examples

LABEL_PASSES = ("trie", "per-label")
LOGIT_ROWS = 256  # trie positions projected onto the vocabulary at once (256 x 151,936 floats: 156 MB)


@dataclass(frozen=True)
class LabelsSpec(KindSpec):
    """Zero-shot labels: their tokens scored after the prompt (`scoring`: auto, first-token or
    sequence), few-shot `examples` in the prompt, descriptions filled into the system message."""

    names: tuple[str, ...]
    scoring: str = "auto"
    examples: tuple[tuple[str, str], ...] = ()
    descriptions: Mapping[str, str] | None = field(default=None, compare=False)
    keep_logits: bool = False
    label_pass: str = "trie"
    none_label: str | None = None  # type: ignore[assignment]  # the label meaning "none of these"

    name = "labels"  # type: ignore[misc]

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        return True  # the default: the table asks it last

    @classmethod
    def from_args(cls, args: KindArgs) -> LabelsSpec:
        labels = tuple(validate_labels(args.labels))  # once: a generator is read here, and one str is refused
        if args.label_pass not in LABEL_PASSES:
            raise ValueError(f"label_pass must be one of {', '.join(LABEL_PASSES)}, not {args.label_pass!r}")
        if args.scoring not in MODES:
            raise LabelError(f"scoring mode {args.scoring!r} is not one of {', '.join(MODES)}")
        examples = check_examples(args.examples, labels)
        none = check_none_label(args.none_label, labels)
        return cls(labels, args.scoring, examples, args.label_descriptions, args.keep_logits, args.label_pass, none)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.names

    def prompt(self, system: str | None, template: str) -> PromptFormat:
        # `{labels}` / `{label_descriptions}` filled once, by the plan (`prompt_labels` says with what).
        return PromptFormat(system, template, self.examples)

    def prompt_labels(self) -> tuple[Sequence[str], Mapping[str, str] | None]:
        return self.names, self.descriptions

    def to_task(self, path: Any = None) -> dict[str, Any]:
        return {
            "labels": list(self.names),
            "scoring": self.scoring,
            "examples": [{"text": t, "label": lab} for t, lab in self.examples],
        }

    def for_request(self, labels: tuple[str, ...], same_prompt: bool) -> KindSpec | None:
        return self if labels == self.names else None  # its scoring mode and examples hold for its labels

    def task_kwargs(self, mode: str) -> dict[str, Any]:
        return {"labels": self.names, "scoring": mode, "examples": self.examples}

    def manifest(self, mode: str) -> dict[str, Any]:
        return {"labels": list(self.names), "scoring": mode, "examples": [list(e) for e in self.examples]}

    @classmethod
    def read_task(
        cls, d: dict[str, Any], where: str, labels: list[str], calibration: CalibrationSpec
    ) -> dict[str, Any] | None:
        return {"examples": task_examples(d, where, labels)}  # the scoring mode is a shared field

    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> LabelsKind:
        return LabelsKind(self, engine, fmt, run)


class LabelsKind(OnePrompt):
    """The labels' tokens scored after each prompt (see the module docstring)."""

    spec: LabelsSpec
    labelset: LabelSet = None  # type: ignore[assignment]  # its own, set once made (replaceable in tests)

    def __init__(self, spec: LabelsSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        require_lm_head(engine)
        super().__init__(spec, engine, fmt, run)
        # a decision client's option names (`controls_as_text`): a control token in one is read as text
        self.labelset = labelset_for(engine, fmt, spec.names, spec.scoring, as_text=run.controls_as_text)
        self._settle()

    @property
    def mode(self) -> str:
        return self.labelset.mode

    @property
    def label_extra(self) -> int:
        return self.labelset.max_len - 1

    @property
    def row_extra(self) -> int:
        """The label trie's (largest chunk's) nodes run beside every row. The per-label passes run
        B x (label length - 1) tokens at a time, so they plan as the prompt alone."""
        return self.labelset.row_tokens if self._trie else 0

    @property
    def _trie(self) -> bool:
        return self.spec.label_pass == "trie" and getattr(self.engine.model, "supports_tree", False)

    def label_too_long(self, fixed: int) -> Exception:
        ls = self.labelset
        longest = max(range(len(ls.labels)), key=lambda k: len(ls.token_ids[k]))
        return LabelError(
            f"label {ls.labels[longest][:60]!r} is {ls.max_len} tokens: with the "
            f"prompt ({fixed - 1} tokens) it is over the model's context of {self.max_length}: shorten the label"
        )

    def score(self, batch: Batch, items: list[Item], prefix: PrefixCache | None, st: Stats) -> list[Prediction]:
        scores, logits, ran = self.scores(batch, prefix)
        count(st, batch, ran)
        labels = self.labelset.labels
        return [
            prediction(item, labels, scores[r], softmax(scores[r]), logits=None if logits is None else logits[r])
            for r, item in enumerate(items)
        ]

    def scores(self, batch: Batch, prefix: PrefixCache | None) -> tuple[np.ndarray, np.ndarray | None, int]:
        """(B, k) label scores of one batch (float64), the full last logits when kept, and the
        label tokens run."""
        ls, engine = self.labelset, self.engine
        rows = mx.array(ls.first_ids, dtype=mx.int32)
        first, full, kv = engine.forward(batch, prefix, rows, self.spec.keep_logits)
        scores = np.array(first, dtype=np.float64)
        ran = 0
        if ls.mode == "sequence":
            # a batch of several heads (chat items) hands its StackedPrefix on: each row sees its own head's keys
            p: Any = prefix if getattr(prefix, "mask", None) is not None else len(prefix) if prefix else 0
            if self._trie:
                rest, ran = trie_logprobs(engine, kv, batch, p, ls.trie, len(ls.labels))
            else:
                rest, ran = continuation_logprobs(engine, kv, batch, p, ls.token_ids)
            scores = scores + rest
        return scores, full, ran


# --------------------------------------------------------------------------- label continuations


def trie_logprobs(
    engine: Engine, kv: list[KV], batch: Batch, prefix_len: Any, chunks: Sequence[TrieChunk], n_labels: int
) -> tuple[np.ndarray, int]:
    """Per label, the sum of log p(label token k | prompt, earlier label tokens) for k >= 1,
    all labels at once: the labels' token trie runs as one extra sequence per row.

    `prefix_len`: the cached head's length, or a `StackedPrefix` (its rows' own heads, masked).
    Each trie node sees the shared prefix, its row's own prompt (through the row's KV)
    and its own ancestors, never a sibling (`tree` mask), at RoPE position prompt end +
    depth: exactly the context it has when its label alone follows the prompt. One pass
    per trie chunk (one in all unless the trie has over `labels.MAX_TRIE_NODES` nodes).
    Returns (B, n_labels) (0 for one-token labels) and the tokens run.
    """
    B, L = batch.ids.shape
    cache_mask = engine.cache_mask(batch, prefix_len)
    end = batch.offsets.astype(np.int32) + L  # each row's position after its last prompt token
    out = np.zeros((B, n_labels), dtype=np.float64)
    ran = 0
    with engine.lock:
        for c in chunks:
            T = len(c)
            ids = mx.broadcast_to(mx.array(c.tokens)[None], (B, T))
            h = engine.continue_after(kv, cache_mask, ids, positions=end[:, None] + c.depth[None, :], tree=c.visible)
            lp = edge_logprobs(engine, h.reshape(B * T, -1), c, T)  # (B, E)
            out[:, c.labels] += lp @ c.paths
            ran += B * T
    return out, ran


def edge_logprobs(engine: Engine, hidden: mx.array, c: TrieChunk, T: int) -> np.ndarray:
    """log p(edge token | node) for every edge of a chunk, rows (B, E), from the nodes'
    hidden states (B*T, D). The vocabulary's log-sum-exp is taken LOGIT_ROWS node
    positions at a time, so the (positions, V) logits never all exist at once."""
    rows = np.unique(c.edge_token)
    lse, got = engine.vocab_logprob_parts(hidden, rows, LOGIT_ROWS)
    lse, got = lse.reshape(-1, T), got.reshape(-1, T, len(rows))  # (B, T), (B, T, R)
    col = np.searchsorted(rows, c.edge_token)
    return got[:, c.edge_node, col] - lse[:, c.edge_node]  # (B, E)


def continuation_logprobs(
    engine: Engine, kv: list[KV], batch: Batch, prefix_len: Any, token_ids: Sequence[Sequence[int]]
) -> tuple[np.ndarray, int]:
    """Per label, the sum of log p(label token k | prompt, earlier label tokens) for k >= 1.

    Extends each row's own KV (prefix + suffix) with the label's tokens in one batched
    pass per label; the prompt is never run again. Returns (B, k) and the tokens run.
    The path for a model without tree masks (the mlx-lm fallback), and the "before" row
    of benchmarks/many_labels.py; `trie_logprobs` is the packed pass.
    """
    B, L = batch.ids.shape
    cache_mask = engine.cache_mask(batch, prefix_len)
    offsets = batch.offsets + L
    cols, ran = [], 0
    model = engine.model
    with engine.lock:
        for toks in token_ids:
            if len(toks) == 1:
                cols.append(mx.zeros((B,), dtype=mx.float32))
                continue
            inp = mx.broadcast_to(mx.array(toks[:-1], dtype=mx.int32)[None], (B, len(toks) - 1))
            h = engine.continue_after(kv, cache_mask, inp, offsets=offsets)
            logits = model.logits(h).astype(mx.float32)  # (B, n-1, V): context differs per label
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            tgt = mx.broadcast_to(mx.array(toks[1:], dtype=mx.int32)[None, :, None], (B, len(toks) - 1, 1))
            cols.append(mx.take_along_axis(lp, tgt, axis=-1)[..., 0].sum(axis=1))
            ran += B * (len(toks) - 1)
        out = mx.stack(cols, axis=1)
        mx.eval(out)
    return np.array(out, dtype=np.float64), ran


def labelset_for(
    engine: Engine, fmt: PromptFormat, labels: Sequence[str], scoring: str = "auto", as_text: bool = False
) -> LabelSet:
    """The label set of `labels` after prompts of `fmt` on this engine's tokenizer (`as_text`: a
    control token written in a label read as text, as a decision client's option names are)."""
    got = build_labelset(engine.tokenizer, labels, render(engine.tokenizer, fmt, "example"), scoring)
    if as_text:
        from ..text.decisions.prompt_tokens import labels_as_text  # lazy: a decision's own rule

        got = labels_as_text(engine.tokenizer, got)
    return got
