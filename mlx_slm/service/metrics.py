"""The service's measures: counters and histograms (written out as Prometheus text), and
the compute-time estimate the scheduler's deadlines rest on (`RateTracker`)."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

_BUCKETS = {
    "batch_items": (1, 2, 4, 8, 16, 32, 64, 128),
    "batch_tokens": (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    "seconds": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
}
_COUNTERS = (  # (name, attribute, help)
    ("mlx_slm_batches_total", "batches", "Micro-batches run by the model worker."),
    ("mlx_slm_prefix_cache_hits_total", "prefix_hits", "Items whose prompt starts with the cached prefix."),
    ("mlx_slm_prefix_cache_misses_total", "prefix_misses", "Items run without the prefix cache."),
    ("mlx_slm_prefix_cache_saved_tokens_total", "prefix_saved_tokens", "Prompt tokens the prefix cache saved."),
    ("mlx_slm_processed_tokens_total", "processed_tokens", "Tokens the forward ran (padding included)."),
    ("mlx_slm_padding_tokens_total", "padding_tokens", "Padding tokens among them."),
    ("mlx_slm_decisions_total", "decisions", "Decision requests answered (/v1/systemone, /v1/decisions)."),
    ("mlx_slm_decision_questions_total", "decision_questions", "Questions of the decision requests answered."),
    ("mlx_slm_decision_refusals_total", "decision_refusals", "Decision questions refused (over the context)."),
    (
        "mlx_slm_state_cache_hits_total",
        "state_hits",
        "Decision requests whose state's keys and values came from the state cache.",
    ),
    ("mlx_slm_state_cache_misses_total", "state_misses", "Decision requests whose state ran in full."),
    ("mlx_slm_state_cache_tokens_total", "state_cached_tokens", "State tokens the state cache saved."),
)
_HISTOGRAMS = {  # name: (buckets, help)
    "mlx_slm_batch_items": ("batch_items", "Items per micro-batch."),
    "mlx_slm_batch_tokens": ("batch_tokens", "Padded suffix tokens per micro-batch."),
    "mlx_slm_queue_seconds": ("seconds", "Time an item waited in the queue."),
    "mlx_slm_inference_seconds": ("seconds", "Compute time of the micro-batch an item ran in."),
    "mlx_slm_request_seconds": ("seconds", "End-to-end time of answered requests."),
}


class _Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets, self.counts, self.sum, self.n = tuple(buckets), [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.n += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1


class Metrics:
    """Counters and histograms, thread-safe, written out in Prometheus' text format here: the
    text is a snapshot taken under the one lock, and no client library is needed. It is a
    serialisation, not HTTP, so it lives with the counters (the router only serves it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = {}  # (route, outcome): count
        self.items: dict[str, int] = {}
        self.prefix_hits = self.prefix_misses = self.prefix_saved_tokens = self.batches = 0
        self.processed_tokens = self.padding_tokens = 0
        self.decisions = self.decision_questions = self.decision_refusals = 0
        self.state_hits = self.state_misses = self.state_cached_tokens = 0
        self.hist = {name: _Histogram(_BUCKETS[b]) for name, (b, _) in _HISTOGRAMS.items()}

    def count(self, what: dict[str, int], key: str, n: int = 1) -> None:
        with self.lock:
            what[key] = what.get(key, 0) + n

    def count_request(self, route: str, outcome: str) -> None:
        """One request to a model route (its path) answered with `outcome`."""
        with self.lock:
            self.requests[route, outcome] = self.requests.get((route, outcome), 0) + 1

    def requests_by_outcome(self) -> dict[str, int]:
        """Every route's requests summed per outcome."""
        out: dict[str, int] = {}
        with self.lock:
            for (_, outcome), n in self.requests.items():
                out[outcome] = out.get(outcome, 0) + n
        return out

    def observe(self, name: str, v: float) -> None:
        with self.lock:
            self.hist[name].observe(v)

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        out: list[str] = []
        with self.lock:
            out += [
                "# HELP mlx_slm_requests_total Requests to the model routes (classify, chat completions, embeddings, "
                "rerank, and the same on TEI's and vLLM's paths) by outcome and route (sum by outcome for the total).",
                "# TYPE mlx_slm_requests_total counter",
            ]
            out += [
                f'mlx_slm_requests_total{{outcome="{o}",route="{_label(r)}"}} {v}'
                for (r, o), v in sorted(self.requests.items(), key=lambda kv: (kv[0][1], kv[0][0]))
            ]
            out += [
                "# HELP mlx_slm_items_total Items by outcome (ok: computed; dropped: client gone, timed out or "
                "shut down before compute; late: computed after its request timed out or left; error: the forward "
                "failed).",
                "# TYPE mlx_slm_items_total counter",
            ]
            out += [f'mlx_slm_items_total{{outcome="{k}"}} {v}' for k, v in sorted(self.items.items())]
            for name, attr, help_ in _COUNTERS:
                out += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {getattr(self, attr)}"]
            for name, (help_, v) in gauges.items():
                out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name} {v:g}"]
            for name, h in self.hist.items():
                out += [f"# HELP {name} {_HISTOGRAMS[name][1]}", f"# TYPE {name} histogram"]
                for b, c in zip(h.buckets, h.counts):
                    out.append(f'{name}_bucket{{le="{b:g}"}} {c}')
                out += [f'{name}_bucket{{le="+Inf"}} {h.n}', f"{name}_sum {h.sum:.6f}", f"{name}_count {h.n}"]
        return "\n".join(out) + "\n"

    def record_batch(self, items: Sequence[Any], stats: Any, t0: float, seconds: float) -> None:
        """One micro-batch run: its items (`scheduler.WorkItem`s), the run's token figures and its compute time."""
        with self.lock:
            self.batches += 1
            self.prefix_hits += sum(it.prefix_hit for it in items)
            self.prefix_misses += sum(not it.prefix_hit for it in items)
            self.prefix_saved_tokens += max(0, stats.prefix_saved_tokens)
            self.processed_tokens += stats.processed_tokens
            self.padding_tokens += stats.padding_tokens
            self.hist["mlx_slm_batch_items"].observe(len(items))
            self.hist["mlx_slm_batch_tokens"].observe(len(items) * max(it.cost for it in items))
            self.hist["mlx_slm_inference_seconds"].observe(seconds)
            for it in items:
                self.hist["mlx_slm_queue_seconds"].observe(t0 - it.t_enqueued)
        self.count(self.items, "ok", len(items))

    def decided(self, result: Any) -> Any:
        """One decision request answered (its `DecisionResult`, returned): its questions, those
        refused, and the state tokens that came from the state cache (a hit when any did). A
        `DecisionError` the worker's `Decider` raised for it is raised here, uncounted."""
        if isinstance(result, Exception):
            raise result
        cached = int(result.cached_tokens)
        with self.lock:
            self.decisions += 1
            self.decision_questions += len(result.probabilities)
            self.decision_refusals += sum(p is None for p in result.probabilities)
            self.state_hits += cached > 0
            self.state_misses += cached <= 0
            self.state_cached_tokens += max(0, cached)
        return result


def _label(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# Attention's time per multiply-add against the other products' (the weights' matmuls): its score
# products are small and its softmax passes memory-bound. Measured on the 2-core x86 CPU (the
# fastmath kernel, Qwen2.5-0.5B, 4,096 tokens, instrumented forward): 1.4.
ATTENTION_TIME = 1.4


class RateTracker:
    """A micro-batch's compute time as `fixed + per_token * tokens`, fitted on measured batches.

    A cost per token alone (seconds over tokens) charges a batch's fixed cost (dispatch, the
    label pass, Python) to its tokens: after a few one-word requests it priced a 300-word text
    at 13 s when it took 2 s, and the service refused it (504). Here each size class (tokens
    rounded down to a power of two) keeps a moving average of its (tokens, seconds), so a run
    of small batches refreshes the small end without erasing what longer ones showed, and the
    least-squares line through the classes' averages gives both terms. The warm-up measures a
    short and a longer item, so both ends are known from the start. Not thread-safe: only the
    worker thread writes it.

    Attention grows with the square of a row's length, the rest linearly: a line fitted on the
    warm-up's short items priced an 8,161-token text at under the 60 s timeout, and it took 100 s
    (the request got its 504 after the full minute, and the worker ran 41 s more for nobody). So
    each batch's tokens are weighed by `1 + ATTENTION_TIME * attention * keys`, where `attention`
    is the model's own ratio of attention work per token per position to the rest of a layer's
    work (`attention_share`, from its shape) and `keys` the positions a token attends on average
    (causal: half its own row, all of a cached start): the fit stays a line in those weighted
    tokens, and an item far longer than any measured is priced with its attention.

    The line's slope is the cost of a token in a long row: a short item's tokens cost more each
    (small products, per-layer overheads), so a slope measured on short items alone priced
    jevcompat's 255-option choice (5,642 tokens) at 43 s on SmolLM2-135M when it ran in about
    20 s, and refused it. The warm-up measures a long item too (`core.warm_up`)."""

    ALPHA = 0.3  # weight of a new batch in its size class's moving average

    def __init__(self, attention: float = 0.0) -> None:
        self._by_size: dict[int, tuple[float, float]] = {}  # size class: (mean tokens, mean seconds)
        self.fixed = 0.0  # seconds per micro-batch, whatever its size
        self.per_token = 0.0  # seconds per processed (attention-weighted) token
        self.attention = attention  # extra work per token per position of the row, relative to one token's

    def weighted(self, tokens: int, longest: int | None = None) -> float:
        """A batch's tokens weighed by its attention (`longest`: its longest row, a cached start
        included; None: one row of `tokens`). A token attends the keys before it: on average half
        of a row's own (the causal square's lower half), and all of a cached start (a row of `n`
        new tokens after `c` cached ones: `longest` c + n, keys c + n / 2 each)."""
        row = tokens if longest is None else longest
        keys = row - min(tokens, row) / 2
        return tokens * (1.0 + ATTENTION_TIME * self.attention * keys)

    @property
    def known(self) -> bool:
        """Whether any batch has been measured (before that, no estimate binds)."""
        return bool(self._by_size)

    def observe(self, tokens: int, seconds: float, longest: int | None = None) -> None:
        """Fold one measured micro-batch (processed tokens, compute seconds, its longest row:
        None for one row) into the fit."""
        if tokens <= 0 or seconds <= 0:
            return
        tokens = self.weighted(tokens, longest)  # type: ignore[assignment]
        c, a = int(tokens).bit_length(), self.ALPHA
        old = self._by_size.get(c)
        self._by_size[c] = (
            (float(tokens), seconds)
            if old is None
            else (old[0] + a * (tokens - old[0]), old[1] + a * (seconds - old[1]))
        )
        self.fixed, self.per_token = _fit_line(list(self._by_size.values()))

    def estimate(self, tokens: int, longest: int | None = None) -> float:
        """Seconds a micro-batch of `tokens` processed tokens (its longest row `longest`; None:
        one row) should take (0 before any measure)."""
        return self.fixed + self.per_token * self.weighted(tokens, longest) if self.known else 0.0

    def tokens_within(self, seconds: float) -> int | None:
        """The most tokens a micro-batch may hold to take about `seconds` (at least 1); None
        when the size does not measurably matter (nothing measured, or no per-token cost)."""
        if self.per_token <= 0:
            return None
        w = (seconds - self.fixed) / self.per_token  # weighted tokens; raw ones, as if one row held them all
        c = ATTENTION_TIME * self.attention  # w = t (1 + c t / 2)
        raw = w if c <= 0 else (math.sqrt(1 + 2 * c * max(w, 0.0)) - 1) / c
        return max(1, int(raw))


def attention_share(args: Any) -> float:
    """Attention's work per token per position of the row, relative to the rest of one token's
    work in a layer, from the model's shape: the scores and the weighted values cost
    2 x heads x head_dim multiply-adds per earlier position; the projections and the MLP
    hidden x (q + k + v + o widths) + 3 x hidden x intermediate per token (about 1.2e-4 for
    Qwen2.5-0.5B: an 8k-token prompt costs about twice its tokens at the short-item rate).
    0 when the shape cannot be read (an mlx-lm model of another kind): linear, as before."""
    try:
        h, i = int(args.hidden_size), int(args.intermediate_size)
        heads, kv = int(args.num_attention_heads), int(args.num_key_value_heads or args.num_attention_heads)
        hd = int(getattr(args, "head_dim", None) or h // heads)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return 0.0
    per_token = h * (heads * hd) * 2 + 2 * h * (kv * hd) + 3 * h * i
    return 2.0 * heads * hd / per_token if per_token > 0 else 0.0


def _fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (tokens, seconds) points, both kept
    non-negative: a line that would cost a small batch less than nothing goes through the origin
    instead; points that show no growth with size give a fixed cost only (their mean)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    vxx = sum((x - mx) ** 2 for x, _ in points)
    if vxx > 0:
        slope = sum((x - mx) * (y - my) for x, y in points) / vxx
        if slope <= 0:
            return my, 0.0
        if my - slope * mx >= 0:
            return my - slope * mx, slope
    return 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)
