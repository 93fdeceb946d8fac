"""Classify a Ray Dataset on many workers: one engine per actor, loaded once.

Ray Data is the engine for batch inference across machines: stateful actors that load
the model once, task retries and actor restarts (an actor that dies is restarted and its
batch re-run, so no row is lost or written twice), streaming reads and writes. This
module is the adapter, nothing more:

    import ray, mlx_slm.ray as mr
    ds = ray.data.read_parquet("s3://archive/tickets/")          # any Ray Data source
    out = mr.classify_dataset(ds, task="task.json", concurrency=8)
    out.write_parquet("s3://archive/labels/")                    # id, label, probs, error, ...

`ClassifyBatch` is the callable class behind it, for pipelines that call
`Dataset.map_batches` themselves. Each output row keeps the input's columns and adds
`label`, `probs` (a struct, one field per label), `n_tokens`, `truncated` and `error`
(null, or why this row has no label); with calibration also `raw_probs`, and
`abstained` with a confidence threshold. Rows whose text is missing or empty are error
rows, never dropped.

Calibration that needs the whole input (`batch`, `em`) cannot be done batch by batch
on independent actors: `classify_dataset` fits its prior on a first pass over the
first `warmup` rows (paid twice), or takes it from a saved task (`mlx-slm classify
--calibrate batch --save-task task.json` on a sample). `mlx-slm classify --ray`
instead streams raw scores back to the driver and calibrates there, as a local run.

May import: ground, text, engine, kinds, classifier.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .ground.errors import MissingExtra
from .text.records import RecordShape

try:
    import pyarrow as pa
    import ray
    import ray.data
except ImportError as e:  # pragma: no cover - the extra is installed in the test env
    raise MissingExtra(f"mlx_slm.ray needs Ray Data ({e.name} is missing): pip install 'mlx-slm[ray]'") from None
from .classifier.classifier import Classifier
from .classifier.decider import DecisionResult
from .classifier.plan import Plan
from .classifier.task import Task
from .engine import Engine
from .kinds.base import TaskError
from .text.calibration import DEFAULT_WARMUP, CalibrationSpec
from .text.decisions.errors import DecisionError
from .text.decisions.questions import DecisionRequest
from .text.labels import log_softmax
from .text.predictions import Prediction

# `classify_dataset`'s own options (the rest are `Classifier.load`'s, or a task's overrides).
RUN_OPTIONS = ("text_column", "calibrate", "warmup", "min_confidence", "scores")


def _load_classifier(task: dict[str, Any] | None, load: Plan | dict[str, Any] | None) -> Any:
    """A worker's classifier: the task's, or the plan's (the driver resolved it once; a dict of
    `Classifier.load` keywords is resolved into one here)."""
    if task is not None:
        return Classifier.from_task(Task.from_dict(task), **(load or {}))
    return Classifier.from_plan(load if isinstance(load, Plan) else Plan.loading(**(load or {})))


class ClassifyBatch:
    """`Dataset.map_batches` callable class (use `batch_format="pyarrow"`).

    task: a task as `Task.to_dict()` gives it (a dict, so that remote nodes need no
    file), or None with `load` the `classifier.Plan` to run (the driver's, resolved once) or
    `Classifier.load` keyword arguments (model, labels, system, template, dtype, batch_size, ...).
    calibrator: a fitted `Calibrator` as a dict (`to_dict()`), applied to every row;
    "none" for raw scores; None applies the task's own fitted prior, if it has one. scores: also return the
    raw label log-scores (`scores`, a list in label order) for a caller that calibrates.
    weights_sha256: refuse other weights than these (each node loads the model by name; a
    saved prior and the run's record hold for one set of weights only). pair_column: a
    second text (an NLI hypothesis, a reranker's document), where the dataset has that column;
    a row's null or empty one is no pair. The columns added are the kind's record shape
    (`records.RecordShape.arrow_fields`: a multi-label head's `labels`, a one-output head's
    `score` and `logit`).
    """

    def __init__(
        self,
        task: dict[str, Any] | None = None,
        load: Plan | dict[str, Any] | None = None,
        *,
        text_column: str = "text",
        calibrator: dict[str, Any] | str | None = None,
        min_confidence: float | None = None,
        scores: bool = False,
        weights_sha256: str | None = None,
        pair_column: str | None = "text_pair",
    ):

        self.clf = _load_classifier(task, load)
        if weights_sha256 and self.clf.path is not None:
            here = self.clf.engine.weights_sha256
            if here != weights_sha256:  # another conversion under the same name on this node
                raise TaskError(
                    f"this worker's {self.clf.path} has weights sha256 {here[:12]}..., the run was set up "
                    f"with {weights_sha256[:12]}...: give every node the same converted model"
                )
        self.text_column, self.with_scores, self.pair_column = text_column, scores, pair_column
        self.labels = tuple(self.clf.labels)
        spec = self.clf.calibration if calibrator is None else CalibrationSpec.from_dict(calibrator)
        # A prior needing this input's own warm-up ("batch", "em") cannot be fitted per
        # batch: classify_dataset resolves it before the actors start.
        self.calibration = spec.fixed()
        self.min_confidence = self.clf.min_confidence if min_confidence is None else min_confidence
        self.shape = self.clf.spec.record_shape(
            calibrated=self.calibration.applies, abstains=self.min_confidence is not None, scores=scores
        )
        self.fields = self.shape.arrow_fields()

    def __call__(self, batch: pa.Table) -> pa.Table:

        if not isinstance(batch, pa.Table):  # another batch_format: accept what Ray hands over
            batch = pa.Table.from_pandas(batch) if hasattr(batch, "to_numpy") else pa.table(batch)
        if self.text_column not in batch.column_names:
            raise ValueError(
                f"the dataset has no column {self.text_column!r} (it has {', '.join(batch.column_names)}): "
                "pass text_column="
            )
        clash = [f for f, _ in self.fields if f in batch.column_names]
        if clash:
            raise ValueError(
                f"the dataset already has column(s) {', '.join(clash)}, which classification writes: "
                "rename or drop them first (Dataset.rename_columns / drop_columns)"
            )
        texts = batch.column(self.text_column).to_pylist()
        pairs = [None] * len(texts)
        if self.pair_column is not None and self.pair_column in batch.column_names:
            pairs = batch.column(self.pair_column).to_pylist()
        todo = [i for i, t in enumerate(texts) if isinstance(t, str)]
        items = [(texts[i], pairs[i]) if pairs[i] else texts[i] for i in todo]
        raw = list(self.clf.run(items, window=max(1, len(todo))))
        done = dict(zip(todo, self.clf.calibration_run(self.calibration, self.min_confidence)(raw)))
        preds = [
            done[i]
            if i in done
            else Prediction(i, error=f"no text: column {self.text_column!r} is {t!r}, not a string")
            for i, t in enumerate(texts)
        ]
        out = batch
        for field, array in self.shape.arrow_columns(preds):
            out = out.append_column(field, array)
        return out


def answers_type(questions: Sequence[Any], raw: bool = False, abstain: bool = False) -> pa.DataType:
    """The `answers` column of a run on `questions` (see `records.RecordShape.answers_type`)."""
    return RecordShape.of(questions=questions, calibrated=raw, abstains=abstain).answers_type()


CONNECT_TIMEOUT_S = 10.0  # how long `init` waits for a cluster's port to answer


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) a Ray address points at, or None where Ray finds the cluster itself."""
    a = address.strip()
    if a in ("", "auto", "local"):
        env = os.environ.get("RAY_ADDRESS", "")
        return _host_port(env) if a == "auto" and env not in ("", "auto", "local") else None
    default = 6379
    if a.startswith("ray://"):
        a, default = a[len("ray://") :], 10001
    elif "://" in a:
        return None
    a = a.split("/", 1)[0]
    if a.startswith("["):  # [IPv6]:port
        host, _, rest = a[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif a.count(":") == 1:
        host, port = a.split(":")
    else:
        host, port = a, ""
    try:
        return host, int(port) if port else default
    except ValueError:
        return None


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise ConnectionError, within `timeout` seconds, if nothing accepts a TCP connection at
    the address of a Ray cluster (Ray itself retries an absent cluster for minutes)."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout):
            pass
    except OSError as e:
        why = f"no answer within {timeout:g} s" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ConnectionError(
            f"nothing answers at {hp[0]}:{hp[1]} ({why}): is the Ray head running there? "
            "(start one with `ray start --head`, or check the address and port)"
        ) from None


def init(address: str | None = None, connect_timeout: float = CONNECT_TIMEOUT_S, **kwargs: Any) -> None:
    """Join the Ray cluster at `address` (or start a local one), quietly; once per process.

    An address where nothing answers is a ConnectionError within `connect_timeout`, even in a
    process already joined to a cluster (which `ray.init` would keep, silently, whatever the address)."""
    if address:
        check_reachable(address, connect_timeout)
    if not ray.is_initialized():
        kwargs.setdefault("include_dashboard", False)
        kwargs.setdefault("logging_level", "WARNING")
        kwargs.setdefault("configure_logging", True)
        ray.init(address=address, **kwargs)
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # per-dataset INFO lines: mlx-slm reports progress
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # output rows in input order
    ctx.enable_progress_bars = False  # mlx-slm reports progress itself


def worker_options(concurrency: int, threads_per_worker: int | None) -> dict[str, Any]:
    """Actor options: CPUs reserved per worker, and BLAS told how many threads to use.

    Threads: by default the cluster's CPUs split evenly (two workers on a 2-core machine
    get a thread each, rather than four BLAS threads fighting over two cores). The CPUs
    each actor *reserves* fit the cluster with one CPU left over for Ray Data's own read
    and write tasks: all the workers together reserve at most the cluster's CPUs less
    one, so `read_parquet -> classify_dataset(concurrency=2) -> write_parquet` runs on a
    2-CPU cluster rather than waiting forever for a CPU the actors hold ("3/2 CPU")."""
    concurrency = max(1, concurrency)
    cpus = float(ray.cluster_resources().get("CPU", os.cpu_count() or 1))
    if threads_per_worker is None:
        threads_per_worker = max(1, int(cpus) // concurrency)
    reserve = min(float(threads_per_worker), max(0.0, cpus - 1.0) / concurrency)
    reserve = math.floor(reserve * 100) / 100  # Ray takes CPU requests in hundredths
    env = {
        k: str(threads_per_worker)
        for k in ("MLX_SLM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    }
    return {"num_cpus": reserve, "runtime_env": {"env_vars": env}}


def classify_dataset(
    ds: ray.data.Dataset,
    task: str | os.PathLike | dict[str, Any] | Any | None = None,
    *,
    concurrency: int = 1,
    threads_per_worker: int | None = None,
    batch_size: int = 256,
    **options: Any,
) -> ray.data.Dataset:
    """`ds` with each row classified (lazy: write or iterate the result to run it).

    task: a task file, `Task`, or its dict; or None with `Classifier.load` keywords in
    `options` (model=..., labels=..., system=..., template=...), resolved once into the plan
    every worker runs. concurrency: the number of workers (actors), each loading the model
    once and using `threads_per_worker` CPU threads (default: the cluster's CPUs split
    evenly). batch_size: rows per call; each batch is sorted and bucketed by length inside
    the worker, so larger batches pad less, smaller ones spread better over workers.
    The run's own options: `text_column` ("text"); `calibrate`: None (the task's own),
    "none", "batch"/"em" (a prior fitted here on the first `warmup` rows, a first pass over
    them), or a fitted `Calibrator`; `min_confidence`; `scores` (also the raw label scores).
    """
    run_options = {k: options.pop(k) for k in RUN_OPTIONS if k in options}
    text_column, calibrate = run_options.get("text_column", "text"), run_options.get("calibrate")
    warmup, min_confidence = run_options.get("warmup"), run_options.get("min_confidence")
    scores = run_options.get("scores", False)
    load: Any = Plan.loading(**options) if task is None else options
    if task is not None and not isinstance(task, dict):
        task = (task if isinstance(task, Task) else Task.load(task)).to_dict()
    t = Task.from_dict(task) if task is not None else None
    warmup = warmup or (t.warmup if t is not None else DEFAULT_WARMUP)
    try:
        spec = CalibrationSpec.of(calibrate if calibrate is not None else (t.calibration if t else "none"))
    except ValueError:
        raise ValueError(f"calibrate must be None, 'none', 'batch', 'em' or a Calibrator, not {calibrate!r}") from None
    if spec.method == "em" and spec.needs_data and t is not None and t.calibration.base is not None:
        spec = t.calibration  # the task's own base, re-estimated on this input
    if spec.method == "em" and spec.needs_data:
        raise ValueError("calibrate='em' needs a base: a task saved with --calibrate em, or a fitted Calibrator")
    if run_options.get("warmup") is not None and not spec.per_input:  # as the CLI's --warmup (`jobs.plan`)
        raise ValueError(
            f"warmup is how many rows calibrate='batch' or 'em' fits its prior on; this run's calibration "
            f"({'a fitted prior' if spec.fitted else spec.method}) has no warm-up: pass calibrate='batch', or drop warmup"
        )
    spec = CalibrationSpec.of(spec, warmup=warmup)
    opts = worker_options(concurrency, threads_per_worker)

    def run(src: ray.data.Dataset, calibrator: Any, want_scores: bool, conf: Any) -> Any:
        return src.map_batches(
            ClassifyBatch,
            fn_constructor_args=(task, load or None),  # a task's overrides, or the plan
            fn_constructor_kwargs={
                "text_column": text_column,
                "calibrator": calibrator,
                "min_confidence": conf,
                "scores": want_scores,
            },
            batch_format="pyarrow",
            batch_size=batch_size,
            compute=ray.data.ActorPoolStrategy(size=concurrency),
            **opts,
        )

    if spec.prior is not None:
        final: Any = spec.prior.to_dict()
    elif spec.method == "none":
        final = "none"  # raw scores, even where the task holds a prior
    elif spec.method in ("batch", "em"):
        # A first pass over the warm-up rows for their raw scores; the prior fitted on them
        # is then applied to every row, them included, as a local run does.
        first = run(ds.limit(warmup), "none", True, None).select_columns(["probs", "scores"]).to_arrow_refs()
        parts = [t for t in ray.get(first) if t.num_rows]
        table = pa.concat_tables(parts) if parts else None
        got = [s for s in table.column("scores").to_pylist() if s is not None] if table is not None else []
        final = "none"
        if table is not None and len(got) >= 2:
            labels = [f.name for f in table.schema.field("probs").type]  # the classifier's own label order
            lp = log_softmax(np.array(got))
            final = spec.fit_prior(lp, labels).to_dict()
    else:
        raise ValueError(f"calibrate must be None, 'none', 'batch', 'em' or a Calibrator, not {calibrate!r}")
    return run(ds, final, scores, min_confidence)


def predictions(
    texts: Sequence[str],
    plan: Plan,
    *,
    concurrency: int = 1,
    threads_per_worker: int | None = None,
    batch_size: int | None = None,
    weights_sha256: str | None = None,
) -> Iterator[Any]:
    """Raw predictions for `texts`, in order, computed on Ray workers (the CLI's `--ray`).

    Yields `Prediction`s as a local `Classifier.run` would (index = position in
    `texts`, raw scores kept), so the caller calibrates and writes as for a local run.
    A text may be a (text, pair) tuple. Every worker runs `plan` (picklable; its task
    file's object is left here), uncalibrated: the driver calibrates and abstains.
    """
    plan = replace(plan.portable(), calibration=CalibrationSpec(), min_confidence=None)

    n = len(texts)
    if n == 0:
        return
    if batch_size is None:  # a few batches per worker, so that workers finish together
        batch_size = max(1, min(1024, math.ceil(n / (4 * concurrency))))
    # A (text, pair) item: its second text in a column of its own (one Arrow type a column).
    items = [
        {"row": i, "text": t[0], "text_pair": t[1]}
        if isinstance(t, tuple)
        else {"row": i, "text": t, "text_pair": None}
        for i, t in enumerate(texts)
    ]
    ds = ray.data.from_items(items, override_num_blocks=math.ceil(n / batch_size))
    out = ds.map_batches(
        ClassifyBatch,
        fn_constructor_args=(None, plan),
        fn_constructor_kwargs={"scores": True, "weights_sha256": weights_sha256},
        batch_format="pyarrow",
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(size=concurrency),
        **worker_options(concurrency, threads_per_worker),
    )
    labels: tuple[str, ...] | None = None
    expect = 0
    for b in out.iter_batches(batch_format="pyarrow", batch_size=None):
        for r in b.to_pylist():
            if r["row"] != expect:  # preserve_order is on: anything else is a bug, not data to write
                raise RuntimeError(f"Ray returned row {r['row']} where row {expect} was due")
            expect += 1
            if r["error"] is not None:
                yield Prediction(r["row"], error=r["error"], n_tokens=r["n_tokens"], truncated=r["truncated"])
                continue
            if "answers" in r:
                yield Prediction(r["row"], n_tokens=r["n_tokens"], truncated=r["truncated"], answers=r["answers"])
                continue
            if "score" in r:  # a one-output head: its score, and the raw logit
                lab = r["label"]
                yield Prediction(
                    r["row"], lab, {lab: r["score"]}, {lab: r["logit"]}, r["n_tokens"], r["truncated"], value=r["score"]
                )
                continue
            if "labels" in r:  # a multi-label head: the labels at or above its threshold
                yield Prediction(
                    r["row"],
                    probs=dict(r["probs"]),
                    n_tokens=r["n_tokens"],
                    truncated=r["truncated"],
                    labels=list(r["labels"]),
                )
                continue
            labels = labels or tuple(r["probs"])
            yield Prediction(
                r["row"],
                label=r["label"],
                probs=dict(r["probs"]),
                scores=dict(zip(labels, r["scores"])),
                n_tokens=r["n_tokens"],
                truncated=r["truncated"],
            )
    if expect != n:
        raise RuntimeError(f"Ray returned {expect} rows for {n} inputs")


class DecideBatch:
    """`Dataset.map_batches` callable class for `mlx-slm decide --ray`: one `Decider` per actor,
    made once from the run's `DecisionPlan` (resolved and loaded on the driver: its questions,
    decision settings and methods travel whole, nothing is read again) and the run's batch
    priors. Each row's `state` column holds a state as JSON text (a string, an object or an
    array: one Arrow type a column); the column added, `result`, is JSON text: the probabilities,
    raw probabilities and what was applied per question (`DecisionResult`'s), the input and
    cached tokens, or the error that left the state unanswered (over the context)."""

    def __init__(self, plan: Any, priors: dict[str, Any], weights_sha256: str | None = None):
        engine = Engine.load(plan.model)
        here = engine.weights_sha256
        if weights_sha256 and here and here != weights_sha256:  # another conversion under the same name
            raise TaskError(
                f"this worker's {engine.path} has weights sha256 {here[:12]}..., the run was set up "
                f"with {weights_sha256[:12]}...: give every node the same converted model"
            )
        self.plan, self.priors = plan, priors
        self.decider = plan.decider(engine)

    def _answer(self, states: list[Any]) -> list[dict[str, Any]]:
        reqs = [DecisionRequest(s, self.plan.questions, "", None, self.plan.refusal) for s in states]
        try:
            return [_result_json(r) for r in self.decider.decide(reqs, self.priors)]
        except DecisionError as e:
            if len(states) == 1:
                return [{"error": str(getattr(e, "msg", e))}]
            return [got for s in states for got in self._answer([s])]

    def __call__(self, batch: pa.Table) -> pa.Table:
        states = [json.loads(s) for s in batch.column("state").to_pylist()]
        self.decider.states.clear()  # a batch's answers depend on the batch alone
        got = [json.dumps(r) for r in self._answer(states)]
        return batch.append_column("result", pa.array(got, pa.string()))


def _result_json(r: DecisionResult) -> dict[str, Any]:
    def arrays(ps: Any) -> list[Any]:
        return [None if p is None else [float(x) for x in p] for p in ps]

    return {
        "probs": arrays(r.probabilities),
        "raw": arrays(r.raw),
        "applied": list(r.applied),
        "input_tokens": int(r.input_tokens),
        "cached_tokens": int(r.cached_tokens),
    }


def decisions(
    states: Sequence[Any],
    plan: Any,
    priors: dict[str, Any],
    *,
    concurrency: int = 1,
    threads_per_worker: int | None = None,
    weights_sha256: str | None = None,
) -> Iterator[tuple[Any, str | None]]:
    """Each state's (`DecisionResult`, None) or (None, error), in order, answered on Ray workers
    (the CLI's `decide --ray`) from the run's loaded `DecisionPlan` and its batch `priors`."""
    n = len(states)
    if n == 0:
        return
    batch_size = max(1, min(256, math.ceil(n / (4 * concurrency))))
    items = [{"row": i, "state": json.dumps(s, ensure_ascii=False)} for i, s in enumerate(states)]
    ds = ray.data.from_items(items, override_num_blocks=math.ceil(n / batch_size))
    out = ds.map_batches(
        DecideBatch,
        fn_constructor_args=(plan, priors),
        fn_constructor_kwargs={"weights_sha256": weights_sha256},
        batch_format="pyarrow",
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(size=concurrency),
        **worker_options(concurrency, threads_per_worker),
    )
    expect = 0
    for b in out.iter_batches(batch_format="pyarrow", batch_size=None):
        for r in b.to_pylist():
            if r["row"] != expect:  # preserve_order is on: anything else is a bug, not data to write
                raise RuntimeError(f"Ray returned row {r['row']} where row {expect} was due")
            expect += 1
            got = json.loads(r["result"])
            if "error" in got:
                yield None, got["error"]
                continue
            arr = [[None if p is None else np.asarray(p, dtype=np.float64) for p in got[k]] for k in ("probs", "raw")]
            yield (
                DecisionResult(
                    None, tuple(arr[0]), got["input_tokens"], got["cached_tokens"], tuple(arr[1]), tuple(got["applied"])
                ),
                None,
            )  # type: ignore[arg-type]
    if expect != n:
        raise RuntimeError(f"Ray returned {expect} rows for {n} inputs")


__all__ = ["ClassifyBatch", "DecideBatch", "classify_dataset", "decisions", "init", "predictions", "worker_options"]
