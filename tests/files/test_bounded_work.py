"""Every wait bounded: `--shard I/N` planned in time independent of N (and bounded by the
input), an unreachable Ray address refused at once, naming it."""

import socket
import time

import pytest

from mlx_slm.files.sharding import plan_shards, shard_range
from mlx_slm.text.workload import tickets
from tests.hostile import invoke, write_input
from tests.hostile import model_cli as cli
from tests.hostile import refused_cleanly as refused

TEXTS = [t for t, _ in tickets(40)]


def _old_plan_shards(token_counts, window, n):
    """The planner before issue 18 (O(N)): the new one must cut exactly where it did."""
    valid_rows = [r for r, c in enumerate(token_counts) if c is not None]
    starts = valid_rows[::window]
    weights = [
        sum(max(1, token_counts[r] or 0) for r in valid_rows[k * window : (k + 1) * window]) for k in range(len(starts))
    ]
    total, bounds, cum, k = sum(weights), [0], 0.0, 0
    for s in range(1, n):
        while k < len(weights) and (cum + weights[k] / 2) * n < s * total:
            cum += weights[k]
            k += 1
        bounds.append(k)
    bounds.append(len(weights))
    cuts = [0] + [starts[b] if b < len(starts) else len(token_counts) for b in bounds[1:-1]] + [len(token_counts)]
    return [(cuts[s], cuts[s + 1]) for s in range(n)]


def test_shards_are_bounded_by_the_input_and_planned_in_time_independent_of_n(tiny_qwen_mlx, tmp_path):
    import random

    rng = random.Random(18)
    for _ in range(300):
        counts = [None if rng.random() < 0.1 else rng.randint(1, 60) for _ in range(rng.randint(0, 40))]
        window, n = rng.randint(1, 6), rng.randint(1, 12)
        plan = plan_shards(counts, window, n)
        assert plan == _old_plan_shards(counts, window, n)
        assert [shard_range(counts, window, n, i) for i in range(n)] == plan
    counts = [rng.randint(1, 60) for _ in range(5000)]
    t = time.perf_counter()
    for n, i in ((10**7, 0), (10**20, 10**20 - 1), (10**7, 5 * 10**6)):
        shard_range(counts, 16, n, i)
    assert time.perf_counter() - t < 1.0

    inp = write_input(tmp_path / "in.jsonl", 10)
    for spec in ("99999999999999999999/100000000000000000000", "0/10000000", "0/11"):
        t = time.perf_counter()
        r = invoke(["classify", inp, "-o", tmp_path / "o.jsonl", "--shard", spec, *cli(tiny_qwen_mlx)])
        refused(r, "only 10 row(s)", "at most 10 shards")
        assert time.perf_counter() - t < 10
    refused(invoke(["classify", inp, "-o", tmp_path / "o.jsonl", "--shard", "0/1_0"]), "give it as I/N")
    assert not (tmp_path / "o.jsonl").exists()
    assert invoke(["classify", inp, "-o", tmp_path / "o.jsonl", "--shard", "9/10", *cli(tiny_qwen_mlx)]).exit_code == 0


def test_an_unreachable_ray_address_exits_2_at_once_naming_it(tiny_qwen_mlx, tmp_path):
    pytest.importorskip("ray")
    from mlx_slm.ray import _host_port

    assert _host_port("127.0.0.1:6390") == ("127.0.0.1", 6390)
    assert _host_port("ray://head:10001") == ("head", 10001)
    assert _host_port("[::1]:7000") == ("::1", 7000)
    assert _host_port("head") == ("head", 6379)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inp = write_input(tmp_path / "in.jsonl", 4)
    t = time.perf_counter()
    r = invoke(["classify", inp, "-o", tmp_path / "o.jsonl", "--ray-address", f"127.0.0.1:{port}", *cli(tiny_qwen_mlx)])
    refused(r, f"127.0.0.1:{port}", "nothing answers")
    assert time.perf_counter() - t < 30
    assert not (tmp_path / "o.jsonl").exists()
