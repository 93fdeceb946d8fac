"""A/B of the CPU path: numpy SiLU/softmax (fastmath) against MLX native ops, same process.

python benchmarks/cpu_math_ab.py 24     # N length-stratified workload tickets, alternating, twice
"""

import sys
import time

from transformers import AutoTokenizer

import mlx_slm  # noqa: F401  (BLAS before mlx)
from mlx_slm.classifier.classifier import Classifier
from mlx_slm.engine.engine import Engine
from mlx_slm.models import FASTMATH, NATIVE, load_model
from mlx_slm.text.workload import stratified_sample, tickets
from mlx_slm.weights.sources import materialise

p = materialise("qwen2.5-coder-0.5b")
m = load_model(p)
tok = AutoTokenizer.from_pretrained(str(p))
texts = [t for t, _ in tickets()]
lens = [len(x) for x in tok(texts)["input_ids"]]
sub = [texts[i] for i in stratified_sample(lens, int(sys.argv[1]))]
res = {}
for _rep in range(2):
    for fast in (False, True):
        m.ops = FASTMATH if fast else NATIVE  # the CPU-math choice, made here instead of at load
        c = Classifier(Engine(m, tok))
        t = time.perf_counter()
        run = c.run(sub, window=len(sub))
        preds = list(run)
        dt = time.perf_counter() - t
        res.setdefault(fast, []).append(dt)
        print(
            "fast" if fast else "native",
            round(dt, 1),
            "s",
            round(len(sub) / dt, 2),
            "items/s",
            run.stats.processed_tokens,
            [p.label[0] for p in preds][:20],
            flush=True,
        )
