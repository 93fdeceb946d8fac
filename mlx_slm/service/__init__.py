"""The service core behind `mlx-slm serve`: it knows no HTTP (the router is the `server` package).

    api.py        what a front end and the core exchange (ServeOptions, Loaded, TaskSpec, Call, Answer)
    errors.py     the core's failures (ServiceError and its kinds), each with its field and retry delay
    keys.py       the task cache's keys: a frozen value per kind of task, which builds its own task
    tasks.py      the task cache: classifiers per task (front and back), their checks, calibration
    scheduler.py  the bounded queue, admission, micro-batching worker, deadlines, drain
    decide.py     decision requests as queue items: a `Decider` prepares (front) and runs (worker) them
    metrics.py    counters and histograms (Prometheus text), the compute-time estimate
    core.py       `Service`: the facade (lifecycle, one request's path)

Imports run one way: core -> scheduler -> tasks, metrics -> keys, api, errors; nothing here
imports the server. Every name below is what front ends, tests and benchmarks import.

May import: ground, text, models, weights, engine, kinds, classifier.
"""

from __future__ import annotations

from .api import Answer, Call, Loaded, ServeOptions, TaskSpec, classifier_loader
from .core import Service
from .errors import (
    Aborted,
    ClientGone,
    Draining,
    Failed,
    Invalid,
    NotReady,
    NotSupported,
    QueueFull,
    ServiceError,
    TimedOut,
    TooLarge,
    TooSlow,
)
from .metrics import Metrics, RateTracker
from .scheduler import BATCH_TIME_FRACTION, LOOKAHEAD
from .tasks import LRU, MAX_LABEL_TOKENS, TaskCache

__all__ = [
    "BATCH_TIME_FRACTION",
    "LOOKAHEAD",
    "LRU",
    "MAX_LABEL_TOKENS",
    "Aborted",
    "Answer",
    "Call",
    "ClientGone",
    "Draining",
    "Failed",
    "Invalid",
    "Loaded",
    "Metrics",
    "NotReady",
    "NotSupported",
    "QueueFull",
    "RateTracker",
    "ServeOptions",
    "Service",
    "ServiceError",
    "TaskCache",
    "TaskSpec",
    "TimedOut",
    "TooLarge",
    "TooSlow",
    "classifier_loader",
]
