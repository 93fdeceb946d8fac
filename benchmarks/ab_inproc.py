"""In-process A/B of the default classify path: an older tree (imported as `mlx_slm_before`) against this one.

Both load the same weights into one process and classify the same stratified workload sample in
turn, ABBA, so the machine's drift hits both alike (separate processes, one after the other, varied
-9 % .. +7 % here). Set up the older tree under another package name, then run:

    mkdir -p /tmp/abin && git archive 3e6db0b mlx_slm | tar -x -C /tmp/abin && mv /tmp/abin/mlx_slm /tmp/abin/mlx_slm_before
    PYTHONPATH=.:/tmp/abin python benchmarks/ab_inproc.py 60 4      # 60 tickets, 4 rounds
"""

import sys
import time

from mlx_slm_before.classifier import Classifier as Old
from transformers import AutoTokenizer

from mlx_slm.classifier.classifier import Classifier as New
from mlx_slm.text.prompts import PromptFormat, render, tokenize
from mlx_slm.text.workload import stratified_sample, tickets
from mlx_slm.weights.sources import materialise

n, rounds = int(sys.argv[1]), int(sys.argv[2])
p = materialise("qwen2.5-coder-0.5b")
tok = AutoTokenizer.from_pretrained(str(p))
texts = [t for t, _ in tickets()]
ids = tokenize(tok, [render(tok, PromptFormat(), t) for t in texts])
sub = [texts[i] for i in stratified_sample([len(x) for x in ids], n)]
clfs = {"before": Old.load("qwen2.5-coder-0.5b"), "after": New.load("qwen2.5-coder-0.5b")}
for c in clfs.values():
    c.classify(sub[:2])
times = {"before": [], "after": []}
labels = {}
for r in range(rounds):
    order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
    for name in order:
        t = time.perf_counter()
        preds = clfs[name].classify(sub)
        times[name].append(time.perf_counter() - t)
        labels[name] = [p.label for p in preds]
        print(name, round(times[name][-1], 2), flush=True)
import statistics as st

b, a = st.median(times["before"]), st.median(times["after"])
ratios = [x / y for x, y in zip(times["after"], times["before"])]
print(
    f"n={n} rounds={rounds} median before {b:.2f} s after {a:.2f} s; after/before by median {a / b:.3f}; paired ratios median {st.median(ratios):.3f}; labels equal {labels['before'] == labels['after']}"
)
