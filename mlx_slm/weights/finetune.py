"""LoRA fine-tuning of a classifier on one of our models, from tokenized prompts and gold labels.

    prompts (token ids) + gold -> checks -> a stratified validation split -> the blocks below the
    adapted ones, run once (`encode`: the shared prompt head once at batch 1, each text once;
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
import mlx.optimizers as optim
import numpy as np

from ..models import Model
from ..text import batching
from ..text.labels import MIN_LABELS, gold_problem, validate
from .adapted import Encoded, Top, cross_entropy, encode
from .adapters import (
    ALL_KEYS,
    OBJECTIVES,
    Epoch,
    FineTuned,
    FinetuneError,
    LabelTokens,
    LoraLayout,
    base_of,
    projections,
)
from .head_starts import centroid, probe, words

SCHEDULES = ("cosine", "linear", "constant")
HEAD_INITS = ("zeros", "probe", "centroid", "words")
# Each setting's option on `mlx-slm train --finetune` (the messages name both: a CLI user typed the option).
OPTIONS = {
    "objective": "--objective",
    "layers": "--adapt-layers",
    "rank": "--rank",
    "scale": "--lora-scale",
    "dropout": "--dropout",
    "epochs": "--epochs",
    "learning_rate": "--lr",
    "head_learning_rate": "--head-lr",
    "schedule": "--schedule",
    "batch_size": "--train-batch-size",
    "seed": "--seed",
    "val_fraction": "--val-fraction",
    "patience": "--patience",
    "max_minutes": "--max-minutes",
    "head_init": "--head-init",
    "keep": "--keep",
    "label_smoothing": "--label-smoothing",
    "contrastive": "--contrastive",
}
# Which epoch's weights a run keeps: "auto" is the recipe (with a validation split its best epoch,
# without one, the default, the mean of the later half's epochs).
KEEPS = ("auto", "average", "best", "last")
# The top blocks adapted by default: on BANKING77 at 10 per intent (benchmarks/finetune.py,
# qwen2.5-coder-0.5b's 24 blocks) 16 gave 0.840, 8 gave 0.806 and all 24 0.827.
DEFAULT_LAYERS = 16


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
    first (`probe`). `keep`: which weights the run keeps ("best": the epoch with the lowest
    validation loss, and `patience` stops early; "average": the mean of the later half's epochs,
    an SWA-style average that beat keeping the best epoch on BANKING77 at 10 per intent, where a
    tenth held out is one example a label; "last"; "auto": best with a validation split, else
    average). The defaults are the measured recipe: no split (every example trains), averaged."""

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
    val_fraction: float = 0.0
    patience: int = 2
    max_minutes: float | None = None
    prefix_grad: bool = False
    head_init: str = "zeros"
    label_smoothing: float = 0.0
    contrastive: float = 0.0
    contrastive_temperature: float = 0.1
    keep: str = "auto"

    @property
    def kept(self) -> str:
        """What `keep` resolves to: "best", "average" or "last"."""
        if self.keep != "auto":
            return self.keep
        return "best" if self.val_fraction else "average"

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
            v = getattr(self, name)
            flag = f"{name}={v!r} ({OPTIONS[name]} {v})" if name in OPTIONS else f"{name}={v!r}"
            return FinetuneError(f"{flag}: {want}")

        if self.objective not in OBJECTIVES:
            raise bad("objective", f"one of {', '.join(OBJECTIVES)}")
        if self.head_init not in HEAD_INITS:
            raise bad("head_init", f"one of {', '.join(HEAD_INITS)}")
        if self.schedule not in SCHEDULES:
            raise bad("schedule", f"one of {', '.join(SCHEDULES)}")
        if self.keep not in KEEPS:
            raise bad("keep", f"one of {', '.join(KEEPS)}")
        if self.keep == "best" and not self.val_fraction:
            raise bad(
                "keep", "the best epoch is chosen on held-out examples: set val_fraction (e.g. 0.1), or keep 'average'"
            )
        if self.layers is None:
            self.for_model(model)  # checks the settings with `layers` resolved
            return
        for name, lo in (
            ("layers", 1),
            ("rank", 1),
            ("epochs", 1),
            ("batch_size", 1),
            ("max_tokens", 1),
            ("patience", 1),
            ("seed", 0),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise bad(name, f"a whole number, at least {lo}")
        if self.layers > n:
            raise bad("layers", f"this model has {n} blocks: adapt at most {n} (the top blocks get adapters)")
        for name, lo, hi in (("scale", 0, None), ("learning_rate", 0, None), ("head_learning_rate", 0, None)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > lo or (hi is not None and v >= hi):
                raise bad(name, "a number above 0")
        for name, hi in (
            ("dropout", 1.0),
            ("warmup", 1.0),
            ("val_fraction", 0.5),
            ("weight_decay", 1.0),
            ("label_smoothing", 1.0),
            ("contrastive", 10.0),
        ):
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


# --------------------------------------------------------------------------- the loop


class _Optimizer:
    """AdamW on the adapters and, for a score head, a second AdamW at its own rate (two plain
    optimizers on two flat dicts: mlx's MultiOptimizer would read the dotted names as paths).
    Each rate is warmed up linearly over `warmup` of the steps, then decayed to 0 by `schedule`."""

    def __init__(self, s: FinetuneSettings, total: int):
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


def _batches(
    lengths: np.ndarray, idx: np.ndarray, s: FinetuneSettings, rng: np.random.Generator, T: int, y: np.ndarray
) -> list[np.ndarray]:
    """One epoch's batches: the texts shuffled, then bucketed by length (so a bucket's members
    change every epoch), and the buckets in a random order. With a contrastive loss, batches of
    pairs of the same label instead (a text needs another of its label in its batch)."""
    if s.contrastive:
        groups = []
        for k in np.unique(y[idx]):
            members = rng.permutation(idx[y[idx] == k])
            groups += [members[i : i + 2] for i in range(0, len(members), 2)]
        order = rng.permutation(len(groups))
        per = max(1, s.batch_size // 2)
        return [np.concatenate([groups[g] for g in order[i : i + per]]) for i in range(0, len(order), per)]
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


def _supcon(h: mx.array, gold: mx.array, temperature: float) -> mx.array:
    """Supervised contrastive loss (Khosla et al. 2020) of a batch's last-position states (B, D):
    each text pulled toward the batch's other texts of its label, away from the rest (rows
    without another of their label count nothing)."""
    z = h.astype(mx.float32)
    z = z / mx.sqrt((z * z).sum(-1, keepdims=True) + 1e-12)
    sim = (z @ z.T) / temperature
    B = sim.shape[0]
    eye = mx.eye(B, dtype=mx.bool_)
    sim = mx.where(eye, mx.array(-1e9, dtype=sim.dtype), sim)
    logp = sim - mx.logsumexp(sim, axis=-1, keepdims=True)
    pos = (gold[:, None] == gold[None, :]) & ~eye
    n = pos.sum(-1)
    per = -(mx.where(pos, logp, 0.0)).sum(-1) / mx.maximum(n, 1)
    has = (n > 0).astype(mx.float32)
    return (per * has).sum() / mx.maximum(has.sum(), 1.0)


def _evaluate(top: Top, enc: Encoded, y: np.ndarray, idx: np.ndarray, s: FinetuneSettings) -> tuple[float, float]:
    """(mean loss, accuracy) of the texts `idx` with the adapters as they are."""
    lengths = np.array([len(o) for o in enc.own])
    total, right = 0.0, 0
    T = top.lt.nodes if top.lt is not None else 0
    for b in batching.plan(lengths[idx], s.batch_size, s.max_tokens, row_extra=T):
        rows = idx[b]
        sc = top.scores(enc, rows)
        loss = cross_entropy(sc, mx.array(y[rows]))
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
        self.sum: dict[str, mx.array] | None = None
        self.summed = 0
        self.added: list[int] = []  # the epochs in the average

    def add(self, params: dict[str, mx.array]) -> None:
        """Add an epoch's weights to the running average (`average`: the later epochs' mean)."""
        self.sum = dict(params) if self.sum is None else {k: self.sum[k] + v for k, v in params.items()}
        self.summed += 1
        mx.eval(self.sum)

    def averaged(self) -> None:
        """Keep the average of the epochs added, if any, as the result."""
        if self.sum is not None:
            self.best = {k: v / self.summed for k, v in self.sum.items()}

    def keep(self, params: dict[str, mx.array], epoch: Epoch, by_loss: bool) -> None:
        """Record the epoch; keep its weights if its validation loss is the best yet (`by_loss`:
        keep "best"), else every epoch's: the last one wins (or, averaged, ends the average)."""
        self.history.append(epoch)
        vl = epoch.val_loss
        if self.best is None or not by_loss or vl is None or vl < self.best_loss:
            self.best, self.best_epoch, self.bad = dict(params), epoch.epoch, 0
            self.best_loss = vl if vl is not None else float("inf")
        else:
            self.bad += 1


@dataclass
class _Loop:
    """What every step of one training run reads: the model's top, the encoded texts and their
    gold, the settings, the optimizer, the clock and where progress goes."""

    top: Top
    enc: Encoded
    y: np.ndarray
    s: FinetuneSettings
    opt: _Optimizer
    step_fn: Callable[..., Any]
    progress: Callable[[Progress], None]
    clock: tuple[float, float, float]  # (the run's start, its deadline, the first step's start)
    total: int

    def report(self, run: _Run, epoch: int, loss: float, last: Epoch | None) -> None:
        """One progress line: the steps so far, this epoch's mean loss, the last epoch's validation."""
        t0, _, train0 = self.clock
        now = time.perf_counter()
        eta = (now - train0) / max(run.step, 1) * (self.total - run.step)
        self.progress(
            Progress(
                "train",
                run.step,
                self.total,
                epoch,
                self.s.epochs,
                loss,
                last and last.val_loss,
                last and last.val_accuracy,
                now - t0,
                eta,
                last and last.epoch,
            )
        )

    def steps(self, run: _Run, params: dict[str, mx.array], epoch: int, batches: list) -> tuple:
        """One epoch's steps on the training part: (params, steps, items seen, loss sum, complete),
        `complete` False when the time limit stopped it part way."""
        steps, seen, loss_sum = 0, 0, 0.0
        self.top.keys.training = True
        for idx in batches:
            loss, grads = self.step_fn(params, mx.array(idx))
            params = self.opt.apply(grads, params)
            mx.eval(params, self.opt.state, loss)
            run.step, steps, seen = run.step + 1, steps + 1, seen + len(idx)
            if not np.isfinite(loss.item()):  # NaN or inf: every later step would be too
                raise diverged(epoch, "training loss", loss.item(), self.s)
            loss_sum += loss.item() * len(idx)
            self.report(run, epoch, loss_sum / seen, run.history[-1] if run.history else None)
            if time.perf_counter() > self.clock[1]:
                self.top.keys.training = False
                return params, steps, seen, loss_sum, False
        self.top.keys.training = False
        return params, steps, seen, loss_sum, True


def _train(
    top: Top,
    enc: Encoded,
    y: np.ndarray,
    split: tuple[np.ndarray, np.ndarray],
    s: FinetuneSettings,
    clock: tuple[float, float],
    progress: Callable[[Progress], None],
) -> _Run:
    """The epochs: steps on the training part, the validation loss after each epoch, early
    stopping, the time limit and Ctrl-C (the best epoch so far is kept; before any epoch, the
    interruption goes on up)."""
    tr, va = split
    t0, deadline = clock
    rng = np.random.default_rng([s.seed, 1])
    lengths = np.array([len(o) for o in enc.own])
    T = top.lt.nodes if top.lt is not None else 0
    total = len(_batches(lengths, tr, s, np.random.default_rng(0), T, y)) * s.epochs
    gold = mx.array(y)

    def loss_fn(params: dict[str, mx.array], idx: mx.array) -> mx.array:
        top.assign(params)
        sc, last = top.scored(enc, np.array(idx))
        loss = cross_entropy(sc, gold[idx], s.label_smoothing)
        if s.contrastive:
            loss = loss + s.contrastive * _supcon(last, gold[idx], s.contrastive_temperature)
        return loss

    opt = _Optimizer(s, total)
    loop = _Loop(top, enc, y, s, opt, mx.value_and_grad(loss_fn), progress, (t0, deadline, time.perf_counter()), total)
    params = dict(top.params)
    run = _Run()
    try:
        for epoch in range(1, s.epochs + 1):
            if run.history and time.perf_counter() > deadline:  # the first epoch takes one step at least
                run.stopped = "max_minutes"
                break
            e0 = time.perf_counter()
            mx.reset_peak_memory()
            params, steps, seen, loss_sum, complete = loop.steps(
                run, params, epoch, _batches(lengths, tr, s, rng, T, y)
            )
            top.assign(params)
            if not _finite(params):  # the last step's update overflowed
                raise diverged(epoch, "adapters' or head's weights", float("nan"), s)
            vl, va_acc = _evaluate(top, enc, y, va, s) if len(va) else (None, None)
            if vl is not None and not np.isfinite(vl):
                raise diverged(epoch, "validation loss", vl, s)
            took, peak = round(time.perf_counter() - e0, 3), round(mx.get_peak_memory() / 1e6, 1)
            ep = Epoch(epoch, steps, complete, loss_sum / max(seen, 1), vl, va_acc, took, peak)
            run.keep(params, ep, s.kept == "best")
            loop.report(run, epoch, loss_sum / max(seen, 1), ep)  # the epoch's own validation figures, as it ends
            if s.kept == "average" and complete and epoch > s.epochs // 2:
                run.add(params)
                run.added.append(epoch)
            if not complete:
                run.stopped = "max_minutes"
                break
            if s.kept == "best" and run.bad >= s.patience:
                run.stopped = "early_stopping"
                break
    except KeyboardInterrupt:
        if run.best is None:
            raise
        run.stopped = "interrupted"
    if s.kept == "average":
        run.averaged()
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


@dataclass(frozen=True)
class Provenance:
    """What the adapters record of where they came from, untouched by training: `base_sha256`,
    the model's weights hash (so the adapters refuse other weights later), and `prompt`, what the
    caller records of the prompt (system, template, examples), kept as is."""

    base_sha256: str | None = None
    prompt: dict[str, Any] | None = None


def finetune(
    model: Model,
    prompts: Sequence[Sequence[int]],
    gold: Sequence[int | str],
    labels: Sequence[str],
    settings: FinetuneSettings | None = None,
    *,
    label_tokens: Sequence[Sequence[int]] | None = None,
    provenance: Provenance = Provenance(),
    progress: Callable[[Progress], None] | None = None,
) -> FineTuned:
    """Fine-tune a classifier on `model` (left unchanged) and return its adapters and head.

    prompts: each example's whole prompt as token ids (rendered and tokenized as classify does:
        `prompts.render` and `prompts.tokenize`); gold: label indices or label strings.
    label_tokens: objective "labels" only: each label's token ids as label scoring tokenizes them
        (`labels.build_labelset(...).token_ids`).
    provenance: the base weights' hash and the prompt, recorded in the adapters as given.
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
    top = Top(model, s, len(labels), lt)

    def tick(done: int) -> None:
        say(Progress("encode", done, len(seqs), 0, s.epochs, None, None, None, time.perf_counter() - t0, None))

    enc = encode(model, seqs, top.start, lt, s, tick)
    if s.objective == "score" and s.head_init != "zeros":
        if s.head_init == "words":
            init = words(top, _label_tokens(label_tokens, labels))
        else:
            init = (probe if s.head_init == "probe" else centroid)(top, enc, y, split, s)
        top.head = top.params["score.weight"] = init
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
        base=base_of(model, provenance.base_sha256),
        settings={
            **asdict(s),
            "keep": s.kept,
            "averaged_epochs": run.added,
            "keys": list(s.keys),
            "train_size": int(len(split[0])),
            "val_size": int(len(split[1])),
        },
        history=run.history,
        best_epoch=run.best_epoch,
        stopped=run.stopped,
        encode_seconds=round(encoded - t0, 3),
        train_seconds=round(time.perf_counter() - encoded, 3),
        prompt=provenance.prompt,
    )
