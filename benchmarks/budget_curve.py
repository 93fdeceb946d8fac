"""Throughput against the token budget: python benchmarks/budget_curve.py N (N stratified tickets)."""

import sys
import time

from transformers import AutoTokenizer

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.engine.engine import Engine
from mlx_slm.models import load_model
from mlx_slm.text.workload import stratified_sample, tickets
from mlx_slm.weights.sources import materialise

p = materialise("qwen2.5-coder-0.5b")
m = load_model(p)
tok = AutoTokenizer.from_pretrained(str(p))
texts = [t for t, _ in tickets()]
lens = [len(x) for x in tok(texts)["input_ids"]]
sub = [texts[i] for i in stratified_sample(lens, int(sys.argv[1]))]
Classifier(Engine(m, tok)).classify(sub[:4])
for budget in [256, 512, 1024, 2048, 4096, None]:  # the curve in results/budget-curve.md
    c = Classifier(Engine(m, tok), max_batch_tokens=budget, batch_size=64 if budget else 32)
    t = time.perf_counter()
    run = c.run(sub, window=len(sub))
    list(run)
    dt = time.perf_counter() - t
    st = run.stats
    print(
        budget,
        round(dt, 1),
        "s",
        round(len(sub) / dt, 2),
        "items/s",
        st.processed_tokens,
        "tok",
        round(st.padding_pct, 1),
        "% pad",
        st.batches,
        "batches",
        flush=True,
    )
