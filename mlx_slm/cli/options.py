"""The options classify, eval, train and serve share (what defines a task and how to run
it), and the `TaskOptions` they make."""

from __future__ import annotations

from typing import Any

import click

from ..jobs.plan import TaskOptions
from ..text.calibration import DEFAULT_WARMUP
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from ..weights.registry import DEFAULT_MODEL
from .base import ESCAPES_HELP, escapes, given, number


def keep_quantized_option(why: str = "") -> Any:
    """--keep-quantized/--dequantize: how an MLX-quantized model's weights load (None: not typed),
    `ModelRef`'s one choice as every command types it; `why` the CPU default's reason, if said."""
    return click.option(
        "--keep-quantized/--dequantize",
        "keep_quantized",
        default=None,
        help="An MLX-quantized model: keep its weights packed, or dequantize them at load "
        f"(default: dequantize on the CPU, {why}keep on a GPU).",
    )


_TASK_OPTIONS = [
    click.option(
        "--task",
        "task_file",
        type=click.Path(exists=True, dir_okay=False),
        help="A saved task (model, labels, prompt, examples, calibration). Options given here override "
        "it; changing what its prior was fitted for (model, labels, prompt, examples, scoring) "
        "needs a new --calibrate. A decision task (saved by eval --decisions --fit or train --decisions) "
        "is read by eval --decisions, decide and serve.",
    ),
    click.option(
        "--model",
        "-m",
        default=DEFAULT_MODEL,
        show_default=True,
        help="Built-in name, converted dir, Hugging Face dir, .gguf file or hub id.",
    ),
    click.option(
        "--labels",
        "-l",
        "labels_csv",
        default=",".join(DEFAULT_LABELS),
        show_default=True,
        help="Comma-separated labels.",
    ),
    click.option(
        "--labels-file",
        type=click.Path(exists=True, dir_okay=False),
        help='One label a line, optionally \'label<TAB>description\', or JSONL {"label", "description"} '
        "(overrides --labels). Descriptions go where --system says {label_descriptions}.",
    ),
    click.option(
        "--questions",
        "questions_file",
        type=click.Path(exists=True, dir_okay=False),
        help="Several questions per text, answered in one pass (JSONL, one question a line, or a JSON list): "
        '{"name": "team", "question": "Which team?", "labels": [...]}; kind choice (labels, descriptions, none), '
        "yesno (answers), scale (levels) or multi ({label} in the question). Output rows: "
        '{"id", "answers": {name: answer}}. Replaces --labels; --template may hold {question} after {text}; '
        "with a --task of questions, more questions.",
    ),
    click.option(
        "--system",
        default=DEFAULT_SYSTEM,
        show_default=True,
        callback=escapes,
        help="System message ('' for none). {labels} becomes the labels, comma-separated; {label_descriptions} "
        "one line a label, '- label: description'. " + ESCAPES_HELP,
    ),
    click.option(
        "--template",
        default=DEFAULT_TEMPLATE,
        show_default=True,
        callback=escapes,
        help="User message; {text} is replaced by the item. " + ESCAPES_HELP,
    ),
    click.option(
        "--examples",
        "examples_file",
        type=click.Path(exists=True, dir_okay=False),
        help="Few-shot examples (JSONL: text, label), put before every item inside the cached prefix.",
    ),
    click.option(
        "--calibrate",
        type=click.Choice(["none", "batch", "fit", "em"]),
        default="none",
        show_default=True,
        help="none: the model's raw scores. batch: divide by the input's mean label probability "
        "(assumes roughly balanced labels). fit: per-label offsets fitted on --calibration-data. "
        "em: fit, then re-estimate the input's own label mix (Saerens EM).",
    ),
    click.option(
        "--calibration-data",
        type=click.Path(exists=True, dir_okay=False),
        help="Labelled JSONL/CSV (text and --gold-field) for --calibrate fit|em.",
    ),
    click.option(
        "--warmup",
        default=DEFAULT_WARMUP,
        show_default=True,
        type=number("warmup"),
        help="batch/em: the prior comes from the first N items (held back until it is known).",
    ),
    click.option(
        "--min-confidence",
        type=number("min_confidence"),
        help="Abstain (label null, abstained true) under this probability: route those to a person.",
    ),
    click.option(
        "--reranker",
        type=click.Choice(["auto", "seqcls", "qwen3", "question"]),
        help="Score (text, text_pair) as (query, document) relevance: seqcls (a one-label sequence classifier), "
        "qwen3 (a causal LM asked as Qwen3-Reranker asks), question (a yes/no --template with {query} and "
        "{text}); auto: seqcls for such a model, qwen3 for one named *Reranker*.",
    ),
    click.option(
        "--instruction",
        help="--reranker qwen3: the <Instruct> line (default: the model card's web-search instruction).",
    ),
    click.option(
        "--threshold",
        type=number("threshold"),
        help="A multi-label sequence classifier: its answer is the labels at or above this probability [0.5].",
    ),
    click.option(
        "--save-task", type=click.Path(dir_okay=False), help="Write the task (with the fitted prior) to this file."
    ),
    click.option(
        "--format",
        "fmt",
        type=click.Choice(["jsonl", "csv", "text", "parquet"]),
        help="Input format (default: from the extension; stdin is sniffed).",
    ),
    click.option("--text-field", default="text", show_default=True, help="JSONL field holding the text."),
    click.option(
        "--id-field", default="id", show_default=True, help="JSONL field holding the id (default: line number)."
    ),
    click.option("--text-column", default="text", show_default=True, help="CSV column holding the text."),
    click.option(
        "--pair-field",
        default="text_pair",
        show_default=True,
        help="JSONL/Parquet field of a second text (a pair: NLI, a query and a document), read where present.",
    ),
    click.option("--pair-column", help="CSV/TSV column of a second text (a pair); none unless named."),
    click.option(
        "--id-column", default="id", show_default=True, help="CSV column holding the id (default: line number)."
    ),
    click.option(
        "--gold-field",
        "--gold-column",
        "gold_field",
        default="label",
        show_default=True,
        help="Field (JSONL) or column (CSV) of the gold label (eval, --calibration-data).",
    ),
    click.option("--batch-size", default=None, type=number("batch_size"), help="Max rows per batch."),
    click.option(
        "--max-batch-tokens",
        default=None,
        type=number("max_batch_tokens"),
        help="Max padded tokens per batch (rows x longest); default 512 on the CPU, 4096 on a GPU.",
    ),
    click.option(
        "--window",
        default=1024,
        show_default=True,
        type=number("window"),
        help="Items sorted and batched together (with --warmup, this bounds the items held in memory).",
    ),
    click.option("--no-sort", is_flag=True, help="Batch in input order (no length bucketing)."),
    click.option("--no-prefix-cache", is_flag=True, help="Run every prompt in full (no shared-prefix KV cache)."),
    click.option(
        "--scoring", type=click.Choice(["auto", "first-token", "sequence"]), default="auto", show_default=True
    ),
    click.option(
        "--truncate",
        type=click.Choice(["head", "tail", "middle"]),
        help="Over-long prompts: keep the text's head, tail, or both ends (default: error row).",
    ),
    click.option(
        "--dtype",
        type=click.Choice(["float32", "float16", "bfloat16"]),
        help="Compute dtype (default: float32 on CPU, float16 on GPU).",
    ),
    keep_quantized_option("where MLX's quantized matmuls are slow; "),
    click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr."),
]


def task_options(f: Any) -> Any:
    """All of classify's task options."""
    for opt in reversed(_TASK_OPTIONS):
        f = opt(f)
    return f


def _name(opt: Any) -> str:
    return opt(lambda: None).__click_params__[0].name


TASK_OPTION_NAMES = frozenset(_name(opt) for opt in _TASK_OPTIONS)


def some_task_options(names: set[str] | frozenset[str]) -> Any:
    """The options of classify named in `names` (their parameter names), as classify has them."""

    def deco(f: Any) -> Any:
        for opt in reversed(_TASK_OPTIONS):
            if _name(opt) in names:
                f = opt(f)
        return f

    return deco


def task_settings(ctx: click.Context, o: dict[str, Any]) -> TaskOptions:
    """The task options given to a command, as the job takes them."""
    return TaskOptions(**o, given=given(ctx, o))
