"""`export`: a fine-tuned task out as a Transformers sequence-classification checkpoint."""

from __future__ import annotations

import os

import click
import mlx.core as mx

from ..classifier.task import Task
from ..engine.engine import Engine
from ..files.output import check_new_folder
from ..kinds.finetune import FinetuneSpec
from ..models import load_model
from ..weights.adapters import FinetuneError
from ..weights.export import Described
from ..weights.export import export as write
from ..weights.registry import ModelRef
from .base import Command, notice, warn_blas


@click.command(cls=Command)
@click.argument("task_file", metavar="TASK", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="A new (or empty) folder.")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "bfloat16"]),
    default="float32",
    show_default=True,
    help="The written weights' dtype (float32 keeps the merged values exactly).",
)
@click.option("--quiet", "-q", is_flag=True, help="No note on stderr.")
def export(task_file: str, output: str, dtype: str, quiet: bool) -> None:
    """Write a fine-tuned TASK (mlx-slm train --finetune lora) as a Transformers checkpoint.

    \b
      mlx-slm export task.json -o my-classifier/
    The adapters merged into the weights, the score head as `score.weight`: a
    `Qwen2ForSequenceClassification` (or its architecture's) folder with config.json
    (id2label, label2id, problem_type, pad_token_id, the task's prompt under
    `mlx_slm.prompt`), model.safetensors, the tokenizer and a model card.
    `AutoModelForSequenceClassification.from_pretrained` loads it and gives the same
    probabilities on the same prompts; `mlx-slm classify --model my-classifier/` loads it
    back, fed the prompt it was trained with.

    Docs: docs/finetune.md
    """
    warn_blas()
    check_new_folder(output)  # a new or empty folder, as --help says (no input can be in one)
    t = Task.load(task_file)
    spec = t.kind
    if t.decisions and not isinstance(spec, FinetuneSpec):  # its heads read where a decision prompt's answer is
        own = [  # questions answered by a classifier of their own (--finetune lora/auto, --head-prompt question)
            (m.get("key"), os.path.join(os.path.dirname(task_file), m["tuned"]))
            for m in t.decisions.get("methods", [])
            if isinstance(m, dict) and isinstance(m.get("tuned"), str)
        ]
        each = "; ".join(f"question {k!r}: mlx-slm export {f} -o OUT (if it is fine-tuned)" for k, f in own)
        raise click.UsageError(
            f"{task_file} holds typed decision questions (eval --decisions --fit, train --decisions): export writes "
            "one fine-tuned classify task as a sequence classifier, not a task of several questions; serve it with "
            f"mlx-slm serve --task, or check it with mlx-slm parity --decisions Q.json --task {task_file}"
            + (
                f". A question's own classifier is a classify task beside it: {each}; it answers the question's "
                "options by name, without the decision task's 'none of these' threshold"
                if own
                else ""
            )
        )
    if not isinstance(spec, FinetuneSpec):
        raise click.UsageError(f"{task_file} is a {spec.name} task: export writes fine-tuned tasks (train --finetune)")
    engine = Engine.load(ModelRef(t.model))  # the conversion the adapters were trained on
    if engine.path is None:
        raise FinetuneError(f"{t.model} has no converted folder to read its config from")
    model = engine.model
    if model.compute_dtype != mx.float32:  # merged in float32, whatever the device computes in
        model = load_model(engine.path, dtype=mx.float32)
    out = write(
        spec.tuned,
        model,
        engine.tokenizer,
        engine.path,
        output,
        described=Described(
            prompt={"system": t.system, "template": t.template},
            none={"label": t.none["label"], "min_confidence": t.min_confidence} if t.none else None,
            base_name=t.model,
        ),
        dtype=dtype,
        sha256=engine.weights_sha256,
    )
    if not quiet:
        notice(f"mlx-slm: exported to {out} ({len(spec.labels)} labels); load it with --model {out}")
