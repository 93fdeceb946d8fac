"""`mlx-slm rerank`'s work without click: queries and their documents in, each query's
documents best first out.

Two inputs: one query (`--query TEXT`) over a file of documents (read as `classify` reads its
input: JSONL, CSV/TSV, text, Parquet; one document per row), or a JSONL file of queries, one
`{"query": "...", "documents": ["...", ...], "id"?: ...}` per line. Every (query, document)
is one item of a reranker kind (`kinds/rerank.py`), so each query's tokens run once and
documents of several queries share batches. The output, JSONL, is per query best first:
`{"query_id"?, "index", "score", "rank"}` (`document` on request); a bad document row or a bad
query line gives an error row naming its line, after the query's ranked documents.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import UserError
from .kinds.rerank import rerank_order
from .predictions import Stats

MAX_DOCUMENTS = 10_000  # per query: a larger list is refused (ask in parts)


class RerankError(UserError, ValueError):
    pass


@dataclass
class Query:
    """One query and its documents; `line` where it was read; `error` when it cannot run."""

    text: str | None
    documents: list[str | None]
    id: Any = None
    line: int | None = None
    error: str | None = None
    doc_lines: list[int] = field(default_factory=list)  # each document's line (a documents file)
    doc_errors: list[str | None] = field(default_factory=list)


def query_problem(query: Any, documents: Any, top_n: Any = None) -> str | None:
    """Why a query and its documents cannot be reranked (the one check of the CLI and the
    service), or None: a query that is not text, documents that are not a non-empty list of
    strings, more than `MAX_DOCUMENTS`, a `top_n` out of range."""
    if not isinstance(query, str) or not query.strip():
        return "the query must be a non-empty string"
    if not isinstance(documents, list) or not documents:
        return "documents must be a non-empty list of strings"
    if len(documents) > MAX_DOCUMENTS:
        return f"{len(documents)} documents for one query, over the limit of {MAX_DOCUMENTS}: send them in parts"
    for i, d in enumerate(documents):
        if not isinstance(d, str) or not d.strip():
            return f"documents[{i}] must be a non-empty string"
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        return f"top_n must be a positive integer, got {top_n!r}"
    return None


def read_queries(path: str) -> Iterator[Query]:
    """A JSONL file of queries; a line that cannot be read is a `Query` with its error."""
    from .textfiles import InputError, json_error, read_text_file

    try:
        text = read_text_file(path, "queries file")
    except InputError as e:
        raise RerankError(str(e)) from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            yield Query(None, [], line=n, error=f"line {n}: blank line: remove it")
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield Query(None, [], line=n, error=f"line {n}: malformed JSON ({json_error(e)}): fix the line")
            continue
        if not isinstance(obj, dict):
            yield Query(None, [], line=n, error=f'line {n}: expected {{"query": ..., "documents": [...]}}')
            continue
        why = query_problem(obj.get("query"), obj.get("documents"))
        yield Query(
            obj.get("query"), list(obj.get("documents") or []), obj.get("id"), n, f"line {n}: {why}" if why else None
        )


def documents_query(query: str, rows: Sequence[Any]) -> Query:
    """`--query TEXT` over a file's rows (`io.Row`s): one query, a document per row."""
    why = query_problem(query, ["x"])
    if why:
        raise RerankError(f"--query: {why}")
    if len(rows) > MAX_DOCUMENTS:
        raise RerankError(f"{len(rows)} documents, over the limit of {MAX_DOCUMENTS} per query: rerank them in parts")
    return Query(
        query,
        [r.text if r.error is None else None for r in rows],
        line=None,
        doc_lines=[r.line for r in rows],
        doc_errors=[r.error for r in rows],
    )


def rerank(
    clf: Any, queries: Sequence[Query], top_n: int | None = None, return_documents: bool = False
) -> tuple[list[dict[str, Any]], Stats]:
    """Every query's documents scored (one run over all (query, document) items) and ordered
    best first: the output rows, and the run's figures."""
    items, where = [], []
    for qi, q in enumerate(queries):
        if q.error is not None:
            continue
        for di, d in enumerate(q.documents):
            if d is not None:
                items.append((q.text, d))
                where.append((qi, di))
    run = clf.run(items, window=max(1, len(items)))
    scores: dict[tuple[int, int], Any] = {}
    for (qi, di), p in zip(where, run):
        scores[(qi, di)] = p
    out: list[dict[str, Any]] = []
    for qi, q in enumerate(queries):
        qid = (
            {}
            if q.id is None and len(queries) == 1 and q.line is None
            else {"query_id": q.id if q.id is not None else q.line}
        )
        if q.error is not None:
            out.append({**qid, "line": q.line, "error": q.error})
            continue
        ok = [di for di in range(len(q.documents)) if (qi, di) in scores and scores[(qi, di)].ok]
        order = [ok[i] for i in rerank_order([scores[(qi, di)].value for di in ok], top_n)]
        for rank, di in enumerate(order, 1):
            p = scores[(qi, di)]
            row = {**qid, "index": di, "score": round(p.value, 6), "rank": rank}
            if p.truncated:
                row["truncated"] = True
            if return_documents:
                row["document"] = q.documents[di]
            out.append(row)
        for di in range(len(q.documents)):  # documents that could not run: their error rows, in order
            p = scores.get((qi, di))
            why = q.doc_errors[di] if q.doc_errors and q.doc_errors[di] else (p.error if p is not None else None)
            if why is not None:
                line = q.doc_lines[di] if q.doc_lines else None
                out.append({**qid, "index": di, **({"line": line} if line else {}), "error": why})
    return out, run.stats
