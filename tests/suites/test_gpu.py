"""GPU (Metal or CUDA) against the CPU in float32: the tolerance the parity check allows.

Skipped where MLX has no GPU (these Linux CI machines); they run on a Mac or a CUDA box.
On a GPU the default compute dtype is half precision, so labels may differ only where the
float32 margin is inside the tolerance, and logits must stay within it.
"""

import mlx.core as mx
import numpy as np
import pytest

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.parity.labels import TOLERANCE
from mlx_slm.text.workload import tickets


def _gpu() -> bool:
    cuda = getattr(mx, "cuda", None)
    return bool(mx.metal.is_available() or (cuda is not None and cuda.is_available()))


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _gpu(), reason="no Metal or CUDA device for MLX here")]

TEXTS = [t for t, _ in tickets(12)]
LABELS = ["billing", "technical", "account"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_half_precision_within_the_parity_tolerance(tiny_mlx, dtype):
    with mx.stream(mx.cpu):
        ref = Classifier.load(str(tiny_mlx), LABELS, dtype="float32", keep_logits=True).classify(TEXTS)
    with mx.stream(mx.gpu):
        got = Classifier.load(str(tiny_mlx), LABELS, dtype=dtype, keep_logits=True).classify(TEXTS)
    tol = TOLERANCE[dtype]
    worst = max(float(np.abs(a.logits - b.logits).max()) for a, b in zip(ref, got))
    assert worst <= tol, f"{dtype} on the GPU: max |d logit| {worst:.3g} over {tol}"
    for a, b in zip(ref, got):
        if a.label != b.label:  # only a near-tie may flip
            top = sorted(a.scores.values())[-2:]
            assert top[1] - top[0] <= 2 * tol
