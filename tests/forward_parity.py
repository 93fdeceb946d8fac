"""Helpers the forward-parity tests share: left-padded batches, the max-|diff| check, and
the prefix -> padded batch -> continuation scenario (the classifier's whole cache path)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np
import torch


def padded(seqs: Sequence[Sequence[int]], pad_id: int, cache_len: int = 0) -> tuple[mx.array, mx.array, mx.array]:
    """Left-padded ids (B, L), the real-token mask, and per-row RoPE offsets after `cache_len` cached tokens."""
    L = max(map(len, seqs))
    ids = np.full((len(seqs), L), pad_id, np.int32)
    mask = np.zeros((len(seqs), L), bool)
    for r, s in enumerate(seqs):
        ids[r, L - len(s) :] = s
        mask[r, L - len(s) :] = True
    offs = np.array([cache_len - (L - len(s)) for s in seqs], np.int32)
    return mx.array(ids), mx.array(mask), mx.array(offs)


def check_diff(maxes: dict[str, float], name: str, ours, ref, tol: float) -> None:
    """Assert max |ours - ref| <= tol, and keep the largest difference seen per `name` (printed with -s)."""
    d = float(np.abs(np.asarray(ours, np.float64) - ref).max())
    maxes[name] = max(d, maxes.get(name, 0.0))
    assert d <= tol, f"{name}: max |diff| {d:.2e} > {tol}"


def prefix_batch_continuation(
    model, prompts: Sequence[Sequence[int]], ref: Callable, check: Callable, name_batch: str, name_cont: str
) -> None:
    """A prefix at batch 1, a padded batch after it, then label tokens after that (sequence
    scoring's path, `cache_mask` marking the padding): each checked against `ref(ids, last=...)`."""
    prefix = list(prompts[0][:20])
    suffixes = [list(prompts[3][:30]), list(prompts[1]), [44]]
    _, kv = model(mx.array([prefix]))
    ids, mask, offs = padded(suffixes, 0, cache_len=len(prefix))
    h, kv2 = model(ids, mask, offs, cache=kv)
    got = np.array(model.logits(h))
    for r, s in enumerate(suffixes):
        check(name_batch, got[r], ref(prefix + s))
    B, L = ids.shape
    cache_mask = mx.concatenate([mx.ones((B, len(prefix)), dtype=mx.bool_), mask], axis=1)
    cont = [9, 33, 71]
    h, _ = model(mx.array([cont] * B), None, offs + L, cache=kv2, cache_mask=cache_mask, last_only=False)
    got = np.array(model.logits(h))
    for r, s in enumerate(suffixes):
        check(name_cont, got[r], ref(prefix + s + cont, last=False)[-len(cont) :])


class HFLogits:
    """Transformers' logits for a token sequence (float32, no cache), memoized: the parity
    tests ask for the same sequences many times. `ref(ids)` is the last position's row,
    `ref(ids, last=False)` every position's."""

    def __init__(self, hf) -> None:
        self.hf = hf
        self._memo: dict[tuple, np.ndarray] = {}

    def __call__(self, ids: Sequence[int], last: bool = True) -> np.ndarray:
        key = (tuple(ids), last)
        if key not in self._memo:
            with torch.no_grad():
                out = self.hf(torch.tensor([list(ids)]), use_cache=False).logits[0].numpy()
            self._memo[key] = out[-1] if last else out
        return self._memo[key]

    def clear(self) -> None:
        """Forget the memo (after changing the reference model in place)."""
        self._memo.clear()


ARCHS = ["qwen2", "llama", "qwen3", "gemma3"]
LENGTHS = [45, 7, 23, 60]  # two longer than the window (16) by far, one shorter


class Tiny:
    """One architecture's tiny checkpoint (conftest.TinyModels): its folders, Transformers' float32
    model with its memoized logits (`ref`), our tokenizer and config, and four prompts of LENGTHS."""

    def __init__(self, arch, models):
        import json

        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.arch = arch
        self.hf_dir = models.hf(arch)
        self.mlx_dir = models.mlx(arch)
        self.hf = AutoModelForCausalLM.from_pretrained(str(self.hf_dir), dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(str(self.mlx_dir))
        self.config = json.loads((self.mlx_dir / "config.json").read_text())
        rng = np.random.default_rng(7)
        self.prompts = [rng.integers(3, self.config["vocab_size"], size=n).tolist() for n in LENGTHS]
        self.ref = HFLogits(self.hf)
