"""The service's own failures: each kind carries what a front end needs to answer (the
message, the request field at fault, a retry delay). The HTTP layer maps each kind to a
status in one table (`server.errors.http_error`); the core knows no status codes."""

from __future__ import annotations


class ServiceError(Exception):
    """A request the service cannot answer. `field`: the request field at fault (None: the
    request as a whole); `retry_after`: seconds after which trying again may succeed."""

    def __init__(self, message: str, field: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.message, self.field, self.retry_after = message, field, retry_after


class Invalid(ServiceError):
    """The request's task cannot be built, or one of its texts cannot be run (over the context)."""


class TooLarge(ServiceError):
    """The request's work is over a fixed limit, refused before it is queued (the tokens of its
    labels or choices: `tasks.MAX_LABEL_TOKENS`)."""


class TooSlow(TooLarge):
    """An item whose estimated compute time is over the request timeout even with nothing else
    to run: no retry can help, so it is no `TimedOut` (a 504, which clients retry) but the
    request's work over a limit (the server's --request-timeout)."""


class NotSupported(ServiceError):
    """The served model cannot answer the route at all (a rerank on a model that is no reranker)."""


class NotReady(ServiceError):
    """The model is loading, or failed to load."""


class Draining(ServiceError):
    """Shutting down: new requests are refused."""


class Aborted(ServiceError):
    """Accepted, then dropped uncomputed: the drain timed out."""


class QueueFull(ServiceError):
    """The request's items would take the queue past `max_queue_items`."""


class TimedOut(ServiceError):
    """Not answered within the request timeout, or could not be within what it had left."""


class ClientGone(ServiceError):
    """The caller went away while its request waited (its queued items are dropped)."""


class Failed(ServiceError):
    """The forward pass raised: a bug or the machine, never the request."""
