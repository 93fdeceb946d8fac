"""`rerank`: each query's documents, best first (`reranking.py` does the work)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

import click

from ..files.output import check_run_files, files_read
from ..files.readers import read_rows
from ..ground.safefs import atomic_write
from ..jobs import plan as plans
from ..jobs.plan import flag_names
from ..jobs.rerank import check_output, documents_query, read_queries
from ..jobs.rerank import rerank as run_rerank
from .base import Command, given, notice, number, warn_blas
from .options import some_task_options, task_settings

_OPTIONS = {
    "task_file",
    "model",
    "system",
    "template",
    "reranker",
    "instruction",
    "fmt",
    "text_field",
    "id_field",
    "text_column",
    "id_column",
    "batch_size",
    "max_batch_tokens",
    "no_sort",
    "no_prefix_cache",
    "truncate",
    "dtype",
    "keep_quantized",
    "quiet",
}


@click.command(cls=Command)
@click.argument("input", required=False, default="-")
@click.option("--query", help="One query: INPUT is then a file of documents, one per row (as classify reads it).")
@click.option("--top-n", type=number("top_n"), help="Keep only each query's N best documents.")
@click.option("--return-documents", is_flag=True, help="Repeat each document's text in its output row.")
@click.option("-o", "--output", help="Output JSONL file, named .jsonl (default: stdout).")
@some_task_options(_OPTIONS)
@click.pass_context
def rerank(
    ctx: click.Context,
    input: str,
    query: str | None,
    top_n: int | None,
    return_documents: bool,
    output: str | None,
    **o: Any,
) -> None:
    """Score each document's relevance to its query and list them best first.

    \b
      mlx-slm rerank --query "card charged twice" docs.jsonl --model M --top-n 5
      mlx-slm rerank queries.jsonl --model M      # {"query": ..., "documents": [...], "id"?: ...} per line
    Output, JSONL, each query's documents best first:
      {"query_id": 7, "index": 3, "score": 0.94, "rank": 1}
    ("query_id": the query's id, else its line; none with --query). A document or query
    that cannot run gives an error row naming its line, after its query's ranking.

    \b
    The model: a one-label sequence classifier (a cross-encoder, a Qwen3-Reranker
    seq-cls conversion) scores the pair; a causal LM is asked as Qwen3-Reranker asks
    (--reranker qwen3, the default for a model named *Reranker*; --instruction sets its
    instruction) or a yes/no --template holding {query} and {text} (--reranker question).
    Each query's tokens run once: its documents continue from the query's cached KV.

    Docs: docs/rerank.md
    """

    warn_blas()
    check_run_files(files_read(o, ("INPUT", input)), [("-o", output)])
    check_output(output)
    o["reranker"] = o.get("reranker") or "auto"
    settings = task_settings(ctx, o)
    plan = plans.resolve(settings, notice)
    if query is not None:  # the documents file: its format and fields as typed, its ids as found
        queries = [documents_query(query, list(read_rows(input, replace(plan.read, id_required=False))))]
    else:
        if input == "-":
            raise click.UsageError("give a queries file (JSONL), or --query TEXT with a documents file")
        unused = {"fmt", "text_field", "text_column", "id_column"} & given(ctx, o)
        if unused:
            raise click.UsageError(
                f"{flag_names(unused).replace('--fmt', '--format')} read a documents file (with --query); a queries "
                'file is JSONL, "query", "documents" and --id-field on each line: drop it'
            )
        queries = list(read_queries(input, settings.id_field))
    plan, clf = plans.load_fitted(plan, notice)
    rows, stats = run_rerank(clf, queries, top_n, return_documents)
    out = sys.stdout if output in (None, "-") else None
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if out is not None:
        out.write(text)
    else:
        atomic_write(output, text, "-o")
    if not plan.quiet:
        errors = sum(1 for r in rows if "error" in r)
        notice(
            f"mlx-slm: {len(queries)} queries, {stats.items} documents ({errors} errors) in {stats.seconds:.1f} s, "
            f"{stats.items_per_s:.2f} documents/s; {stats.processed_tokens:,} tokens processed, padding "
            f"{stats.padding_pct:.1f} %, query heads saved {stats.prefix_saved_tokens:,} tokens "
            f"({stats.prefix_saved_pct:.1f} % of {stats.prompt_tokens:,}); {clf.mode}"
        )
    if any("error" in r for r in rows):
        sys.exit(1)
