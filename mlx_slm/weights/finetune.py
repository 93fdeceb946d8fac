"""LoRA fine-tuning of a classifier on one of our models, from tokenized prompts and gold labels.

    prompts (token ids) + gold -> checks -> a stratified validation split -> the blocks below the
    adapted ones, run once (`_encode`: the shared prompt head once at batch 1, each text once;
    their hidden states kept) -> epochs of length-bucketed, left-padded batches through the
    adapted blocks only (AdamW, warm-up then cosine or linear decay, cross-entropy) -> the
    best epoch by validation loss, as an `adapters.FineTuned`

Why it is built so:
* The forward must be differentiable. Ours is with MLX's native ops (RoPE with per-row offsets,
  the boolean mask into the fused attention, the tree mask: checked against finite differences
  in the tests). The CPU's fastmath kernels (numpy's exp for the softmax and SiLU) are not:
  autodiff takes their outputs for constants and returns wrong gradients without an error. So
  the adapted blocks always run `base.NATIVE`; the frozen blocks below run the model's own ops
  (no gradient passes them), and so does inference.
* Frozen blocks do not change: their outputs are computed once per text and reused every
  epoch, so a step costs the adapted blocks only.
* The shared prompt head (system message, chat template) passes the adapted blocks once per
  step at batch 1 and is broadcast to the rows: its keys and values there depend on the
  adapters, as they do at inference. Below them it is computed once.
* Objective (b) puts each label's trie nodes after the row's own tokens in the same pass
  (a tree mask, explicit RoPE positions), so its frozen part is cached too.
* Deterministic: the split, the batches and their order come from `numpy.random.default_rng
  (seed)`, the adapters' initialization and dropout from MLX keys made from the seed; nothing
  depends on MLX's global random state. Same seed and data: bit-identical adapters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn

from ..models import Model
from ..models.base import NATIVE, Context
from ..text import batching
from ..text.labels import MIN_LABELS, gold_problem, validate
from .adapters import (
    ALL_KEYS,
    OBJECTIVES,
    Epoch,
    FineTuned,
    FinetuneError,
    LabelTokens,
    LoraLayout,
    adapter_init,
    base_of,
    head_scores,
    linear_dims,
    lora_layer,
    module_at,
    projections,
    shared_head,
    swap,
)

SCHEDULES = ("cosine", "linear", "constant")
HEAD_INITS = ("zeros", "probe")
# The top blocks adapted by default: on BANKING77 at 10 per intent (benchmarks/finetune.py,
# qwen2.5-coder-0.5b's 24 blocks) 16 gave 0.840, 8 gave 0.806 and all 24 0.827.
DEFAULT_LAYERS = 16
STOPS = ("finished", "early_stopping", "max_minutes", "interrupted")


@dataclass(frozen=True)
class FinetuneSettings:
    """How to fine-tune. `layers`: the top N blocks get adapters on their `keys` projections
    (None: the top DEFAULT_LAYERS, or every block of a smaller model; rank, scale: the delta is
    scale * x A B, mlx-lm's convention); `learning_rate` for the adapters, `head_learning_rate`
    for the score head (objective "score", initialized to zero);
    `warmup`: the fraction of all steps the rate climbs linearly, then `schedule` decays it to 0;
    `val_fraction` of each label's examples is held out (stratified) and the epoch with the
    lowest validation loss is kept; training stops after `patience` epochs without a better one,
    or when `max_minutes` (wall time, the frozen pass included) run out. `prefix_grad`: let the
    gradient pass through the shared prompt head's keys and values in the adapted blocks too
    (their forward always uses the adapters; without it each step skips the head's backward,
    which for a long head, as BANKING77's 360 tokens, was about half of a step's time).
    `head_init`: the score head starts at zero, or ("probe") fitted on the base model's features
    first (`_probe`)."""

    objective: str = "score"
    layers: int | None = None  # None: the top DEFAULT_LAYERS blocks, or every block of a smaller model
    rank: int = 8
    scale: float = 20.0
    dropout: float = 0.0
    keys: tuple[str, ...] = ALL_KEYS
    epochs: int = 8
    learning_rate: float = 2e-5
    head_learning_rate: float = 1e-4
    schedule: str = "cosine"
    warmup: float = 0.1
    weight_decay: float = 0.0
    batch_size: int = 16
    max_tokens: int = 4096
    seed: int = 0
    val_fraction: float = 0.1
    patience: int = 2
    max_minutes: float | None = None
    prefix_grad: bool = False
    head_init: str = "zeros"

    def for_model(self, model: Model) -> FinetuneSettings:
        """These settings with `layers` resolved for `model` (None: its top DEFAULT_LAYERS blocks,
        or all of them), checked: what training runs and what the adapters record."""
        out = self if self.layers is not None else replace(self, layers=min(DEFAULT_LAYERS, len(model.layers)))
        out.check(model)
        return out

    def check(self, model: Model) -> None:
        """Refuse settings that cannot train on `model`, naming the setting and its range."""
        n = len(model.layers)

        def bad(name: str, want: str) -> FinetuneError:
            return FinetuneError(f"{name}={getattr(self, name)!r}: {want}")

        if self.objective not in OBJECTIVES:
            raise bad("objective", f"one of {', '.join(OBJECTIVES)}")
        if self.head_init not in HEAD_INITS:
            raise bad("head_init", f"one of {', '.join(HEAD_INITS)}")
        if self.schedule not in SCHEDULES:
            raise bad("schedule", f"one of {', '.join(SCHEDULES)}")
        if self.layers is None:
            self.for_model(model)  # checks the settings with `layers` resolved
            return
        for name, lo in (("layers", 1), ("rank", 1), ("epochs", 1), ("batch_size", 1), ("max_tokens", 1),
                         ("patience", 1), ("seed", 0)):  # fmt: skip
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise bad(name, f"a whole number, at least {lo}")
        if self.layers > n:
            raise bad("layers", f"the model has {n} blocks: adapt at most {n}")
        for name, lo, hi in (("scale", 0, None), ("learning_rate", 0, None), ("head_learning_rate", 0, None)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > lo or (hi is not None and v >= hi):
                raise bad(name, "a number above 0")
        for name, hi in (("dropout", 1.0), ("warmup", 1.0), ("val_fraction", 0.5), ("weight_decay", 1.0)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < hi:
                raise bad(name, f"a number from 0 up to (not including) {hi}")
        if self.max_minutes is not None and (
            not isinstance(self.max_minutes, (int, float))
            or isinstance(self.max_minutes, bool)
            or self.max_minutes <= 0
        ):
            raise bad("max_minutes", "a number of minutes above 0, or None")
        have = projections(model.layers[-1])
        if not self.keys or any(k not in have for k in self.keys):
            raise bad("keys", f"projections of a block, among {', '.join(have)}")


@dataclass(frozen=True)
class Progress:
    """What a progress callback sees: the phase ("encode": the frozen blocks' one pass, texts
    done of all; "train": steps done of all planned), the epoch, this epoch's running training
    loss, the validation figures of the last finished epoch (`val_epoch`: which one; during
    an epoch's steps, the one before it), seconds elapsed and left (estimated)."""

    phase: str
    done: int
    total: int
    epoch: int
    epochs: int
    loss: float | None
    val_loss: float | None
    val_accuracy: float | None
    elapsed: float
    eta: float | None
    val_epoch: int | None = None


# --------------------------------------------------------------------------- checks


def _check_labels(labels: Sequence[str]) -> tuple[str, ...]:
    if isinstance(labels, (str, bytes)) or len(list(labels)) < MIN_LABELS:
        raise FinetuneError(
            f"fine-tuning a classifier needs at least {MIN_LABELS} labels, got {labels!r}: give the label set"
        )
    return tuple(validate(labels))


def _check_data(
    prompts: Sequence[Sequence[int]], gold: Sequence[Any], labels: tuple[str, ...], model: Model, extra: int
) -> tuple[list[list[int]], np.ndarray]:
    """The prompts as lists and the gold as label indices, or a `FinetuneError` naming the example."""
    if len(prompts) == 0:
        raise FinetuneError("no examples to fine-tune on: give labelled texts (a prompt and a gold label each)")
    if len(prompts) != len(gold):
        raise FinetuneError(f"{len(prompts)} prompts but {len(gold)} gold labels: give one gold label per prompt")
    V, context = model.args.vocab_size, model.args.max_position_embeddings
    seqs = []
    for i, p in enumerate(prompts):
        s = [int(t) for t in p]
        if not s:
            raise FinetuneError(f"example {i}: the prompt has no tokens")
        if min(s) < 0 or max(s) >= V:
            raise FinetuneError(
                f"example {i}: token id {max(s) if max(s) >= V else min(s)} is outside the model's vocabulary "
                f"(0..{V - 1}): tokenize with this model's tokenizer"
            )
        if len(s) + extra > context:
            more = f" plus the longest label's {extra} tokens" if extra else ""
            raise FinetuneError(
                f"example {i}: the prompt has {len(s)} tokens{more}, over the model's context of {context}: "
                "shorten the text (or truncate it as classify would) or drop the example"
            )
        seqs.append(s)
    index = {lab: k for k, lab in enumerate(labels)}
    y = np.empty(len(gold), dtype=np.int64)
    for i, g in enumerate(gold):
        if isinstance(g, (int, np.integer)) and not isinstance(g, bool):
            if not 0 <= int(g) < len(labels):
                raise FinetuneError(f"example {i}: gold index {int(g)} is not a label index (0..{len(labels) - 1})")
            y[i] = int(g)
        elif gold_problem(g, labels) is None:
            y[i] = index[g]
        else:
            raise FinetuneError(
                f"example {i}: gold label {g!r} is {gold_problem(g, labels)}: the labels are "
                f"{list(labels)[:10]}{' ...' if len(labels) > 10 else ''}; fix the example or add the label"
            )
    counts = np.bincount(y, minlength=len(labels))
    if counts.min() == 0:
        none = [labels[k] for k in np.flatnonzero(counts == 0)]
        raise FinetuneError(
            f"no examples of {none[:8]}{' ...' if len(none) > 8 else ''}: give each label examples, or leave "
            "those labels out"
        )
    return seqs, y


def validation_split(y: np.ndarray, labels: Sequence[str], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices of `finetune`'s split: `fraction` of each label's examples (at
    least one), drawn with the run's seed."""
    rng = np.random.default_rng([seed, 0])
    if fraction == 0:
        return np.arange(len(y)), np.zeros(0, dtype=np.int64)
    train, val, short = [], [], []
    for k in range(len(labels)):
        members = rng.permutation(np.flatnonzero(y == k))
        n = max(1, int(round(len(members) * fraction)))
        if len(members) - n < 1:
            short.append(f"{labels[k]!r} has {len(members)}")
        val.append(members[:n])
        train.append(members[n:])
    if short:
        raise FinetuneError(
            f"too few examples for the validation split (val_fraction={fraction}): {'; '.join(short[:8])}"
            f"{' ...' if len(short) > 8 else ''}. It holds out at least one example of each label and trains on "
            "the rest, so each label needs at least 2: add examples, or set val_fraction=0 (no early stopping)"
        )
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


# --------------------------------------------------------------------------- the two passes


class _View:
    """What `Context` reads of a model, with the ops replaced (training runs the native ones)."""

    def __init__(self, model: Model, ops: Any):
        self.ops, self.args, self.layers = ops, model.args, model.layers


def _layout(b: batching.Batch, lt: LabelTokens | None) -> tuple[mx.array, mx.array | None, mx.array | None]:
    """(mask, positions, tree) of a batch's rows, with objective (b)'s trie nodes after each
    row's own tokens: a node sees the prefix, the row's real tokens and its own ancestors, at
    RoPE position (row end + depth), as label scoring runs them."""
    T = lt.nodes if lt is not None else 0
    if not T:
        return mx.array(b.mask), None, None
    assert lt is not None and lt.trie is not None
    B, L = b.ids.shape
    mask = np.concatenate([b.mask, np.ones((B, T), dtype=bool)], axis=1)
    own = b.offsets[:, None].astype(np.int32) + np.arange(L, dtype=np.int32)[None]
    nodes = (b.offsets.astype(np.int32) + L)[:, None] + lt.trie.depth[None]
    tree = np.zeros((L + T, L + T), dtype=bool)
    tree[:L, :L] = np.tril(np.ones((L, L), dtype=bool))
    tree[L:, :L] = True
    tree[L:, L:] = lt.trie.visible
    return mx.array(mask), mx.array(np.concatenate([own, nodes], axis=1)), mx.array(tree)


@dataclass
class _Encoded:
    """The hidden states entering the first adapted block: the shared head's (1, P, D) or None,
    and each text's own tokens (then its trie nodes) (L_i [+ T], D)."""

    prefix: mx.array | None
    rows: list[mx.array]
    own: list[list[int]]  # each text's tokens after the shared head
    P: int


def _encode(
    model: Model, seqs: list[list[int]], start: int, lt: LabelTokens | None, s: FinetuneSettings, tick: Callable
) -> _Encoded:
    """Run the frozen blocks (0 .. start-1) once: the shared head at batch 1, then every text."""
    P = shared_head(seqs)
    frozen = model.layers[:start]
    prefix, kvs = None, None
    if P:
        h = model.embed(mx.array([seqs[0][:P]], dtype=mx.int32))
        ctx = Context(model, mx.ones((1, P), dtype=mx.bool_), None, 0, mx.zeros((1,), dtype=mx.int32), False,
                      n_layers=start)  # fmt: skip
        kvs = []
        for blk in frozen:
            h, kv = blk(h, ctx, None, False)
            kvs.append(kv)
        mx.eval(h, kvs)
        prefix = h
    own = [q[P:] for q in seqs]
    rows: list[mx.array] = [mx.zeros((0,))] * len(seqs)
    T = lt.nodes if lt is not None else 0
    done = 0
    for idx in batching.plan([len(o) for o in own], s.batch_size * 2, s.max_tokens * 2, row_extra=T):
        b = batching.pad(own, idx, 0, P)
        mask, positions, tree = _layout(b, lt)
        ids = mx.array(b.ids)
        if T:
            assert lt is not None and lt.trie is not None
            ids = mx.concatenate([ids, mx.broadcast_to(mx.array(lt.trie.tokens)[None], (len(idx), T))], axis=1)
        h = model.embed(ids)
        if start:
            ctx = Context(model, mask, None, P, mx.array(b.offsets), False, positions, tree, n_layers=start)
            for i, blk in enumerate(frozen):
                h, _ = blk(h, ctx, None if kvs is None else kvs[i], False)
        mx.eval(h)
        pads = b.ids.shape[1] - np.array([len(own[i]) for i in idx])
        for r, i in enumerate(idx):
            rows[i] = h[r, int(pads[r]) :]
        done += len(idx)
        tick(done)
    return _Encoded(prefix, rows, own, P)


class _KeyedDropout(nn.Module):
    """Dropout whose masks come from the trainer's key stream (not MLX's global random state)."""

    def __init__(self, p: float, keys: _Keys):
        super().__init__()
        self.p, self.keys = p, keys

    def __call__(self, x: mx.array) -> mx.array:
        if not self.keys.training:
            return x
        keep = mx.random.bernoulli(1 - self.p, x.shape, key=self.keys.next())
        return mx.where(keep, x / (1 - self.p), mx.zeros_like(x))


class _Keys:
    def __init__(self, key: mx.array):
        self.key, self.training = key, False

    def next(self) -> mx.array:
        self.key, sub = mx.random.split(self.key)
        return sub


class _Top:
    """The adapted blocks (copies of the model's top blocks with mlx-lm LoRA layers), the final
    norm and the objective's scoring: what a step runs and differentiates. Its trainable
    arrays are one flat dict (`params`: the LoRA A and B by their model names, and the score
    head's "score.weight"), assigned into the layers before each forward."""

    def __init__(self, model: Model, s: FinetuneSettings, k: int, lt: LabelTokens | None):
        n = len(model.layers)
        self.model, self.lt, self.start, self.prefix_grad = model, lt, n - s.layers, s.prefix_grad
        self.view = _View(model, NATIVE)
        self.keys = _Keys(mx.random.key(s.seed))
        self.slots: dict[str, tuple[nn.Module, str]] = {}
        self.params: dict[str, mx.array] = {}
        init = mx.random.key(s.seed + 1)
        blocks = []
        for i in range(self.start, n):
            replace = {}
            for key in s.keys:
                name = f"model.layers.{i}.{key}"
                linear = module_at(model.layers[i], key)
                init, sub = mx.random.split(init)
                a, b = adapter_init(sub, *linear_dims(linear), s.rank)
                layer = lora_layer(linear, a, b, s.scale)
                if s.dropout:
                    layer.dropout = _KeyedDropout(s.dropout, self.keys)
                replace[key] = layer
                for leaf in ("lora_a", "lora_b"):
                    self.slots[f"{name}.{leaf}"] = (layer, leaf)
                    self.params[f"{name}.{leaf}"] = layer[leaf]
            blocks.append(swap(model.layers[i], replace))
        self.blocks = blocks
        self.head: mx.array | None = None
        if s.objective == "score":
            self.head = mx.zeros((k, model.args.hidden_size), dtype=mx.float32)
            self.params["score.weight"] = self.head

    def assign(self, params: dict[str, mx.array]) -> None:
        for name, v in params.items():
            if name == "score.weight":
                self.head = v
            else:
                layer, leaf = self.slots[name]
                layer[leaf] = v

    def hidden(self, enc: _Encoded, idx: np.ndarray) -> tuple[mx.array, mx.array | None]:
        """Final-norm hidden states of the texts `idx`: at the last position (B, D) and at objective
        (b)'s trie nodes (B, T, D) or None. The shared head, then the batch, through the adapted blocks."""
        P, T = enc.P, (self.lt.nodes if self.lt is not None else 0)
        n = len(self.blocks)
        kvs: list[Any] = [None] * n
        if P:
            hp = enc.prefix
            ctx = Context(self.view, mx.ones((1, P), dtype=mx.bool_), None, 0, mx.zeros((1,), dtype=mx.int32), True)
            for j, blk in enumerate(self.blocks):
                hp, kvs[j] = blk(hp, ctx, None, j == n - 1)
            if not self.prefix_grad:
                kvs = [(mx.stop_gradient(k), mx.stop_gradient(v)) for k, v in kvs]
        b = batching.pad(enc.own, idx, 0, P)
        L = b.ids.shape[1]
        D = self.model.args.hidden_size
        h = mx.stack(
            [mx.concatenate([mx.zeros((L + T - r.shape[0], D), dtype=r.dtype), r]) for r in (enc.rows[i] for i in idx)]
        )
        mask, positions, tree = _layout(b, self.lt)
        last_only = not T
        ctx = Context(self.view, mask, None, P, mx.array(b.offsets), last_only, positions, tree)
        for j, blk in enumerate(self.blocks):
            h, _ = blk(h, ctx, kvs[j], last_only and j == n - 1)
        h = self.model.model.norm(h)
        return (h[:, -1], None) if last_only else (h[:, L - 1], h[:, L:] if T else None)

    def scores(self, enc: _Encoded, idx: np.ndarray) -> mx.array:
        """(B, K) label logits of the texts `idx`."""
        last, nodes = self.hidden(enc, idx)
        if self.head is not None:
            return head_scores(self.head, last)
        assert self.lt is not None
        return self.lt.scores(self.model, last, nodes)


PROBE_PENALTIES = (1e-3, 1e-2, 1e-1, 1.0)  # L2 on the standardized head, chosen by validation loss


def _probe(top: _Top, enc: _Encoded, y: np.ndarray, split: tuple[np.ndarray, np.ndarray], s: FinetuneSettings):
    """A score head fitted on the base model's features first (linear probing, then fine-tuning:
    LP-FT): multinomial logistic regression without a bias (the score head has none) on the final
    norm's last position, each dimension scaled by its spread for the fit (folded back into the
    weights), its L2 penalty chosen among PROBE_PENALTIES by validation loss (no validation set:
    0.01). Full-batch Adam, fixed iterations: deterministic."""
    import mlx.optimizers as optim

    tr, va = split
    everything = np.concatenate([tr, va])
    lengths = np.array([len(o) for o in enc.own])
    feats = np.zeros((len(enc.own), top.model.args.hidden_size), dtype=np.float32)
    for b in batching.plan(lengths[everything], s.batch_size * 2, s.max_tokens * 2):
        rows = everything[b]
        last, _ = top.hidden(enc, rows)
        feats[rows] = np.array(last.astype(mx.float32))
    scale = feats[tr].std(axis=0) + 1e-6
    x = mx.array(feats / scale)
    assert top.head is not None
    k = top.head.shape[0]
    best: tuple[float, mx.array] | None = None
    for lam in PROBE_PENALTIES if len(va) else (1e-2,):
        w = mx.zeros((k, x.shape[1]))
        opt = optim.Adam(learning_rate=0.01)

        def loss(w: mx.array, lam: float = lam) -> mx.array:
            return _loss(x[mx.array(tr)] @ w.T, mx.array(y[tr])) + 0.5 * lam * (w * w).sum() / len(tr)

        step = mx.value_and_grad(loss)
        for _ in range(300):
            _, g = step(w)
            w = opt.apply_gradients({"w": g}, {"w": w})["w"]
            mx.eval(w, opt.state)
        vl = _loss(x[mx.array(va)] @ w.T, mx.array(y[va])).item() if len(va) else 0.0
        if best is None or vl < best[0]:
            best = (vl, w)
    assert best is not None
    return best[1] / mx.array(scale)[None]


# --------------------------------------------------------------------------- the loop


class _Optimizer:
    """AdamW on the adapters and, for a score head, a second AdamW at its own rate (two plain
    optimizers on two flat dicts: mlx's MultiOptimizer would read the dotted names as paths).
    Each rate is warmed up linearly over `warmup` of the steps, then decayed to 0 by `schedule`."""

    def __init__(self, s: FinetuneSettings, total: int):
        import mlx.optimizers as optim

        warm = int(round(s.warmup * total))

        def rate(lr: float) -> Any:
            rest = max(1, total - warm)
            decay = {
                "cosine": lambda: optim.cosine_decay(lr, rest, 0.0),
                "linear": lambda: optim.linear_schedule(lr, 0.0, rest),
                "constant": lambda: optim.linear_schedule(lr, lr, 1),
            }[s.schedule]()
            if not warm:
                return decay
            return optim.join_schedules([optim.linear_schedule(lr / (warm + 1), lr, warm), decay], [warm])

        self.lora = optim.AdamW(learning_rate=rate(s.learning_rate), weight_decay=s.weight_decay)
        self.head = optim.AdamW(learning_rate=rate(s.head_learning_rate), weight_decay=s.weight_decay)

    def apply(self, grads: dict[str, mx.array], params: dict[str, mx.array]) -> dict[str, mx.array]:
        head = {k: v for k, v in grads.items() if k == "score.weight"}
        lora = {k: v for k, v in grads.items() if k != "score.weight"}
        new = self.lora.apply_gradients(lora, {k: params[k] for k in lora})
        if head:
            new.update(self.head.apply_gradients(head, {k: params[k] for k in head}))
        return new

    @property
    def state(self) -> list[Any]:
        return [self.lora.state, self.head.state]


def _batches(lengths: np.ndarray, idx: np.ndarray, s: FinetuneSettings, rng: np.random.Generator, T: int):
    """One epoch's batches: the texts shuffled, then bucketed by length (so a bucket's members
    change every epoch), and the buckets in a random order."""
    perm = rng.permutation(idx)
    plan = batching.plan(lengths[perm], s.batch_size, s.max_tokens, row_extra=T)
    return [perm[plan[j]] for j in rng.permutation(len(plan))]


def diverged(epoch: int, what: str, value: float, s: FinetuneSettings) -> FinetuneError:
    """The refusal of a run whose loss (or weights) became NaN or infinite: nothing is kept."""
    return FinetuneError(
        f"fine-tuning diverged in epoch {epoch}: the {what} is {value} (not a finite number), so nothing is saved; "
        f"lower the learning rates (--lr {s.learning_rate:g} and --head-lr {s.head_learning_rate:g}; Python: "
        "learning_rate=, head_learning_rate=), or train in float32 (--dtype float32) if the model runs in float16"
    )


def _finite(params: dict[str, mx.array]) -> bool:
    """Whether every trained array holds finite values only."""
    return bool(mx.all(mx.stack([mx.all(mx.isfinite(v)) for v in params.values()])).item())


def _loss(scores: mx.array, gold: mx.array) -> mx.array:
    """Mean cross-entropy of (B, K) label logits against gold indices (B,)."""
    lp = scores - mx.logsumexp(scores, axis=-1, keepdims=True)
    return -mx.take_along_axis(lp, gold[:, None], axis=1).mean()


def _evaluate(top: _Top, enc: _Encoded, y: np.ndarray, idx: np.ndarray, s: FinetuneSettings) -> tuple[float, float]:
    """(mean loss, accuracy) of the texts `idx` with the adapters as they are."""
    lengths = np.array([len(o) for o in enc.own])
    total, right = 0.0, 0
    T = top.lt.nodes if top.lt is not None else 0
    for b in batching.plan(lengths[idx], s.batch_size, s.max_tokens, row_extra=T):
        rows = idx[b]
        sc = top.scores(enc, rows)
        loss = _loss(sc, mx.array(y[rows]))
        pred = mx.argmax(sc, axis=-1)
        mx.eval(loss, pred)
        total += loss.item() * len(rows)
        right += int((np.array(pred) == y[rows]).sum())
    return total / len(idx), right / len(idx)


@dataclass
class _Run:
    """A training run's state: what the loop updates and `finetune` reads back."""

    best: dict[str, mx.array] | None = None
    best_loss: float = float("inf")
    best_epoch: int = 0
    bad: int = 0
    stopped: str = "finished"
    step: int = 0

    def __post_init__(self) -> None:
        self.history: list[Epoch] = []

    def keep(self, params: dict[str, mx.array], epoch: Epoch) -> None:
        """Record the epoch; keep its weights if its validation loss is the best yet (without a
        validation set every epoch is kept: the last one wins)."""
        self.history.append(epoch)
        vl = epoch.val_loss
        if self.best is None or vl is None or vl < self.best_loss:
            self.best, self.best_epoch, self.bad = dict(params), epoch.epoch, 0
            self.best_loss = vl if vl is not None else float("inf")
        else:
            self.bad += 1


def _train(
    top: _Top, enc: _Encoded, y: np.ndarray, split: tuple[np.ndarray, np.ndarray], s: FinetuneSettings,
    clock: tuple[float, float], progress: Callable[[Progress], None],
) -> _Run:  # fmt: skip
    """The epochs: steps on the training part, the validation loss after each epoch, early
    stopping, the time limit and Ctrl-C (the best epoch so far is kept; before any epoch, the
    interruption goes on up)."""
    tr, va = split
    t0, deadline = clock
    rng = np.random.default_rng([s.seed, 1])
    lengths = np.array([len(o) for o in enc.own])
    T = top.lt.nodes if top.lt is not None else 0
    per_epoch = len(batching.plan(lengths[tr], s.batch_size, s.max_tokens, row_extra=T))
    total = per_epoch * s.epochs
    opt = _Optimizer(s, total)
    gold = mx.array(y)

    def loss_fn(params: dict[str, mx.array], idx: mx.array) -> mx.array:
        top.assign(params)
        return _loss(top.scores(enc, np.array(idx)), gold[idx])

    step_fn = mx.value_and_grad(loss_fn)
    params = dict(top.params)
    run = _Run()
    train0 = time.perf_counter()
    try:
        for epoch in range(1, s.epochs + 1):
            if run.history and time.perf_counter() > deadline:  # the first epoch takes one step at least
                run.stopped = "max_minutes"
                break
            e0 = time.perf_counter()
            mx.reset_peak_memory()
            steps, seen, loss_sum, complete = 0, 0, 0.0, True
            top.keys.training = True
            for idx in _batches(lengths, tr, s, rng, T):
                loss, grads = step_fn(params, mx.array(idx))
                params = opt.apply(grads, params)
                mx.eval(params, opt.state, loss)
                run.step += 1
                steps += 1
                seen += len(idx)
                if not np.isfinite(loss.item()):  # NaN or inf: every later step would be too
                    raise diverged(epoch, "training loss", loss.item(), s)
                loss_sum += loss.item() * len(idx)
                now = time.perf_counter()
                last = run.history[-1] if run.history else None
                progress(Progress("train", run.step, total, epoch, s.epochs, loss_sum / seen,
                                  last and last.val_loss, last and last.val_accuracy, now - t0,
                                  (now - train0) / run.step * (total - run.step), last and last.epoch))  # fmt: skip
                if now > deadline:
                    complete = False
                    break
            top.keys.training = False
            top.assign(params)
            if not _finite(params):  # the last step's update overflowed
                raise diverged(epoch, "adapters' or head's weights", float("nan"), s)
            vl, va_acc = _evaluate(top, enc, y, va, s) if len(va) else (None, None)
            if vl is not None and not np.isfinite(vl):
                raise diverged(epoch, "validation loss", vl, s)
            run.keep(params, Epoch(epoch, steps, complete, loss_sum / max(seen, 1), vl, va_acc,
                                   round(time.perf_counter() - e0, 3), round(mx.get_peak_memory() / 1e6, 1)))  # fmt: skip
            now = time.perf_counter()  # the epoch's own validation figures, as it ends
            progress(Progress("train", run.step, total, epoch, s.epochs, loss_sum / max(seen, 1), vl, va_acc,
                              now - t0, (now - train0) / max(run.step, 1) * (total - run.step), epoch))  # fmt: skip
            if not complete:
                run.stopped = "max_minutes"
                break
            if len(va) and run.bad >= s.patience:
                run.stopped = "early_stopping"
                break
    except KeyboardInterrupt:
        if run.best is None:
            raise
        run.stopped = "interrupted"
    return run


def _label_tokens(label_tokens: Sequence[Sequence[int]] | None, labels: tuple[str, ...]) -> LabelTokens:
    if label_tokens is None:
        raise FinetuneError(
            "objective 'labels' scores each label by its tokens: give label_tokens (e.g. "
            "labels.build_labelset(tokenizer, labels, a rendered prompt).token_ids)"
        )
    ids = tuple(tuple(int(t) for t in x) for x in label_tokens)
    if len(ids) != len(labels) or any(not t for t in ids):
        raise FinetuneError(f"label_tokens: give one non-empty token id list per label ({len(labels)} labels)")
    if len(set(ids)) != len(ids):
        raise FinetuneError("label_tokens: two labels have the same tokens: make the labels differ")
    return LabelTokens(ids)


def finetune(
    model: Model,
    prompts: Sequence[Sequence[int]],
    gold: Sequence[int | str],
    labels: Sequence[str],
    settings: FinetuneSettings | None = None,
    *,
    label_tokens: Sequence[Sequence[int]] | None = None,
    base_sha256: str | None = None,
    prompt: dict[str, Any] | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> FineTuned:
    """Fine-tune a classifier on `model` (left unchanged) and return its adapters and head.

    prompts: each example's whole prompt as token ids (rendered and tokenized as classify does:
        `prompts.render` and `prompts.tokenize`); gold: label indices or label strings.
    label_tokens: objective "labels" only: each label's token ids as label scoring tokenizes them
        (`labels.build_labelset(...).token_ids`).
    base_sha256: the model's weights hash, recorded so the adapters refuse other weights later.
    prompt: what the caller records of the prompt (system, template, examples), kept as is.
    progress: called after each text batch of the frozen pass and after each step.
    A quantized model kept packed trains as QLoRA (mlx-lm's LoRA layers over the packed layers).
    Ctrl-C returns the best finished epoch so far (`stopped == "interrupted"`), or goes on up
    before the first epoch ends; so does `max_minutes` running out ("max_minutes"), and then
    the epoch under way counts, cut short.
    """
    s = settings or FinetuneSettings()
    if not isinstance(model, Model):
        raise FinetuneError(
            f"fine-tuning runs on one of our architectures (qwen2, qwen3, llama, gemma3), not {type(model).__name__}"
        )
    s = s.for_model(model)
    labels = _check_labels(labels)
    lt = _label_tokens(label_tokens, labels) if s.objective == "labels" else None
    seqs, y = _check_data(prompts, gold, labels, model, lt.max_len if lt is not None else 0)
    split = validation_split(y, labels, s.val_fraction, s.seed)
    t0 = time.perf_counter()
    deadline = t0 + s.max_minutes * 60 if s.max_minutes is not None else float("inf")
    say = progress or (lambda _p: None)
    top = _Top(model, s, len(labels), lt)

    def tick(done: int) -> None:
        say(Progress("encode", done, len(seqs), 0, s.epochs, None, None, None, time.perf_counter() - t0, None))

    enc = _encode(model, seqs, top.start, lt, s, tick)
    if s.objective == "score" and s.head_init == "probe":
        top.head = top.params["score.weight"] = _probe(top, enc, y, split, s)
    encoded = time.perf_counter()
    run = _train(top, enc, y, split, s, (t0, deadline), say)
    assert run.best is not None
    best = run.best
    return FineTuned(
        labels=labels,
        objective=s.objective,
        lora=LoraLayout(tuple(range(top.start, len(model.layers))), tuple(s.keys), s.rank, float(s.scale)),
        adapters={k: v for k, v in best.items() if k != "score.weight"},
        head=best.get("score.weight"),
        label_tokens=lt.token_ids if lt is not None else None,
        base=base_of(model, base_sha256),
        settings={**asdict(s), "keys": list(s.keys), "train_size": int(len(split[0])), "val_size": int(len(split[1]))},
        history=run.history,
        best_epoch=run.best_epoch,
        stopped=run.stopped,
        encode_seconds=round(encoded - t0, 3),
        train_seconds=round(time.perf_counter() - encoded, 3),
        prompt=prompt,
    )
