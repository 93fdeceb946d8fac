"""The service's own failures (`service/errors.py`): each kind carries what a front end needs (the
message, the request field at fault, a retry delay), and knows no status code; an item too slow even
alone is a limit (`TooLarge`), never a timeout a client would retry."""

from __future__ import annotations

import pytest

from mlx_slm.service import errors as E


def test_a_failure_carries_its_message_field_and_retry_delay():
    e = E.QueueFull("the queue is full", field=None, retry_after=2)
    assert (str(e), e.message, e.field, e.retry_after) == ("the queue is full", "the queue is full", None, 2)
    assert E.Invalid("over the context", field="texts[3]").field == "texts[3]"
    assert not hasattr(e, "status")  # the HTTP layer maps kinds to statuses (server.errors.http_error)


@pytest.mark.parametrize("kind", [E.Invalid, E.TooLarge, E.TooSlow, E.NotSupported, E.NotReady, E.Draining,
                                  E.Aborted, E.QueueFull, E.TimedOut, E.ClientGone, E.Failed])  # fmt: skip
def test_every_kind_is_a_service_error(kind):
    assert issubclass(kind, E.ServiceError)


def test_too_slow_is_a_limit_not_a_timeout():
    assert issubclass(E.TooSlow, E.TooLarge) and not issubclass(E.TooSlow, E.TimedOut)
