"""A classify job: one input file to one output, as `mlx-slm classify` runs it.

The options are resolved once into a `classifier.Plan` (`plan.resolve`, shared with every
command); here is only the file-to-file run: `ClassifyJob` gives the file run (`jobs.filerun`:
the manifest, shard and resume plan and the writer loop) classify's pieces: how the rows are
read, what the manifest records, a resumed prior, the rows classified (here or on Ray workers)
and calibrated; then the task saved and the summary.
It reads the plan and never changes it: a prior a resumed run keeps is a new plan
(`Plan.with_calibration`). Nothing here knows about click: user errors are `UserError`s
(`UsageError` for options that do not go together); notes and the summary go to `say` (the
CLI's `cli.base.notice`), and only the live progress line on a terminal is written here.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from ..classifier.classifier import Run
from ..files.output import OutputLock, check_run_files, files_read, is_plain_file_target, result_record
from ..files.output import output_format as output_format_of
from ..files.readers import read_rows
from ..ground.errors import UsageError
from ..text.calibration import Calibrator
from ..text.predictions import Stats
from . import plan as plans
from .filerun import (  # noqa: F401 (Progress, ray_init and RAY_INIT_TIMEOUT_S: their old home)
    RAY_INIT_TIMEOUT_S,
    Distribution,
    FileRun,
    Progress,
    Where,
    check_io,
    ray_init,
)
from .plan import Plan, Say, TaskOptions, flag_names  # noqa: F401 (their old home)


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
    check_io(s.input, s.output, s.resume, out_fmt, file_out)
    # No output may be a file the run reads (the one table of them: output.runfiles), before any is read.
    reads = files_read(s.task, ("INPUT", s.input))
    check_run_files(reads, [("-o", s.output if file_out else None), ("--save-task", s.task.save_task)])
    dist = Distribution(s.shard, s.ray or s.ray_address is not None, s.ray_address, s.workers, s.worker_threads)
    dist.check(s.input, file_out)
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


class ClassifyJob:
    """One file-to-file run with its output locked (a `FileRun` with classify's pieces): `run`
    returns the number of error rows in the whole output. It reads `plan`; what the run learns
    (the classifier, a resumed prior) is its own, the plan given is never changed."""

    command = "classify"
    changed_input = (
        ", so its rows are of the old content; start again without --resume (the whole input is classified "
        "again into {out})"
    )
    loose = ("model",)  # the same weights by another name or path
    all_rows = False
    group = None

    def __init__(self, plan: Plan, say: Say, where: Where, dist: Distribution | None = None):
        self.plan, self.say, self.where, self.dist = plan, say, where, dist or Distribution()
        self.clf: Any = None
        self.abstained = 0
        self.calib: Any = None
        self.pred_run: Any = None
        self.file = FileRun(self, where, plan.window, self.dist, say, plan.quiet)

    def run(self) -> int:
        done = self.file.run()
        plans.save_task(self.plan, self.clf, self.calib, self.say)
        if not self.plan.quiet:
            self._summary(self.pred_run, self.calib, done)
        return self.file.failed

    # ------------------------------------------------------------------ the pieces a FileRun takes
    def rows(self) -> Iterator[Any]:
        """The input's rows. The first one settles its format and header (a CSV without the text
        column raises here), before the model loads and before the output is touched."""
        rows = iter(read_rows(self.where.input, self.plan.read.for_input(self.where.input)))
        first = next(rows, None)
        return itertools.chain([first] if first is not None else [], rows)

    def load(self) -> None:
        self.plan, self.clf = plans.load_fitted(self.plan, self.say)
        self.extra = plans.settings(self.plan, self.clf)
        calibrated = self.extra["calibration"] != "none"
        self.shape = self.clf.spec.record_shape(calibrated=calibrated, abstains=self.plan.min_confidence is not None)

    def sizes(self, rows: list[Any]) -> list[int | None]:
        """Each row's tokens (None: an error row), batched through the fast tokenizer's own threads."""
        tok = self.clf.engine.tokenizer
        counts: list[int | None] = [None] * len(rows)
        valid = [i for i, r in enumerate(rows) if r.error is None]
        for k in range(0, len(valid), 4096):
            chunk = valid[k : k + 4096]
            ids = tok([rows[i].text for i in chunk], add_special_tokens=False)["input_ids"]
            for i, x in zip(chunk, ids):
                counts[i] = len(x)
        return counts

    def columns(self) -> list[str]:
        return self.shape.columns

    def settings(self) -> dict[str, Any]:
        """What the output's manifest records: --resume and merge accept only the same."""
        p, r, clf = self.plan, self.plan.read, self.clf
        assert p.model is not None
        return {
            "weights_sha256": clf.engine.weights_sha256,
            "system": p.system or None,
            "template": p.template,
            **self.extra,  # the kind's settings (labels, scoring, examples, ...) and the calibration
            "truncate": p.truncate,
            "dtype": clf.engine.compute_dtype,
            **({"quantized": clf.model.quantized} if getattr(clf.model, "quantized", None) else {}),
            **self.file.input_record(),
            "input_format": r.fmt,
            "fields": [r.text_field, r.id_field, r.text_column, r.id_column],
            "output_format": self.where.out_fmt,
            "batch_size": clf.batching.batch_size,
            "max_batch_tokens": clf.batching.max_batch_tokens,
            "window": p.window,
            "sort": p.sort,
            "prefix_cache": p.use_prefix_cache,
            "model": p.model.name,
        }

    def restore(self, previous: dict[str, Any], kept: int) -> None:
        if previous.get("fitted_calibrator") and kept > 0:
            # The rows kept were calibrated with this prior: the rest must be too.
            self.file.fitted = previous["fitted_calibrator"]
            self.plan = self.plan.with_calibration(Calibrator.from_dict(self.file.fitted), "resume")

    def _on_fit(self, cal: Calibrator) -> None:
        self.file.fitted.update(cal.to_dict())
        self.file.write_manifest(complete=False)

    def records(self, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        """Classify and calibrate every row in input order, error rows in their places."""
        calib = self.calib = plans.calibration_run(self.plan, self.clf, self._on_fit)
        pending: deque = deque()

        def texts() -> Iterator[str]:
            for row in rows:
                pending.append(row)
                if row.error is None:
                    yield row.item

        def errors() -> Iterator[dict[str, Any]]:
            while pending and pending[0].error is not None:
                yield result_record(pending.popleft(), None)

        run = self._ray_run(list(texts())) if self.dist.ray else self.clf.run(texts(), window=self.plan.window)
        self.pred_run = run
        for pred in calib(run):
            yield from errors()
            rec = result_record(pending.popleft(), pred, calib.method)
            self.abstained += bool(rec.get("abstained"))
            yield rec
        yield from errors()

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
        clf, kept, kept_failed, say = self.clf, self.file.kept, self.file.kept_failed, self.say
        if kept and done == 0:
            say(
                f"mlx-slm: {self.where.output} was complete already: {kept} rows ({kept_failed} errors) kept, "
                "nothing left to classify"
            )
            return
        kept_note = f"; {kept} rows kept from the interrupted run ({kept_failed} errors)" if kept else ""
        s = run.stats
        head = (
            f"mlx-slm: {done} rows ({self.file.failed - kept_failed} errors"
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
