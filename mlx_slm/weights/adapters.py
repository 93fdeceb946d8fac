"""A fine-tuned classifier: LoRA adapters on a model's top blocks, and a score head or the labels' tokens.

`FineTuned` is plain data (what `finetune.finetune` returns, what `save` writes and `load` reads):
the adapters' weights, named as the model names its projections (`model.layers.21.self_attn.q_proj.
lora_a`, (in, r); `.lora_b`, (r, out)), the objective's part (a score head (K, D), as Transformers'
`*ForSequenceClassification` holds it, or the labels' token ids), the settings and the history.
It runs on a model two ways, and never changes the model it is given (only the modules on the
way to an adapted projection are copied; every weight array is shared):

* `apply(model)`: adapted projections are mlx-lm `LoRALinear` layers, x W^T + scale * (x A) B
  (one base model in memory, several tasks on it);
* `merge(model)`: adapted projections hold W + scale * (A B)^T (mlx-lm's `fuse`; a quantized
  projection is dequantized first and stays dense).

`predict` scores prompts on either: the model's own forward (its ops, the shared prompt head
run once at batch 1 and broadcast, batches bucketed by length and left padded), then the score
head at the last position, or the label tokens as label scoring scores them (`LabelTokens`).
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx.utils import tree_flatten

from ..ground.errors import UserError
from ..ground.safefs import atomic_write
from ..models import Model, Tree, quant
from ..text import batching
from ..text.labels import TrieChunk, build_trie

OBJECTIVES = ("score", "labels")  # (a) a score head at the last position; (b) the labels' own tokens
FORMAT = "mlx-slm-finetuned"
FORMAT_VERSION = 1
LOGIT_ROWS = 256  # positions projected onto the vocabulary at once (256 x 151,936 floats: 156 MB)


class FinetuneError(UserError, ValueError):
    """Data, settings or files that cannot give (or take) a fine-tuned classifier; the message says the fix."""


# --------------------------------------------------------------------------- the labels' tokens (objective b)


@dataclass(frozen=True)
class LabelTokens:
    """How objective (b) scores the labels from hidden states, as label scoring does (`kinds/labels.py`).

    A label's score is its first token's logit at the last prompt position (the label rows only:
    the vocabulary's normalizer is one per row and cancels in the softmax over labels) plus the
    log-probabilities of its later tokens, normalized over the whole vocabulary, read at the
    labels' trie nodes (one chunk: every proper prefix of a label, its ancestors before it).
    """

    token_ids: tuple[tuple[int, ...], ...]

    @cached_property
    def first(self) -> mx.array:
        return mx.array([t[0] for t in self.token_ids], dtype=mx.int32)  # (K,)

    @cached_property
    def trie(self) -> TrieChunk | None:
        chunks = build_trie(self.token_ids, max_nodes=1 << 30)  # one chunk: a training row holds them all
        return chunks[0] if chunks else None

    @property
    def nodes(self) -> int:
        """Trie nodes each prompt runs after its own tokens (0 when every label is one token)."""
        return 0 if self.trie is None else len(self.trie)

    @property
    def max_len(self) -> int:
        return max(len(t) for t in self.token_ids)

    @cached_property
    def _edges(self) -> tuple[mx.array, mx.array, mx.array]:
        """(unique edge tokens (U,), each edge's (node, token) as one flat index into a row's
        (T, U) logits (E,), the paths (E, K): label k sums the edges on its path)."""
        c = self.trie
        assert c is not None
        tokens = np.unique(c.edge_token)
        flat = c.edge_node.astype(np.int64) * len(tokens) + np.searchsorted(tokens, c.edge_token)
        paths = np.zeros((len(c.edge_node), len(self.token_ids)), dtype=np.float32)
        paths[:, c.labels] = c.paths
        return mx.array(tokens.astype(np.int32)), mx.array(flat.astype(np.int32)), mx.array(paths)

    def scores(self, model: Model, last: mx.array, nodes: mx.array | None) -> mx.array:
        """(B, K) float32 label scores from the final-norm hidden states at the last prompt position
        (B, D) and at the trie nodes (B, T, D) (None when every label is one token)."""
        s = model.logits(last, self.first).astype(mx.float32)
        if self.trie is None:
            return s
        assert nodes is not None
        B, T, D = nodes.shape
        flat = nodes.reshape(B * T, D)
        tokens, at, paths = self._edges
        lse = logsumexp_rows(model, flat).reshape(B, T)
        picked = model.logits(flat, tokens).astype(mx.float32).reshape(B, T * tokens.shape[0])
        node = mx.array(self.trie.edge_node)
        lp = mx.take(picked, at, axis=1) - mx.take(lse, node, axis=1)  # (B, E)
        return s + lp @ paths


def logsumexp_rows(model: Model, h: mx.array) -> mx.array:
    """log sum_v exp(logit_v) of each row of h (N, D), LOGIT_ROWS rows at a time (at inference the
    (rows, V) logits of one chunk exist at once). Not under `mx.checkpoint` in training: measured
    on BANKING77 (16 rows x 142 trie nodes, 8 adapted blocks) a step's peak was 8.0 GB either way,
    and recomputing the logits doubled the step's time."""
    return mx.concatenate(
        [
            mx.logsumexp(model.logits(h[i : i + LOGIT_ROWS]).astype(mx.float32), axis=-1)
            for i in range(0, h.shape[0], LOGIT_ROWS)
        ]
    )


def head_scores(head: mx.array, last: mx.array) -> mx.array:
    """(B, K) float32 logits of a score head (K, D) at the last position's hidden states (B, D)."""
    return last.astype(mx.float32) @ head.T


# --------------------------------------------------------------------------- model surgery


LINEAR = (nn.Linear, nn.QuantizedLinear)
ALL_KEYS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def projections(block: nn.Module) -> list[str]:
    """The paths of a block's linear projections (what LoRA may adapt), e.g. `self_attn.q_proj`."""
    return [name for name, m in block.named_modules() if isinstance(m, LINEAR)]


def linear_dims(linear: nn.Module) -> tuple[int, int]:
    """(in, out) of a Linear or QuantizedLinear."""
    out_dims, in_dims = linear.weight.shape
    if isinstance(linear, nn.QuantizedLinear):
        in_dims = in_dims * 32 // linear.bits
    return in_dims, out_dims


def module_at(root: nn.Module, path: str) -> nn.Module:
    node: Any = root
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def swap(block: nn.Module, replace: dict[str, nn.Module]) -> nn.Module:
    """A copy of `block` with the modules at `replace`'s paths replaced. The modules on the way
    are copied (shallow: their arrays shared), so the block given is never changed."""
    new = copy.copy(block)
    copies: dict[str, nn.Module] = {"": new}
    for path, module in replace.items():
        parts = path.split(".")
        node = new
        for d in range(1, len(parts)):
            key = ".".join(parts[:d])
            if key not in copies:
                copies[key] = copy.copy(node[parts[d - 1]])
                node[parts[d - 1]] = copies[key]
            node = copies[key]
        node[parts[-1]] = module
    return new


def with_blocks(model: Model, blocks: dict[int, nn.Module]) -> Model:
    """A new Model sharing everything with `model` but the blocks given (index -> block)."""
    new = copy.copy(model)
    new.model = copy.copy(model.model)
    layers = list(model.model.layers)
    for i, b in blocks.items():
        layers[i] = b
    new.model.layers = layers
    return new


def lora_layer(linear: nn.Module, a: mx.array, b: mx.array, scale: float) -> nn.Module:
    """mlx-lm's LoRALinear over `linear` with the given A (in, r) and B (r, out)."""
    from mlx_lm.tuner.lora import LoRALinear  # lazy: mlx-lm loads only here

    layer = LoRALinear.from_base(linear, r=a.shape[1], dropout=0.0, scale=scale)
    layer.lora_a, layer.lora_b = a, b
    return layer


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class LoraLayout:
    """Where the adapters sit: the adapted blocks (indices) and projections, and the LoRA rank and scale."""

    layers: tuple[int, ...]
    keys: tuple[str, ...]
    rank: int
    scale: float

    def names(self) -> list[str]:
        """Each adapted projection's path in the model, e.g. `model.layers.21.self_attn.q_proj`."""
        return [f"model.layers.{i}.{k}" for i in self.layers for k in self.keys]


@dataclass(frozen=True)
class Epoch:
    """One epoch of training, as the history records it (`complete`: False when time ran out in it)."""

    epoch: int
    steps: int
    complete: bool
    train_loss: float
    val_loss: float | None
    val_accuracy: float | None
    seconds: float
    peak_memory_mb: float


def base_of(model: Model, sha256: str | None = None) -> dict[str, Any]:
    """What adapters record of the model they were trained on (and check at load)."""
    a = model.args
    return {
        "model_type": a.model_type,
        "num_hidden_layers": a.num_hidden_layers,
        "hidden_size": a.hidden_size,
        "vocab_size": a.vocab_size,
        "sha256": sha256,
    }


@dataclass
class FineTuned:
    """A fine-tuned classifier's own weights and record (see the module's docstring)."""

    labels: tuple[str, ...]
    objective: str
    lora: LoraLayout
    adapters: dict[str, mx.array]  # "<projection>.lora_a" (in, r), "<projection>.lora_b" (r, out), float32
    head: mx.array | None  # (K, D) float32: objective "score"
    label_tokens: tuple[tuple[int, ...], ...] | None  # objective "labels": each label's token ids
    base: dict[str, Any]  # `base_of` the model trained on
    settings: dict[str, Any] = field(default_factory=dict)  # the training settings, as given
    history: list[Epoch] = field(default_factory=list)
    best_epoch: int = 0  # 1-based, into history
    stopped: str = "finished"  # finished, early_stopping, max_minutes, interrupted
    encode_seconds: float = 0.0  # the one-time work before the epochs: the frozen blocks' pass (and a probe)
    train_seconds: float = 0.0
    prompt: dict[str, Any] | None = None  # what the caller records of the prompt (system, template, ...)

    @cached_property
    def label_scoring(self) -> LabelTokens | None:
        return LabelTokens(self.label_tokens) if self.label_tokens is not None else None

    # ----------------------------------------------------------------- running it

    def check_model(self, model: Model, sha256: str | None = None, where: str = "these adapters") -> None:
        """Refuse a model other than the one trained on (its shape, and its sha256 when both are known)."""
        if not isinstance(model, Model):
            raise FinetuneError(f"{where} run on one of our architectures, not {type(model).__name__}")
        have = base_of(model, sha256)
        want = self.base
        diff = [k for k in want if k != "sha256" and want[k] != have[k]]
        if not diff and want.get("sha256") and sha256 and want["sha256"] != sha256:
            diff = ["sha256"]
        if diff:
            shown = ", ".join(f"{k} {want[k]!r} (this model: {have[k]!r})" for k in diff)
            raise FinetuneError(
                f"{where} were trained on another model ({shown}): load the model they were trained on, or "
                "fine-tune again on this one"
            )
        for name in self.lora.names():
            a, b = self.adapters[name + ".lora_a"], self.adapters[name + ".lora_b"]
            in_dims, out_dims = linear_dims(module_at(model, name))
            if a.shape != (in_dims, self.lora.rank) or b.shape != (self.lora.rank, out_dims):
                raise FinetuneError(f"{where}: {name}'s adapter shapes do not fit this model's {name}")

    def _blocks(self, model: Model, make: Callable[[nn.Module, mx.array, mx.array], nn.Module]) -> Model:
        blocks = {}
        for i in self.lora.layers:
            replace = {}
            for k in self.lora.keys:
                name = f"model.layers.{i}.{k}"
                replace[k] = make(
                    module_at(model.layers[i], k), self.adapters[name + ".lora_a"], self.adapters[name + ".lora_b"]
                )
            blocks[i] = swap(model.layers[i], replace)
        return with_blocks(model, blocks)

    def apply(self, model: Model, sha256: str | None = None) -> Model:
        """`model` with the adapters as LoRA layers (unfused); `model` itself is unchanged."""
        self.check_model(model, sha256)
        return self._blocks(model, lambda lin, a, b: lora_layer(lin, a, b, self.lora.scale))

    def merge(self, model: Model, sha256: str | None = None) -> Model:
        """`model` with the adapters merged into the adapted projections' weights (fused)."""
        self.check_model(model, sha256)
        merged = self._blocks(model, lambda lin, a, b: lora_layer(lin, a, b, self.lora.scale).fuse(dequantize=True))
        mx.eval([merged.layers[i].parameters() for i in self.lora.layers])  # once, not in every forward
        return merged

    def scores(self, model: Model, last: mx.array, nodes: mx.array | None = None) -> mx.array:
        """(B, K) float32 label logits from final-norm hidden states (see `predict`)."""
        if self.head is not None:
            return head_scores(self.head, last)
        assert self.label_scoring is not None
        return self.label_scoring.scores(model, last, nodes)

    def predict(
        self, model: Model, prompts: Sequence[Sequence[int]], batch_size: int = 16, max_tokens: int = 4096
    ) -> np.ndarray:
        """Log-probabilities (N, K) float64 of the labels for each tokenized prompt, on `model`, the
        model returned by `apply` or `merge`."""
        return predict(self, model, prompts, batch_size, max_tokens)

    # ----------------------------------------------------------------- the file

    def record(self) -> dict[str, Any]:
        """Everything but the arrays, as JSON-ready values."""
        return {
            "labels": list(self.labels),
            "objective": self.objective,
            "lora": asdict(self.lora),
            "label_tokens": None if self.label_tokens is None else [list(t) for t in self.label_tokens],
            "base": self.base,
            "settings": self.settings,
            "history": [asdict(e) for e in self.history],
            "best_epoch": self.best_epoch,
            "stopped": self.stopped,
            "encode_seconds": self.encode_seconds,
            "train_seconds": self.train_seconds,
            "prompt": self.prompt,
        }

    def to_bytes(self) -> bytes:
        arrays = dict(self.adapters)
        if self.head is not None:
            arrays["score.weight"] = self.head
        buf = io.BytesIO()
        meta = {"format": FORMAT, "version": str(FORMAT_VERSION), "finetuned": json.dumps(self.record())}
        mx.save_safetensors(buf, arrays, meta)
        return buf.getvalue()

    def save(self, path: str | Path) -> str:
        """Write one safetensors file (atomically: the old file or the new, never half of one);
        returns its sha256, what a task records to check the file at load."""

        data = self.to_bytes()
        atomic_write(path, data, "the adapters file")
        return hashlib.sha256(data).hexdigest()

    @classmethod
    def load(cls, path: str | Path, sha256: str | None = None) -> FineTuned:
        """Read a file `save` wrote; with `sha256`, refuse a file whose content changed since."""
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise FinetuneError(
                f"cannot read the adapters file {path} ({e.strerror or e}): keep it beside the task that names it "
                "(or give its new path in the task's finetune.adapters), or fine-tune again"
            ) from None
        got = hashlib.sha256(data).hexdigest()
        if sha256 is not None and got != sha256:
            raise FinetuneError(
                f"the adapters file {path} has sha256 {got[:12]}..., not the {sha256[:12]}... recorded: it changed "
                "since it was saved; restore it, or fine-tune again"
            )
        return cls.from_bytes(data, str(path))

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "the adapters") -> FineTuned:
        try:
            arrays, meta = mx.load(io.BytesIO(data), format="safetensors", return_metadata=True)
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}")
            if int(meta.get("version", 0)) > FORMAT_VERSION:
                raise ValueError(f"version {meta.get('version')} is newer than this mlx-slm reads")
            doc = json.loads(meta["finetuned"])
            lora = LoraLayout(
                tuple(doc["lora"]["layers"]),
                tuple(doc["lora"]["keys"]),
                int(doc["lora"]["rank"]),
                float(doc["lora"]["scale"]),
            )
            head = arrays.pop("score.weight", None)
            missing = [n + s for n in lora.names() for s in (".lora_a", ".lora_b") if n + s not in arrays]
            if missing or len(arrays) != 2 * len(lora.names()):
                raise ValueError(f"adapters missing or extra ({missing[:2]})")
            tokens = doc["label_tokens"]
            tuned = cls(
                labels=tuple(doc["labels"]),
                objective=doc["objective"],
                lora=lora,
                adapters=arrays,
                head=head,
                label_tokens=None if tokens is None else tuple(tuple(int(x) for x in t) for t in tokens),
                base=doc["base"],
                settings=doc.get("settings", {}),
                history=[Epoch(**e) for e in doc.get("history", [])],
                best_epoch=int(doc.get("best_epoch", 0)),
                stopped=doc.get("stopped", "finished"),
                encode_seconds=float(doc.get("encode_seconds", 0.0)),
                train_seconds=float(doc.get("train_seconds", 0.0)),
                prompt=doc.get("prompt"),
            )
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise FinetuneError(
                f"{where} is not an mlx-slm adapters file ({e}): give the file `FineTuned.save` wrote"
            ) from None
        tuned.check_finite(where)
        return tuned

    def check_finite(self, where: str = "these adapters") -> None:
        """Refuse adapters or a head holding NaN or infinite values (a diverged fine-tune's): every
        probability they gave would be NaN."""
        arrays = {**self.adapters, **({"score.weight": self.head} if self.head is not None else {})}
        bad = [k for k, v in arrays.items() if not bool(mx.all(mx.isfinite(v)).item())]
        if bad:
            raise FinetuneError(
                f"{where}: non-finite weights (NaN or infinity) in {', '.join(bad[:3])}"
                f"{' ...' if len(bad) > 3 else ''}: they come from a fine-tune that diverged, and every probability "
                "would be NaN; fine-tune again with lower learning rates (--lr, --head-lr) or in float32 (--dtype float32)"
            )


# --------------------------------------------------------------------------- inference


def shared_head(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix every prompt starts with, leaving each at least one token of its own."""
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    i = 0
    while i < n and all(p[i] == first[i] for p in prompts):
        i += 1
    return i


def predict(
    ft: FineTuned, model: Model, prompts: Sequence[Sequence[int]], batch_size: int = 16, max_tokens: int = 4096
) -> np.ndarray:
    """`FineTuned.predict`: inference as the engine runs it (the model's own ops, the shared head's
    KV computed once and broadcast, batches sorted by length and left padded), in input order."""
    if not prompts:
        return np.zeros((0, len(ft.labels)))
    P = shared_head(prompts)
    cache = None
    if P:
        _, cache = model(mx.array([list(prompts[0][:P])], dtype=mx.int32), last_only=True)
        mx.eval(cache)
    own = [list(p[P:]) for p in prompts]
    lt = ft.label_scoring
    T = lt.nodes if lt is not None else 0
    out = np.zeros((len(prompts), len(ft.labels)))
    for idx in batching.plan([len(s) for s in own], batch_size, max_tokens, row_extra=T):
        b = batching.pad(own, idx, 0, P)
        last, kv = model(mx.array(b.ids), mx.array(b.mask), mx.array(b.offsets), cache=cache, last_only=True)
        nodes = None
        if T:
            assert lt is not None and lt.trie is not None
            B, L = b.ids.shape
            end = b.offsets.astype(np.int32) + L
            nodes, _ = model(
                mx.broadcast_to(mx.array(lt.trie.tokens)[None], (B, T)),
                None,
                None,
                cache=kv,
                cache_mask=mx.array(np.concatenate([np.ones((B, P), dtype=bool), b.mask], axis=1)),
                last_only=False,
                tree=Tree(mx.array(end[:, None] + lt.trie.depth[None]), mx.array(lt.trie.visible)),
            )
        s = ft.scores(model, last, nodes)
        s = s - mx.logsumexp(s, axis=-1, keepdims=True)
        out[idx] = np.array(s, dtype=np.float64)
    return out


def adapter_init(key: mx.array, in_dims: int, out_dims: int, rank: int) -> tuple[mx.array, mx.array]:
    """mlx-lm's LoRA initialization, from an explicit key: A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0."""
    bound = 1 / math.sqrt(in_dims)
    return mx.random.uniform(-bound, bound, (in_dims, rank), key=key), mx.zeros((rank, out_dims))


def dense_weights(model: Model) -> dict[str, mx.array]:
    """Every weight of `model` by its (Hugging Face) name, quantized ones dequantized."""

    out: dict[str, mx.array] = {}
    for name, m in model.named_modules():
        if quant.is_quantized(m):
            out[f"{name}.weight"] = quant.dense_weight(m)
            if "bias" in m:
                out[f"{name}.bias"] = m["bias"]
    skip = {n.rsplit(".", 1)[0] for n in out}
    for name, v in tree_flatten(model.parameters()):
        if name.rsplit(".", 1)[0] not in skip:
            out[name] = v
    return out
