"""`embed`: every text's vector, in input order (`classifier.Embedder` does the work).

INPUT is read as classify reads it (JSONL, CSV/TSV, text lines, Parquet: `readers.read_rows`); the
output's format is its extension: JSONL (`{"id", "embedding": [...]}` per row, an error row
`{"id", "line", "error"}` as classify writes one; stdout when there is no -o), Parquet (columns
id, embedding (a list of float32), line, error) or `.npy` (one (N, D) float32 array in input
order, a row of NaN for each error, the errors on stderr). Parquet's ids are typed as classify's
(`files.output.id_columns`: `1` and "1" stay apart)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np

from ..classifier.embedder import Embedder, Embeddings
from ..engine.engine import Engine
from ..files.output import check_run_files, files_read, id_columns, require_pyarrow
from ..files.readers import ReadSpec, read_rows
from ..ground.errors import UsageError
from ..ground.safefs import atomic_writer
from ..weights.registry import ModelRef
from .base import Command, notice, number, warn_blas
from .options import some_task_options

OUTPUTS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".npy": "npy"}
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


def output_kind(output: str | None) -> str:
    """jsonl, parquet or npy, by -o's extension (stdout: JSONL)."""
    if output in (None, "-"):
        return "jsonl"
    ext = Path(output).suffix.lower()
    if ext not in OUTPUTS:
        raise UsageError(f"-o {output}: unknown extension {ext or '(none)'!r}; use .jsonl, .parquet or .npy")
    return OUTPUTS[ext]


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
    kind = output_kind(output)
    check_run_files(files_read(o, ("INPUT", input)), [("-o", output)])
    if prompt is not None and prompt_name is not None:
        raise UsageError("give --prompt-name or --prompt, not both")
    read = ReadSpec(o["fmt"], o["text_field"], o["id_field"], o["text_column"], o["id_column"])
    engine = Engine.load(ModelRef.typed(o["model"], o["dtype"], o.get("keep_quantized")))
    emb = Embedder(
        engine,
        truncate=truncate,
        batch_size=o.get("batch_size"),
        max_batch_tokens=o.get("max_batch_tokens") or "auto",
        sort=not o.get("no_sort"),
        use_prefix_cache=not o.get("no_prefix_cache"),
    )
    text = emb.pooling.prompt_text(prompt_name, prompt, "--prompt-name")
    dims = emb.check_dimensions(dimensions)
    norm = (emb.pooling.normalize or dims is not None) if normalize is None else normalize
    rows, got = run(emb, input, read, text, norm, dims, o["window"])
    write(kind, output, rows, got)
    failed = sum(1 for r, e in zip(rows, got.errors) if r.error or e)
    if not o.get("quiet"):
        st = got.stats
        notice(
            f"mlx-slm: {len(rows)} texts ({failed} errors) in {st.seconds:.1f} s, {len(rows) / max(st.seconds, 1e-9):.2f} "
            f"texts/s; {st.processed_tokens:,} tokens processed, padding {st.padding_pct:.1f} %, the prompt's head saved "
            f"{st.prefix_saved_tokens:,} tokens; {emb.pooling.describe()}"
            + (f"; normalized{f', first {dims} values' if dims else ''}" if norm else "")
        )
    if failed:
        notice(f"mlx-slm: {failed} row(s) failed; see their error rows")
        sys.exit(1)


def run(
    emb: Embedder, path: str, read: ReadSpec, prompt: str, normalize: bool, dims: int | None, window: int
) -> tuple[list[Any], Embeddings]:
    """Every row of `path` (`files.readers.read_rows`) and their vectors (a row the reader refused: NaN
    and its error)."""
    rows = list(read_rows(path, read))
    texts = [r.text if r.error is None else None for r in rows]
    got = emb.embed(texts, prompt=prompt, normalize=normalize, dimensions=dims, window=window)
    for i, r in enumerate(rows):
        if r.error is not None:
            got.errors[i] = r.error
    return rows, got


def _error(row: Any, err: str) -> str:
    return err if err.startswith("line ") else f"line {row.line}: {err}"


def write(kind: str, output: str | None, rows: list[Any], got: Embeddings) -> None:
    """The rows in `kind`'s format to `output` (atomically) or stdout."""

    if kind == "jsonl":
        lines = []
        for r, v, e in zip(rows, got.vectors, got.errors):
            rec = {"id": r.id, "line": r.line, "error": _error(r, e)} if e else {"id": r.id, "embedding": v.tolist()}
            lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
        if output in (None, "-"):
            sys.stdout.writelines(lines)
            return
        with atomic_writer(output, "w", "-o", encoding="utf-8") as f:
            f.writelines(lines)
        return
    if kind == "npy":
        with atomic_writer(output, "wb", "-o") as f:  # type: ignore[arg-type]
            np.save(f, got.vectors)
        for r, e in zip(rows, got.errors):
            if e:
                notice(f"mlx-slm: row {r.id!r}: {_error(r, e)}")
        return
    pa = require_pyarrow()
    import pyarrow.parquet as pq  # lazy: pyarrow is optional (the ray extra) and slow to import

    columns = id_columns([r.id for r in rows])  # typed as classify's: `1` and "1" stay apart (`id_is_int`)
    columns += [
        ("embedding", pa.array([None if e else v for v, e in zip(got.vectors, got.errors)], pa.list_(pa.float32()))),
        ("line", pa.array([r.line for r in rows], pa.int64())),
        ("error", pa.array([_error(r, e) if e else None for r, e in zip(rows, got.errors)], pa.string())),
    ]
    table = pa.Table.from_arrays([a for _, a in columns], names=[n for n, _ in columns])
    with atomic_writer(output, "wb", "-o") as f:  # type: ignore[arg-type]
        pq.write_table(table, f)
