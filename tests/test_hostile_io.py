"""Hostile input, one test per class (issue 18, part B): a user's bad file is a one-line
error naming the file, the line or field and the fix (exit 2), never a traceback (exit 70);
the service answers every client-caused failure with a 4xx, counts it, logs no traceback,
and a request that timed out never holds up the next one."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import BUG_REPORT, main
from mlx_slm.errors import UserError

GOLD = [("a", "My card was charged twice.", "billing"), ("b", "The app crashes on start.", "technical")]


def cli(*args: str, input: str | None = None):
    r = CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)
    assert BUG_REPORT not in r.output and r.exit_code != 70, r.output
    return r


def refused(r, *words: str) -> None:
    """Exit 2 with one `mlx-slm: error:` line holding every word."""
    assert r.exit_code == 2, r.output
    line = next(ln for ln in r.output.splitlines() if "error" in ln.lower())
    for w in words:
        assert w in line, (w, line)


def write(p: Path, data: bytes | str) -> Path:
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


# ----------------------------------------------------------------------------- input files


def test_input_path_that_is_a_folder(tmp_path):
    from mlx_slm.io import InputError, read_rows

    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(InputError, match="is a folder"):
        list(read_rows(str(d)))
    refused(cli("classify", str(d), "-o", str(tmp_path / "o.jsonl"), "--model", "no-such-model"), "is a folder")
    refused(cli("eval", str(d), "--predictions", str(write(tmp_path / "p.jsonl", ""))), "is a folder")


def _task(**over) -> dict:
    d = {"format": "mlx-slm.task", "version": 1, "model": "m", "labels": ["billing", "technical"]}
    d.update(template="T: {text}\nC:", system=None)
    d.update(over)
    return d


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"warmup": "abc"}, ["'warmup'", "integer"]),
        ({"warmup": 1}, ["'warmup'"]),
        ({"min_confidence": "high"}, ["'min_confidence'", "number from 0 to 1"]),
        ({"min_confidence": 2}, ["'min_confidence'"]),
        ({"system": 123}, ["'system'", "string or null"]),
        ({"labels": [1, 2, 3]}, ["'labels'", "strings"]),
        ({"labels": "billing"}, ["'labels'"]),
        ({"model": None}, ["'model'"]),
        ({"template": "no placeholder"}, ["'template'", "{text}"]),
        ({"version": "2"}, ["'version'", "integer"]),
        ({"scoring": 5}, ["'scoring'"]),
        ({"examples": "x"}, ["'examples'"]),
        ({"examples": [["hi", "billing"]]}, ["'examples'", "example 1"]),
        ({"examples": [{"text": "hi", "label": "zzz"}]}, ["'examples'", "'zzz'", "not one of the labels"]),
        ({"calibration": 7}, ["'calibration'"]),
        ({"calibration": {"method": "fit"}}, ["'calibration'"]),
        ({"weights_sha256": 5}, ["'weights_sha256'"]),
        ({"versions": []}, ["'versions'"]),
    ],
)
def test_task_file_with_wrong_types_names_the_field(tmp_path, bad, words):
    from mlx_slm.task import Task, TaskError

    p = write(tmp_path / "task.json", json.dumps(_task(**bad)))
    with pytest.raises(TaskError) as e:
        Task.load(p)
    for w in [str(p), *words]:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize(
    "key, hint",
    [("min_confidance", "did you mean 'min_confidence'?"), ("Labels", "did you mean 'labels'?"), ("zzz", "")],
)
def test_task_file_with_an_unknown_field_names_it_and_the_closest_known_one(tmp_path, key, hint):
    """Issue 26: a misspelt field was ignored without a word (the threshold silently off)."""
    from mlx_slm.task import Task, TaskError

    p = write(tmp_path / "task.json", json.dumps(_task(**{key: 0.7})))
    with pytest.raises(TaskError) as e:
        Task.load(p)
    assert str(p) in str(e.value) and f"unknown field {key!r}" in str(e.value) and hint in str(e.value)
    assert Task.load(write(tmp_path / "ok.json", json.dumps(_task(created="2026-01-01", min_confidence=0.7))))


def test_task_file_bytes_json_and_cli(tmp_path):
    from mlx_slm.task import Task, TaskError

    good = json.dumps(_task())
    cases = {
        "ff.json": (good[:40] + "\udcff" + good[40:]).encode("utf-8", "surrogateescape"),  # a 0xff byte
        "deep.json": b"[" * 100_000,
        "notjson.json": b"{oops",
        "bigint.json": b'{"format": "mlx-slm.task", "version": 1' + b"1" * 5000 + b"}",
    }
    for name, data in cases.items():
        with pytest.raises(TaskError, match=name):
            Task.load(write(tmp_path / name, data))
    with pytest.raises(TaskError, match="line 1: invalid UTF-8 \\(byte 0xff at column 41\\)"):
        Task.load(tmp_path / "ff.json")
    with pytest.raises(TaskError, match="is a folder"):
        Task.load(tmp_path)
    assert Task.load(write(tmp_path / "good.json", good)).labels == ("billing", "technical")
    inp = write(tmp_path / "in.txt", "hello\n")
    bad = write(tmp_path / "t.json", json.dumps(_task(warmup="abc")))
    refused(cli("classify", str(inp), "--task", str(bad), "-o", str(tmp_path / "o.jsonl")), "'warmup'", str(bad))
    refused(cli("classify", str(inp), "--task", str(tmp_path / "ff.json")), "invalid UTF-8")
    # An example whose label is not a task label is refused, as the same example via --examples is.
    ex = write(tmp_path / "ex.json", json.dumps(_task(examples=[{"text": "hi", "label": "refund"}])))
    refused(cli("classify", str(inp), "--task", str(ex)), "'refund'", "not one of the labels")


def test_examples_and_labels_files_with_bad_bytes_or_fields(tmp_path):
    from mlx_slm.io import read_labels_file
    from mlx_slm.prompts import PromptError, read_examples

    labels = ["billing", "technical"]
    ok = json.dumps({"text": "hi", "label": "billing"}) + "\n"
    bad_examples = {
        b'{"text": "x\xff", "label": "billing"}\n': "line 1: invalid UTF-8",
        (ok + "[1, 2]\n").encode(): "line 2: an example is a JSON object",
        (ok + '{"text": 5, "label": "billing"}\n').encode(): "line 2",
        (ok + "[" * 50_000 + "\n").encode(): "line 2: malformed JSON",
        (ok + '{"text": "hi", "label": "nope"}\n').encode(): "line 2: label 'nope' is not one of the labels",
        (ok + '{"text": "hi\\ud800", "label": "billing"}\n').encode(): "line 2: the example holds an unpaired",
        b"\n\n": "holds no examples",
    }
    for data, words in bad_examples.items():
        p = write(tmp_path / "ex.jsonl", data)
        with pytest.raises(PromptError) as e:
            read_examples(str(p), labels)
        assert str(p) in str(e.value) and words in str(e.value), str(e.value)
    assert read_examples(str(write(tmp_path / "ok.jsonl", b"\xef\xbb\xbf" + ok.encode())), labels) == (
        ("hi", "billing"),
    )
    lf = write(tmp_path / "labels.txt", b"billing\ntech\xffnical\n")
    with pytest.raises(UserError, match="labels.txt line 2: invalid UTF-8 \\(byte 0xff at column 5\\)"):
        read_labels_file(str(lf))
    assert read_labels_file(str(write(tmp_path / "l2.txt", b"\xef\xbb\xbfa\r\n\r\n b \n"))) == ["a", "b"]
    inp = write(tmp_path / "in.txt", "hello\n")
    refused(cli("classify", str(inp), "--labels-file", str(lf), "--model", "no-such-model"), "line 2", "UTF-8")
    exf = write(tmp_path / "ex.jsonl", b'{"text": "x\xff", "label": "billing"}\n')
    refused(cli("classify", str(inp), "--examples", str(exf), "--model", "no-such-model"), "line 1", "UTF-8")


def test_parquet_with_a_corrupt_data_page(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from mlx_slm.io import InputError, read_rows

    p = tmp_path / "in.parquet"
    texts = [f"ticket number {i} about my invoice and the app" for i in range(2000)]
    pq.write_table(pa.table({"id": list(range(2000)), "text": texts}), p, compression="snappy", row_group_size=500)
    assert len(list(read_rows(str(p)))) == 2000
    data = bytearray(p.read_bytes())
    # Damage the middle of the file (data pages), leaving the footer (schema) readable.
    for i in range(len(data) // 3, len(data) // 3 + 200):
        data[i] ^= 0x5A
    write(p, bytes(data))
    try:
        rows = list(read_rows(str(p)))
    except InputError as e:
        assert str(p) in str(e) and "damaged" in str(e)
    else:  # whatever pyarrow could still decode is rows or error rows, never a traceback
        assert all(r.text is not None or r.error for r in rows)
    write(p, bytes(data[: len(data) // 2]))  # a torn file: no footer
    with pytest.raises(InputError, match="not a readable Parquet file"):
        list(read_rows(str(p)))


# ----------------------------------------------------------------------------- eval


def _gold(tmp_path: Path) -> Path:
    return write(
        tmp_path / "gold.jsonl", "".join(json.dumps({"id": i, "text": t, "label": g}) + "\n" for i, t, g in GOLD)
    )


def _pred(i: str, label: str = "billing", probs=None) -> dict:
    return {"id": i, "label": label, "probs": probs or {"billing": 0.7, "technical": 0.2, "account": 0.1}}


def test_eval_predictions_with_wrong_types(tmp_path):
    gold = _gold(tmp_path)
    good = [_pred("a"), _pred("b", "technical")]
    cases = {
        "strprob.jsonl": (
            json.dumps(_pred("a", probs={"billing": "0.9"})) + "\n" + json.dumps(good[1]) + "\n",
            ["line 1", "'probs'", "'0.9'"],
        ),
        "array.jsonl": ("[1, 2]\n" + json.dumps(good[1]) + "\n", ["line 1", "JSON list"]),
        "label.jsonl": (json.dumps({**good[0], "label": 3}) + "\n" + json.dumps(good[1]) + "\n", ["'label'"]),
        "probs.jsonl": (json.dumps({**good[0], "probs": [0.5]}) + "\n" + json.dumps(good[1]) + "\n", ["'probs'"]),
        "nan.jsonl": (
            json.dumps(_pred("a", probs={"billing": float("nan")})) + "\n" + json.dumps(good[1]),
            ["nan is not"],
        ),
        "deep.jsonl": ("[" * 50_000 + "\n" + json.dumps(good[1]) + "\n", ["line 1", "nested too deeply"]),
        "bytes.jsonl": (b"\xff\n", ["line 1"]),
        "p.csv": (
            "id,label,p_billing,p_technical,p_account,truncated,line,error\na,billing,high,0.1,0.1,,,\n",
            ["line 2", "'p_billing'", "'high'", "not a number"],
        ),
        "extra.csv": ("id,label,p_billing\na,billing,0.5,0.5\n", ["line 2", "more fields"]),
        "noid.csv": ("x,y\n1,2\n", ["no 'id' column"]),
        "ff.csv": (b"id,label\na,b\xff\n", ["line 2", "UTF-8"]),
        "quote.tsv": ("id\tlabel\n" + '"' + "x" * (3 << 20) + "\n", ["not valid CSV"]),  # past any field limit
    }
    for name, (data, words) in cases.items():
        p = write(tmp_path / name, data)
        r = cli("eval", str(gold), "--predictions", str(p), "--labels", "billing,technical,account")
        refused(r, f"--predictions {p}", *words)
    p = write(tmp_path / "ok.jsonl", "".join(json.dumps(x) + "\n" for x in good))
    r = cli("eval", str(gold), "--predictions", str(p), "--labels", "billing,technical,account")
    assert r.exit_code == 0 and "accuracy 100.00 %" in r.output, r.output


def test_eval_plots_folder_missing_is_made_and_unusable_is_refused(tmp_path):
    pytest.importorskip("matplotlib")
    gold = _gold(tmp_path)
    p = write(tmp_path / "p.jsonl", json.dumps(_pred("a")) + "\n" + json.dumps(_pred("b", "technical")) + "\n")
    base = ["eval", str(gold), "--predictions", str(p), "--labels", "billing,technical,account", "--plots"]
    r = cli(*base, str(tmp_path / "new" / "deeper"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "new" / "deeper" / "confusion.png").is_file()
    write(tmp_path / "afile", "x")
    refused(cli(*base, str(tmp_path / "afile" / "sub")), "--plots", "cannot create the folder")
    r = cli(*base, str(tmp_path / "afile"))
    assert r.exit_code == 2 and BUG_REPORT not in r.output  # click: a file where a folder is asked for


# ----------------------------------------------------------------------------- resume


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_resume_after_a_torn_or_edited_output_or_manifest(tiny_qwen_mlx, tmp_path, fmt):
    inp = write(
        tmp_path / "in.jsonl", "".join(json.dumps({"id": f"t{i}", "text": f"item {i} x"}) + "\n" for i in range(6))
    )
    out = tmp_path / f"out.{fmt}"
    args = ["classify", str(inp), "-o", str(out), "--model", str(tiny_qwen_mlx), "-q", "--window", "2"]
    r = cli(*args)
    assert r.exit_code == 0, r.output
    whole = out.read_bytes()
    manifest = Path(str(out) + ".mlx-slm.json")
    man = json.loads(manifest.read_text())
    man["complete"], man["rows"] = False, None  # as an interrupted run leaves it
    lines = whole.split(b"\n")
    edits = {
        "torn 0xff": b"\n".join(lines[:3]) + b"\n\xff\xfe garbage\n",
        "blank line": b"\n".join(lines[:2]) + b"\n\n" + b"\n".join(lines[2:]),
        "one field": b"\n".join(lines[:2]) + b"\nx\n",
        "deep": b"\n".join(lines[:2]) + b"\n" + b"[" * 50_000 + b"\n",
    }
    for what, data in edits.items():
        write(out, data)
        manifest.write_text(json.dumps(man))
        refused(cli(*args, "--resume"), str(out), "start again without --resume")
        assert out.read_bytes() == data, what  # refused: left untouched
    for bad in ({"manifest_version": "2"}, {"complete": "yes"}, {"rows": -1}, {"fitted_calibrator": [1]}):
        write(out, whole)
        manifest.write_text(json.dumps({**man, **bad}))
        refused(cli(*args, "--resume"), str(manifest), "not a readable mlx-slm manifest", next(iter(bad)))
    manifest.write_bytes(b"\xff{")
    refused(cli(*args, "--resume"), "not a readable mlx-slm manifest")
    write(out, whole)
    manifest.write_text(json.dumps(man))
    r = cli(*args, "--resume")
    assert r.exit_code == 0 and out.read_bytes() == whole, r.output


# ----------------------------------------------------------------------------- the service

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")


class _Server:
    """The real app under uvicorn on a loopback port, in a thread (as tests/test_server.py)."""

    def __init__(self, service):
        from mlx_slm.server import bind_socket, create_app

        self.service = service
        self.sock = bind_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        cfg = uvicorn.Config(create_app(service), log_level="error", lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        end = time.time() + 60
        while time.time() < end:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    def post(self, content: bytes, timeout: float = 30):
        return httpx.post(
            self.url + "/v1/classify", content=content, headers={"content-type": "application/json"}, timeout=timeout
        )

    def metric(self, outcome: str) -> float:
        text = httpx.get(self.url + "/metrics").text
        key = f'mlx_slm_requests_total{{outcome="{outcome}"}}'
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(key))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def server(tiny_qwen_mlx):
    from mlx_slm.server import ServeOptions, Service, classifier_loader

    with _Server(Service(classifier_loader(str(tiny_qwen_mlx)), ServeOptions(max_wait_ms=2))) as s:
        yield s


def test_service_hostile_bodies_are_422_and_counted(server):
    before = server.metric("invalid")
    bodies = {
        "deep": b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # 200 KB, nested past the recursion limit
        "deep object": b'{"text": "x", "labels": ' + b'{"a":' * 60_000 + b"1" + b"}" * 60_000 + b"}",
        "surrogate text": b'{"text": "hello \\ud800 there"}',
        "surrogate texts": b'{"texts": ["ok", "\\udfff"]}',
        "surrogate id": b'{"texts": ["ok"], "ids": ["\\ud800"]}',
        "surrogate label": b'{"text": "ok", "labels": ["a\\ud800", "b"]}',
        "surrogate system": b'{"text": "ok", "system": "\\ud800"}',
        "surrogate template": b'{"text": "ok", "template": "{text}\\ud800"}',
        "surrogate field name": b'{"text": "ok", "\\ud800": 1}',
        "not utf-8": b'{"text": "\xff"}',
        "big int": b'{"text": "ok", "min_confidence": ' + b"9" * 5000 + b"}",
        "nan": b'{"text": "ok", "min_confidence": NaN}',
    }
    for what, body in bodies.items():
        r = server.post(body)
        assert r.status_code == 422, (what, r.status_code, r.text[:300])
        assert r.json()["error"]["status"] == 422, what
    assert server.metric("invalid") - before == len(bodies)
    assert server.metric("error") == 0
    assert server.post(b'{"text": "My card was charged twice."}').status_code == 200


def test_client_gone_mid_upload_logs_no_traceback(server):
    rec = _Records()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "uvicorn", "mlx_slm.server", "")]
    for lg in loggers:
        lg.addHandler(rec)
    try:
        before = server.metric("client_gone")
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(
                b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n" + b'{"text": "' + b"a" * 5000
            )
            time.sleep(0.05)
            s.close()
        end = time.time() + 10
        while server.metric("client_gone") - before < 5:
            assert time.time() < end, "disconnects were not counted"
            time.sleep(0.05)
    finally:
        for lg in loggers:
            lg.removeHandler(rec)
    tracebacks = [
        r for r in rec.records if r.exc_info or "Traceback" in r.getMessage() or "Exception" in r.getMessage()
    ]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


def test_port_in_use_is_one_line_and_exit_2(tmp_path):
    from mlx_slm.server import bind_socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}: the port is in use"):
            bind_socket("127.0.0.1", port)
        r = cli("serve", "--port", str(port), "--model", "no-such-model")
        refused(r, f"127.0.0.1:{port}", "in use", "--port")
    finally:
        holder.close()


def test_a_timed_out_forward_does_not_hold_up_the_next_request(tiny_qwen_mlx):
    """Compute is made slow (a sleep per padded token in the forward pass); the request timeout
    is shorter than a full micro-batch would take. A request of many texts and one of a very
    long text time out (504); the trivial request sent right after each gets its answer (200)
    rather than waiting behind work for a request nobody waits for. Nothing here asserts a
    duration: only the status codes."""
    from mlx_slm.server import ServeOptions, Service, classifier_loader

    per_token = 0.012  # seconds of "compute" per token: a full micro-batch (512 tokens) takes ~6 s
    inner = classifier_loader(str(tiny_qwen_mlx))

    def slow_loader():
        loaded = inner()
        eng = loaded.clf.engine
        fwd, pre = eng.forward, eng.prefix

        def forward(batch, *a, **k):
            time.sleep(per_token * batch.padded_tokens)
            return fwd(batch, *a, **k)

        def prefix(tokens):
            cache, computed = pre(tokens)
            if computed:
                time.sleep(per_token * len(tokens))
            return cache, computed

        eng.forward, eng.prefix = forward, prefix
        return loaded

    opts = ServeOptions(max_wait_ms=2, request_timeout_s=2.0)
    many = {"texts": [f"ticket {i}: my invoice shows the wrong amount again" for i in range(96)]}
    long = {"text": " ".join(["the invoice and the app and my account"] * 70)}  # ~900 tokens: ~11 s
    with _Server(Service(slow_loader, opts)) as s:
        for heavy in (many, long):
            r = s.post(json.dumps(heavy).encode(), timeout=60)
            assert r.status_code == 504, r.text[:300]
            nxt = s.post(b'{"text": "My card was charged twice."}', timeout=60)
            assert nxt.status_code == 200, nxt.text[:300]
        text = httpx.get(s.url + "/metrics").text
        dropped = sum(float(ln.split()[-1]) for ln in text.splitlines() if 'outcome="dropped"' in ln)
        assert dropped > 0  # the timed-out work was dropped, not computed
