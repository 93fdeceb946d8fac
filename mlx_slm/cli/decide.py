"""`decide`: typed decisions (System One's or OpenAI's questions) about every state of a file."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..engine.state_cache import STATE_CACHE
from ..files.output import OUTPUT_FORMATS
from ..files.readers import FORMATS
from ..jobs.decide import DEFAULT_WINDOW, SHAPES, DecideSettings
from ..jobs.decide import decide as decide_job
from ..text.calibration import DEFAULT_WARMUP
from ..text.decisions.methods import PERMUTES, PRIORS
from ..text.decisions.prompt import STYLES
from ..text.decisions.questions import REFUSALS
from ..weights.registry import DEFAULT_MODEL
from .base import Command, given, notice, number, warn_blas
from .options import keep_quantized_option


def method_options(prefix: str = "", batch: bool = True) -> Any:
    """How each question is answered beyond the raw letters, as options (decide's, and serve's
    with the `decision-` prefix): --style, --permute and --calibrate (`batch`: whether the command
    has a run of states to find a batch prior in; a server has not, and refuses it saying how)."""
    names = {"style": f"--{prefix}style", "permute": f"--{prefix}permute", "calibrate": f"--{prefix}calibrate"}
    dest = {k: (prefix.replace("-", "_") + k) for k in names}

    def wrap(f: Any) -> Any:
        f = click.option(
            names["calibrate"],
            dest["calibrate"],
            type=click.Choice(PRIORS),
            default="none",
            show_default=True,
            help="Divide each answer by the model's own bias: "
            + (
                "batch: the mean answer over the first --warmup states; "
                if batch
                else "batch: refused (no run of states to average over: fit the prior with `eval --fit-prior`); "
            )
            + "contextual: the answer to content-free states (several fillers averaged). A task's fitted "
            "questions keep their fit. Raw probabilities stay in x_raw_probabilities.",
        )(f)
        f = click.option(
            names["permute"],
            dest["permute"],
            type=click.Choice([str(p) for p in PERMUTES]),
            default="1",
            show_default=True,
            callback=lambda _c, _p, v: int(v),
            help="2: ask each choice with its options in both orders and average (cancels a preference for the "
            "first option; costs a second branch per choice).",
        )(f)
        return click.option(
            names["style"],
            dest["style"],
            type=click.Choice(STYLES),
            default="letters",
            show_default=True,
            help="letters: Transformers' decision prompt, exact; names: the options listed and read by their own "
            "names, scored whole (often more right on a small model; a noul, or a score whose levels are no distinct "
            "names, is asked as the letters ask it); prompt: that question as the system message and the state as "
            "the user's, classify's prompt shape (each question its own pass over the state; many options cost "
            "little).",
        )(f)

    return wrap


@click.command(
    cls=Command,
    sections={
        "questions_file": "Task and model",
        "shape": "Output",
        "state_field": "Input",
        "state_column": "Input",
        "state_cache": "Batching",
        "style": "Answers",
        "permute": "Answers",
        "calibrate": "Answers",
        "warmup": "Answers",
        "refuse": "Answers",
    },
)
@click.argument("input", required=False, default="-")
@click.option(
    "--questions",
    "questions_file",
    type=click.Path(exists=True, dir_okay=False),
    help="The questions (JSON): a System One questions object, an OpenAI questions list, or a whole request "
    "body of either. Default: the --task's.",
)
@click.option("-o", "--output", help="Output file (.jsonl, .csv, .tsv or .parquet); default JSONL on stdout.")
@click.option(
    "--output-format", type=click.Choice(OUTPUT_FORMATS), help="Output format (default: from the -o extension)."
)
@click.option(
    "--shape",
    type=click.Choice(SHAPES),
    default="systemone",
    show_default=True,
    help="The answers' shape: System One's {key: answer}, or OpenAI's list in question order.",
)
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Model (name, dir, .gguf or hub id).")
@click.option(
    "--task",
    "task_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A task saved by `eval --decisions --fit --save-task` or `train --decisions`: its model, questions "
    "and each fitted or trained question's method (applied to that very question only).",
)
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), help="Compute dtype.")
@keep_quantized_option("where MLX's quantized matmuls are slow; ")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Input format (default: from the extension).")
@click.option("--state-field", help="JSONL/Parquet: the state's field (default: state, else text).")
@click.option("--id-field", default="id", show_default=True, help="JSONL/Parquet: the id's field.")
@click.option("--state-column", help="CSV/TSV: the state's column (default: state, else text).")
@click.option("--id-column", default="id", show_default=True, help="CSV/TSV: the id's column.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run into the same -o file (not .parquet).")
@click.option(
    "--on-error",
    type=click.Choice(["fail", "skip"]),
    default="fail",
    show_default=True,
    help="fail: exit 1 if any row failed (all rows are still written); skip: exit 0.",
)
@click.option(
    "--window",
    default=DEFAULT_WINDOW,
    show_default=True,
    type=number("window"),
    help="States handed to the model at once (and where --resume and --shard may cut).",
)
@click.option(
    "--state-cache",
    default=STATE_CACHE,
    show_default=True,
    type=number("state_cache"),
    help="Recent states whose keys and values are kept for a state asked again within a window (0: off).",
)
@method_options()
@click.option(
    "--warmup",
    default=DEFAULT_WARMUP,
    show_default=True,
    type=number("warmup"),
    help="--calibrate batch: the states the prior is found on (the run's first; recorded for --resume).",
)
@click.option(
    "--refuse",
    type=click.Choice(REFUSALS),
    help="A question over the model's context: refuse it alone (OpenAI's refusal; --shape openai) or its "
    "whole row (an error row). Default: question for --shape openai, else request.",
)
@click.option("--shard", metavar="I/N", help="Answer only shard I of N (0-based); join the parts with `mlx-slm merge`.")
@click.option("--ray", "use_ray", is_flag=True, help="Answer on Ray workers (a local Ray started for this run).")
@click.option("--ray-address", metavar="ADDR", help="Join this Ray cluster instead; implies --ray.")
@click.option("--workers", default=1, show_default=True, type=number("workers"), help="--ray: workers.")
@click.option("--worker-threads", type=number("worker_threads"), help="--ray: CPU threads per worker.")
@click.option("--quiet", "-q", is_flag=True, help="No summary on stderr.")
@click.pass_context
def decide(ctx: click.Context, input: str, on_error: str, use_ray: bool, **o: Any) -> None:
    """Ask typed questions about each state of INPUT (JSONL, CSV, Parquet, or '-' for stdin).

    \b
    Each row's state is its "state" field (a string, a JSON object or an array), else
    its "text". Q.json holds the questions, as System One's /v1/systemone takes them:
      {"urgent": {"type": "noul", "instructions": "Does it need an answer today?"},
       "team": {"type": "choice", "instructions": "Which team handles it?",
                "criteria": {"billing": "Payments, refunds", "technical": null}},
       "anger": {"type": "score", "criteria": ["Calm", "Annoyed", "Furious"]}}
    (or an OpenAI questions list, or a whole request body of either).

    \b
      mlx-slm decide tickets.jsonl --questions Q.json -o answers.jsonl
    One output row per input row, in input order, every question answered in one pass:
      {"id": 1, "answers": {"urgent": {"type": "noul", "noul": 0.91},
        "team": {"type": "choice", "choice": "billing", "confidence": 0.83,
                 "probabilities": {"billing": 0.87, "technical": 0.13}}, "anger": {...}}}
      {"id": 7, "line": 7, "error": "line 7: field 'state' is empty: ..."}
    --shape openai writes OpenAI's answer list instead; CSV/Parquet hold the answers
    as one JSON text column. Answers are the model's own probabilities (Transformers'
    decision path) unless asked otherwise: --calibrate batch|contextual divides out
    the model's bias, --style names|prompt and --permute 2 ask differently, and a --task
    fitted (`eval GOLD --decisions Q.json --fit --save-task T`) or trained (`train
    GOLD --decisions Q.json --save-task T`) answers its own questions its way; such
    answers carry x_method, and x_raw_probabilities where a prior or fit changed
    them. --resume, --shard and --ray work as for classify. Exit status: 0 every
    row answered, 1 some error rows, 2 a usage error.

    Docs: docs/decisions.md
    """
    warn_blas()
    o["given"] = given(ctx, o)
    failed = decide_job(DecideSettings(input=input, ray=use_ray, **o), notice)
    if failed and on_error == "fail":
        notice(f"mlx-slm: {failed} row(s) failed; see their error rows (use --on-error skip to exit 0)")
        sys.exit(1)
