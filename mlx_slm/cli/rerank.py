"""`rerank`: each query's documents, best first (`jobs/rerank.py` does the work)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..files.output import check_run_files, files_read
from ..jobs import plan as plans
from ..jobs.plan import flag_names
from ..jobs.rerank import DEFAULT_WINDOW, RerankSettings, check_output, rerank_file
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
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted run into the same -o file (same input and settings), query by query.",
)
@click.option(
    "--shard",
    metavar="I/N",
    help="Rerank only shard I of N (0-based) of a queries file: a contiguous slice with about 1/N of its text, "
    "cut where a window starts. Write each to its own -o part and join them with `mlx-slm merge`.",
)
@click.option(
    "--window",
    default=DEFAULT_WINDOW,
    show_default=True,
    type=number("window"),
    help="Queries whose documents are sorted and batched together (and where --resume and --shard may cut).",
)
@some_task_options(_OPTIONS)
@click.pass_context
def rerank(
    ctx: click.Context,
    input: str,
    query: str | None,
    top_n: int | None,
    return_documents: bool,
    output: str | None,
    resume: bool,
    shard: str | None,
    window: int,
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
    if query is None:
        if input == "-":
            raise click.UsageError("give a queries file (JSONL), or --query TEXT with a documents file")
        unused = {"fmt", "text_field", "text_column", "id_column"} & given(ctx, o)
        if unused:
            raise click.UsageError(
                f"{flag_names(unused).replace('--fmt', '--format')} read a documents file (with --query); a queries "
                'file is JSONL, "query", "documents" and --id-field on each line: drop it'
            )
    s = RerankSettings(input, query, output, top_n, return_documents, resume, shard, window)
    if rerank_file(s, plan, notice):
        sys.exit(1)
