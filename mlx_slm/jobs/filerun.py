"""One file run, shared by every job that reads an input file and writes one output of it:
`classify`, `decide`, `embed` and `rerank`.

`FileRun` is what they all repeat: the output's manifest read back (`--resume` refuses an output
mlx-slm did not write), the input's sha256 hashed while the model loads, the shard's slice
(`--shard I/N`: about 1/N of the input's weight, cut where a window starts; `mlx-slm merge` joins
the parts), the resume plan (an input edited since, other settings or a manifest of before are
refused, naming the fix; the finished windows are kept and the file cut back to the start of the
last unfinished one, so a resumed output equals an uninterrupted one byte for byte), the manifest
written incomplete and then complete, and the writer loop (every record written and flushed in
input order, the live progress line, error rows counted).

A job plugs its own pieces in (`FileJob`): how its input is read and in which form (rows, or a
rerank's queries), how much each weighs for a shard, how the model loads, what its manifest
records, what a resumed run takes back from the manifest (classify's fitted prior, decide's batch
priors), and how its records are made, window by window. The output is one row per input row
(`plan_resume`), or, for a job whose units give several rows (`FileJob.group`: a rerank query's
ranked documents), the rows of each unit in turn (`plan_group_resume`).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..files.output import (
    InputDigest,
    OutputError,
    Writer,
    changed_settings,
    input_changed,
    plan_group_resume,
    plan_resume,
    read_manifest,
    truncate_to,
    write_manifest,
)
from ..files.sharding import check_shard_count, parse_shard, shard_range, shard_settings
from ..ground.errors import UsageError, UserError

Say = Callable[[str], None]
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
    """Where a run's work goes: a shard of the input, and/or Ray workers."""

    shard_spec: str | None = None
    ray: bool = False
    address: str | None = None
    workers: int = 1
    worker_threads: int | None = None

    def __post_init__(self) -> None:

        self.shard = parse_shard(self.shard_spec) if self.shard_spec else None
        if not self.ray and (self.workers != 1 or self.worker_threads is not None):
            raise UsageError("--workers and --worker-threads are for --ray (or --ray-address)")

    def check(self, input: str, file_out: bool) -> None:
        """A shard writes its own part (-o FILE) of an input file it reads whole."""
        if self.shard is not None and not file_out:
            raise UsageError("--shard needs -o FILE: each shard writes its own part (joined by `mlx-slm merge`)")
        if self.shard is not None and input == "-":
            raise UsageError("--shard needs an input file: every shard reads the whole input to find its slice")


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


PARQUET_NO_RESUME = (
    "--resume does not work with Parquet output: a Parquet file is written whole when the run ends, so "
    "an interrupted run leaves no rows to continue from. For a resumable run write .jsonl (then convert), "
    "or run --shard parts and join them with `mlx-slm merge ... -o all.parquet`"
)


def check_io(input: str, output: str | None, resume: bool, out_fmt: str, file_out: bool) -> None:
    """The input exists; --resume and Parquet have the output they need."""
    if input != "-" and not Path(input).exists():
        raise UsageError(f"input file {input!r} does not exist")
    if resume and not file_out:
        raise UsageError("--resume needs -o FILE, a regular file (the output to continue)")
    if resume and input == "-":
        raise UsageError("--resume needs an input file: standard input cannot be read again to check it")
    if out_fmt == "parquet" and not file_out:
        raise UsageError("Parquet output needs -o FILE.parquet (a regular file): it is written whole, not streamed")
    if out_fmt == "parquet" and resume:
        raise UsageError(PARQUET_NO_RESUME)


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


class FileJob(Protocol):
    """What a job plugs into a `FileRun`. Its attributes: `command` (named in the messages: "not
    written by mlx-slm classify"), `changed_input` (what the refusal of an edited input adds after
    the change, `{out}` the output), `loose` (the manifest settings a resumed run may differ in:
    "model", a name or a path of the same weights), `all_rows` (a window counts every input row,
    error rows too, as `embed` always cut them; else only the rows that run) and `group` (None: one
    output row per input row; else the field naming each output row's unit, and `unit_of(unit)`
    its (id, alone) for `plan_group_resume`). A job may also have `said_change(key, was, now)`: a
    setting that differs from the interrupted run's in words (None: as recorded)."""

    command: str
    changed_input: str
    loose: tuple[str, ...]
    all_rows: bool
    group: str | None

    def rows(self) -> Iterator[Any]:
        """The input's units (`readers.Row`s, or a rerank's queries); the first read before the
        model loads, so a bad input fails before anything is loaded or written."""
        ...

    def load(self) -> None:
        """Load the model (and what is fitted before the run)."""

    def sizes(self, rows: list[Any]) -> list[int | None]:
        """Each unit's weight for a shard's slice (tokens, characters); None: it does not run."""
        ...

    def settings(self) -> dict[str, Any]:
        """The job's manifest settings (`FileRun.input_record` spliced in where it records them)."""
        ...

    def columns(self) -> list[str]:
        """The output's columns (a CSV/TSV header)."""
        ...

    def restore(self, previous: dict[str, Any], kept: int) -> None:
        """What a resumed run takes back from the interrupted run's manifest (`kept` rows kept)."""

    def records(self, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        """Every output record, in input order (error rows in their places)."""
        ...


class FileRun:
    """One job's file run (see the module's docstring): `run` returns the output rows it wrote;
    `failed`, `kept` and `kept_failed` count the whole output's error rows, the rows kept from an
    interrupted run and their error rows; `settings` and `fitted` are what the manifest records."""

    def __init__(self, job: FileJob, where: Where, window: int, dist: Distribution, say: Say, quiet: bool):
        self.job, self.where, self.window, self.dist, self.say, self.quiet = job, where, window, dist, say, quiet
        self.input, self.output = where.input, where.output
        self.settings: dict[str, Any] = {}
        self.fitted: dict[str, Any] = {}  # a prior fitted on this input (classify's batch/em calibration)
        self.failed = self.kept = self.kept_failed = 0
        self.input_sha256: str | None = None
        self.input_not_hashed: str | None = None
        self.shard_info: dict[str, Any] | None = None
        self.seconds = 0.0  # the writing's (answering's) time
        self._writer: Writer | None = None
        self._open: Callable[[], Writer] | None = None  # the output's writer, made when the run starts writing

    def run(self) -> int:
        job = self.job
        digest = InputDigest(self.input) if self.output is not None else None  # hashed while the model loads
        previous = self._previous()
        rows = self._rows()
        job.load()
        if digest is not None:
            self.input_sha256, self.input_not_hashed = digest.result()
        if self.dist.shard is not None:
            rows = self._shard_rows(rows, self.dist.shard)
        columns = job.columns()
        if self.output is not None:
            self.settings = {**job.settings(), **({"shard": self.shard_info} if self.shard_info else {})}
        if previous is not None:
            rows = self._resume(previous, columns, rows)
        done = self._write(rows, columns, previous is not None)
        self.write_manifest(complete=True, rows=self.kept + done)
        return done

    def write_manifest(self, complete: bool, rows: int | None = None) -> None:
        """The manifest as the run stands (nothing without a file output). The first one a run writes
        (the job's, once its prior is fitted, or the first record's) starts the output: this run's
        from then on, an output of before replaced (see `_write`) before its manifest is: a run
        stopped in between leaves a manifest of a complete run beside fewer rows, which --resume
        refuses, never an output of before under this run's manifest."""
        if self._writer is None and self._open is not None:
            self._writer = self._open()
        if self.output is not None:
            write_manifest(self.output, self.settings, complete=complete, rows=rows, fitted=self.fitted or None)

    def input_record(self) -> dict[str, Any]:
        """The input as the manifest records it: its path, size and content (--resume, merge and
        eval --predictions refuse another)."""
        inp = Path(self.input).resolve() if self.input != "-" else None
        return {
            "input": str(inp) if inp else "-",
            "input_size": inp.stat().st_size if inp else None,
            "input_sha256": self.input_sha256,
            **({"input_not_hashed": self.input_not_hashed} if self.input_not_hashed else {}),
        }

    # ------------------------------------------------------------------ the input
    def _previous(self) -> dict[str, Any] | None:
        """The manifest of the output to resume, if any; an output that is not ours is refused."""
        out = self.output
        if not (self.where.resume and out is not None and Path(out).exists()):
            return None
        previous = read_manifest(out)
        if previous is None and Path(out).stat().st_size > 0:
            raise OutputError(
                f"{out} has no {Path(out).name}.mlx-slm.json record, so it was not written by mlx-slm "
                f"{self.job.command}: not resuming into it, and it is left untouched (start again without "
                "--resume, or choose another -o)"
            )
        return previous

    def _rows(self) -> Iterator[Any]:
        """The job's units; with --shard all of them, counted before the model loads (too many
        shards fail at once)."""
        rows = self.job.rows()
        if self.dist.shard is None:
            return rows
        listed = list(rows)
        check_shard_count(self.dist.shard[1], len(listed), f"the input {self.input}")
        return iter(listed)

    def _shard_rows(self, rows: Iterator[Any], shard: tuple[int, int]) -> Iterator[Any]:
        """The units of one shard; what the part's manifest records about it is `shard_info`."""
        every = list(rows)
        i, n = shard
        start, end = shard_range(self.job.sizes(every), self.window, n, i)  # O(rows) whatever N is
        if not self.quiet:
            what = f"input rows {start + 1}..{end}" if end > start else "no rows (fewer windows than shards)"
            self.say(f"mlx-slm: shard {i}/{n}: {what} of {len(every)}")
        self.shard_info = shard_settings(i, n, (start, end), len(every))
        return iter(every[start:end])

    # ------------------------------------------------------------------ --resume
    def _resume(self, previous: dict[str, Any], columns: list[str], rows: Iterator[Any]) -> Iterator[Any]:
        """Check the interrupted output against this run, keep its finished windows; the units still to run."""
        out = self.output
        assert out is not None
        old = previous["settings"]
        if "input_sha256" not in old:
            raise OutputError(
                f"cannot --resume {out}: it was made by an older mlx-slm that did not record its input's sha256, "
                "so the rows kept could not be checked against the input; start again without --resume"
            )
        changed = input_changed(self.input, old, (self.settings["input_sha256"], self.settings["input_size"]))
        if changed:
            raise OutputError(f"cannot --resume {out}: {changed}{self.job.changed_input.format(out=out)}")
        diff = [k for k in changed_settings(old, self.settings) if k not in self.job.loose]
        if diff:
            said = getattr(self.job, "said_change", None)  # a job may word its own settings (decide's methods)
            detail = "; ".join(
                (said and said(k, old.get(k), self.settings.get(k)))
                or f"{k}: was {_shown(old.get(k))}, now {_shown(self.settings.get(k))}"
                for k in diff[:3]
            )
            raise OutputError(
                f"cannot --resume {out}: it was made with other settings ({detail}); "
                "run with the same options, or start again without --resume"
            )
        complete = previous.get("rows") if previous.get("complete") else None
        fmt = self.where.out_fmt
        if self.job.group is None:
            keep, self.kept, self.failed, redo = plan_resume(
                out, fmt, columns, rows, self.window, complete, all_rows=self.job.all_rows
            )
        else:
            keep, self.kept, self.failed, redo = plan_group_resume(
                out,
                self.job.group,
                rows,
                self.job.unit_of,
                self.window,
                complete,  # type: ignore[attr-defined]
            )
        self.kept_failed = self.failed
        self.job.restore(previous, self.kept)  # before the file is cut: a manifest it cannot read leaves it as it is
        truncate_to(out, keep)
        return itertools.chain(redo, rows)

    # ------------------------------------------------------------------ writing
    def _write(self, rows: Iterator[Any], columns: list[str], append: bool) -> int:
        """Every record written in input order and flushed; the rows written. The manifest and the
        output are touched only once the run starts writing (the job records its fitted prior, or
        the first record is made): a run that fails before (a prior refused, the first window's
        answers) leaves an output already there, and its manifest, as they were."""
        t0 = time.perf_counter()
        self._open = lambda: Writer(self.output or self.where.stream, columns, self.where.out_fmt, append=append)
        progress = Progress(self.quiet)
        finished = False
        try:
            records = iter(self.job.records(rows))
            first = list(itertools.islice(records, 1))
            if self._writer is None:
                self.write_manifest(complete=False)  # (the job wrote none yet) the run starts writing
            assert self._writer is not None
            for rec in itertools.chain(first, records):
                self.failed += "error" in rec
                self._writer.write(rec)
                progress.tick()
            finished = True
        finally:
            if self._writer is not None:
                self._writer.close(complete=finished)  # an interrupted Parquet run writes no file
            progress.done()
            self.seconds = time.perf_counter() - t0
        return progress.n


def windows(rows: Iterator[Any], window: int, all_rows: bool = False) -> Iterator[list[Any]]:
    """The units in windows of `window` that run (error rows ride along in their places), or of
    `window` units whatever they are (`all_rows`): where --resume and --shard may cut."""
    pending: list[Any] = []
    n = 0
    for row in rows:
        pending.append(row)
        n += all_rows or row.error is None
        if n == window:
            yield pending
            pending, n = [], 0
    if pending:
        yield pending


def _shown(value: Any) -> str:
    """A manifest's setting as its JSON reads (null, true, "x"), cut short: what a refusal quotes."""
    got = json.dumps(value, ensure_ascii=False, default=str)
    return got if len(got) <= 300 else got[:300] + " ..."
