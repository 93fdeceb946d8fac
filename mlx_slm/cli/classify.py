"""`classify` (a file-to-file run, `jobs.classify`) and `merge` (the parts of a sharded run)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ..files.output import OUTPUT_FORMATS, check_run_files, read_manifest
from ..files.sharding import merge_parts
from ..jobs.classify import ClassifySettings
from ..jobs.classify import classify as classify_job
from .base import Command, notice, number, warn_blas
from .options import task_options, task_settings


@click.command(cls=Command)
@click.argument("input", required=False, default="-")
@click.option(
    "-o",
    "--output",
    help="Output file (.jsonl, .csv, .tsv or .parquet); default JSONL on stdout. CSV/TSV ids are strings; "
    "JSONL and Parquet keep integer and string ids apart.",
)
@click.option(
    "--output-format", type=click.Choice(OUTPUT_FORMATS), help="Output format (default: from the -o extension)."
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted run into the same -o file (same input and settings). Not for .parquet: "
    "Parquet is written whole at the end of a run; write .jsonl to resume, or shards and `merge -o X.parquet`.",
)
@click.option(
    "--on-error",
    type=click.Choice(["fail", "skip"]),
    default="fail",
    show_default=True,
    help="fail: exit 1 if any row failed (all rows are still written); skip: exit 0.",
)
@click.option(
    "--shard",
    metavar="I/N",
    help="Classify only shard I of N (0-based): a contiguous slice with about 1/N of the tokens, "
    "cut where a window starts. Write each to its own -o part and join them with `mlx-slm merge`.",
)
@click.option("--ray", "use_ray", is_flag=True, help="Classify on Ray workers (a local Ray started for this run).")
@click.option(
    "--ray-address",
    metavar="ADDR",
    help="Join this Ray cluster instead (e.g. auto, or ray://head:10001); implies --ray.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=number("workers"),
    help="--ray: workers, each loading the model once.",
)
@click.option(
    "--worker-threads",
    type=number("worker_threads"),
    help="--ray: CPU threads per worker (default: the cluster's CPUs split evenly between the workers).",
)
@task_options
@click.pass_context
def classify(
    ctx: click.Context,
    input: str,
    output: str | None,
    output_format: str | None,
    resume: bool,
    on_error: str,
    shard: str | None,
    use_ray: bool,
    ray_address: str | None,
    workers: int,
    worker_threads: int | None,
    **o: Any,
) -> None:
    """Classify each item of INPUT (JSONL, CSV, text, or '-' for stdin) into one label.

    \b
    Every input row gives exactly one output row, in input order:
      {"id": 1, "label": "billing", "probs": {"billing": 0.93, ...}}
      {"id": null, "line": 7, "error": "line 7: malformed JSON ..."}
    With --calibrate, "probs" are calibrated and "raw_probs" keep the model's own.
    With --questions Q, each text's questions are answered in one pass:
      {"id": 1, "answers": {"team": {"label": "billing", "probs": {...}}, "urgent": {...}}}

    \b
    With -o FILE the run holds FILE.lock (a second run on the same output stops)
    and records its settings in FILE.mlx-slm.json; --resume continues only an
    output of the same input and settings, and the result equals an
    uninterrupted run's, byte for byte. Exit status: 0 all rows classified,
    1 some rows are error rows (all still written), 2 a usage error, 130 Ctrl-C,
    70 a bug in mlx-slm.

    Docs: docs/classify.md
    """
    warn_blas()
    failed = classify_job(
        ClassifySettings(
            input,
            output,
            output_format,
            resume,
            shard,
            use_ray,
            ray_address,
            workers,
            worker_threads,
            task=task_settings(ctx, o),
        ),
        notice,
    )
    if failed and on_error == "fail":
        notice(f"mlx-slm: {failed} row(s) failed; see their error rows (use --on-error skip to exit 0)")
        sys.exit(1)


@click.command(cls=Command)
@click.argument("parts", nargs=-1, required=True)
@click.option(
    "-o", "--output", required=True, help="The joined output: the parts' format, or .parquet (typed columns)."
)
@click.option(
    "--no-input-check",
    is_flag=True,
    help="Do not re-read the input to check the ids (when it is not on this machine); counts are still checked.",
)
@click.option("--quiet", "-q", is_flag=True, help="No summary on stderr.")
def merge(parts: tuple[str, ...], output: str, no_input_check: bool, quiet: bool) -> None:
    """Join the parts of a `classify --shard I/N` run into one output, in input order.

    \b
      for i in 0 1 2 3; do mlx-slm classify in.jsonl -o part-$i.jsonl --shard $i/4; done
      mlx-slm merge part-*.jsonl -o all.jsonl

    Every part must be complete (finish one with --resume) and of the same input and
    settings; every shard 0..N-1 present once; their row ranges must tile the input and
    each hold its rows. The ids are then checked, in order, against the input (when
    its path, recorded in the parts, can be read here). Nothing is written unless all of
    that holds; the result equals a single run's output.

    Docs: docs/scale-out.md
    """

    if output == "-":
        raise click.UsageError("merge writes a file: give -o a path (the result is checked before it is written)")
    reads: list[tuple[str, str | None]] = [("PARTS", p) for p in parts]
    for p in parts:
        m = read_manifest(p) if Path(p).is_file() else None
        if m and m["settings"].get("input") not in (None, "-"):
            reads.append(("INPUT", m["settings"]["input"]))  # read to check the ids
    check_run_files(reads, [("-o", output)])
    res = merge_parts(list(parts), output, check_input=not no_input_check)
    if not quiet:
        notice(
            f"mlx-slm: merged {res['parts']} parts into {output}: {res['rows']} rows ({res['error_rows']} error rows); "
            + ("ids checked against the input" if res["ids_checked"] else "ids not checked (input not read here)")
        )
