"""What a front end and the service exchange: the server's options, what the loader gives,
a request's own task, and a request's answer. Plain values, no behaviour beyond the loader."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..classifier.classifier import Classifier
from ..engine.state_cache import STATE_CACHE
from ..ground.errors import UsageError
from ..ground.ranges import check_all, check_waits
from ..ground.textfiles import has_lone_surrogate
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE


@dataclass
class ServeOptions:
    max_batch_items: int = 32  # items gathered into one micro-batch (1: batching off)
    max_batch_tokens: int | None = None  # padded suffix tokens per micro-batch (None: the classifier's budget)
    max_wait_ms: float = 5.0  # how long the worker waits for more items once it has one
    max_queue_items: int = 1024  # items waiting, all requests together; beyond: 429
    max_items_per_request: int = 256  # beyond: 413
    max_body_bytes: int = 1 << 20  # beyond: 413
    request_timeout_s: float = 60.0  # beyond: 504
    drain_timeout_s: float = 30.0  # SIGTERM: time to finish accepted requests
    api_key: str | None = None  # Bearer key for /v1/*; /health and /metrics stay open
    task_cache: int = 8  # per-request tasks kept (classifiers on the one engine)
    state_cache: int = STATE_CACHE  # decisions: recent states whose keys and values are kept (0: none)
    # More names the decision routes (and the model list) answer to; the first is the name answers report.
    served_model_names: tuple[str, ...] = ()

    @property
    def items_limit(self) -> tuple[int, str]:
        """The most items one request may hold, and the option that sets it: --max-items-per-request,
        or --max-queue-items where that is lower (a request is queued whole, so none larger fits)."""
        if self.max_queue_items < self.max_items_per_request:
            return self.max_queue_items, "--max-queue-items"
        return self.max_items_per_request, "--max-items-per-request"

    def __post_init__(self) -> None:
        """Every number in range (`ranges.RANGES`: NaN, the infinities and zeros refused), the
        worker's wait inside the request timeout, the key usable: before anything starts."""

        check_all({k: v for k, v in vars(self).items() if k != "max_batch_tokens" or v is not None})
        check_waits(self.max_wait_ms, self.request_timeout_s)
        if self.api_key is not None:
            self.api_key = check_api_key(self.api_key)
        self.served_model_names = tuple(check_served_name(n) for n in self.served_model_names)


def check_api_key(key: Any) -> str:
    """A Bearer key a client can send: not blank (no client could ever authenticate, or a
    `--api-key "$UNSET"` would serve an open server), no spaces around it (clients' headers lose
    them), no control characters, and UTF-8 text (compared as its UTF-8 bytes)."""

    if not isinstance(key, str) or not key.strip():
        raise UsageError(
            "--api-key is blank: no client could ever authenticate; give a key of visible characters "
            "(or set MLX_SLM_API_KEY), or leave --api-key out to serve without one"
        )
    if key != key.strip():
        raise UsageError("--api-key has spaces around it, which an Authorization header loses: remove them")
    if has_lone_surrogate(key) or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise UsageError("--api-key holds control characters or bytes that are not UTF-8: give a key of visible text")
    return key


def check_served_name(name: Any) -> str:
    """A --served-model-name a client can send: not blank (a request's `model` of "" would be
    this model), no spaces around it (" a " is not the `a` a client types), no control characters,
    and UTF-8 text; refused as `--api-key` is, before anything starts."""

    if not isinstance(name, str) or not name.strip():
        raise UsageError(
            f"--served-model-name {name!r} is blank: no client would ask for it; give a name of visible "
            "characters (or leave the option out to serve under the model's own name)"
        )
    if name != name.strip():
        raise UsageError(
            f"--served-model-name {name!r} has spaces around it, which a client's `model` would not: "
            f"give {name.strip()!r}"
        )
    if has_lone_surrogate(name) or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise UsageError(
            "--served-model-name holds control characters or bytes that are not UTF-8: give a name of visible text"
        )
    return name


@dataclass
class Loaded:
    """What the loader gives the service: the default task's classifier and how to calibrate it."""

    clf: Any  # Classifier
    calibration: Any = "none"  # a CalibrationSpec, or what CalibrationSpec.of takes
    min_confidence: float | None = None
    warmup: int = 512
    model: str = ""
    weights_sha256: str | None = None
    # The served labels' descriptions a request's own labels are checked and prompted with (the
    # Python API's `label_descriptions`); a request's task takes everything else from `clf`.
    label_descriptions: Mapping[str, str] | None = None
    # Decisions: how the routes answer (`classifier.decision_plan.DecisionPlan`: a task's fitted or trained
    # questions by digest, the server's style, orders and prior); None: the raw letters.
    decision_plan: Any = None


def classifier_loader(
    model: str,
    labels: Sequence[str] | None = None,
    system: str | None = None,
    template: str | None = None,
    calibration: Any = "none",
    min_confidence: float | None = None,
    **kwargs: Any,
) -> Callable[[], Loaded]:
    """A loader for `Service` from `Classifier.load` arguments (the Python API and tests)."""

    def load() -> Loaded:

        clf = Classifier.load(
            model,
            labels or DEFAULT_LABELS,
            DEFAULT_SYSTEM if system is None else (system or None),
            template or DEFAULT_TEMPLATE,
            **kwargs,
        )
        return Loaded(
            clf,
            calibration,
            min_confidence,
            model=str(model),
            weights_sha256=_sha(clf),
            label_descriptions=kwargs.get("label_descriptions"),
        )

    return load


def _sha(clf: Any) -> str | None:
    try:
        return clf.engine.weights_sha256
    except OSError:
        return None


@dataclass(frozen=True)
class TaskSpec:
    """A request's own task settings, made once by its route; None: the served task's (its labels,
    prompt, truncation). `rerank`: the reranker's task instead (its truncation only)."""

    labels: list[str] | None = None
    system: str | None = None  # "": no system message
    template: str | None = None
    truncate: str | bool | None = None  # False: no truncation
    min_confidence: float | None = None
    rerank: bool = False  # the model's reranker (`TaskCache.rerank_key`): items are (query, document) pairs
    # A chat completion (`TaskCache.chat_key`): items are `chat.Conversation`s, scored for these
    # choices (as labels), or for their next token when empty.
    chat: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Call:
    """One request as the core sees it beside its items, made once by the route: each item's
    field (`names`, for errors), the field a timeout names (`whole`), when it started
    (`time.perf_counter()`; the request timeout counts from it), how the caller's API asks for
    truncation (`truncate_hint`: it replaces the CLI's `--truncate ...` in messages), and
    `gone()`, whose completion says the caller left (None: not watched)."""

    names: tuple[str, ...]
    whole: str
    started: float
    truncate_hint: str = ""
    gone: Callable[[], Awaitable[Any]] | None = None


@dataclass
class Answer:
    """One request's outcome: calibrated predictions in input order, each item's (prediction,
    queue s, inference s) from the worker, the run's `Calibration`, the task's front classifier."""

    predictions: list[Any]
    raw: list[Any]
    calibration: Any
    classifier: Any
