"""What every command shares: `notice` (one line on stderr), the BLAS warning, and `Command`,
which maps errors to exit statuses' usage lines and groups its options into help sections."""

from __future__ import annotations

import re
from typing import Any

import click
from click.core import ParameterSource

from ..ground import blas as _blas
from ..ground.errors import UsageError
from ..ground.notices import notice as _notice
from ..ground.ranges import RANGES, advice
from ..ground.textfiles import not_utf8

# The fine-tuning options (`train --finetune lora`), as FinetuneSettings names them where they differ:
# their own --help section, and refused without --finetune.
TUNING = (
    "finetune",
    "objective",
    "epochs",
    "learning_rate",
    "head_learning_rate",
    "schedule",
    "adapt_layers",
    "rank",
    "lora_scale",
    "dropout",
    "train_batch_size",
    "val_fraction",
    "patience",
    "max_minutes",
    "head_init",
    "keep",
    "label_smoothing",
    "contrastive",
    "fused",
)

# Help sections, in the order --help shows them; an option's section is in SECTIONS (by
# parameter name), or in the command's own `sections=` where the same option means
# something else there.
ORDER = (
    "Input",
    "Output",
    "Task and model",
    "Labels and prompt",
    "Calibration",
    "Calibration data",
    "Batching",
    "Answers",
    "Scale-out",
    "Head",
    "Fine-tuning",
    "Conversion",
    "Server",
    "Limits",
    "Other",
)
SECTIONS = {
    **dict.fromkeys(
        (
            "fmt",
            "text_field",
            "id_field",
            "text_column",
            "id_column",
            "gold_field",
            "gold_fields",
            "pair_field",
            "pair_column",
        ),
        "Input",
    ),
    **dict.fromkeys(("predictions", "input_path", "n"), "Input"),
    **dict.fromkeys(("output", "output_format", "resume", "on_error", "save_task", "json_path", "plots"), "Output"),
    **dict.fromkeys(("out", "as_json", "strict", "no_input_check", "force", "quiet"), "Output"),
    **dict.fromkeys(("task_file", "model", "reference", "dtype", "keep_quantized"), "Task and model"),
    **dict.fromkeys(("quantize", "group_size"), "Conversion"),
    **dict.fromkeys(
        ("labels_csv", "labels_file", "questions_file", "system", "template", "examples_file"), "Labels and prompt"
    ),
    **dict.fromkeys(("scoring", "truncate", "reranker", "instruction"), "Labels and prompt"),
    **dict.fromkeys(("calibrate", "calibration_data", "warmup", "min_confidence", "threshold"), "Calibration"),
    **dict.fromkeys(("batch_size", "max_batch_tokens", "window", "no_sort", "no_prefix_cache"), "Batching"),
    **dict.fromkeys(("shard", "use_ray", "ray_address", "workers", "worker_threads"), "Scale-out"),
    **dict.fromkeys(("layers_spec", "layer", "folds", "pooling", "seed"), "Head"),
    **dict.fromkeys(TUNING, "Fine-tuning"),
    **dict.fromkeys(("host", "port", "api_key", "log_level"), "Server"),
    **dict.fromkeys(("max_batch_items", "max_wait_ms", "max_queue_items", "max_items_per_request"), "Limits"),
    **dict.fromkeys(("max_body_bytes", "request_timeout", "drain_timeout", "task_cache"), "Limits"),
}


# Every command's notes, warnings, progress and summaries go through the package's one printer.
notice = _notice


def warn_blas() -> None:
    if _blas.PROBLEM:
        notice(f"mlx-slm: warning: slow BLAS ({_blas.PROBLEM}); MLX matmuls run ~30x slower. Fix: {_blas.FIX}")


def given(ctx: click.Context, o: dict[str, Any]) -> frozenset[str]:
    """The parameters set on the command line (a --task file fills in the others)."""
    return frozenset(k for k in o if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE)


def check_arguments_text(ctx: click.Context) -> None:
    """Every argument and option is UTF-8 text, checked once here before any work: a byte the
    system could not decode arrives in Python's argv as a surrogate escape, which would reach a
    tokenizer, a manifest or a task file and fail there as a bug (exit 70)."""

    for p in ctx.command.params:
        value = ctx.params.get(p.name or "")
        for v in value if isinstance(value, (tuple, list)) else (value,):
            where = not_utf8(v) if isinstance(v, str) else None
            if where:
                name = max(p.opts, key=len) if isinstance(p, click.Option) else p.human_readable_name
                raise UsageError(
                    f"{name} {v.encode('utf-8', 'surrogateescape')!r:.80} is not valid UTF-8 ({where}): give it as "
                    "UTF-8 text (a file or folder named so: rename it, or use a link with a UTF-8 name)"
                )


class Command(click.Command):
    """A command whose --help groups its options into sections, and whose option clashes found
    past parsing (`errors.UsageError`) show the usage line, as click's own do."""

    def __init__(self, *args: Any, sections: dict[str, str] | None = None, **kwargs: Any):
        self.sections = {**SECTIONS, **(sections or {})}
        super().__init__(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            check_arguments_text(ctx)
            return super().invoke(ctx)
        except UsageError as e:
            raise click.UsageError(str(e), ctx) from e

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        for p in self.get_params(ctx):
            if isinstance(p, click.Argument):  # named in the usage line, not an option
                continue
            rv = p.get_help_record(ctx)
            if rv is not None:
                groups.setdefault(self.sections.get(p.name or "", "Other"), []).append(rv)
        for title in ORDER:
            if title in groups:
                with formatter.section(f"{title} options" if title != "Other" else "Other options"):
                    formatter.write_dl(groups[title])


def number(name: str) -> click.ParamType:
    """The click type of the numeric option `name`: parsed as click parses an int or a float, then
    held to its one range in `ranges.RANGES` (NaN, the infinities and out-of-range values refused,
    naming the range and the fix); --help shows the bounds as click's ranges do."""
    r = RANGES[name]
    base = click.IntRange if r.integer else click.FloatRange
    parse = click.types.IntParamType.convert if r.integer else click.types.FloatParamType.convert

    class Checked(base):  # type: ignore[misc,valid-type]
        def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
            v = parse(self, value, param, ctx)
            why = r.problem(v)
            if why is not None:
                self.fail(f"{why}{advice(name)}", param, ctx)
            return v

    checked = Checked(r.lo, r.hi, min_open=r.lo_open, max_open=r.hi_open)  # --help shows the range checked
    checked.range_name = name  # type: ignore[attr-defined]  # for tests: which range holds this option
    return checked


ESCAPES_HELP = "On the command line \\n is a newline and \\t a tab (\\\\n: a backslash and n)."
_ESCAPE = {"\\": "\\", "n": "\n", "t": "\t"}


def escapes(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """`\\n` and `\\t` in --system/--template typed on a command line are a newline and a tab
    (a shell passes them as a backslash and a letter); `\\\\` is one backslash. Defaults, task
    files and the Python API take strings as they are."""
    if not isinstance(value, str) or ctx.get_parameter_source(param.name or "") is not ParameterSource.COMMANDLINE:
        return value
    return re.sub(r"\\([\\nt])", lambda m: _ESCAPE[m.group(1)], value)
