"""Every numeric option and parameter, checked once, here, before any work.

A number that reaches the code unchecked fails late and far from its cause: `--request-timeout
nan` killed the service's worker (every request then timed out behind a 200 `/health`),
`--max-wait-ms inf` overflowed a thread wait, `batch_size=0` in the estimator fell back to the
default without a word. So each number has one `Range` in `RANGES`, by its parameter name (the
CLI's, which the service options, the task file and the estimator share): its kind (an integer,
or a finite float: NaN and the infinities never pass), its bounds, and the option as a person
types it. `problem` says what is wrong with a value (the caller words it with its own prefix, as
a task file's field); `check` raises a `RangeError` naming the option and the fix. The CLI's
number types (`cli.base.number`), `ServeOptions`, `TaskOptions`, the classifier's batching and
`SLMClassifier.fit` all ask here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import UsageError

INT_MAX = (1 << 31) - 1  # counts and sizes past this are mistakes (and overflow int32 arrays)
DAY_S = 86_400.0  # the longest timeout: past a day a wait is a mistake (threads cap theirs near 292 years)


class RangeError(UsageError, ValueError):
    """A number out of its range (or not a number): exit 2 on the CLI, a ValueError in Python."""


@dataclass(frozen=True)
class Range:
    """One number's rule: `integer` or a finite float within [lo, hi] (an end open when said)."""

    flag: str  # the option as typed ("--batch-size"); the Python name is the key in RANGES
    integer: bool
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    none_ok: bool = False
    hi_open: bool = False  # None means "the default" (e.g. --batch-size not given)
    unit: str = ""  # what the number counts, for the message ("rows per batch")

    def describe(self) -> str:
        """The range as words: "an integer from 1 to 2147483647", "a number above 0 and at most 86400"."""
        kind = "an integer" if self.integer else "a finite number"
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None and not self.lo_open and not self.hi_open:
            return f"{kind} from {_num(lo)} to {_num(hi)}"
        parts = []
        if lo is not None:
            parts.append(f"above {_num(lo)}" if self.lo_open else f"of at least {_num(lo)}")
        if hi is not None:
            parts.append(f"below {_num(hi)}" if self.hi_open else f"at most {_num(hi)}")
        return f"{kind} {' and '.join(parts)}".strip()

    def problem(self, value: Any) -> str | None:
        """Why `value` is not in range ("must be ..., got nan"), or None."""
        if value is None and self.none_ok:
            return None
        ok = not isinstance(value, bool) and isinstance(value, numbers.Real)
        if ok and self.integer:
            ok = isinstance(value, numbers.Integral)
        if ok:
            v = float(value) if not isinstance(value, numbers.Integral) else int(value)
            ok = math.isfinite(v) if isinstance(v, float) else True
            ok = ok and (self.lo is None or (v > self.lo if self.lo_open else v >= self.lo))
            ok = ok and (self.hi is None or (v < self.hi if self.hi_open else v <= self.hi))
        if ok:
            return None
        unit = f" ({self.unit})" if self.unit else ""
        return f"must be {self.describe()}{unit}, got {value!r}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _count(flag: str, lo: int = 1, unit: str = "", none_ok: bool = False, hi: int = INT_MAX) -> Range:
    return Range(flag, True, lo, hi, none_ok=none_ok, unit=unit)


# Keys: the parameter names (the CLI's, `ServeOptions`' and the estimator's where they differ).
RANGES: dict[str, Range] = {
    # how a run batches and reads
    "batch_size": _count("--batch-size", unit="rows per batch", none_ok=True),
    "max_batch_tokens": _count("--max-batch-tokens", unit="padded tokens per batch", none_ok=True),
    "window": _count("--window", unit="items sorted and batched together"),
    "warmup": _count("--warmup", 2, "items the batch/em prior is fitted on"),
    "min_confidence": Range("--min-confidence", False, 0.0, 1.0, none_ok=True, unit="a probability"),
    "none_target": Range(
        "--none-target",
        False,
        0.0,
        1.0,
        lo_open=True,
        hi_open=True,
        unit="the share of in-scope accuracy the threshold may cost on the held-out data",
    ),
    # scale-out
    "workers": _count("--workers", unit="Ray workers"),
    "worker_threads": _count("--worker-threads", unit="CPU threads per worker", none_ok=True, hi=4096),
    # heads (train, the estimator)
    "folds": _count("--folds", 2, "cross-validation folds", hi=1000),
    "layer": _count("--layer", unit="a layer number", none_ok=True, hi=10_000),
    "seed": _count("--seed", 0, "the folds' shuffle", hi=(1 << 32) - 1),
    "random_state": _count("random_state", 0, "the folds' shuffle", none_ok=True, hi=(1 << 32) - 1),
    # parity, rerank
    "n": _count("--n", unit="items", hi=1_000_000),
    "top_n": _count("--top-n", unit="documents kept per query", none_ok=True),
    # embed
    "dimensions": _count("--dimensions", unit="values kept per vector", none_ok=True, hi=1 << 20),
    # the service
    "port": _count("--port", 0, hi=65535),
    "max_batch_items": _count("--max-batch-items", unit="items per micro-batch"),
    "max_wait_ms": Range("--max-wait-ms", False, 0.0, 60_000.0, unit="milliseconds the worker waits for more items"),
    "max_queue_items": _count("--max-queue-items", unit="items waiting"),
    "max_items_per_request": _count("--max-items-per-request", unit="texts per request"),
    "max_body_bytes": _count("--max-body-bytes", unit="bytes per request body"),
    "request_timeout": Range("--request-timeout", False, 0.0, DAY_S, lo_open=True, unit="seconds"),
    "drain_timeout": Range("--drain-timeout", False, 0.0, DAY_S, unit="seconds"),
    "task_cache": _count("--task-cache", unit="tasks kept loaded", hi=1024),
    "state_cache": _count("--state-cache", 0, "recent decision states whose keys and values are kept", hi=1 << 16),
    # a multi-label sequence classifier's answer threshold (--threshold), and a multi question's
    "threshold": Range("--threshold", False, 0.0, 1.0, none_ok=True, unit="a probability"),
    "question_threshold": Range("threshold", False, 0.0, 1.0, unit="a probability"),
    # fine-tuning (train --finetune lora)
    "epochs": _count("--epochs", unit="passes over the data", hi=10_000),
    "learning_rate": Range("--lr", False, 0.0, 1.0, lo_open=True, unit="the adapters' peak learning rate"),
    "head_learning_rate": Range("--head-lr", False, 0.0, 1.0, lo_open=True, unit="the head's peak learning rate"),
    "adapt_layers": _count("--adapt-layers", unit="top blocks with adapters", none_ok=True, hi=10_000),
    "rank": _count("--rank", unit="the LoRA rank", hi=4096),
    "lora_scale": Range("--lora-scale", False, 0.0, 1e6, lo_open=True, unit="the LoRA scale"),
    "dropout": Range("--dropout", False, 0.0, 0.99, unit="a probability"),
    "train_batch_size": _count("--train-batch-size", unit="texts per step", hi=65_536),
    "val_fraction": Range("--val-fraction", False, 0.0, 0.49, unit="each label's share held out"),
    "patience": _count("--patience", unit="epochs without a better validation loss", hi=10_000),
    "label_smoothing": Range("--label-smoothing", False, 0.0, 0.99, unit="a share of the target"),
    "contrastive": Range("--contrastive", False, 0.0, 9.99, unit="the contrastive loss's weight"),
    # a decision question type's temperature (decision.json) or a fitted one (a task's decisions)
    "temperature": Range("temperature", False, 0.0, 1e6, lo_open=True, unit="a temperature"),
    "max_minutes": Range("--max-minutes", False, 0.0, 60 * 24 * 30, lo_open=True, none_ok=True, unit="minutes"),
}
# ServeOptions spells two of them with their unit.
RANGES["request_timeout_s"] = RANGES["request_timeout"]
RANGES["drain_timeout_s"] = RANGES["drain_timeout"]

_FIX = {
    "request_timeout": "e.g. --request-timeout 60",
    "max_wait_ms": "e.g. --max-wait-ms 5 (0: no wait)",
    "drain_timeout": "e.g. --drain-timeout 30",
}


def problem(name: str, value: Any) -> str | None:
    """What is wrong with `value` for the parameter `name` (see `RANGES`), or None."""
    return RANGES[name].problem(value)


def advice(name: str) -> str:
    """ ": e.g. --request-timeout 60" where an example helps, else ""."""
    fix = _FIX.get(name.removesuffix("_s"))
    return f": {fix}" if fix else ""


def check(name: str, value: Any, as_: str | None = None) -> Any:
    """`value` if it is in `name`'s range, else a `RangeError` naming the option (`as_`: how the
    caller's API spells it, e.g. "batch_size=" for the estimator) and the fix."""
    why = problem(name, value)
    if why is None:
        return value
    raise RangeError(f"{as_ or RANGES[name].flag} {why}{advice(name)}")


def check_all(values: Mapping[str, Any], spelling: str = "{flag}") -> None:
    """Check every value of `values` whose name has a range (others are not numbers).
    `spelling` words the name for messages: "{flag}" (the CLI's) or "{name}=" (Python's)."""
    for name, value in values.items():
        if name in RANGES:
            check(name, value, spelling.format(flag=RANGES[name].flag, name=name))


def check_waits(max_wait_ms: float, request_timeout_s: float) -> None:
    """The worker's wait for more items must end well inside a request's timeout: a lone request
    would otherwise time out while the worker waits for company."""
    if max_wait_ms / 1000.0 >= request_timeout_s:
        raise RangeError(
            f"--max-wait-ms {max_wait_ms:g} is not shorter than --request-timeout {request_timeout_s:g} s: a lone "
            "request would time out while the worker waits for more; lower --max-wait-ms (e.g. 5)"
        )
