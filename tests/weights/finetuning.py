"""What the fine-tuning tests share (tests/weights/test_finetune.py and the tests of adapted.py,
adapters.py, export.py and head_starts.py): a tiny model with the workload's tickets rendered as
classify renders them, the fast settings, and the training path's probabilities."""

from __future__ import annotations

import numpy as np

from mlx_slm.weights.finetune import FinetuneSettings, Provenance, finetune

LABELS = ("billing", "technical", "account")
FAST = dict(
    layers=2, epochs=4, learning_rate=1e-4, head_learning_rate=1e-2, batch_size=8, val_fraction=0.0, keep="last"
)  # the mechanics; the recipe has its tests


class Data:
    """A tiny model, its tokenizer and the workload's tickets rendered as classify renders them."""

    def __init__(self, path, n: int = 36):
        from transformers import AutoTokenizer

        from mlx_slm.models import load_model
        from mlx_slm.text.labels import build_labelset
        from mlx_slm.text.prompts import PromptFormat, render, tokenize
        from mlx_slm.text.workload import tickets

        self.path = path
        self.model = load_model(path)
        self.tok = AutoTokenizer.from_pretrained(str(path))
        self.fmt = PromptFormat()
        rows = tickets(n)
        self.texts = [t for t, _ in rows]
        self.gold = [g for _, g in rows]
        self.y = np.array([LABELS.index(g) for g in self.gold])
        self.prompts = tokenize(self.tok, [render(self.tok, self.fmt, t) for t in self.texts])
        self.label_tokens = build_labelset(self.tok, LABELS, render(self.tok, self.fmt, "x")).token_ids

    def train(self, **kw):
        extra = {k: kw.pop(k) for k in ("progress",) if k in kw}
        if "base_sha256" in kw:
            extra["provenance"] = Provenance(base_sha256=kw.pop("base_sha256"))
        s = FinetuneSettings(**{**FAST, **kw})
        return finetune(self.model, self.prompts, self.gold, LABELS, s, label_tokens=self.label_tokens, **extra)


def _top_probs(data, s, params=None):
    """The training path's probabilities of every example: the frozen blocks cached, then `adapted.Top`."""
    import mlx.core as mx

    from mlx_slm.weights import adapted as F
    from mlx_slm.weights.adapters import LabelTokens

    lt = LabelTokens(tuple(data.label_tokens)) if s.objective == "labels" else None
    top = F.Top(data.model, s, len(LABELS), lt)
    if params is not None:
        top.assign(params)
    enc = F.encode(data.model, [list(p) for p in data.prompts], top.start, lt, s, lambda _d: None)
    sc = top.scores(enc, np.arange(len(data.prompts)))
    return np.array(mx.softmax(sc, axis=-1)), top, enc
