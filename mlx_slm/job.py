"""A classify job: one input file to one output, as `mlx-slm classify` runs it.

`TaskOptions` are the settings classify, eval and serve share (a task file fills in those
not given); `Setup` resolves them into labels, prompt, examples and a `CalibrationSpec`,
loads the classifier and fits --calibration-data. `ClassifyJob` is one file-to-file run:
read, plan (shard, resume), classify (here or on Ray workers), calibrate, write, manifest
and summary. Nothing here knows about click: user errors are `UserError`s (`UsageError`
for options that do not go together), progress and the summary go to stderr.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .calibration import DEFAULT_WARMUP, CalibrationSpec, Calibrator
from .errors import UsageError, UserError
from .prompts import (
    DEFAULT_LABELS,
    DEFAULT_SYSTEM,
    DEFAULT_TEMPLATE,
    check_plain_system,
    check_template,
    fill_labels,
    fill_system,
)
from .registry import DEFAULT_MODEL

RAY_INIT_TIMEOUT_S = 60  # joining (or starting) Ray: past this, exit 2 rather than wait on Ray's retries


def err(msg: str) -> None:
    """One line on stderr (results alone go to stdout)."""
    print(msg, file=sys.stderr, flush=True)


@dataclass
class TaskOptions:
    """What defines the task and how to run it; the names are the CLI's parameter names.
    `given`: the names set on the command line (a --task file fills in the others)."""

    task_file: str | None = None
    model: str = DEFAULT_MODEL
    labels_csv: str | None = ",".join(DEFAULT_LABELS)
    labels_file: str | None = None
    system: str = DEFAULT_SYSTEM
    template: str = DEFAULT_TEMPLATE
    examples_file: str | None = None
    questions_file: str | None = None
    calibrate: str = "none"
    calibration_data: str | None = None
    warmup: int = DEFAULT_WARMUP
    min_confidence: float | None = None
    save_task: str | None = None
    fmt: str | None = None
    text_field: str = "text"
    id_field: str = "id"
    text_column: str = "text"
    id_column: str = "id"
    gold_field: str = "label"
    batch_size: int | None = None
    max_batch_tokens: int | None = None
    window: int = 1024
    no_sort: bool = False
    no_prefix_cache: bool = False
    scoring: str = "auto"
    truncate: str | None = None
    dtype: str | None = None
    keep_quantized: bool | None = None
    quiet: bool = False
    given: frozenset[str] = field(default_factory=frozenset)

    def read_args(self) -> tuple[str | None, str, str, str, str]:
        """`io.read_rows`' format and field arguments."""
        return self.fmt, self.text_field, self.id_field, self.text_column, self.id_column


def flag_names(names: set[str]) -> str:
    """Parameter names as the options a person typed: labels_csv -> --labels."""
    return ", ".join("--" + k.replace("_csv", "").replace("_file", "").replace("_", "-") for k in sorted(names))


def note_descriptions(system: str | None, descriptions: dict[str, str], quiet: bool = False) -> None:
    """Descriptions from --labels-file reach the model only through {label_descriptions} in
    --system: say so when they would be dropped without a word."""
    from .prompts import DESCRIPTIONS_PLACEHOLDER

    if not quiet and any(descriptions.values()) and DESCRIPTIONS_PLACEHOLDER not in (system or ""):
        err(
            "mlx-slm: note: --labels-file gives label descriptions, but --system has no {label_descriptions}: "
            "the model does not see them (add it, e.g. --system 'What the labels mean:\\n{label_descriptions}')"
        )


def check_outputs(inputs: list[str | None], outputs: list[tuple[str, str | None]]) -> None:
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
            raise UsageError(f"{flag} {path} is also {seen[real]}: give each output its own file")
        seen[real] = f"{flag} {path}"


def _check_head_options(given: frozenset[str]) -> None:
    """A task with a learned head: its model, labels and prompt are what the head was trained on."""
    changed = {"model", "labels_csv", "labels_file", "system", "template", "examples_file"} & given
    if changed:
        raise UsageError(
            f"the task's learned head was trained on its own model, labels and prompt; with {flag_names(changed)} "
            "changed it no longer applies: train a new head (mlx-slm train DATA ... --save-task TASK)"
        )
    if {"calibrate", "calibration_data"} & given:
        raise UsageError(
            "calibration does not apply to a task with a learned head (its probabilities are fitted on labelled "
            "data already): drop --calibrate/--calibration-data; --min-confidence works on the head's probabilities"
        )


class Setup:
    """What classify, eval and serve share: the options (with a task file's values filled
    in), the loaded classifier, and the calibration to run with (`calibration`)."""

    def __init__(self, options: TaskOptions):
        o = self.o = replace(options)
        self.task: Any = None
        self.origin = "here"  # where the calibrator comes from: "here" (fitted in this run), "task", "resume"
        given = self.given = options.given
        # An id column named on the command line must exist (no silent fall-back to line numbers).
        self.id_required = "id_column" in given
        self.labels: list[str] | None = None
        self.examples: Any = ()
        self.questions: Any = None
        self.calibration = CalibrationSpec.of(o.calibrate)
        if o.task_file:
            self._take_task(o.task_file)
        if o.questions_file or self.questions is not None:
            self._read_questions()
            return
        self.calibration = CalibrationSpec.of(self.calibration, warmup=o.warmup)
        if "template" in given:  # as typed: every {word} checked, {{ }} literal braces
            o.template = check_template(o.template)
        if self.labels is None:
            self._read_labels()
        elif "system" in given:  # the task's labels, a message typed here
            o.system = fill_system(o.system, self.labels)
        if o.examples_file:
            from .prompts import read_examples

            self.examples = read_examples(o.examples_file, self.labels)
        if self.calibration.needs_data and not o.calibration_data:
            raise UsageError(f"--calibrate {self.calibration.kind} needs --calibration-data FILE (labelled texts)")

    def _take_task(self, path: str) -> None:
        """Fill in what the command line did not give from the task file."""
        from .task import Task

        o, given = self.o, self.given
        t = self.task = Task.load(path)
        defining = {"model", "labels_csv", "labels_file", "system", "template", "examples_file", "scoring"} & given
        if t.heads:
            _check_head_options(given)
        if t.calibration.fitted and defining and "calibrate" not in given:
            raise UsageError(
                f"the task's calibration prior was fitted for its own model and prompt; with {flag_names(defining)} "
                "changed it no longer applies: add --calibrate none|batch|fit to recalibrate"
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
                setattr(o, k, v)
        self.labels = list(t.labels) if not ({"labels_csv", "labels_file"} & given) else None
        if t.questions:
            self.questions = tuple(t.questions)
        self.examples = t.examples if "examples_file" not in given else ()
        if "calibrate" not in given:
            self.calibration = t.calibration

    def _read_questions(self) -> None:
        """--questions (added to a task's own, if any): each question carries its labels; the
        label-scoring options do not apply."""
        from .questions import DEFAULT_SYSTEM, DEFAULT_TEMPLATE, QuestionError, check_questions, read_questions

        o = self.o
        clash = {"labels_csv", "labels_file", "examples_file", "scoring", "truncate", "calibration_data"} & self.given
        if o.calibrate not in ("none", "batch"):
            raise UsageError(
                f"--calibrate {o.calibrate} with several questions is not supported yet: use --calibrate batch "
                "(a prior per question, from the input itself) or none"
            )
        if clash:
            raise UsageError(
                f"--questions does not go with {flag_names(clash)}: each question carries its own labels"
                + ("" if clash & {"labels_csv", "labels_file"} else " (not supported with --questions yet)")
            )
        if self.task is not None and not self.task.questions:
            raise UsageError(
                f"--task {o.task_file} asks one question (its labels): --questions goes with a task of questions "
                "(saved by classify --questions --save-task, or train --label-field A --label-field B)"
            )
        if o.questions_file:
            try:
                self.questions = check_questions([*(self.questions or ()), *read_questions(o.questions_file)])
            except QuestionError as e:
                raise QuestionError(f"--questions {o.questions_file} with the task's questions: {e}") from None
        # As typed: every {word} checked ({text} and {question} in the template), {{ }} literal braces;
        # otherwise the task's, or the defaults for questions.
        if "system" in self.given:
            o.system = check_plain_system(o.system)
        elif self.task is None:
            o.system = DEFAULT_SYSTEM
        if "template" in self.given:
            o.template = check_template(o.template, placeholders=("text", "question"))
        elif self.task is None:
            o.template = DEFAULT_TEMPLATE

    def _read_labels(self) -> None:
        from .labels import parse_labels

        o = self.o
        descriptions: dict[str, str] = {}
        if o.labels_file:
            from .io import read_label_descriptions

            descriptions = read_label_descriptions(o.labels_file)  # a BOM dropped; bad UTF-8 names its line
            self.labels = list(descriptions)
        else:
            self.labels = parse_labels(o.labels_csv)
        # Filled here, so the saved task, the manifest and Ray's workers all hold the message the model saw.
        note_descriptions(o.system, descriptions, o.quiet)
        # As typed (--system): every {word} checked; a task's message is filled as it is.
        fill = fill_system if "system" in self.given else fill_labels
        o.system = fill(o.system, self.labels, descriptions)

    def load(self) -> Any:
        from .classifier import DEFAULT_BATCH_SIZE, Classifier

        o = self.o
        # Kept: --ray workers load the same classifier from these (on their own nodes).
        self.load_kwargs = dict(
            model=o.model,
            labels=list(self.labels or ()),
            system=o.system or None,
            template=o.template,
            dtype=o.dtype,
            dequantize=None if o.keep_quantized is None else not o.keep_quantized,
            **({"head": self.task.head} if self.task is not None and self.task.head is not None else {}),
            batch_size=o.batch_size or DEFAULT_BATCH_SIZE,
            max_batch_tokens=o.max_batch_tokens or "auto",
            sort=not o.no_sort,
            use_prefix_cache=not o.no_prefix_cache,
            scoring=o.scoring,
            truncate=o.truncate,
            examples=tuple(self.examples),
            **({"questions": self.questions} if self.questions is not None else {}),
        )
        self.clf = Classifier.load(**self.load_kwargs)
        self.weights = self.clf.engine.weights_sha256
        if self.task is not None and (self.origin == "task" or self.task.heads):  # same weights only
            self.task.check_weights(self.weights, o.model)
        if self.calibration.needs_data:
            self.calibration = self._fit(self.calibration)
        return self.clf

    def _fit(self, spec: CalibrationSpec) -> CalibrationSpec:
        """Fit per-label offsets on the labelled sample (`em` then uses them as its base)."""
        from .calibration import CalibrationError
        from .io import gold_problem, read_rows

        o = self.o
        path = o.calibration_data
        rows = list(read_rows(path, None, *self.o.read_args()[1:], gold=o.gold_field))
        for r in rows:
            why = r.error or gold_problem(r, self.clf.labels, o.gold_field)
            if why:
                raise CalibrationError(f"--calibration-data {path}: {why}")
        if not rows:
            raise CalibrationError(
                f"--calibration-data {path} is empty: give it labelled texts (text and {o.gold_field})"
            )
        fitted = self.clf.fit_calibration(
            [r.text for r in rows],
            [str(r.gold) for r in rows],
            spec,
            window=o.window,
            source=f"--calibration-data {path}",
            lines=[r.line for r in rows],
        )
        cal = fitted.calibrator
        assert cal is not None
        i = cal.info
        if not o.quiet:
            if i.get("cv_accuracy_raw") is not None:
                err(
                    f"mlx-slm: fitted on {len(rows)} labelled items; {i['folds']}-fold cross-validated accuracy "
                    f"{100 * i['cv_accuracy_raw']:.1f} % raw -> {100 * i['cv_accuracy_calibrated']:.1f} % calibrated"
                )
            else:
                err(f"mlx-slm: fitted on {len(rows)} labelled items ({i.get('cv_note', 'no cross-validation')})")
        return fitted

    def calibration_run(self, on_fit: Callable[[Calibrator], None] | None = None) -> Any:
        return self.clf.calibration_run(self.calibration, self.o.min_confidence, on_fit)

    def describe(self, run: Any) -> str:
        c = run.calibrator
        if run.method == "none":
            return "no calibration (raw scores)"
        if hasattr(run, "priors"):  # several questions: a prior per question
            if not run.fitted_here:
                return f"{run.method} calibration per question (too few items to fit priors: raw scores)"
            return f"{run.method} calibration per question (priors from the first {run.n} items of this input)"
        if run.method in ("batch", "em") and c is None:
            return f"{run.method} calibration (too few items to fit a prior: raw scores)"
        if run.fitted_here:
            return f"{run.method} calibration (prior from the first {c.n} items of this input)"
        where = {"task": "the task's saved prior", "resume": "the prior the interrupted run fitted"}.get(
            self.origin, "fitted on --calibration-data"
        )
        # Only `fit` learns from labels; batch (and em's re-estimate) from the input's own items.
        if c.method == "fit":
            return f"{run.method} calibration ({where}, {c.n} labelled items)"
        source = "of this input" if self.origin == "resume" else "of the input it was fitted on"
        return f"{run.method} calibration ({where}, from the first {c.n} items {source}, no labels)"

    def settings(self) -> dict[str, Any]:
        head = self.clf.head
        return {
            "calibration": self.calibration.record(),
            "min_confidence": self.o.min_confidence,
            "examples": [list(e) for e in self.clf.format.examples],
            **({"head": {"layers": list(head.layers), "sha256": head.sha256}} if head is not None else {}),
        }

    def save_task(self, run: Any) -> None:
        from .convert import versions
        from .task import Task

        path = self.o.save_task
        if not path:
            return
        cal = run.result()  # em keeps its base: later inputs re-estimate their own mix
        t = Task(
            model=self.o.model,
            labels=tuple(self.clf.labels),
            system=self.o.system or None,
            template=self.o.template,
            scoring="auto" if self.clf.questions else self.clf.mode,
            examples=self.clf.format.examples,
            calibration=cal,
            warmup=self.o.warmup,
            min_confidence=self.o.min_confidence,
            weights_sha256=self.weights,
            versions=versions(),
            questions=tuple(self.clf.questions or ()),
        )
        t.save(path)
        if not self.o.quiet:
            err(f"mlx-slm: task saved to {path} ({run.method + ' prior' if cal.applies else 'no calibration'})")


class Progress:
    """Items done and their rate on a terminal's stderr (nothing when piped or quiet)."""

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


@dataclass
class Distribution:
    """Where a classify run's work goes: a shard of the input, and/or Ray workers."""

    shard_spec: str | None = None
    ray: bool = False
    address: str | None = None
    workers: int = 1
    worker_threads: int | None = None

    def __post_init__(self) -> None:
        from .sharding import parse_shard

        self.shard = parse_shard(self.shard_spec) if self.shard_spec else None
        if not self.ray and (self.workers != 1 or self.worker_threads is not None):
            raise UsageError("--workers and --worker-threads are for --ray (or --ray-address)")


def ray_init(address: str | None) -> None:
    """Join (or start) Ray, or a `UserError`; a cluster silent for a minute ends the process (exit 2)."""
    import os
    import threading

    from . import ray as mray  # MissingExtra (exit 2) names the pip command

    where = f"the Ray cluster at {address}" if address else "a local Ray"

    def give_up() -> None:  # Ray retries a silent cluster for minutes; nothing is written yet
        err(f"mlx-slm: error: cannot start or join {where}: no answer within {RAY_INIT_TIMEOUT_S} s")
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


@dataclass
class ClassifySettings:
    """One classify run: the input, where the rows go, and how the work is spread."""

    input: str = "-"
    output: str | None = None  # -o as given (None: stdout)
    output_format: str | None = None
    resume: bool = False
    shard: str | None = None  # "I/N"
    ray: bool = False
    ray_address: str | None = None  # implies ray
    workers: int = 1
    worker_threads: int | None = None
    task: TaskOptions = field(default_factory=TaskOptions)


def classify(s: ClassifySettings) -> int:
    """Check the settings, lock the output and run; the number of error rows in the whole output."""
    from contextlib import ExitStack

    from .output import OutputLock, is_plain_file_target
    from .output import output_format as output_format_of

    out_fmt = output_format_of(s.output, s.output_format)
    file_out = is_plain_file_target(s.output)
    _check_io(s, out_fmt, file_out)
    dist = Distribution(s.shard, s.ray or s.ray_address is not None, s.ray_address, s.workers, s.worker_threads)
    if dist.shard is not None and not file_out:
        raise UsageError("--shard needs -o FILE: each shard writes its own part (joined by `mlx-slm merge`)")
    if dist.shard is not None and s.input == "-":
        raise UsageError("--shard needs an input file: every shard reads the whole input to find its slice")
    setup = Setup(s.task)
    if setup.questions is not None and setup.calibration.per_input and s.resume:
        raise UsageError(
            "--resume with --questions and batch calibration would fit other priors on the rest of the input: "
            "start again without --resume"
        )
    if dist.shard is not None and setup.calibration.per_input:
        raise UsageError(
            "--shard with batch/em calibration would fit a different prior on each shard: fit one prior first "
            "(mlx-slm classify SAMPLE --calibrate batch --save-task task.json) and give every shard --task task.json"
        )
    o = s.task
    inputs = [s.input, o.labels_file, o.examples_file, o.calibration_data, o.task_file]
    check_outputs(inputs, [("-o", s.output if file_out else None), ("--save-task", o.save_task)])
    if dist.ray:  # joined before the output is touched: a cluster that is not there fails first
        ray_init(dist.address)
    with ExitStack() as stack:
        if file_out:
            # A Parquet output appears only when complete: the lock does not create it.
            stack.enter_context(OutputLock(s.output, create=out_fmt != "parquet"))
        return ClassifyJob(setup, s.input, s.output if file_out else None, s.output, out_fmt, s.resume, dist).run()


def _check_io(s: ClassifySettings, out_fmt: str, file_out: bool) -> None:
    """The input exists; --resume and Parquet have the output they need."""
    if s.input != "-" and not Path(s.input).exists():
        raise UsageError(f"input file {s.input!r} does not exist")
    if s.resume and not file_out:
        raise UsageError("--resume needs -o FILE, a regular file (the output to continue)")
    if s.resume and s.input == "-":
        raise UsageError("--resume needs an input file: standard input cannot be read again to check it")
    if out_fmt == "parquet" and not file_out:
        raise UsageError("Parquet output needs -o FILE.parquet (a regular file): it is written whole, not streamed")
    if out_fmt == "parquet" and s.resume:
        raise UsageError(
            "--resume does not work with Parquet output: a Parquet file is written whole when the run ends, so "
            "an interrupted run leaves no rows to continue from. For a resumable run write .jsonl (then convert), "
            "or run --shard parts and join them with `mlx-slm merge ... -o all.parquet`"
        )


class ClassifyJob:
    """One file-to-file run with its output locked: `run` returns the number of error rows in
    the whole output. `output` is the regular file written (with its manifest), or None;
    `stream` is where rows go when it is None (stdout, /dev/null, a FIFO)."""

    def __init__(
        self,
        setup: Setup,
        input: str,
        output: str | None,
        stream: str | None,
        out_fmt: str,
        resume: bool = False,
        dist: Distribution | None = None,
    ):
        self.setup, self.input, self.output, self.stream = setup, input, output, stream
        self.out_fmt, self.resume, self.dist = out_fmt, resume, dist or Distribution()
        self.settings: dict[str, Any] = {}
        self.fitted: dict[str, Any] = {}  # the prior fitted on this input (a resumed run keeps it)
        self.failed = self.kept = self.kept_failed = self.abstained = 0
        self.input_sha256: str | None = None
        self.input_not_hashed: str | None = None

    def run(self) -> int:
        from .output import InputDigest, csv_columns, write_manifest

        setup, o = self.setup, self.setup.o
        # The input's sha256 for the manifest, hashed while the model loads.
        digest = InputDigest(self.input) if self.output is not None else None
        previous = self._previous()
        rows = self._rows()
        clf = setup.load()
        if digest is not None:
            self.input_sha256, self.input_not_hashed = digest.result()
        shard_info = None
        if self.dist.shard is not None:
            rows, shard_info = self._shard_rows(rows, self.dist.shard)
        extra = setup.settings()
        calibrated = extra["calibration"] != "none"
        if clf.questions is not None:
            from .output import question_columns

            columns = question_columns(clf.questions, raw=calibrated, abstain=o.min_confidence is not None)
        else:
            columns = csv_columns(clf.labels, raw=calibrated, abstain=o.min_confidence is not None)
        if self.output is not None:
            self.settings = self._manifest_settings(extra, shard_info)
        append = previous is not None
        if previous is not None:
            rows = self._plan_resume(previous, columns, rows)
        if self.output is not None:
            write_manifest(self.output, self.settings, complete=False, fitted=self.fitted or None)
        calib = setup.calibration_run(self._on_fit)
        run, progress = self._write(rows, columns, append, calib)
        if self.output is not None:
            write_manifest(
                self.output, self.settings, complete=True, rows=self.kept + progress.n, fitted=self.fitted or None
            )
        setup.save_task(calib)
        if not o.quiet:
            self._summary(run, calib, progress.n)
        return self.failed

    def _previous(self) -> dict[str, Any] | None:
        """The manifest of the output to resume, if any; an output that is not ours is refused."""
        from .output import OutputError, read_manifest

        out = self.output
        if not (self.resume and out is not None and Path(out).exists()):
            return None
        previous = read_manifest(out)
        if previous is None and Path(out).stat().st_size > 0:
            raise OutputError(
                f"{out} has no {Path(out).name}.mlx-slm.json record, so it was not written by mlx-slm classify: "
                "not resuming into it, and it is left untouched (start again without --resume, or choose another -o)"
            )
        return previous

    def _rows(self) -> Iterator[Any]:
        """The input's rows. The first one settles its format and header (a CSV without the text
        column raises here), before the model loads and before the output is touched."""
        from .io import read_rows

        rows = iter(read_rows(self.input, *self.setup.o.read_args(), id_required=self.setup.id_required))
        first = next(rows, None)
        rows = itertools.chain([first] if first is not None else [], rows)
        if self.dist.shard is not None:  # before the model loads: too many shards fail at once
            from .sharding import check_shard_count

            listed = list(rows)
            check_shard_count(self.dist.shard[1], len(listed), f"the input {self.input}")
            return iter(listed)
        return rows

    def _shard_rows(self, rows: Iterator[Any], shard: tuple[int, int]) -> tuple[Iterator[Any], dict[str, Any]]:
        """The rows of one shard, and what the part's manifest records about it."""
        from .sharding import shard_range, shard_settings

        all_rows = list(rows)
        tok = self.setup.clf.tokenizer
        counts: list[int | None] = [None] * len(all_rows)
        valid = [i for i, r in enumerate(all_rows) if r.error is None]
        for k in range(0, len(valid), 4096):  # batched: the fast tokenizer's own threads
            chunk = valid[k : k + 4096]
            ids = tok([all_rows[i].text for i in chunk], add_special_tokens=False)["input_ids"]
            for i, x in zip(chunk, ids):
                counts[i] = len(x)
        i, n = shard
        start, end = shard_range(counts, self.setup.o.window, n, i)  # O(rows) whatever N is
        if not self.setup.o.quiet:
            what = f"input rows {start + 1}..{end}" if end > start else "no rows (fewer windows than shards)"
            err(f"mlx-slm: shard {i}/{n}: {what} of {len(all_rows)}")
        return iter(all_rows[start:end]), shard_settings(i, n, (start, end), len(all_rows))

    def _manifest_settings(self, extra: dict[str, Any], shard_info: dict[str, Any] | None) -> dict[str, Any]:
        """What the output's manifest records: --resume and merge accept only the same."""
        o, clf = self.setup.o, self.setup.clf
        inp = Path(self.input).resolve() if self.input != "-" else None
        return {
            "weights_sha256": self.setup.weights,
            "labels": list(clf.labels),
            **({"questions": [q.record() for q in clf.questions]} if clf.questions is not None else {}),
            "system": o.system or None,
            "template": o.template,
            "scoring": clf.mode,
            **extra,
            "truncate": o.truncate,
            "dtype": clf.engine.compute_dtype,
            **({"quantized": clf.model.quantized} if getattr(clf.model, "quantized", None) else {}),
            "input": str(inp) if inp else "-",
            "input_size": inp.stat().st_size if inp else None,
            # The input's content: --resume, merge and eval --predictions refuse another.
            "input_sha256": self.input_sha256,
            **({"input_not_hashed": self.input_not_hashed} if self.input_not_hashed else {}),
            "input_format": o.fmt,
            "fields": [o.text_field, o.id_field, o.text_column, o.id_column],
            "output_format": self.out_fmt,
            "batch_size": clf.batch_size,
            "max_batch_tokens": clf.max_batch_tokens,
            "window": o.window,
            "sort": not o.no_sort,
            "prefix_cache": not o.no_prefix_cache,
            "model": o.model,
            **({"shard": shard_info} if shard_info else {}),
        }

    def _plan_resume(self, previous: dict[str, Any], columns: list[str], rows: Iterator[Any]) -> Iterator[Any]:
        """Keep the finished windows of the interrupted output; the rows still to classify."""
        from .output import OutputError, changed_settings, input_changed, plan_resume, truncate_to

        out = self.output
        assert out is not None
        diff = [k for k in changed_settings(previous["settings"], self.settings) if k != "model"]
        if "input_sha256" not in previous["settings"]:
            raise OutputError(
                f"cannot --resume {out}: it was made by an older mlx-slm that did not record its input's sha256, "
                "so the rows kept could not be checked against the input; start again without --resume"
            )
        new_input = (self.settings["input_sha256"], self.settings["input_size"])
        changed = input_changed(self.input, previous["settings"], new_input)
        if changed:
            raise OutputError(
                f"cannot --resume {out}: {changed}, so its rows are of the old content; "
                f"start again without --resume (the whole input is classified again into {out})"
            )
        if diff:
            old, new = previous["settings"], self.settings
            detail = "; ".join(f"{k}: was {old.get(k)!r}, now {new.get(k)!r}" for k in diff[:3])
            raise OutputError(
                f"cannot --resume {out}: it was made with other settings ({detail}); "
                "run with the same options, or start again without --resume"
            )
        complete_rows = previous.get("rows") if previous.get("complete") else None
        window = self.setup.o.window
        keep_bytes, self.kept, self.failed, redo = plan_resume(out, self.out_fmt, columns, rows, window, complete_rows)
        self.kept_failed = self.failed
        truncate_to(out, keep_bytes)
        if previous.get("fitted_calibrator") and self.kept > 0:
            # The rows kept were calibrated with this prior: the rest must be too.
            self.fitted = previous["fitted_calibrator"]
            prior = Calibrator.from_dict(self.fitted)
            self.setup.calibration = CalibrationSpec.of(prior, warmup=self.setup.o.warmup)
            self.setup.origin = "resume"
        return itertools.chain(redo, rows)

    def _on_fit(self, cal: Calibrator) -> None:
        from .output import write_manifest

        self.fitted.update(cal.to_dict())
        if self.output is not None:
            write_manifest(self.output, self.settings, complete=False, fitted=self.fitted)

    def _write(self, rows: Iterator[Any], columns: list[str], append: bool, calib: Any) -> tuple[Any, Progress]:
        """Classify, calibrate and write every row in input order, error rows in their places."""
        from .output import Writer, result_record

        o = self.setup.o
        writer = Writer(self.output or self.stream, columns, self.out_fmt, append=append)
        pending: deque = deque()
        progress = Progress(o.quiet)

        def texts() -> Iterator[str]:
            for row in rows:
                pending.append(row)
                if row.error is None:
                    yield row.text

        def flush_errors() -> None:
            while pending and pending[0].error is not None:
                writer.write(result_record(pending.popleft(), None))
                self.failed += 1
                progress.tick()

        clf = self.setup.clf
        run = self._ray_run(list(texts())) if self.dist.ray else clf.run(texts(), window=o.window)
        finished = False
        try:
            for pred in calib(run):
                flush_errors()
                rec = result_record(pending.popleft(), pred, calib.method)
                self.failed += "error" in rec
                self.abstained += bool(rec.get("abstained"))
                writer.write(rec)
                progress.tick()
            flush_errors()
            finished = True
        finally:
            writer.close(complete=finished)  # an interrupted Parquet run writes no file
            progress.done()
        return run, progress

    def _ray_run(self, texts: list[str]) -> Any:
        """Raw predictions computed by Ray workers, in input order, as a `Run` (stats included)."""
        from . import ray as mray
        from .classifier import Run, Stats

        stats, setup, dist = Stats(), self.setup, self.dist

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

    def _summary(self, run: Any, calib: Any, done: int) -> None:
        setup, clf, kept, kept_failed = self.setup, self.setup.clf, self.kept, self.kept_failed
        if kept and done == 0:
            err(
                f"mlx-slm: {self.output} was complete already: {kept} rows ({kept_failed} errors) kept, "
                "nothing left to classify"
            )
            return
        kept_note = f"; {kept} rows kept from the interrupted run ({kept_failed} errors)" if kept else ""
        s = run.stats
        head = (
            f"mlx-slm: {done} rows ({self.failed - kept_failed} errors"
            + (f", {self.abstained} abstained" if setup.o.min_confidence is not None else "")
            + f") in {s.seconds:.1f} s, {s.items_per_s:.2f} items/s; "
        )
        if self.dist.ray:
            where = self.dist.address or "a local Ray"
            err(
                head + f"{self.dist.workers} Ray worker(s) on {where}, {s.prompt_tokens:,} prompt tokens; "
                f"{clf.mode} scoring; {setup.describe(calib)}" + kept_note
            )
            return
        err(
            head + f"{s.processed_tokens:,} tokens processed, padding {s.padding_pct:.1f} %, "
            f"prefix {len(clf.prefix) if clf.prefix else 0} tokens, cache saved {s.prefix_saved_tokens:,} tokens "
            f"({s.prefix_saved_pct:.1f} % of {s.prompt_tokens:,}); {clf.mode} scoring; {setup.describe(calib)}"
            + kept_note
        )
