"""A decide job: a file of states to a file of typed answers, as `mlx-slm decide` runs it.

Each input row's state (its `state` field, else `text`: a string, a JSON object or an
array) is asked every question of a questions file (System One's `questions` object, an
OpenAI `questions` list, or a whole request body of either, read by `text.decisions`), in
one pass through a `Decider` (the state's tokens once, each question a branch). One output
row per input row, in input order: `{"id", "answers": {...}}` in System One's shape, or
OpenAI's answer list (`--shape openai`); a row that cannot be answered is an error row as
`classify` writes it (`{"id", "line", "error"}`, naming the row and the field).

The rest is `classify`'s machinery, reused: the readers, the output writers and their lock
and manifest (`--resume` continues an output of the same input and settings, byte for
byte: requests go to the Decider in windows of `window` states, and a resumed run starts
again at the last unfinished window), `--shard I/N` (a slice of about 1/N of the states'
characters, cut where a window starts; `mlx-slm merge` joins the parts) and `--ray`
(`ray.decisions`: one Decider per worker). A task saved by `eval --decisions --fit
--save-task` gives the model, the questions and a temperature per question; raw answers
are the default and stay exact (no temperature is applied unless a task gives one).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.decider import Decider, applied_temperatures
from ..classifier.task import Task, decision_temperatures
from ..engine import Engine
from ..files.output import (
    InputDigest,
    OutputError,
    OutputLock,
    Writer,
    changed_settings,
    check_run_files,
    input_changed,
    is_plain_file_target,
    plan_resume,
    read_manifest,
    truncate_to,
    write_manifest,
)
from ..files.output import output_format as output_format_of
from ..files.readers import STATE_OPTIONS, ReadSpec, Row, read_rows
from ..files.sharding import check_shard_count, shard_range, shard_settings
from ..ground.errors import UsageError, UserError
from ..ground.textfiles import InputError
from ..text.decisions import (
    DecisionConfig,
    DecisionError,
    DecisionQuestion,
    DecisionRequest,
    load_questions_file,
    openai_answer,
    questions_of,
    refusal,
    systemone_answer,
    text,
)
from ..text.decisions import (
    state_problem as decision_state_problem,
)
from ..weights.registry import DEFAULT_MODEL, ModelRef
from .classify import Distribution, Progress, _check_io, ray_init
from .plan import Say

SHAPES = ("systemone", "openai")
DEFAULT_WINDOW = 64  # states handed to the Decider at once (and the unit --resume restarts at)
STATE_FIELDS = ("state", "text")  # a row's state: the first of these it has


@dataclass
class DecideSettings:
    """One decide run: the states, the questions, where the answers go, and how the work is spread.
    `given`: the parameter names set on the command line (a --task fills in the model and questions)."""

    input: str = "-"
    questions_file: str | None = None
    output: str | None = None
    output_format: str | None = None
    shape: str = "systemone"
    model: str = DEFAULT_MODEL
    task_file: str | None = None
    resume: bool = False
    shard: str | None = None
    ray: bool = False
    ray_address: str | None = None
    workers: int = 1
    worker_threads: int | None = None
    fmt: str | None = None
    state_field: str | None = None  # None: "state", else "text"
    id_field: str = "id"
    state_column: str | None = None  # CSV/TSV: None: "state" if the header has it, else "text"
    id_column: str = "id"
    window: int = DEFAULT_WINDOW
    state_cache: int = 64
    dtype: str | None = None
    quiet: bool = False
    given: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Questions:
    """The questions asked of every state, as read (`raw`: the JSON value, recorded in the manifest
    and in a saved task), the task's own questions and their fitted temperatures by key (empty:
    raw answers). Which apply is the `Decider`'s rule (`Decider.temperature`): a task's
    temperature only for the very question it was fitted for."""

    raw: Any
    questions: tuple[DecisionQuestion, ...]
    own: tuple[DecisionQuestion, ...] = ()
    temperatures: dict[str, float] = field(default_factory=dict)

    @property
    def applied(self) -> dict[str, float]:
        """The temperatures that apply to the asked questions (the Decider's rule), by key."""
        return applied_temperatures(self.questions, self.own, self.temperatures)


def read_questions(path: str | None, task: Task | None, config: DecisionConfig) -> Questions:
    """--questions FILE, or the task's (with the task's questions and temperatures)."""
    if path is None and (task is None or not task.decisions):
        raise UsageError("give the questions: --questions Q.json (or a --task saved with eval --decisions --save-task)")
    own: tuple[DecisionQuestion, ...] = ()
    if task is not None and task.decisions:
        own = questions_of(task.decisions["questions"], config)
    if path is None:
        assert task is not None and task.decisions
        raw, questions = task.decisions["questions"], own
    else:
        raw, questions = load_questions_file(path, config)
    temps = dict((task.decisions or {}).get("temperatures") or {}) if task is not None else {}
    return Questions(raw, questions, own, temps)


def decision_config(model: str, converted: Any) -> DecisionConfig:
    """The model's decision settings: the folder given's `decision.json` (+ template) where it has
    one (a Hugging Face folder keeps them beside its weights), else the converted folder's, else
    Transformers' defaults."""
    own = Path(str(model)).expanduser()
    if own.is_dir() and any((own / f).is_file() for f in ("decision.json", "decision_template.jinja")):
        return DecisionConfig.from_folder(own)
    return DecisionConfig.from_folder(converted if converted is not None and Path(converted).is_dir() else None)


def state_problem(row: Row) -> str | None:
    """Why a row's state cannot be asked (not a string, object or array; nested too deep; not
    valid Unicode), in the words of the decision reader, or None."""
    bad = decision_state_problem(row.text, ("state",))
    return None if bad is None else f"line {row.line}: {bad}"


def answers(qs: Sequence[DecisionQuestion], probs: Sequence[np.ndarray], shape: str, keyed: bool = False) -> Any:
    """One state's answers in `shape`: System One's {key: answer}, or OpenAI's list in question order
    (`keyed`: the questions are a System One object, so each answer's `name` is its key)."""
    if shape == "openai":  # a question the state leaves no room for is OpenAI's refusal (the Decider gives None)
        return [
            {
                **(refusal(q) if p is None else openai_answer(q, p)),
                **({"name": q.key} if keyed and q.name is None else {}),
            }
            for q, p in zip(qs, probs)
        ]
    return {q.key: systemone_answer(q, p) for q, p in zip(qs, probs)}


def decide(s: DecideSettings, say: Say) -> int:
    """Check the settings, lock the output and run; the number of error rows in the whole output."""
    if s.shape not in SHAPES:
        raise UsageError(f"--shape {s.shape!r}: one of {', '.join(SHAPES)}")
    out_fmt = output_format_of(s.output, s.output_format)
    file_out = is_plain_file_target(s.output)
    _check_io(s, out_fmt, file_out)
    reads = [
        (flag, p)
        for flag, p in (("INPUT", s.input), ("--questions", s.questions_file), ("--task", s.task_file))
        if p is not None
    ]
    check_run_files(reads, [("-o", s.output if file_out else None)])
    dist = Distribution(s.shard, s.ray or s.ray_address is not None, s.ray_address, s.workers, s.worker_threads)
    if dist.shard is not None and not file_out:
        raise UsageError("--shard needs -o FILE: each shard writes its own part (joined by `mlx-slm merge`)")
    if dist.shard is not None and s.input == "-":
        raise UsageError("--shard needs an input file: every shard reads the whole input to find its slice")
    task = Task.load(s.task_file) if s.task_file else None
    if task is not None and "model" not in s.given:
        s = replace(s, model=task.model)
    read_questions(s.questions_file, task, DecisionConfig())  # a bad questions file: exit 2 before the model loads
    if dist.ray:
        ray_init(dist.address, say)
    with ExitStack() as stack:
        if file_out:
            stack.enter_context(OutputLock(s.output, create=out_fmt != "parquet"))  # type: ignore[arg-type]
        return DecideJob(s, task, s.output if file_out else None, out_fmt, dist, say).run()


class DecideJob:
    """One file-to-file run with its output locked (see the module's docstring)."""

    def __init__(
        self, s: DecideSettings, task: Task | None, output: str | None, out_fmt: str, dist: Distribution, say: Say
    ):
        self.s, self.task, self.output, self.out_fmt, self.dist, self.say = s, task, output, out_fmt, dist, say
        self.failed = self.kept = self.kept_failed = 0
        self.input_tokens = self.cached_tokens = 0
        self.settings: dict[str, Any] = {}

    def run(self) -> int:
        s = self.s
        digest = InputDigest(s.input) if self.output is not None else None
        previous = self._previous()
        rows = self._rows()
        engine = Engine.load(ModelRef(s.model, s.dtype))
        weights = engine.weights_sha256
        config = decision_config(s.model, engine.path)
        qs = read_questions(s.questions_file, self.task, config)
        if qs.applied:
            decision_temperatures(self.task, weights)  # a task fitted on other weights: refused
        decider = Decider(
            engine, config, state_cache=s.state_cache, calibration=qs.temperatures or None, calibration_questions=qs.own
        )
        shard_info = None
        if self.dist.shard is not None:
            rows, shard_info = self._shard_rows(rows)
        if self.output is not None:
            sha, not_hashed = digest.result() if digest is not None else (None, None)
            self.settings = self._manifest_settings(weights, qs, decider, sha, not_hashed, shard_info)
        columns = ["id", "answers", "line", "error"]
        if previous is not None:
            rows = self._plan_resume(previous, columns, rows)
        if self.output is not None:
            write_manifest(self.output, self.settings, complete=False)
        t0 = time.perf_counter()
        done = self._write(rows, columns, previous is not None, decider, qs)
        if self.output is not None:
            write_manifest(self.output, self.settings, complete=True, rows=self.kept + done)
        if not s.quiet:
            self._summary(done, time.perf_counter() - t0, qs)
        return self.failed

    # ------------------------------------------------------------------ rows in
    def _rows(self) -> Iterator[Row]:
        """The input's rows, each state checked (a state the decision reader refuses is an error row
        here, so windows count the same states in every run); the first read now, before the model
        loads (a CSV without the state column fails here)."""
        s = self.s
        states = (s.state_field,) if s.state_field else STATE_FIELDS
        column, opts = s.state_column or "state", {"states": states, "text_options": STATE_OPTIONS}
        try:
            it = read_rows(s.input, ReadSpec(s.fmt, states[0], s.id_field, column, s.id_column, **opts))
            first = next(it, None)
        except InputError:
            if s.state_column is not None or s.input == "-":
                raise
            column = "text"  # a CSV whose header names no state column: its text column is the state
            it = read_rows(s.input, ReadSpec(s.fmt, states[0], s.id_field, column, s.id_column, **opts))
            first = next(it, None)
        self.fields = [states[0], s.id_field, column, s.id_column]
        every = itertools.chain([first] if first is not None else [], it)
        checked = (r if r.error is not None else replace(r, error=state_problem(r)) for r in every)
        if self.dist.shard is not None:
            listed = list(checked)
            check_shard_count(self.dist.shard[1], len(listed), f"the input {s.input}")
            return iter(listed)
        return checked

    def _shard_rows(self, rows: Iterator[Row]) -> tuple[Iterator[Row], dict[str, Any]]:
        """The rows of one shard (cut by the states' characters, where a window starts)."""
        every = list(rows)
        counts = [None if r.error is not None else len(text(r.text)) for r in every]
        i, n = self.dist.shard  # type: ignore[misc]
        start, end = shard_range(counts, self.s.window, n, i)
        if not self.s.quiet:
            what = f"input rows {start + 1}..{end}" if end > start else "no rows (fewer windows than shards)"
            self.say(f"mlx-slm: shard {i}/{n}: {what} of {len(every)}")
        return iter(every[start:end]), shard_settings(i, n, (start, end), len(every))

    # ------------------------------------------------------------------ the manifest and --resume
    def _manifest_settings(
        self,
        weights: str | None,
        qs: Questions,
        decider: Any,
        sha: str | None,
        not_hashed: str | None,
        shard_info: dict[str, Any] | None,
    ) -> dict[str, Any]:
        s = self.s
        inp = Path(s.input).resolve() if s.input != "-" else None
        return {
            "weights_sha256": weights,
            "form": "decisions",
            "labels": [],
            "decision_questions": qs.raw,  # (not "questions": a classify run's, read as its columns)
            "shape": s.shape,
            "temperatures": qs.applied,
            "decision_config": _config_record(decider.config),
            "dtype": decider.engine.compute_dtype,
            "input": str(inp) if inp else "-",
            "input_size": inp.stat().st_size if inp else None,
            "input_sha256": sha,
            **({"input_not_hashed": not_hashed} if not_hashed else {}),
            "input_format": s.fmt,
            "fields": self.fields,
            "output_format": self.out_fmt,
            "window": s.window,
            "model": s.model,
            **({"shard": shard_info} if shard_info else {}),
        }

    def _previous(self) -> dict[str, Any] | None:
        out = self.output
        if not (self.s.resume and out is not None and Path(out).exists()):
            return None
        previous = read_manifest(out)
        if previous is None and Path(out).stat().st_size > 0:
            raise OutputError(
                f"{out} has no {Path(out).name}.mlx-slm.json record, so it was not written by mlx-slm decide: "
                "not resuming into it, and it is left untouched (start again without --resume, or choose another -o)"
            )
        return previous

    def _plan_resume(self, previous: dict[str, Any], columns: list[str], rows: Iterator[Row]) -> Iterator[Row]:
        out = self.output
        assert out is not None
        old = previous["settings"]
        changed = input_changed(self.s.input, old, (self.settings["input_sha256"], self.settings["input_size"]))
        if changed:
            raise OutputError(f"cannot --resume {out}: {changed}; start again without --resume")
        diff = [k for k in changed_settings(old, self.settings) if k != "model"]
        if diff:
            detail = "; ".join(f"{k}: was {old.get(k)!r}, now {self.settings.get(k)!r}" for k in diff[:3])
            raise OutputError(
                f"cannot --resume {out}: it was made with other settings ({detail}); "
                "run with the same options, or start again without --resume"
            )
        complete = previous.get("rows") if previous.get("complete") else None
        keep, self.kept, self.failed, redo = plan_resume(out, self.out_fmt, columns, rows, self.s.window, complete)
        self.kept_failed = self.failed
        truncate_to(out, keep)
        return itertools.chain(redo, rows)

    # ------------------------------------------------------------------ answering and writing
    def _write(self, rows: Iterator[Row], columns: list[str], append: bool, decider: Any, qs: Questions) -> int:
        """Answer and write every row in input order, error rows in their places; the rows written."""
        writer = Writer(self.output or self.s.output, columns, self.out_fmt, append=append)
        progress = Progress(self.s.quiet)
        finished = False
        try:
            for rec in self._records(rows, decider, qs):
                self.failed += "error" in rec
                writer.write(
                    rec
                    if self.out_fmt == "jsonl" or "error" in rec
                    else {**rec, "answers": json.dumps(rec["answers"], ensure_ascii=False)}
                )
                progress.tick()
            finished = True
        finally:
            writer.close(complete=finished)
            progress.done()
        return progress.n

    def _records(self, rows: Iterator[Row], decider: Any, qs: Questions) -> Iterator[dict[str, Any]]:
        """Each row's record, windows of `window` states answered at once (Ray: every state, spread)."""
        if self.dist.ray:
            yield from self._ray_records(list(rows), decider, qs)
            return
        pending: list[Row] = []
        for row in rows:
            pending.append(row)
            if sum(r.error is None for r in pending) == self.s.window:
                yield from self._window(pending, decider, qs)
                pending = []
        yield from self._window(pending, decider, qs)

    def _window(self, rows: list[Row], decider: Any, qs: Questions) -> Iterator[dict[str, Any]]:
        ok = [r for r in rows if r.error is None]
        got = dict(zip((id(r) for r in ok), self._answer(ok, decider, qs)))
        for r in rows:
            yield error_record(r, r.error) if r.error is not None else got[id(r)]

    def _answer(self, rows: list[Row], decider: Any, qs: Questions) -> list[dict[str, Any]]:
        """The records of rows whose states are fine; a request the Decider refuses (a state too long
        for the model) is run again alone, so only its own row is an error row."""
        if not rows:
            return []
        requests = [DecisionRequest(r.text, qs.questions, self.s.model, None, self.s.shape) for r in rows]
        try:
            results = decider.decide(requests)
        except DecisionError:
            if len(rows) == 1:
                raise
            out = []
            for r in rows:
                try:
                    out += self._answer([r], decider, qs)
                except DecisionError as e:
                    out.append(error_record(r, f"line {r.line}: {e.msg if hasattr(e, 'msg') else e}"))
            return out
        return [self._record(r, res, qs) for r, res in zip(rows, results)]

    def _record(self, row: Row, res: Any, qs: Questions) -> dict[str, Any]:
        self.input_tokens += res.input_tokens
        self.cached_tokens += res.cached_tokens
        return {
            "id": row.id,
            "answers": answers(qs.questions, res.probabilities, self.s.shape, isinstance(qs.raw, dict)),
        }

    def _ray_records(self, rows: list[Row], decider: Any, qs: Questions) -> Iterator[dict[str, Any]]:
        """Every state answered on Ray workers (one Decider each), in input order."""
        from .. import ray as mray  # lazy: the ray extra is optional

        got = mray.decisions(
            [r.text for r in rows if r.error is None],
            qs.raw,
            qs.applied,
            {"model": ModelRef(self.s.model, self.s.dtype), "state_cache": self.s.state_cache},
            _config_record(decider.config, whole=True),
            concurrency=self.dist.workers,
            threads_per_worker=self.dist.worker_threads,
            weights_sha256=self.settings.get("weights_sha256"),
        )
        for r in rows:
            if r.error is not None:
                yield error_record(r, r.error)
                continue
            probs, err, n_in, n_cached = next(got)
            if err is not None:
                yield error_record(r, f"line {r.line}: {err}")
                continue
            self.input_tokens += n_in
            self.cached_tokens += n_cached
            ps = [np.asarray(p, dtype=np.float64) for p in probs]
            yield {"id": r.id, "answers": answers(qs.questions, ps, self.s.shape, isinstance(qs.raw, dict))}

    def _summary(self, done: int, seconds: float, qs: Questions) -> None:
        if self.kept and done == 0:
            self.say(f"mlx-slm: {self.output} was complete already: {self.kept} rows ({self.kept_failed} errors) kept")
            return
        kept = f"; {self.kept} rows kept from the interrupted run ({self.kept_failed} errors)" if self.kept else ""
        rate = done / seconds if seconds > 0 else 0.0
        temps = f"temperatures from the task for {len(qs.applied)} question(s)" if qs.applied else "raw"
        self.say(
            f"mlx-slm: {done} rows ({self.failed - self.kept_failed} errors) in {seconds:.1f} s, {rate:.2f} states/s; "
            f"{len(qs.questions)} question(s) a state, {self.input_tokens:,} input tokens "
            f"({self.cached_tokens:,} from the state cache); answers {temps}" + kept
        )


def error_record(row: Row, error: str | None) -> dict[str, Any]:
    """An error row as classify writes it: the id, the line, and why (naming the line)."""
    err = error or "not processed"
    return {"id": row.id, "line": row.line, "error": err if err.startswith("line ") else f"line {row.line}: {err}"}


def _config_record(config: DecisionConfig, whole: bool = False) -> dict[str, Any]:
    """The decision settings that change answers, as JSON: for the manifest (--resume and merge
    compare them; a template by its presence), or `whole` (a Ray worker's DecisionConfig fields)."""
    template: Any = config.chat_template if whole else config.chat_template is not None
    return {
        "labels": {k: list(v) for k, v in config.labels.items()},
        "temperature": dict(config.temperature),
        "noul_options": list(config.noul_options),
        "chat_template": template,
        "sanitize_control_tokens": config.sanitize_control_tokens,
    }


__all__ = ["DecideSettings", "Questions", "SHAPES", "UserError", "answers", "decide", "read_questions"]
