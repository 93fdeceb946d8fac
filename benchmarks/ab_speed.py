"""Time the default classify path on N stratified workload tickets, for A/B runs across commits.

    # one process per run, each importing the tree named by PYTHONPATH; alternate them:
    git worktree add /tmp/before 3e6db0b
    PYTHONPATH=/tmp/before python benchmarks/ab_speed.py 90
    PYTHONPATH=.           python benchmarks/ab_speed.py 90

Prints which package ran, seconds, items/s and the labels' first letters (equal across trees).
"""

import sys
import time

from transformers import AutoTokenizer

import mlx_slm
from mlx_slm.classifier.classifier import Classifier
from mlx_slm.text.prompts import PromptFormat, render, tokenize
from mlx_slm.text.workload import stratified_sample, tickets
from mlx_slm.weights.sources import materialise

n = int(sys.argv[1])
p = materialise("qwen2.5-coder-0.5b")
tok = AutoTokenizer.from_pretrained(str(p))
texts = [t for t, _ in tickets()]
ids = tokenize(tok, [render(tok, PromptFormat(), t) for t in texts])
sub = [texts[i] for i in stratified_sample([len(x) for x in ids], n)]
clf = Classifier.load("qwen2.5-coder-0.5b")
clf.classify(sub[:2])  # warm-up
t = time.perf_counter()
preds = clf.classify(sub)
dt = time.perf_counter() - t
print(
    f"{mlx_slm.__file__} n={n} {dt:.1f} s {n / dt:.3f} items/s labels={''.join(p.label[0] for p in preds)}", flush=True
)
