"""A classify job: one input file to one output, as `mlx-slm classify` runs it.

The options are resolved once into a `classifier.Plan` (`plan.resolve`, shared with every
command); here is only the file-to-file run: `ClassifyJob` reads, plans (shard, resume),
classifies (here or on Ray workers), calibrates, writes, and keeps the manifest and summary.
It reads the plan and never changes it: a prior a resumed run keeps is a new plan
(`Plan.with_calibration`). Nothing here knows about click: user errors are `UserError`s
(`UsageError` for options that do not go together); notes and the summary go to `say` (the
CLI's `cli.base.notice`), and only the live progress line on a terminal is written here.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..classifier.classifier import Run
from ..files.output import (
    InputDigest,
    OutputError,
    OutputLock,
    Writer,
    changed_settings,
    check_run_files,
    files_read,
    input_changed,
    is_plain_file_target,
    plan_resume,
    read_manifest,
    result_record,
    truncate_to,
    write_manifest,
)
from ..files.output import output_format as output_format_of
from ..files.readers import read_rows
from ..files.sharding import check_shard_count, parse_shard, shard_range, shard_settings
from ..ground.errors import UsageError, UserError
from ..text.calibration import Calibrator
from ..text.predictions import Stats
from . import plan as plans
from .plan import Plan, Say, TaskOptions, flag_names  # noqa: F401 (their old home)

RAY_INIT_TIMEOUT_S = 60  # joining (or starting) Ray: past this, exit 2 rather than wait on Ray's retries


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

        self.shard = parse_shard(self.shard_spec) if self.shard_spec else None
        if not self.ray and (self.workers != 1 or self.worker_threads is not None):
            raise UsageError("--workers and --worker-threads are for --ray (or --ray-address)")


def ray_init(address: str | None, say: Say) -> None:
    """Join (or start) Ray, or a `UserError`; a cluster silent for a minute ends the process (exit 2)."""
    from .. import ray as mray  # lazy: the ray extra is optional (MissingExtra, exit 2, names the pip command)

    where = f"the Ray cluster at {address}" if address else "a local Ray"

    def give_up() -> None:  # Ray retries a silent cluster for minutes; nothing is written yet
        say(f"mlx-slm: error: cannot start or join {where}: no answer within {RAY_INIT_TIMEOUT_S} s")
        os._exit(2)

    watchdog = threading.Timer(RAY_INIT_TIMEOUT_S, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        mray.init(address)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError, ...
        raise UserError(f"cannot start or join {where}: {str(e) or 'Ray gave no reason'}") from None
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


def classify(s: ClassifySettings, say: Say) -> int:
    """Check the settings, lock the output and run; the number of error rows in the whole output.
    Notes and the summary go to `say`."""
    out_fmt = output_format_of(s.output, s.output_format)
    file_out = is_plain_file_target(s.output)
    _check_io(s, out_fmt, file_out)
    # No output may be a file the run reads (the one table of them: output.runfiles), before any is read.
    reads = files_read(s.task, ("INPUT", s.input))
    check_run_files(reads, [("-o", s.output if file_out else None), ("--save-task", s.task.save_task)])
    dist = Distribution(s.shard, s.ray or s.ray_address is not None, s.ray_address, s.workers, s.worker_threads)
    if dist.shard is not None and not file_out:
        raise UsageError("--shard needs -o FILE: each shard writes its own part (joined by `mlx-slm merge`)")
    if dist.shard is not None and s.input == "-":
        raise UsageError("--shard needs an input file: every shard reads the whole input to find its slice")
    plans.check_data_fields(s.task, ("gold_field",))  # classify reads no gold but --calibration-data's
    plans.check_format_fields(s.task, (s.input, s.task.calibration_data))
    plan = plans.resolve(s.task, say)
    why = next(filter(None, (own.no_resume(plan.calibration) for own in plan.kind.own)), None) if s.resume else None
    if why:
        raise UsageError(why)
    if dist.shard is not None and plan.calibration.per_input:
        raise UsageError(
            "--shard with batch/em calibration would fit a different prior on each shard: fit one prior first "
            "(mlx-slm classify SAMPLE --calibrate batch --save-task task.json) and give every shard --task task.json"
        )
    if dist.ray:  # joined before the output is touched: a cluster that is not there fails first
        ray_init(dist.address, say)
    with ExitStack() as stack:
        if file_out:
            # A Parquet output appears only when complete: the lock does not create it.
            stack.enter_context(OutputLock(s.output, create=out_fmt != "parquet"))
        if s.task.save_task:  # one writer of a task at a time, as of an output
            stack.enter_context(OutputLock(s.task.save_task, create=False, option="--save-task"))
        where = Where(s.input, s.output if file_out else None, s.output, out_fmt, s.resume)
        return ClassifyJob(plan, say, where, dist).run()


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


@dataclass(frozen=True)
class Where:
    """A run's files: the input, the regular file written (with its manifest) or None, where
    rows go when it is None (`stream`: stdout, /dev/null, a FIFO), the output's format, and
    whether an interrupted output is continued."""

    input: str
    output: str | None
    stream: str | None
    out_fmt: str
    resume: bool = False


class ClassifyJob:
    """One file-to-file run with its output locked: `run` returns the number of error rows in
    the whole output. It reads `plan`; what the run learns (the classifier, a resumed prior)
    is its own, the plan given is never changed."""

    def __init__(self, plan: Plan, say: Say, where: Where, dist: Distribution | None = None):
        self.plan, self.say, self.where = plan, say, where
        self.input, self.output, self.stream = where.input, where.output, where.stream
        self.out_fmt, self.resume, self.dist = where.out_fmt, where.resume, dist or Distribution()
        self.clf: Any = None
        self.settings: dict[str, Any] = {}
        self.fitted: dict[str, Any] = {}  # the prior fitted on this input (a resumed run keeps it)
        self.failed = self.kept = self.kept_failed = self.abstained = 0
        self.input_sha256: str | None = None
        self.input_not_hashed: str | None = None

    def run(self) -> int:

        # The input's sha256 for the manifest, hashed while the model loads.
        digest = InputDigest(self.input) if self.output is not None else None
        previous = self._previous()
        rows = self._rows()
        self.plan, clf = plans.load_fitted(self.plan, self.say)
        self.clf = clf
        if digest is not None:
            self.input_sha256, self.input_not_hashed = digest.result()
        shard_info = None
        if self.dist.shard is not None:
            rows, shard_info = self._shard_rows(rows, self.dist.shard)
        extra = plans.settings(self.plan, clf)
        calibrated = extra["calibration"] != "none"
        shape = clf.spec.record_shape(calibrated=calibrated, abstains=self.plan.min_confidence is not None)
        columns = shape.columns
        if self.output is not None:
            self.settings = self._manifest_settings(extra, shard_info)
        append = previous is not None
        if previous is not None:
            rows = self._plan_resume(previous, columns, rows)
        if self.output is not None:
            write_manifest(self.output, self.settings, complete=False, fitted=self.fitted or None)
        calib = plans.calibration_run(self.plan, clf, self._on_fit)
        run, progress = self._write(rows, columns, append, calib)
        if self.output is not None:
            write_manifest(
                self.output, self.settings, complete=True, rows=self.kept + progress.n, fitted=self.fitted or None
            )
        plans.save_task(self.plan, clf, calib, self.say)
        if not self.plan.quiet:
            self._summary(run, calib, progress.n)
        return self.failed

    def _previous(self) -> dict[str, Any] | None:
        """The manifest of the output to resume, if any; an output that is not ours is refused."""

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

        rows = iter(read_rows(self.input, self.plan.read.for_input(self.input)))
        first = next(rows, None)
        rows = itertools.chain([first] if first is not None else [], rows)
        if self.dist.shard is not None:  # before the model loads: too many shards fail at once
            listed = list(rows)
            check_shard_count(self.dist.shard[1], len(listed), f"the input {self.input}")
            return iter(listed)
        return rows

    def _shard_rows(self, rows: Iterator[Any], shard: tuple[int, int]) -> tuple[Iterator[Any], dict[str, Any]]:
        """The rows of one shard, and what the part's manifest records about it."""

        all_rows = list(rows)
        tok = self.clf.engine.tokenizer
        counts: list[int | None] = [None] * len(all_rows)
        valid = [i for i, r in enumerate(all_rows) if r.error is None]
        for k in range(0, len(valid), 4096):  # batched: the fast tokenizer's own threads
            chunk = valid[k : k + 4096]
            ids = tok([all_rows[i].text for i in chunk], add_special_tokens=False)["input_ids"]
            for i, x in zip(chunk, ids):
                counts[i] = len(x)
        i, n = shard
        start, end = shard_range(counts, self.plan.window, n, i)  # O(rows) whatever N is
        if not self.plan.quiet:
            what = f"input rows {start + 1}..{end}" if end > start else "no rows (fewer windows than shards)"
            self.say(f"mlx-slm: shard {i}/{n}: {what} of {len(all_rows)}")
        return iter(all_rows[start:end]), shard_settings(i, n, (start, end), len(all_rows))

    def _manifest_settings(self, extra: dict[str, Any], shard_info: dict[str, Any] | None) -> dict[str, Any]:
        """What the output's manifest records: --resume and merge accept only the same."""
        p, r, clf = self.plan, self.plan.read, self.clf
        assert p.model is not None
        inp = Path(self.input).resolve() if self.input != "-" else None
        return {
            "weights_sha256": clf.engine.weights_sha256,
            "system": p.system or None,
            "template": p.template,
            **extra,  # the kind's settings (labels, scoring, examples, ...) and the calibration
            "truncate": p.truncate,
            "dtype": clf.engine.compute_dtype,
            **({"quantized": clf.model.quantized} if getattr(clf.model, "quantized", None) else {}),
            "input": str(inp) if inp else "-",
            "input_size": inp.stat().st_size if inp else None,
            # The input's content: --resume, merge and eval --predictions refuse another.
            "input_sha256": self.input_sha256,
            **({"input_not_hashed": self.input_not_hashed} if self.input_not_hashed else {}),
            "input_format": r.fmt,
            "fields": [r.text_field, r.id_field, r.text_column, r.id_column],
            "output_format": self.out_fmt,
            "batch_size": clf.batching.batch_size,
            "max_batch_tokens": clf.batching.max_batch_tokens,
            "window": p.window,
            "sort": p.sort,
            "prefix_cache": p.use_prefix_cache,
            "model": p.model.name,
            **({"shard": shard_info} if shard_info else {}),
        }

    def _plan_resume(self, previous: dict[str, Any], columns: list[str], rows: Iterator[Any]) -> Iterator[Any]:
        """Keep the finished windows of the interrupted output; the rows still to classify."""

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
        window = self.plan.window
        keep_bytes, self.kept, self.failed, redo = plan_resume(out, self.out_fmt, columns, rows, window, complete_rows)
        self.kept_failed = self.failed
        truncate_to(out, keep_bytes)
        if previous.get("fitted_calibrator") and self.kept > 0:
            # The rows kept were calibrated with this prior: the rest must be too.
            self.fitted = previous["fitted_calibrator"]
            self.plan = self.plan.with_calibration(Calibrator.from_dict(self.fitted), "resume")
        return itertools.chain(redo, rows)

    def _on_fit(self, cal: Calibrator) -> None:

        self.fitted.update(cal.to_dict())
        if self.output is not None:
            write_manifest(self.output, self.settings, complete=False, fitted=self.fitted)

    def _write(self, rows: Iterator[Any], columns: list[str], append: bool, calib: Any) -> tuple[Any, Progress]:
        """Classify, calibrate and write every row in input order, error rows in their places."""

        writer = Writer(self.output or self.stream, columns, self.out_fmt, append=append)
        pending: deque = deque()
        progress = Progress(self.plan.quiet)

        def texts() -> Iterator[str]:
            for row in rows:
                pending.append(row)
                if row.error is None:
                    yield row.item

        def flush_errors() -> None:
            while pending and pending[0].error is not None:
                writer.write(result_record(pending.popleft(), None))
                self.failed += 1
                progress.tick()

        clf = self.clf
        run = self._ray_run(list(texts())) if self.dist.ray else clf.run(texts(), window=self.plan.window)
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
        from .. import ray as mray  # lazy: the ray extra is optional

        stats, dist = Stats(), self.dist
        # The workers get the plan (its task file's object left here: what it says is in the plan).
        plan = self.plan.portable()

        def gen() -> Iterator[Any]:
            for p in mray.predictions(
                texts,
                plan,
                concurrency=dist.workers,
                threads_per_worker=dist.worker_threads,
                weights_sha256=self.clf.engine.weights_sha256,
            ):
                stats.items += 1
                stats.errors += not p.ok
                stats.prompt_tokens += p.n_tokens
                yield p

        return Run(gen(), stats)

    def _summary(self, run: Any, calib: Any, done: int) -> None:
        clf, kept, kept_failed, say = self.clf, self.kept, self.kept_failed, self.say
        if kept and done == 0:
            say(
                f"mlx-slm: {self.output} was complete already: {kept} rows ({kept_failed} errors) kept, "
                "nothing left to classify"
            )
            return
        kept_note = f"; {kept} rows kept from the interrupted run ({kept_failed} errors)" if kept else ""
        s = run.stats
        head = (
            f"mlx-slm: {done} rows ({self.failed - kept_failed} errors"
            + (f", {self.abstained} abstained" if self.plan.min_confidence is not None else "")
            + f") in {s.seconds:.1f} s, {s.items_per_s:.2f} items/s; "
        )
        if self.dist.ray:
            where = self.dist.address or "a local Ray"
            say(
                head + f"{self.dist.workers} Ray worker(s) on {where}, {s.prompt_tokens:,} prompt tokens; "
                f"{clf.mode} scoring; {plans.describe(self.plan, calib)}" + kept_note
            )
            return
        say(
            head + f"{s.processed_tokens:,} tokens processed, padding {s.padding_pct:.1f} %, "
            f"prefix {len(clf.prefix) if clf.prefix else 0} tokens, cache saved {s.prefix_saved_tokens:,} tokens "
            f"({s.prefix_saved_pct:.1f} % of {s.prompt_tokens:,}); {clf.mode} scoring; {plans.describe(self.plan, calib)}"
            + kept_note
        )
