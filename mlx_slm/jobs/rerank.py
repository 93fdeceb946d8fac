"""`mlx-slm rerank`'s work without click: queries and their documents in, each query's
documents best first out.

Two inputs: one query (`--query TEXT`) over a file of documents (read as `classify` reads its
input: JSONL, CSV/TSV, text, Parquet; one document per row), or a JSONL file of queries, one
`{"query": "...", "documents": ["...", ...], "id"?: ...}` per line. Every (query, document)
is one item of a reranker kind (`kinds/rerank.py`), so each query's tokens run once and
documents of several queries share batches. The output, JSONL, is per query best first:
`{"query_id"?, "index", "score", "rank"}` (`document` on request); a bad document row or a bad
query line gives an error row naming its line, after the query's ranked documents.

A file is ranked on the file run (`jobs.filerun`, `RerankJob`): the queries of a window (`--window`
queries that run) are scored together, and each query's rows are its unit, so with -o FILE
`--resume` continues query by query (`files.output.plan_group_resume`) and `--shard I/N` writes a
part of whole windows of queries that `mlx-slm merge` checks query by query (its `grouped_by`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..files.output import OutputLock, is_plain_file_target, output_format
from ..files.readers import ReadSpec, read_rows
from ..ground.errors import OutputError, UsageError, UserError
from ..ground.textfiles import has_lone_surrogate
from ..kinds.rerank import rerank_order
from ..text.predictions import Stats
from . import plan as plans
from .filerun import Distribution, FileRun, Where, windows

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
    """Why a query and its documents cannot be reranked, or None: a query that is not text
    (not a non-empty string, or not valid Unicode), documents that are not a non-empty list of
    such strings, more than `MAX_DOCUMENTS`, a `top_n` out of range."""

    if not isinstance(query, str) or not query.strip():
        return "the query must be a non-empty string"
    if has_lone_surrogate(query):
        return "the query holds an unpaired surrogate escape (not valid Unicode): fix the query"
    if not isinstance(documents, list) or not documents:
        return "documents must be a non-empty list of strings"
    if len(documents) > MAX_DOCUMENTS:
        return f"{len(documents)} documents for one query, over the limit of {MAX_DOCUMENTS}: send them in parts"
    for i, d in enumerate(documents):
        if not isinstance(d, str) or not d.strip():
            return f"documents[{i}] must be a non-empty string"
        if has_lone_surrogate(d):
            return f"documents[{i}] holds an unpaired surrogate escape (not valid Unicode): fix the document"
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        return f"top_n must be a positive integer, got {top_n!r}"
    return None


def read_queries(path: str, id_field: str = "id") -> Iterator[Query]:
    """A JSONL file of queries, read as `classify` reads a JSONL input (`readers.read_rows`, the query
    its text): the same line errors, and the same ids (a string or an integer, unique; none: the
    line's number), a bad or duplicate one making the line an error row whose id is null. A line
    that cannot run is a `Query` with its error."""

    n = 0
    for r in read_rows(path, ReadSpec("jsonl", "query", id_field, gold="documents")):
        n += 1
        if r.error is not None:
            yield Query(None, [], r.id, r.line, r.error)
            continue
        why = query_problem(r.text, r.gold)
        docs = list(r.gold) if isinstance(r.gold, list) else []
        yield Query(r.text, docs, r.id, r.line, f"line {r.line}: {why}" if why else None)
    if not n:
        raise RerankError(
            f'the queries file {path} is empty: give it one query a line, {{"query": "...", "documents": ["...", ...]}}'
        )


def documents_query(query: str, rows: Sequence[Any]) -> Query:
    """`--query TEXT` over a file's rows (`readers.Row`s): one query, a document per row."""
    why = query_problem(query, ["x"])
    if why:
        raise RerankError(f"--query: {why}")
    if not rows:
        raise RerankError("--query: the documents file holds no documents: give it one document a row")
    if len(rows) > MAX_DOCUMENTS:
        raise RerankError(f"{len(rows)} documents, over the limit of {MAX_DOCUMENTS} per query: rerank them in parts")
    return Query(
        query,
        [r.text if r.error is None else None for r in rows],
        line=None,
        doc_lines=[r.line for r in rows],
        doc_errors=[r.error for r in rows],
    )


def check_output(path: str | None) -> None:
    """The rerank output is JSON lines (one object a ranked document or error): a file named for
    another format (.csv, .tsv, .parquet, or an extension we do not know) is refused by name, as
    `classify` refuses one it cannot write; stdout, /dev/null and other streams take it as it is."""

    if path in (None, "-") or not is_plain_file_target(path):
        return
    try:
        fmt = output_format(path)
    except OutputError:
        fmt = None
    if fmt != "jsonl":
        what = f"a {fmt} file name" if fmt else f"the extension {Path(path).suffix or '(none)'!r}"
        raise RerankError(
            f"-o {path}: rerank writes JSON lines, and this is {what}: name the file .jsonl (or - for stdout)"
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
        # A file's query: its id, or its line (null where the id could not be read), as classify's "id".
        qid = {} if q.line is None and q.id is None and len(queries) == 1 else {"query_id": q.id}
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


# --------------------------------------------------------------------------- the file run

DEFAULT_WINDOW = 64  # queries whose documents are sorted and batched together (and where --resume and --shard cut)


@dataclass
class RerankSettings:
    """One rerank run: the input (a queries file, or a documents file with `query`), where the rows
    go, the ranking's options, the file run's, and the plan resolved from the task options."""

    input: str = "-"
    query: str | None = None
    output: str | None = None
    top_n: int | None = None
    return_documents: bool = False
    resume: bool = False
    shard: str | None = None  # "I/N"
    window: int = DEFAULT_WINDOW


def rerank_file(s: RerankSettings, plan: Any, say: Any) -> int:
    """Check the file run's settings, lock the output and run; the number of error rows in the whole output."""
    check_output(s.output)
    file_out = is_plain_file_target(s.output)
    if s.resume and not file_out:
        raise UsageError("--resume needs -o FILE, a regular file (the output to continue)")
    if s.resume and s.input == "-":
        raise UsageError("--resume needs an input file: standard input cannot be read again to check it")
    dist = Distribution(s.shard)
    dist.check(s.input, file_out)
    if dist.shard is not None and s.query is not None:
        raise UsageError("--shard needs a queries file: with --query, one query's documents are ranked together")
    with ExitStack() as stack:
        if file_out:
            stack.enter_context(OutputLock(s.output))  # type: ignore[arg-type]
        where = Where(s.input, s.output if file_out else None, s.output, "jsonl", s.resume)
        return RerankJob(s, plan, say).run(where, dist)


class RerankJob:
    """A rerank run on the file run: its units are queries, each giving its ranked documents' rows
    (`group`: the rows name their query in `query_id`), answered `window` queries at a time."""

    command = "rerank"
    changed_input = (
        ", so its rows are of the old content; start again without --resume (the whole input is reranked "
        "again into {out})"
    )
    loose = ("model",)  # the same weights by another name or path
    all_rows = False
    group = "query_id"

    def __init__(self, s: RerankSettings, plan: Any, say: Any):
        self.s, self.plan, self.say = s, plan, say
        self.stats = Stats()
        self.queries = self.errors = 0

    def run(self, where: Where, dist: Distribution) -> int:
        self.file = f = FileRun(self, where, self.s.window, dist, self.say, self.plan.quiet)
        f.run()
        st = self.stats
        if self.plan.quiet:
            return f.failed
        if f.kept and self.queries == 0:
            self.say(
                f"mlx-slm: {where.output} was complete already: {f.kept} rows ({f.kept_failed} errors) kept, "
                "nothing left to rerank"
            )
            return f.failed
        kept = f"; {f.kept} rows kept from the interrupted run ({f.kept_failed} errors)" if f.kept else ""
        self.say(
            f"mlx-slm: {self.queries} queries, {st.items} documents ({self.errors} errors) in {st.seconds:.1f} s, "
            f"{st.items_per_s:.2f} documents/s; {st.processed_tokens:,} tokens processed, padding "
            f"{st.padding_pct:.1f} %, query heads saved {st.prefix_saved_tokens:,} tokens "
            f"({st.prefix_saved_pct:.1f} % of {st.prompt_tokens:,}); {self.clf.mode}" + kept
        )
        return f.failed

    # ------------------------------------------------------------------ the pieces a FileRun takes
    def rows(self) -> Iterator[Query]:
        """The queries: a queries file's, the first read now (an empty file is refused before the
        model loads), or `--query` over a documents file (every document read now)."""
        s = self.s
        if s.query is not None:  # the documents file: its format and fields as typed, its ids as found
            return iter(
                [documents_query(s.query, list(read_rows(s.input, replace(self.plan.read, id_required=False))))]
            )
        queries = read_queries(s.input, self.plan.read.id_field)
        first = next(queries)
        return itertools.chain([first], queries)

    def unit_of(self, q: Query) -> tuple[Any, bool]:
        """A query's id in its rows, and whether it is one error row alone."""
        return q.id, q.error is not None

    def load(self) -> None:
        self.plan, self.clf = plans.load_fitted(self.plan, self.say)
        self.extra = plans.settings(self.plan, self.clf)

    def sizes(self, rows: list[Query]) -> list[int | None]:
        """Each query's characters with its documents' (None: an error row)."""
        return [None if q.error else len(q.text or "") + sum(len(d or "") for d in q.documents) for q in rows]

    def columns(self) -> list[str]:
        return ["query_id", "index", "score", "rank", "line", "error"]

    def settings(self) -> dict[str, Any]:
        """What the output's manifest records: --resume and merge accept only the same."""
        p, r, clf, s = self.plan, self.plan.read, self.clf, self.s
        assert p.model is not None
        fields = (
            [r.text_field, r.id_field, r.text_column, r.id_column]
            if s.query is not None
            else ["query", r.id_field, None, None]
        )
        return {
            "weights_sha256": clf.engine.weights_sha256,
            "system": p.system or None,
            "template": p.template,
            **self.extra,  # the reranker's settings
            "form": "rerank",
            "grouped_by": self.group,  # several rows an input row: merge checks them query by query
            "query": s.query,
            "top_n": s.top_n,
            "return_documents": s.return_documents,
            "truncate": p.truncate,
            "dtype": clf.engine.compute_dtype,
            **self.file.input_record(),
            "input_format": r.fmt if s.query is not None else "jsonl",
            "fields": fields,
            "output_format": "jsonl",
            "batch_size": clf.batching.batch_size,
            "max_batch_tokens": clf.batching.max_batch_tokens,
            "window": s.window,
            "sort": p.sort,
            "prefix_cache": p.use_prefix_cache,
            "model": p.model.name,
        }

    def restore(self, previous: dict[str, Any], kept: int) -> None:
        """Nothing: a query's ranking depends on its window alone."""

    def records(self, rows: Iterator[Query]) -> Iterator[dict[str, Any]]:
        """Each window's queries ranked (their documents sorted and batched together), in order."""
        for window in windows(rows, self.s.window):
            got, st = rerank(self.clf, window, self.s.top_n, self.s.return_documents)
            for f in fields(Stats):
                setattr(self.stats, f.name, getattr(self.stats, f.name) + getattr(st, f.name))
            self.queries += len(window)
            self.errors += sum("error" in r for r in got)
            yield from got
