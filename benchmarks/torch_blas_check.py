"""Transformers forward time with and without mlx_slm (its OpenBLAS preload) imported first.

python benchmarks/torch_blas_check.py without
python benchmarks/torch_blas_check.py with
MLX_SLM_BLAS=none python benchmarks/torch_blas_check.py with
"""

import os
import sys
import time

if sys.argv[1] == "with":
    # The point of the check: mlx_slm's import loads OpenBLAS into the global symbol scope first.
    import mlx_slm  # noqa: F401
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

m = AutoModelForCausalLM.from_pretrained(
    os.path.expanduser("~/.cache/mlx-slm/models/qwen2.5-coder-0.5b-float16"), dtype=torch.float32
).eval()
torch.set_num_threads(2)
ids = torch.randint(0, 1000, (1, 94))
with torch.inference_mode():
    m(ids, logits_to_keep=1)
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        m(ids, logits_to_keep=1)
        ts.append(time.perf_counter() - t)
print(sys.argv[1], sorted(ts)[2], torch.__config__.parallel_info().split("\n")[:4])
