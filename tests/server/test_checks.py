"""A request over the items limit is a 413 naming the limit that applied (issue 40): the
items-per-request limit, or the queue's (--max-queue-items) where that is lower (a request is
queued whole), or the most documents one rerank query takes; on every route's body check."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")

from mlx_slm.server.checks import check_request  # noqa: E402
from mlx_slm.server.errors import HTTPError  # noqa: E402
from mlx_slm.server.rerank import check_cohere, check_tei_rerank  # noqa: E402
from mlx_slm.server.tei import check_tei  # noqa: E402
from mlx_slm.service import ServeOptions  # noqa: E402

BODIES = [
    (lambda d, o: check_request({"texts": d}, o), "texts"),
    (lambda d, o: check_tei({"inputs": d}, o), "inputs"),
    (lambda d, o: check_tei_rerank({"query": "q", "texts": d}, o), "texts"),
    (lambda d, o: check_cohere({"query": "q", "documents": d}, o), "documents"),
]


@pytest.mark.parametrize("check, field", BODIES, ids=["ours", "tei", "tei-rerank", "cohere"])
@pytest.mark.parametrize(
    "opts, named",
    [
        (dict(max_queue_items=4, max_items_per_request=256), "--max-queue-items"),
        (dict(max_queue_items=1024, max_items_per_request=4), "--max-items-per-request"),
    ],
)
def test_a_413_names_the_limit_that_applied(check, field, opts, named):
    o = ServeOptions(**opts)
    assert o.items_limit == (4, named)
    check(["a"] * 4, o)  # at the limit: fine
    with pytest.raises(HTTPError) as e:
        check(["a"] * 5, o)
    assert e.value.status == 413 and e.value.field == field
    assert "5" in e.value.message and "limit of 4" in e.value.message and named in e.value.message
    other = "--max-items-per-request" if named == "--max-queue-items" else "--max-queue-items"
    assert other not in e.value.message
