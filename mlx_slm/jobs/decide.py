"""A decide job: a file of states to a file of typed answers, as `mlx-slm decide` runs it.

Each input row's state (its `state` field, else `text`: a string, a JSON object or an
array) is asked every question of a questions file (System One's `questions` object, an
OpenAI `questions` list, or a whole request body of either, read by `text.decisions`), in
one pass through a `Decider` (the state's tokens once, each question a branch). One output
row per input row, in input order: `{"id", "answers": {...}}` in System One's shape, or
OpenAI's answer list (`--shape openai`); a row that cannot be answered is an error row as
`classify` writes it (`{"id", "line", "error"}`, naming the row and the field).

The run is one `DecisionPlan` (`plan.resolve_decisions`): the model, the questions, how each is
answered (a task's fitted or trained questions by digest; the run's `--style`, `--permute` and
`--calibrate`), the state cache and what is refused (`--refuse`: a question alone, which only
OpenAI's shape can say, or its whole row). Raw answers are the default and stay exact; any
other answer carries what made it (`x_method`) and its raw probabilities (`x_raw_...`).
`--calibrate batch` finds each question's prior on the run's first `--warmup` states (those
windows are answered, the prior fitted, then they are written), records it in the manifest,
and a resumed run applies the recorded prior.

The rest is the file run `classify`, `embed` and `rerank` share (`jobs.filerun`): the output's
lock and manifest (`--resume` continues an output of the same input and settings, byte for
byte: requests go to the Decider in windows of `window` states, the state cache starts empty
at every window, and a resumed run starts again at the last unfinished window, so each row's
bytes depend only on its window), `--shard I/N` (a slice of about 1/N of the states'
characters, cut where a window starts; `mlx-slm merge` joins the parts) and `--ray`
(`ray.decisions`: one Decider per worker, the plan and the priors shipped whole).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..classifier.decision_plan import DecisionPlan, asked
from ..engine.state_cache import STATE_CACHE
from ..files.output import (
    OutputError,
    OutputLock,
    check_run_files,
    is_plain_file_target,
)
from ..files.output import output_format as output_format_of
from ..files.readers import STATE_OPTIONS, ReadSpec, Row, read_rows
from ..ground.errors import UsageError, UserError
from ..ground.textfiles import InputError
from ..text.calibration import DEFAULT_WARMUP, CalibrationError, Calibrator
from ..text.decisions.answers import RAW_METHOD, answer
from ..text.decisions.checks import state_problem as decision_state_problem
from ..text.decisions.errors import DecisionError
from ..text.decisions.fitting import FitError, batch_prior
from ..text.decisions.methods import Methods, threshold_text, trained_phrase
from ..text.decisions.questions import DecisionQuestion, DecisionRequest, text
from ..weights.registry import DEFAULT_MODEL
from .filerun import Distribution, FileRun, Where, check_io, ray_init, windows
from .plan import DecisionOptions, Say, resolve_decisions

SHAPES = ("systemone", "openai")
DEFAULT_WINDOW = 64  # states handed to the Decider at once (and the unit --resume restarts at)
STATE_FIELDS = ("state", "text")  # a row's state: the first of these it has


@dataclass
class DecideSettings:
    """One decide run: the states, the questions, where the answers go, how they are made and how
    the work is spread. `given`: the parameter names set on the command line (a --task fills in
    the model and questions)."""

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
    state_cache: int = STATE_CACHE
    dtype: str | None = None
    keep_quantized: bool | None = None
    style: str = "letters"
    permute: int = 1
    calibrate: str = "none"
    warmup: int = DEFAULT_WARMUP
    refuse: str | None = None
    quiet: bool = False
    given: frozenset[str] = frozenset()

    def options(self) -> DecisionOptions:
        """The options that define the run's plan (`plan.resolve_decisions`)."""
        names = ("model", "dtype", "keep_quantized", "task_file", "questions_file", "style", "permute")
        own = {k: getattr(self, k) for k in (*names, "calibrate", "warmup", "state_cache", "refuse")}
        return DecisionOptions(**own, given=self.given)


def state_problem(row: Row) -> str | None:
    """Why a row's state cannot be asked (not a string, object or array; nested too deep; not
    valid Unicode), in the words of the decision reader, or None."""
    bad = decision_state_problem(row.text, ("state",))
    return None if bad is None else f"line {row.line}: {bad}"


def answers(
    qs: Sequence[DecisionQuestion],
    probs: Sequence[np.ndarray | None],
    shape: str,
    keyed: bool = False,
    raw: Sequence[np.ndarray | None] = (),
    applied: Sequence[Mapping[str, Any]] = (),
) -> Any:
    """One state's answers in `shape`: System One's {key: answer}, or OpenAI's list in question order
    (`keyed`: the questions are a System One object, so each answer's `name` is its key); with what
    made each answer where anything beyond the raw letters did (`text.decisions.answers.answer`)."""
    raw = raw or [None] * len(qs)
    applied = applied or [None] * len(qs)  # type: ignore[list-item]
    got = [answer(q, p, shape, r, a) for q, p, r, a in zip(qs, probs, raw, applied)]
    if shape == "openai":
        return [{**a, **({"name": q.key} if keyed and q.name is None else {})} for q, a in zip(qs, got)]
    return {q.key: a for q, a in zip(qs, got)}


def refusal_of(s: DecideSettings) -> str:
    """What the run refuses when a question does not fit (--refuse), by default what its output
    shape can say: OpenAI's shape a question alone (its refusal), System One's the whole row."""
    if s.refuse == "question" and s.shape != "openai":
        raise UsageError(
            "--refuse question needs --shape openai: System One's answers have no refusal, a row is answered "
            "whole or is an error row (--refuse request)"
        )
    return s.refuse or ("question" if s.shape == "openai" else "request")


def decide(s: DecideSettings, say: Say) -> int:
    """Check the settings, lock the output and run; the number of error rows in the whole output."""
    if s.shape not in SHAPES:
        raise UsageError(f"--shape {s.shape!r}: one of {', '.join(SHAPES)}")
    out_fmt = output_format_of(s.output, s.output_format)
    file_out = is_plain_file_target(s.output)
    check_io(s.input, s.output, s.resume, out_fmt, file_out)
    reads = [
        (flag, p)
        for flag, p in (("INPUT", s.input), ("--questions", s.questions_file), ("--task", s.task_file))
        if p is not None
    ]
    check_run_files(reads, [("-o", s.output if file_out else None)])
    dist = Distribution(s.shard, s.ray or s.ray_address is not None, s.ray_address, s.workers, s.worker_threads)
    dist.check(s.input, file_out)
    plan = replace(resolve_decisions(s.options()), refusal=refusal_of(s))  # a bad questions file: exit 2 now
    if dist.shard is not None and plan.prior == "batch":
        raise UsageError(
            "--shard with --calibrate batch would find a different prior on each shard (the parts would not "
            "merge): learn one prior first (mlx-slm eval SAMPLE --decisions Q.json --fit-prior --save-task "
            "task.json) and give every shard --task task.json"
        )
    if dist.ray:
        ray_init(dist.address, say)
    with ExitStack() as stack:
        if file_out:
            stack.enter_context(OutputLock(s.output, create=out_fmt != "parquet"))  # type: ignore[arg-type]
        return DecideJob(s, plan, s.output if file_out else None, out_fmt, dist, say).run()


class DecideJob:
    """One file-to-file run with its output locked (a `FileRun` with decide's pieces; see the
    module's docstring)."""

    command = "decide"
    changed_input = "; start again without --resume"
    loose = ("model", "priors")  # the same weights by another name; the priors are checked where they apply
    all_rows = False
    group = None

    def __init__(
        self, s: DecideSettings, plan: DecisionPlan, output: str | None, out_fmt: str, dist: Distribution, say: Say
    ):
        self.s, self.plan, self.output, self.out_fmt, self.dist, self.say = s, plan, output, out_fmt, dist, say
        self.input_tokens = self.cached_tokens = 0
        self.priors: dict[str, Calibrator] = {}
        where = Where(s.input, output, s.output, out_fmt, s.resume)
        self.file = FileRun(self, where, s.window, dist, say, s.quiet)

    def run(self) -> int:
        done = self.file.run()
        if not self.s.quiet:
            self._summary(done, self.file.seconds)
        return self.file.failed

    # ------------------------------------------------------------------ rows in
    def rows(self) -> Iterator[Row]:
        """The input's rows, each state checked (a state the decision reader refuses is an error row
        here, so windows count the same states in every run); the first read now, before the model
        loads (a CSV without the state column fails here)."""
        s = self.s
        states = (s.state_field,) if s.state_field else STATE_FIELDS
        spec = ReadSpec(s.fmt, states[0], s.id_field, s.state_column or "state", s.id_column, states=states)
        every, column = state_rows(s.input, replace(spec, text_options=STATE_OPTIONS), s.state_column is not None)
        self.fields = [states[0], s.id_field, column, s.id_column]
        return (r if r.error is not None else replace(r, error=state_problem(r)) for r in every)

    def load(self) -> None:
        self.engine = self.plan.engine()
        self.plan = self.plan.loaded(self.engine)
        self.decider = self.plan.decider(self.engine)

    def sizes(self, rows: list[Row]) -> list[int | None]:
        """Each state's characters (None: an error row)."""
        return [None if r.error is not None else len(text(r.text)) for r in rows]

    # ------------------------------------------------------------------ the manifest and --resume
    def columns(self) -> list[str]:
        return ["id", "answers", "line", "error"]

    def settings(self) -> dict[str, Any]:
        s, plan, engine = self.s, self.plan, self.engine
        return {
            "weights_sha256": engine.weights_sha256,
            "form": "decisions",
            "labels": [],
            "decision_questions": plan.raw_questions,  # (not "questions": a classify run's, read as its columns)
            # each question by its digest, in order: an option's order is the question's (a JSON object's key
            # order is not compared above), and the answers' keys follow the questions' order
            "decision_digests": [[q.key, q.digest] for q in plan.questions],
            "shape": s.shape,
            "refusal": plan.refusal,
            **plan.record(self.priors),
            "decision_config": plan.config.to_record(template=False),
            "dtype": engine.compute_dtype,
            **self.file.input_record(),
            "input_format": s.fmt,
            "fields": self.fields,
            "output_format": self.out_fmt,
            "window": s.window,
            "model": plan.model.name,  # the model loaded (a --task's, where --model was not given)
        }

    def said_change(self, key: str, was: Any, now: Any) -> str | None:
        """How this run's methods or questions differ from the interrupted run's, in the options' words."""
        if key == "decision_digests":
            if not (isinstance(was, list) and all(isinstance(x, list) and len(x) == 2 for x in was)):
                return "its manifest records no digest of each question (an older mlx-slm made it, or it was edited)"
            then, at = ({str(k): d for k, d in pairs} for pairs in (was, now))
            changed = [k for k in at if k in then and then[k] != at[k]]
            if changed:
                return f"question {changed[0]!r} differs (its options, their order, its wording or descriptions)"
            return f"the questions differ (then: {', '.join(then)[:120]}; now: {', '.join(at)[:120]})"
        return methods_change(was, now, self.plan.methods) if key == "methods" else None

    def restore(self, previous: dict[str, Any], kept: int) -> None:
        """The batch priors the interrupted run recorded: the rest is answered with them (rows written
        with a prior that the manifest no longer holds are refused: another prior would answer the rest)."""
        self.priors = _recorded_priors(previous, self.output)
        if self.plan.prior == "batch" and kept > 0:
            missing = [
                q.key
                for q in self.plan.questions
                if self.plan.methods.for_question(q)[0].prior == "batch" and q.digest not in self.priors
            ]
            if missing:
                raise OutputError(
                    f"cannot --resume {self.output}: {kept} row(s) were answered with a batch prior that its manifest "
                    f"does not record for question {missing[0]!r} (edited?); start again without --resume"
                )
        self.file.settings.update(self.plan.record(self.priors))

    # ------------------------------------------------------------------ answering
    def records(self, rows: Iterator[Row]) -> Iterator[dict[str, Any]]:
        """Every row's record as written (a CSV/TSV output holds the answers as JSON text)."""
        for rec in self._records(rows, self.decider):
            yield (
                rec
                if self.out_fmt == "jsonl" or "error" in rec
                else {**rec, "answers": json.dumps(rec["answers"], ensure_ascii=False)}
            )

    def _records(self, rows: Iterator[Row], decider: Any) -> Iterator[dict[str, Any]]:
        """Each row's record, windows of `window` states answered at once (Ray: every state, spread);
        with a batch prior to find, the first windows are answered, the prior fitted, then written."""
        if self.plan.prior == "batch" and not self.priors:
            rows = yield from self._warm_up(rows, decider)
        if self.dist.ray:
            yield from self._ray_records(list(rows))
            return
        for window in windows(rows, self.s.window):
            yield from self._window(window, decider)

    def _warm_up(self, rows: Iterator[Row], decider: Any) -> Any:
        """Answer windows until `warmup` states are answered, fit each question's batch prior on
        their raw answers, record it in the manifest, then yield those windows' records; the rows
        left (an iterator). The windows are those of an uninterrupted run: the bytes do not move."""
        done: list[tuple[list[Row], list[Any]]] = []
        n = 0
        every = windows(rows, self.s.window)
        for window in every:
            ok = [r for r in window if r.error is None]
            done.append((window, self._results(ok, decider)))
            n += sum(not isinstance(res, str) for res in done[-1][1])  # answered: an error row gives no answer
            if n >= self.plan.warmup:
                break
        results = [res for _, got in done for res in got if not isinstance(res, str)]
        failed = [r.error for w, _ in done for r in w if r.error] + [
            x for _, got in done for x in got if isinstance(x, str)
        ]
        self.priors = batch_priors(self.plan.questions, results, self.plan.warmup, self.plan.methods, failed)
        self.file.settings.update(self.plan.record(self.priors))
        self.file.write_manifest(complete=False)
        for window, got in done:  # answered before the prior was known: finished with it now
            yield from self._window_records(
                window, [r if isinstance(r, str) else decider.finish(r, self.priors) for r in got]
            )
        return itertools.chain.from_iterable(every)

    def _window(self, rows: list[Row], decider: Any) -> Iterator[dict[str, Any]]:
        ok = [r for r in rows if r.error is None]
        yield from self._window_records(rows, self._results(ok, decider))

    def _window_records(self, rows: list[Row], results: list[Any]) -> Iterator[dict[str, Any]]:
        ok = [r for r in rows if r.error is None]
        got = dict(zip((id(r) for r in ok), results))
        for r in rows:
            if r.error is not None:
                yield error_record(r, r.error)
                continue
            res = got[id(r)]
            yield error_record(r, res) if isinstance(res, str) else self._record(r, res)

    def _results(self, rows: list[Row], decider: Any) -> list[Any]:
        """The results of rows whose states are fine (a window: the state cache starts empty, so a
        row's answer depends on its window alone); a request the Decider refuses (a state too long
        for the model) is run again alone, so only its own row is an error (its message)."""
        if not rows:
            return []
        decider.states.clear()
        requests = [DecisionRequest(r.text, self.plan.questions, self.s.model, None, self.plan.refusal) for r in rows]
        try:
            return decider.decide(requests, self.priors)
        except DecisionError:
            if len(rows) == 1:
                raise
            out: list[Any] = []
            for r in rows:
                try:
                    out += self._results([r], decider)
                except DecisionError as e:
                    out.append(f"line {r.line}: {e.msg if hasattr(e, 'msg') else e}")
            return out

    def _record(self, row: Row, res: Any) -> dict[str, Any]:
        self.input_tokens += res.input_tokens
        self.cached_tokens += res.cached_tokens
        qs = self.plan.questions
        keyed = isinstance(self.plan.raw_questions, dict)
        return {
            "id": row.id,
            "answers": answers(qs, res.probabilities, self.s.shape, keyed, res.raw, res.applied),
        }

    def _ray_records(self, rows: list[Row]) -> Iterator[dict[str, Any]]:
        """Every state answered on Ray workers (one Decider each, from the plan), in input order."""
        from .. import ray as mray  # lazy: the ray extra is optional

        got = mray.decisions(
            [r.text for r in rows if r.error is None],
            self.plan,
            self.priors,
            concurrency=self.dist.workers,
            threads_per_worker=self.dist.worker_threads,
            weights_sha256=self.file.settings.get("weights_sha256"),
        )
        for r in rows:
            if r.error is not None:
                yield error_record(r, r.error)
                continue
            res, err = next(got)
            yield error_record(r, f"line {r.line}: {err}") if err is not None else self._record(r, res)

    def _summary(self, done: int, seconds: float) -> None:
        f = self.file
        if f.kept and done == 0:
            self.say(f"mlx-slm: {self.output} was complete already: {f.kept} rows ({f.kept_failed} errors) kept")
            return
        kept = f"; {f.kept} rows kept from the interrupted run ({f.kept_failed} errors)" if f.kept else ""
        rate = done / seconds if seconds > 0 else 0.0
        self.say(
            f"mlx-slm: {done} rows ({f.failed - f.kept_failed} errors) in {seconds:.1f} s, {rate:.2f} states/s; "
            f"{len(self.plan.questions)} question(s) a state, {self.input_tokens:,} input tokens "
            f"({self.cached_tokens:,} from the state cache); answers {describe_methods(self.plan, self.priors)}" + kept
        )


def state_rows(path: str, spec: ReadSpec, column_given: bool) -> tuple[Iterator[Row], str]:
    """A decision input's rows as `spec` reads them, and the CSV/TSV column its states came from:
    the one named (`column_given`), else "state" where the header has it, else "text" (decide,
    `eval --decisions` and `train --decisions` read one file alike). The first row is read now,
    so a CSV without the column fails before a model loads."""
    try:
        it = read_rows(path, spec)
        first = next(it, None)
    except InputError:
        if column_given or path == "-" or spec.text_column == "text":
            raise
        spec = replace(spec, text_column="text")  # a header naming no state column: its text column is the state
        it = read_rows(path, spec)
        first = next(it, None)
    return itertools.chain([first] if first is not None else [], it), spec.text_column


def methods_change(was: Any, now: Mapping[str, Any], methods: Methods) -> str | None:
    """Two runs' `DecisionPlan.record()["methods"]` apart, as the options and the task say them
    (None: a record of another shape, said as recorded)."""
    if not isinstance(was, Mapping) or not isinstance(was.get("default"), Mapping):
        return None
    out = []
    for flag, k in (("--style", "style"), ("--permute", "permute")):
        if k in was["default"] and was["default"][k] != now["default"].get(k):
            out.append(f"{flag} was {was['default'][k]}, now {now['default'].get(k)}")
    for flag, k in (("--calibrate", "prior"), ("--warmup", "warmup")):
        if k in was and was[k] != now.get(k):
            out.append(f"{flag} was {_or_unset(was[k])}, now {_or_unset(now.get(k))}")
    if "saved" in was:  # (else nothing recorded to compare)
        before, after = _saved_pairs(was["saved"]), _saved_pairs(now.get("saved"))
        if before is None:
            out.append("the task's fitted or trained questions were recorded otherwise")
        elif after is not None and before != after:
            out.append(_saved_change(before, after, {d: m.key for d, m in methods.saved.items()}))
    return "; ".join(out) or None


def _saved_pairs(saved: Any) -> dict[str, Any] | None:
    """A manifest's saved methods as {question digest: method digest}; None: another shape (a record of before)."""
    if not isinstance(saved, list) or not all(
        isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], str) for x in saved
    ):
        return None
    return dict((x[0], x[1]) for x in saved)


def _saved_change(before: Mapping[str, str], after: Mapping[str, str], keys: Mapping[str, str]) -> str:
    """How two runs' fitted or trained questions differ, by the questions' keys where this run knows them."""
    if not before:
        return "this run's task fits or trains questions, the interrupted run's answered them without"
    if not after:
        return "the interrupted run's task fitted or trained questions, this run answers them without"
    changed = [keys.get(d, d) for d in after if d in before and before[d] != after[d]]
    added = [keys.get(d, d) for d in after if d not in before]
    gone = sum(1 for d in before if d not in after)
    parts = [f"{', '.join(map(repr, changed))} fitted or trained again"] if changed else []
    parts += [f"{', '.join(map(repr, added))} newly fitted or trained"] if added else []
    parts += [f"{gone} fitted or trained question(s) no longer in it"] if gone else []
    return "the task's questions differ: " + ", ".join(parts)


def _or_unset(v: Any) -> Any:
    return "unset" if v is None else v


def method_words(r: Mapping[str, Any], n: int | None = None) -> str:
    """One question's method record (`Method.record`, with a `note` where it changed) in words:
    raw, or what made its answers (`n`: the states a run's batch prior came from)."""
    # a trained answer is asked as it was trained (its phrase says so), not as the run chose
    what = [] if r["style"] == "letters" or r.get("trained") else [f"{r['style']} style"]
    what += [] if r["permute"] == 1 or r.get("trained") else [f"{r['permute']} orders"]
    cal = r["calibration"]
    if cal != "none":
        src = (
            "fitted"
            if r.get("fitted_as")
            else f"prior from the first {n} states"
            if cal == "batch" and n is not None
            else ""
        )
        what.append(f"{cal} calibration" + (f" ({src})" if src else ""))
    what += [trained_phrase(r["trained"])] if r.get("trained") else []
    none = r.get("none_of_these")
    if none:
        t = none["min_confidence"]
        what.append(f"none of these: {none['option']!r}" + ("" if t is None else f" below {threshold_text(t)}"))
    made = "trained" if "the one trained" in str(r.get("note")) else "fitted"
    changed = f", NOT the task's {made} settings: the question changed" if "note" in r else ""
    return (", ".join(what) or "raw") + changed


def describe_methods(plan: DecisionPlan, priors: Mapping[str, Calibrator]) -> str:
    """How the run's answers were made, in words: raw, or what applied to which questions."""
    rows = asked(plan.questions, plan.methods)
    if all(r == {"key": r["key"], **RAW_METHOD} for r in rows):
        return "raw"
    found = {q.key: priors[q.digest].n for q in plan.questions if q.digest in priors}  # priors are by digest
    parts = [f"{r['key']}: {method_words(r, found.get(r['key'], plan.warmup))}" for r in rows]
    return "; ".join(parts)


def batch_priors(
    questions: Sequence[DecisionQuestion],
    results: Sequence[Any],
    warmup: int,
    methods: Methods | None = None,
    failed: Sequence[str] = (),
) -> dict[str, Calibrator]:
    """Each question's batch prior (`fit_batch`: the mean raw answer) over the first `warmup`
    results that answered it, by digest; a question answered by fewer states than its options
    is refused, naming it and the fix (and the warm-up's error rows, `failed`, where they are why).
    Only the questions whose method divides by one (`methods`: a task's fitted or trained questions
    answer their own way, never refused for a prior they do not use)."""
    out: dict[str, Calibrator] = {}
    for k, q in enumerate(questions):
        if methods is not None and methods.for_question(q)[0].prior != "batch":
            continue
        what = f"--calibrate batch: question {q.key!r}: "
        got = [r.raw[k] for r in results if r.raw and r.raw[k] is not None]  # the states that answered it
        refused = sum(1 for r in results if r.raw and r.raw[k] is None)
        if not got and refused:
            raise FitError(
                f"{what}refused for every one of the warm-up's {refused} state(s) (the question over the model's "
                "context after each): shorten the question, or ask it without --calibrate batch"
            )
        answered = np.stack(got) if got else np.empty((0, len(q.options)))
        try:
            out[q.digest] = batch_prior(answered, q.answer_names(), warmup, what)
        except FitError as e:
            if not failed:
                raise
            raise FitError(
                f"{e} ({len(failed)} row(s) of the warm-up were error rows; the first: {failed[0]})"
            ) from None
    return out


def _recorded_priors(previous: Mapping[str, Any], output: str | None) -> dict[str, Calibrator]:
    """The batch priors an interrupted run recorded in its manifest (a resumed run applies them)."""
    got = (previous.get("settings") or {}).get("priors") or {}
    try:
        return {k: Calibrator.from_dict(v) for k, v in got.items()}
    except CalibrationError as e:
        raise OutputError(f"cannot --resume {output}: its recorded prior cannot be read ({e}); start again") from None


def error_record(row: Row, error: str | None) -> dict[str, Any]:
    """An error row as classify writes it: the id, the line, and why (naming the line)."""
    err = error or "not processed"
    return {"id": row.id, "line": row.line, "error": err if err.startswith("line ") else f"line {row.line}: {err}"}


__all__ = ["DecideSettings", "SHAPES", "UserError", "answers", "batch_priors", "decide"]
