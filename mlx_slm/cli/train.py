"""`train`: a learned head on labelled data, saved in a task."""

from __future__ import annotations

from typing import Any

import click

from ..output import check_run_files, files_read
from ..setup import read_labels, run_settings
from .base import Command, given, notice, number, warn_blas
from .options import some_task_options, task_settings

_TRAIN_TASK_OPTIONS = {
    "model", "labels_csv", "labels_file", "system", "template", "examples_file", "fmt", "text_field", "id_field",
    "text_column", "id_column", "batch_size", "max_batch_tokens", "window", "no_prefix_cache",
    "truncate", "dtype", "keep_quantized", "quiet",
}  # fmt: skip


@click.command(cls=Command)
@click.argument("data", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--save-task", required=True, type=click.Path(dir_okay=False), help="Write the task, with its head, here."
)
@click.option(
    "--layers",
    "layers_spec",
    default="auto",
    show_default=True,
    help="Candidate layers: auto (every eighth of the depth from a quarter on, plus the last two together), "
    "all, or numbers like 6,12,24.",
)
@click.option("--layer", type=number("layer"), help="Use this layer (an earlier one is faster), not the CV's choice.")
@click.option(
    "--folds", default=5, show_default=True, type=number("folds"), help="Cross-validation folds (examples per label)."
)
@click.option(
    "--pooling",
    type=click.Choice(["auto", "last", "mean"]),
    default="auto",
    show_default=True,
    help="Hidden state per layer: the last prompt position, the mean over the text's part of the prompt, or "
    "auto (both are candidates; the CV chooses).",
)
@click.option("--seed", default=0, show_default=True, type=number("seed"), help="Seed of the folds' shuffle.")
@click.option(
    "--gold-field",
    "--gold-column",
    "--label-field",
    "gold_fields",
    multiple=True,
    default=("label",),
    show_default=True,
    help="Field (JSONL) or column (CSV) of the gold label. Several (--label-field team --label-field urgent): "
    "one head per field from one pass over the texts, saved as a task of questions named by the fields.",
)
@some_task_options(_TRAIN_TASK_OPTIONS)
@click.pass_context
def train(
    ctx: click.Context,
    data: str,
    save_task: str,
    layers_spec: str,
    layer: int | None,
    folds: int,
    pooling: str,
    seed: int,
    gold_fields: tuple[str, ...],
    **o: Any,
) -> None:
    """Train a learned head on labelled DATA (text and --gold-field) and save it in a task.

    
    One forward pass per text, to the deepest candidate layer; a logistic regression on
    the hidden state (at the last prompt position, or the mean over the text's tokens),
    its layer, pooling and strength chosen by stratified k-fold cross-validation. Prints
    the per-layer table (CV accuracy and macro-F1 against the seconds per item a forward
    stopped there costs) and the choice. Labels: --labels
    or --labels-file, else the data's own. Then classify, eval, serve with --task:
      mlx-slm train labelled.csv --gold-column category --save-task task.json
      mlx-slm classify tickets.jsonl --task task.json -o out.jsonl

    Docs: docs/heads.md
    """
    from ..train import run_train

    warn_blas()
    check_run_files(files_read(o, ("DATA", data)), [("--save-task", save_task)])
    if len(gold_fields) > 1:
        _train_fields(ctx, data, save_task, gold_fields, layers_spec, layer, folds, pooling, seed, o)
        return
    o["gold_field"] = gold_fields[0]
    # Neither --labels nor --labels-file: the data's own labels (not classify's default ones).
    labels_csv = o["labels_csv"] if "labels_csv" in given(ctx, o) else None
    got = read_labels(labels_csv, o["labels_file"], o["system"], None if o["quiet"] else notice)
    keys = ("fmt", "text_field", "id_field", "text_column", "id_column", "gold_field")
    _, table = run_train(
        data,
        save_task,
        model=o["model"],
        labels=got.labels,
        descriptions=got.descriptions,
        system=o["system"] or None,
        template=o["template"],
        examples_file=o["examples_file"],
        read={k: o[k] for k in keys},
        layers=layers_spec,
        layer=layer,
        folds=folds,
        seed=seed,
        poolings=("last", "mean") if pooling == "auto" else (pooling,),
        window=o["window"],
        **run_settings(task_settings(ctx, o)),
        progress=(lambda m: None) if o["quiet"] else (lambda m: notice(f"mlx-slm: {m}")),
    )
    click.echo(table)
    if not o["quiet"]:
        notice(f"mlx-slm: task saved to {save_task}; classify with: mlx-slm classify INPUT --task {save_task}")


def _train_fields(
    ctx: click.Context, data: str, save_task: str, fields: tuple[str, ...], layers_spec: str, layer: int | None,
    folds: int, pooling: str, seed: int, o: dict[str, Any],
) -> None:  # fmt: skip
    """Several gold fields: one head per field, one pass over the texts, a task of questions."""
    from ..train import run_train_fields

    typed = given(ctx, o)
    clash = {"labels_csv", "labels_file", "examples_file"} & typed
    if clash:
        names = {"labels_csv": "--labels", "labels_file": "--labels-file", "examples_file": "--examples"}
        raise click.UsageError(
            f"{names[sorted(clash)[0]]} goes with one --label-field: with several, each head takes its field's own labels"
        )
    keys = ("fmt", "text_field", "id_field", "text_column", "id_column")
    _, table = run_train_fields(
        data, save_task, list(fields), model=o["model"],
        system=(o["system"] or None) if "system" in typed else None,
        template=o["template"] if "template" in typed else None,
        read={k: o[k] for k in keys}, layers=layers_spec, layer=layer, folds=folds, seed=seed,
        poolings=("last", "mean") if pooling == "auto" else (pooling,), window=o["window"],
        **run_settings(task_settings(ctx, o)),
        progress=(lambda m: None) if o["quiet"] else (lambda m: notice(f"mlx-slm: {m}")),
    )  # fmt: skip
    click.echo(table)
    if not o["quiet"]:
        notice(f"mlx-slm: task of {len(fields)} questions saved to {save_task}; classify with: mlx-slm classify "
            f"INPUT --task {save_task} (add zero-shot questions with --questions)")  # fmt: skip
