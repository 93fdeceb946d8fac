"""Ray Data (issue 14): `mlx_slm.ray` and `classify --ray` on a real local Ray with two CPUs,
two workers, and a worker killed mid-run; every id comes back exactly once, in order, with
the labels of a single-process run."""

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.text.workload import tickets
from tests.hostile import invoke, write_input
from tests.hostile import model_cli as cli
from tests.hostile import refused_cleanly as refused

ray = pytest.importorskip("ray")

import mlx_slm.ray as mray  # noqa: E402
from mlx_slm import Classifier  # noqa: E402
from mlx_slm.cli import main  # noqa: E402

# 1,000 short rows: ticket openings of varied length.
_T = [t for t, _ in tickets(200)]
ROWS = [{"id": i, "text": _T[i % len(_T)][: 12 + (i * 7) % 40]} for i in range(1000)]
LABELS = ["a", "b", "c"]


@pytest.fixture(scope="module")
def local_ray():
    mray.init(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_qwen_mlx):
    clf = Classifier.load(str(tiny_qwen_mlx), LABELS)
    return [p.label for p in clf.classify([r["text"] for r in ROWS], calibration="none")]


@pytest.mark.slow
def test_two_workers_return_every_id_once_in_order_with_the_local_labels(local_ray, tiny_qwen_mlx, reference):
    ds = ray.data.from_items(ROWS, override_num_blocks=8)
    out = mray.classify_dataset(
        ds, model=str(tiny_qwen_mlx), labels=LABELS, concurrency=2, threads_per_worker=1, batch_size=100
    ).take_all()
    assert [r["id"] for r in out] == list(range(1000))
    assert [r["label"] for r in out] == reference
    assert all(r["error"] is None and abs(sum(r["probs"].values()) - 1) < 1e-5 for r in out)
    assert set(out[0]) == {"id", "text", "label", "probs", "n_tokens", "truncated", "error"}


class _DiesOnce(mray.ClassifyBatch):
    """A worker that kills its own process (SIGKILL: no cleanup, as an OOM kill or a lost
    node) the first time it is handed row 500; a marker file makes it happen once."""

    marker = ""

    def __call__(self, batch):
        ids = batch.column("id").to_pylist()
        if 500 in ids:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(batch)


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(local_ray, tiny_qwen_mlx, reference, tmp_path):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import the test module
    marker = tmp_path / "killed"

    class Dies(_DiesOnce):
        pass

    Dies.marker = str(marker)
    ds = ray.data.from_items(ROWS, override_num_blocks=10)
    out = ds.map_batches(
        Dies,
        fn_constructor_kwargs={"load": {"model": str(tiny_qwen_mlx), "labels": LABELS}},
        batch_format="pyarrow",
        batch_size=100,
        compute=ray.data.ActorPoolStrategy(size=2),
        **mray.worker_options(2, 1),
    ).take_all()
    assert marker.exists()  # a worker really died
    ids = [r["id"] for r in out]
    assert len(ids) == 1000 and len(set(ids)) == 1000
    assert ids == list(range(1000))
    assert [r["label"] for r in out] == reference


@pytest.mark.slow
def test_batch_calibration_fits_one_prior_on_a_first_pass(local_ray, tiny_qwen_mlx):
    from mlx_slm.text.calibration import CalibrationSpec

    rows = ROWS[:200]
    out = mray.classify_dataset(  # no labels given: the default ones, read back from the first pass
        ray.data.from_items(rows, override_num_blocks=4),
        model=str(tiny_qwen_mlx),
        concurrency=2,
        threads_per_worker=1,
        batch_size=50,
        calibrate="batch",
        warmup=64,
    ).take_all()
    clf = Classifier.load(str(tiny_qwen_mlx))
    want = list(CalibrationSpec("batch", warmup=64).run(clf.labels)(clf.run([r["text"] for r in rows])))
    assert [r["label"] for r in out] == [p.label for p in want]
    for r, p in zip(out, want):
        assert r["probs"] == pytest.approx(p.probs, abs=1e-5)
        assert r["raw_probs"] == pytest.approx(p.raw_probs, abs=1e-5)


@pytest.mark.slow
def test_rows_without_text_are_error_rows_and_column_clashes_are_refused(local_ray, tiny_qwen_mlx):
    rows = [{"id": 0, "text": "hello there"}, {"id": 1, "text": None}, {"id": 2, "text": ""}]
    out = mray.classify_dataset(ray.data.from_items(rows), model=str(tiny_qwen_mlx), labels=LABELS).take_all()
    assert [r["id"] for r in out] == [0, 1, 2]
    assert out[0]["error"] is None and out[0]["label"] in LABELS
    assert "no text" in out[1]["error"] and out[1]["label"] is None and out[1]["probs"] is None
    assert out[2]["error"] and out[2]["label"] is None
    clash = ray.data.from_items([{"id": 0, "text": "x", "label": "gold"}])
    with pytest.raises(Exception, match="already has column"):
        mray.classify_dataset(clash, model=str(tiny_qwen_mlx), labels=LABELS).take_all()


@pytest.mark.slow
def test_cli_ray_writes_the_local_output(local_ray, tiny_qwen_mlx, tmp_path):
    lines = [json.dumps(r) for r in ROWS[:300]]
    lines.insert(50, '{"id": 9999, "text": ')  # malformed: an error row in its place
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    base = ["--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-q"]
    local, dist = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    r1 = CliRunner().invoke(main, ["classify", str(inp), "-o", str(local), *base], catch_exceptions=False)
    r2 = CliRunner().invoke(
        main, ["classify", str(inp), "-o", str(dist), "--ray", "--workers", "2", *base], catch_exceptions=False
    )
    assert r1.exit_code == r2.exit_code == 1  # the malformed row
    a = [json.loads(x) for x in local.read_text().splitlines()]
    b = [json.loads(x) for x in dist.read_text().splitlines()]
    assert len(b) == 301 and [x["id"] for x in a] == [x["id"] for x in b]
    assert [x.get("label") for x in a] == [x.get("label") for x in b]
    assert b[50]["id"] is None and "malformed" in b[50]["error"]
    for x, y in zip(a, b):
        if "probs" in x:
            assert y["probs"] == pytest.approx(x["probs"], abs=1e-5)


def test_cli_ray_options_need_ray(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("hello\n")
    r = CliRunner().invoke(main, ["classify", str(inp), "--workers", "2"])
    assert r.exit_code == 2 and "--ray" in r.output
    assert Path(inp).read_text() == "hello\n"


@pytest.mark.slow
def test_cli_ray_resumes_an_interrupted_output(local_ray, tiny_qwen_mlx, tmp_path):
    from mlx_slm.files.output import manifest_path

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:120]))
    base = ["--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-q", "--window", "16"]
    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    assert CliRunner().invoke(main, ["classify", str(inp), "-o", str(whole), *base]).exit_code == 0
    assert CliRunner().invoke(main, ["classify", str(inp), "-o", str(part), "--ray", *base]).exit_code == 0
    data = part.read_bytes()
    part.write_bytes(data[: len(data) * 2 // 3 + 5])  # interrupted mid-row
    m = json.loads(manifest_path(str(part)).read_text())
    m["complete"], m["rows"] = False, None
    manifest_path(str(part)).write_text(json.dumps(m))
    r = CliRunner().invoke(main, ["classify", str(inp), "-o", str(part), "--ray", "--resume", *base])
    assert r.exit_code == 0, r.output
    a = [json.loads(x) for x in whole.read_text().splitlines()]
    b = [json.loads(x) for x in part.read_text().splitlines()]
    assert [x["id"] for x in b] == [x["id"] for x in a] and [x["label"] for x in b] == [x["label"] for x in a]


def test_parquet_input_reads_as_jsonl_with_error_rows_in_place(tiny_qwen_mlx, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [dict(r) for r in ROWS[:30]]
    rows[4]["text"] = None  # an error row, in its place
    rows[7]["id"] = None  # a null id: an error row, as in JSONL
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet", row_group_size=8)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-q"]
    outs = []
    for name in ("in.parquet", "in.jsonl"):
        out = tmp_path / f"{name}.out.jsonl"
        r = CliRunner().invoke(main, ["classify", str(tmp_path / name), "-o", str(out), *base])
        assert r.exit_code == 1, r.output
        outs.append([json.loads(x) for x in out.read_text().splitlines()])
    pq_rows, js_rows = outs
    assert len(pq_rows) == 30 and "must be a string" in pq_rows[4]["error"]
    assert pq_rows[7]["id"] is None and "got null" in pq_rows[7]["error"]
    assert [r.get("label") for r in pq_rows] == [r.get("label") for r in js_rows]
    r = CliRunner().invoke(main, ["classify", str(tmp_path / "in.parquet"), "--text-field", "body", *base])
    assert r.exit_code == 2 and "no column 'body'" in r.output


def test_a_worker_refuses_other_weights_than_the_run_was_set_up_with(tiny_qwen_mlx):
    from mlx_slm.kinds.base import TaskError
    from mlx_slm.weights.convert import weights_sha256

    load = {"model": str(tiny_qwen_mlx), "labels": LABELS}
    mray.ClassifyBatch(load=load, weights_sha256=weights_sha256(tiny_qwen_mlx))  # the same: fine
    with pytest.raises(TaskError, match="same converted model"):
        mray.ClassifyBatch(load=load, weights_sha256="0" * 64)


@pytest.mark.slow
def test_worker_options_fit_the_cluster(local_ray):
    """On the 2-CPU Ray: the workers' CPU requests leave one CPU for Ray Data's tasks."""
    for conc, threads in ((1, None), (2, None), (2, 2), (4, None), (16, None)):
        o = mray.worker_options(conc, threads)
        assert conc * o["num_cpus"] <= 1.0 + 1e-9, (conc, threads, o)
    assert mray.worker_options(2, None)["runtime_env"]["env_vars"]["OPENBLAS_NUM_THREADS"] == "1"
    assert mray.worker_options(1, None)["runtime_env"]["env_vars"]["OPENBLAS_NUM_THREADS"] == "2"


@pytest.mark.slow
def test_readme_ray_data_example_finishes_on_two_cpus(local_ray, tiny_qwen_mlx, tmp_path, monkeypatch):
    """docs/scale-out.md's Ray Data block, as written, with local folders for its S3 paths and
    concurrency=2, on `ray.init(num_cpus=2)`: it runs to completion (it used to wait forever
    for a third CPU) and writes every row with its label."""
    import re

    import pyarrow as pa
    import pyarrow.parquet as pq

    page = (Path(__file__).resolve().parents[1] / "docs" / "scale-out.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "import ray" in b)
    assert "read_parquet" in block and "classify_dataset" in block and "write_parquet" in block
    monkeypatch.chdir(tmp_path)
    src, dst = tmp_path / "tickets", tmp_path / "labels"
    src.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:40]), src / "part-0.parquet")
    inp = tmp_path / "sample.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:8]))
    args = ["classify", str(inp), "--model", str(tiny_qwen_mlx), "--labels", "a,b,c", "-q", "--save-task", "task.json"]
    r = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "s.jsonl")])
    assert r.exit_code == 0, r.output
    code = block.replace("s3://archive/tickets/", str(src)).replace("s3://archive/labels/", str(dst))
    exec(compile(code, "docs/scale-out.md Ray Data block", "exec"), {"__name__": "__readme__"})
    out = pq.read_table(dst).to_pylist()
    assert sorted(r["id"] for r in out) == list(range(40))
    assert all(r["label"] in LABELS and r["error"] is None for r in out)


@pytest.mark.slow
def test_questions_on_ray_equal_the_local_run(local_ray, tiny_qwen_mlx, tmp_path):
    """Several questions per text: `classify --questions --ray` writes the local run's answers,
    and `ClassifyBatch` adds one typed `answers` struct."""
    from mlx_slm.text.questions import Question

    qs = [
        Question("team", "Which team?", "choice", ("billing", "technical"), none="neither"),
        Question("mood", "How calm?", "scale", ("1", "2", "3")),
        Question("tags", "About {label}?", "multi", ("card", "app"), answers=("y", "n")),
    ]
    qf = tmp_path / "q.jsonl"
    qf.write_text("\n".join(json.dumps(q.to_dict()) for q in qs) + "\n")
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(json.dumps(r) for r in ROWS[:40]) + '\n{"id": 77, "text": ""}\n')
    base = ["--model", str(tiny_qwen_mlx), "--questions", str(qf), "-q", "--on-error", "skip"]
    local, dist = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    r1 = CliRunner().invoke(main, ["classify", str(inp), "-o", str(local), *base], catch_exceptions=False)
    r2 = CliRunner().invoke(main, ["classify", str(inp), "-o", str(dist), "--ray", *base], catch_exceptions=False)
    assert r1.exit_code == r2.exit_code == 0, r2.output
    a = [json.loads(x) for x in local.read_text().splitlines()]
    b = [json.loads(x) for x in dist.read_text().splitlines()]
    assert [x["id"] for x in a] == [x["id"] for x in b] and "error" in b[-1]
    for x, y in zip(a[:-1], b[:-1]):
        for q in qs:
            u, v = x["answers"][q.name], y["answers"][q.name]
            assert u.get("label") == v.get("label") and u.get("labels") == v.get("labels")
            assert v["probs"] == pytest.approx(u["probs"], abs=1e-5)
    batch = mray.ClassifyBatch(None, {"model": str(tiny_qwen_mlx), "questions": qs})
    import pyarrow as pa

    out = batch(pa.table({"text": [ROWS[0]["text"], None]}))
    got = out.column("answers").to_pylist()
    assert set(got[0]) == {"team", "mood", "tags"} and got[1] is None and out.column("error").to_pylist()[1]
    # a confidence threshold abstains per question on the actor, as in a local run
    sure = mray.ClassifyBatch(None, {"model": str(tiny_qwen_mlx), "questions": qs}, min_confidence=0.99)
    got = sure(pa.table({"text": [ROWS[0]["text"]]})).column("answers").to_pylist()[0]
    assert got["mood"]["label"] is None and got["mood"]["abstained"] is True


@pytest.mark.slow
def test_a_task_of_three_questions_and_a_head_on_ray_and_the_service(local_ray, tiny_qwen_mlx, tmp_path):
    """A saved task of three zero-shot questions and one learned head: --task --ray writes the
    local run's answers, and the service's /v1/classify answers the same."""
    import httpx
    import numpy as np

    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.task import Task
    from mlx_slm.engine.engine import Engine
    from mlx_slm.jobs.train import head_classifier
    from mlx_slm.server import ServeOptions, Service
    from mlx_slm.service.api import Loaded
    from mlx_slm.text.heads import Head, fit_linear
    from mlx_slm.text.questions import Question
    from mlx_slm.weights.convert import weights_sha256

    m = str(tiny_qwen_mlx)
    system, template = "You answer questions about a text.", "Text: {text}"
    texts = [r["text"] for r in ROWS[:24]]
    feats, _, _ = head_classifier(Engine.load(m), ("a", "b", "c"), system, template).features(texts, [2])
    head = Head(("a", "b", "c"), (2,), *fit_linear(feats["last"][:, 0], np.arange(24) % 3, 3, "lda"), estimator="lda")
    qs = (
        Question("routed", "", "head", head.labels, head=head),
        Question("team", "Which team?", "choice", ("billing", "technical")),
        Question("mood", "How calm?", "scale", ("1", "2", "3")),
        Question("tags", "About {label}?", "multi", ("card", "app"), answers=("y", "n")),
    )
    task = tmp_path / "task.json"
    Task(m, (), system, template, weights_sha256=weights_sha256(tiny_qwen_mlx), questions=qs).save(task)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:30]))
    local, dist = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    for out, extra in ((local, []), (dist, ["--ray", "--workers", "2"])):
        r = CliRunner().invoke(main, ["classify", str(inp), "--task", str(task), "-o", str(out), "-q", *extra])
        assert r.exit_code == 0, r.output
    a = [json.loads(x)["answers"] for x in local.read_text().splitlines()]
    b = [json.loads(x)["answers"] for x in dist.read_text().splitlines()]
    assert len(a) == len(b) == 30 and list(a[0]) == ["routed", "team", "mood", "tags"]
    for x, y in zip(a, b):
        for q in qs:
            assert x[q.name].get("label") == y[q.name].get("label") and x[q.name].get("labels") == y[q.name].get(
                "labels"
            )
            assert y[q.name]["probs"] == pytest.approx(x[q.name]["probs"], abs=1e-5)
    from tests.server.test_app import ThreadServer

    srv = ThreadServer(Service(lambda: Loaded(Classifier.from_task(str(task)), "none", None, model=m),
                               ServeOptions())).start()  # fmt: skip
    try:
        resp = httpx.post(srv.url + "/v1/classify", json={"texts": [r["text"] for r in ROWS[:30]]}, timeout=60)
        assert resp.status_code == 200, resp.text
        for got, x in zip(resp.json()["results"], a):
            for q in qs:
                assert got["answers"][q.name]["probs"] == pytest.approx(x[q.name]["probs"], abs=1e-5)
    finally:
        srv.stop()


def test_an_unreachable_ray_address_exits_2_at_once_naming_it(tiny_qwen_mlx, tmp_path):
    pytest.importorskip("ray")
    from mlx_slm.ray import _host_port

    assert _host_port("127.0.0.1:6390") == ("127.0.0.1", 6390)
    assert _host_port("ray://head:10001") == ("head", 10001)
    assert _host_port("[::1]:7000") == ("::1", 7000)
    assert _host_port("head") == ("head", 6379)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inp = write_input(tmp_path / "in.jsonl", 4)
    t = time.perf_counter()
    r = invoke(["classify", inp, "-o", tmp_path / "o.jsonl", "--ray-address", f"127.0.0.1:{port}", *cli(tiny_qwen_mlx)])
    refused(r, f"127.0.0.1:{port}", "nothing answers")
    assert time.perf_counter() - t < 30
    assert not (tmp_path / "o.jsonl").exists()


def test_ray_refuses_warmup_without_a_warm_up_calibration(tiny_qwen_mlx):
    mray = pytest.importorskip("mlx_slm.ray")
    with pytest.raises(ValueError, match="warmup"):
        mray.classify_dataset(None, model=str(tiny_qwen_mlx), calibrate="none", warmup=5)
