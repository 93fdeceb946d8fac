"""`embed`: every text's vector, in input order (`jobs.embed` does the work, `classifier.Embedder`
the embedding)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..jobs.embed import OUTPUTS, EmbedSettings, output_kind  # noqa: F401 (their old home)
from ..jobs.embed import embed as embed_job
from .base import Command, notice, number, warn_blas
from .options import some_task_options

_OPTIONS = {
    "model",
    "fmt",
    "text_field",
    "id_field",
    "text_column",
    "id_column",
    "batch_size",
    "max_batch_tokens",
    "window",
    "no_sort",
    "no_prefix_cache",
    "dtype",
    "keep_quantized",
    "quiet",
}
_SECTIONS = {"prompt_name": "Labels and prompt", "prompt": "Labels and prompt", "dimensions": "Output"}
_SECTIONS |= {"normalize": "Output", "truncate": "Labels and prompt"}


@click.command(cls=Command, sections=_SECTIONS)
@click.argument("input", required=False, default="-")
@click.option("-o", "--output", help="Output file: .jsonl (default: stdout), .parquet or .npy.")
@click.option(
    "--prompt-name", help="The model folder's named prompt before each text (its prompts: mlx-slm doctor --model M)."
)
@click.option("--prompt", help="A prompt of your own before each text (instead of --prompt-name).")
@click.option("--dimensions", type=number("dimensions"), help="Keep the first N values, then normalize (Matryoshka).")
@click.option(
    "--normalize/--no-normalize",
    default=None,
    help="Divide each vector by its L2 norm (default: as the folder says: its Normalize module; on with --dimensions).",
)
@click.option("--truncate", is_flag=True, help="Cut an over-long text at the model's limit (default: error row).")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted run into the same -o FILE.jsonl (same input and settings). Not for .npy or "
    ".parquet: they are written whole at the end of a run.",
)
@click.option(
    "--shard",
    metavar="I/N",
    help="Embed only shard I of N (0-based): a contiguous slice with about 1/N of the tokens, cut where a window "
    "starts. Write each to its own -o part (.jsonl) and join them with `mlx-slm merge`.",
)
@some_task_options(_OPTIONS)
@click.pass_context
def embed(
    ctx: click.Context,
    input: str,
    output: str | None,
    prompt_name: str | None,
    prompt: str | None,
    dimensions: int | None,
    normalize: bool | None,
    truncate: bool,
    resume: bool,
    shard: str | None,
    **o: Any,
) -> None:
    """Embed each text: one vector per row, in input order.

    \b
      mlx-slm embed tickets.jsonl --model Qwen/Qwen3-Embedding-0.6B -o vectors.jsonl
      mlx-slm embed queries.txt --model EMBEDDER --prompt-name query -o q.npy
    Output, JSONL: {"id": 7, "embedding": [0.0123, ...]} per row; an error row
    {"id", "line", "error"} for a text that cannot run (exit 1).

    \b
    The model: a sentence-transformers folder (its modules.json, Pooling config in
    either layout, Normalize, named prompts) on a Qwen2/Qwen3/Llama/Gemma 3 backbone,
    or a causal LM (its last token's final-norm hidden state). A prompt's tokens
    run once for all texts (the prefix cache).

    Docs: docs/embeddings.md
    """

    warn_blas()
    s = EmbedSettings(input, output, prompt_name, prompt, dimensions, normalize, truncate, resume, shard, o)
    failed = embed_job(s, notice)
    if failed:
        notice(f"mlx-slm: {failed} row(s) failed; see their error rows")
        sys.exit(1)
