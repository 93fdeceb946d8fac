"""Property-based fuzzing (Hypothesis) of every reader and of the service's request parser.

The property, for every reader: any bytes in give rows (each with a text or an error row),
a value, or a clean refusal (a `UserError` / an `HTTPError` 4xx), never another exception
(the CLI's exit 70, the service's 500). The readers: the input readers (JSONL, CSV, TSV,
text, sniffed; Parquet pages), the task file, the `--examples` file, the `--labels-file`,
`eval --predictions` (JSONL and CSV), the output and manifest read back by `--resume`, and
the service's request parser/validator (`server.validate_request`, called directly) plus a
structured fuzz of whole requests through the app (labels, system, template reach the
tokenizer there).

Inputs are random bytes and, to get past the first check, structured ones: lines built from
hostile fragments (quotes, separators, lone CR, BOMs, 0xff, deep brackets, surrogate
escapes, huge numbers) and JSON documents of random shape around the expected fields.

Budget: `MLX_SLM_FUZZ_EXAMPLES` examples per reader (default 100, so CI stays fast; 25 in
the quick loop `-m "not slow"`, set by conftest.py; the service-through-the-app test runs a
tenth of it, at least 10). The large run, 1,000+ per reader:

    MLX_SLM_FUZZ_EXAMPLES=1000 .venv/bin/python -m pytest tests/files/test_fuzz.py -q --durations=5

(about 25 s at the default budget on a 2-core machine, some minutes at 1,000). A failure
prints the smallest input Hypothesis found; no example database is kept (`database=None`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlx_slm.ground.errors import UserError  # noqa: E402

EXAMPLES = int(os.environ.get("MLX_SLM_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# ----------------------------------------------------------------------------- strategies

FRAGMENTS = [
    b'{"text": "my card was charged"}',
    b'{"id": 1, "text": "a"}',
    b'{"id": "x", "text": "b", "label": "billing"}',
    b'{"id": null, "text": 5}',
    b'{"text": "\\ud800"}',
    b'{"id": "\\udfff", "text": "x"}',
    b"id,text,label",
    b"text\tid",
    b"id,label,p_billing,p_technical,truncated,line,error",
    b'a,"quoted, comma",billing',
    b'"never closed',
    b'""',
    b'"',
    b",",
    b"\t",
    b"\r",
    b"\n",
    b"\r\n",
    b"\xef\xbb\xbf",
    b"\xff",
    b"\xc3",
    b"\x00",
    b"[" * 3000,
    b"{" * 50,
    b"}",
    b"]",
    b"NaN",
    b"-Infinity",
    b"1e999",
    b"9" * 5000,
    b"\\ud800",
    b"\xe2\x80\xa8",
    b" ",
    b"billing",
    b"technical",
    b"0.5",
    b"high",
    b"true",
    b"null",
]

hostile_lines = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=20)), max_size=40).map(b"".join)
hostile_bytes = st.one_of(st.binary(max_size=2000), hostile_lines)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["billing", "technical", "account", "", " ", "\ud800", "{text}", "T: {text}\nC:", "batch", "none"]),
)
json_keys = st.one_of(st.text(max_size=10), st.sampled_from(["\ud800", "text", "texts", "labels", "id", ""]))
json_values = st.recursive(
    json_scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=5), st.dictionaries(json_keys, kids, max_size=5)),
    max_leaves=20,
)


def dumps(v) -> bytes:
    """JSON bytes of any value (lone surrogates escaped, NaN written as Python writes it)."""
    return json.dumps(v).encode()


def doc_around(base: dict, keys: list[str]):
    """JSON documents: `base` with some of `keys` replaced by random values, some dropped, extra keys."""
    return st.tuples(
        st.dictionaries(st.sampled_from(keys), json_values, max_size=len(keys)),
        st.lists(st.sampled_from(keys), max_size=3),
        st.dictionaries(json_keys, json_values, max_size=2),
    ).map(lambda t: {**{k: v for k, v in base.items() if k not in t[1]}, **t[0], **t[2]})


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _write(p: Path, data: bytes) -> str:
    p.write_bytes(data)
    return str(p)


# ----------------------------------------------------------------------------- input readers


@pytest.mark.parametrize("name", ["in.jsonl", "in.csv", "in.tsv", "in.txt", "in.dat"])
@FUZZ
@given(data=hostile_bytes)
def test_input_readers(work, name, data):
    from mlx_slm.files.readers import read_rows

    path = _write(work / name, data)
    try:
        rows = list(read_rows(path, gold="label"))
    except UserError:
        return
    seen = set()
    for r in rows:
        assert (r.text is None) != (r.error is None), r
        assert r.text is None or (isinstance(r.text, str) and r.text.strip())
        assert r.error is None or r.error.startswith("line ")
        if r.id is not None:
            key = (type(r.id).__name__, r.id)
            assert key not in seen
            seen.add(key)


@FUZZ
@given(records=st.lists(doc_around({"id": 1, "text": "t"}, ["id", "text", "label"]), max_size=8))
def test_input_reader_jsonl_structured(work, records):
    from mlx_slm.files.readers import read_rows

    path = _write(work / "s.jsonl", b"".join(dumps(r) + b"\n" for r in records))
    rows = list(read_rows(path, gold="label"))  # JSONL never refuses the whole input
    assert len(rows) == len(records)
    assert all((r.text is None) != (r.error is None) for r in rows)


@pytest.fixture(scope="module")
def parquet_bytes(work) -> bytes:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = work / "base.parquet"
    n = 300
    t = pa.table({"id": list(range(n)), "text": [f"ticket {i} about my invoice" for i in range(n)]})
    pq.write_table(t, p, compression="snappy", row_group_size=100)
    return p.read_bytes()


@FUZZ
@given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=8))
def test_parquet_reader_damaged_pages(work, parquet_bytes, flips):
    from mlx_slm.files.readers import read_rows

    data = bytearray(parquet_bytes)
    for where, x in flips:
        data[int(where * len(data))] ^= x
    path = _write(work / "f.parquet", bytes(data))
    try:
        rows = list(read_rows(path))
    except UserError:
        return
    assert all((r.text is None) != (r.error is None) for r in rows)


# ----------------------------------------------------------------------------- task, examples, labels

TASK = {
    "format": "mlx-slm.task",
    "version": 1,
    "model": "m",
    "labels": ["billing", "technical"],
    "system": None,
    "template": "T: {text}\nC:",
    "scoring": "auto",
    "examples": [{"text": "hi", "label": "billing"}],
    "calibration": "none",
    "warmup": 512,
    "min_confidence": None,
    "weights_sha256": None,
    "versions": {},
}


@FUZZ
@given(data=st.one_of(hostile_bytes, doc_around(TASK, list(TASK)).map(dumps)))
def test_task_file(work, data):
    from mlx_slm.classifier.task import Task

    path = _write(work / "task.json", data)
    try:
        t = Task.load(path)
    except UserError as e:
        assert path in str(e)
        return
    assert all(isinstance(x, str) for x in t.labels) and isinstance(t.template, str)
    assert all(lab in t.labels for _, lab in t.examples)
    assert isinstance(t.warmup, int) and (t.min_confidence is None or 0 <= t.min_confidence <= 1)


@FUZZ
@given(
    data=st.one_of(
        hostile_bytes,
        st.lists(doc_around({"text": "hi", "label": "billing"}, ["text", "label"]), max_size=6).map(
            lambda rs: b"".join(dumps(r) + b"\n" for r in rs)
        ),
    )
)
def test_examples_file(work, data):
    from mlx_slm.text.prompts import read_examples

    path = _write(work / "ex.jsonl", data)
    try:
        ex = read_examples(path, ["billing", "technical"])
    except UserError as e:
        assert path in str(e)
        return
    assert ex and all(isinstance(t, str) and lab in ("billing", "technical") for t, lab in ex)


@FUZZ
@given(data=hostile_bytes)
def test_labels_file(work, data):
    from mlx_slm.files.readers import read_labels_file

    path = _write(work / "labels.txt", data)
    try:
        labels = read_labels_file(path)
    except UserError as e:
        assert path in str(e)
        return
    assert all(isinstance(x, str) and x == x.strip() and x for x in labels)


# ----------------------------------------------------------------------------- eval --predictions


def _gold_rows(work: Path):
    from mlx_slm.files.readers import read_rows

    p = _write(
        work / "gold.jsonl", b'{"id": "a", "text": "x", "label": "billing"}\n{"text": "y", "label": "technical"}\n'
    )
    return list(read_rows(p, gold="label"))


PRED = {"id": "a", "label": "billing", "probs": {"billing": 0.7, "technical": 0.3}}


@pytest.mark.parametrize("name", ["p.jsonl", "p.csv", "p.tsv"])
@FUZZ
@given(
    data=st.one_of(
        hostile_bytes,
        st.lists(doc_around(PRED, ["id", "label", "probs", "error"]), min_size=1, max_size=3).map(
            lambda rs: b"".join(dumps(r) + b"\n" for r in rs)
        ),
        st.lists(st.lists(st.sampled_from(FRAGMENTS[6:]) | st.text(max_size=6).map(str.encode), max_size=9)).map(
            lambda rows: (
                b"id,label,p_billing,p_technical,truncated,line,error\n" + b"".join(b",".join(r) + b"\n" for r in rows)
            )
        ),
    )
)
def test_predictions_file(work, name, data):
    from mlx_slm.jobs.evaluate import read_predictions
    from mlx_slm.text.metrics import report

    rows = _gold_rows(work)
    path = _write(work / name, data)
    try:
        preds = read_predictions(path, rows)
    except UserError as e:
        assert path in str(e)
        return
    assert len(preds) == len(rows)
    gold, labels, conf = [], [], []
    for r, p in zip(rows, preds):
        assert isinstance(p["probs"], dict) and all(0 <= v <= 1 for v in p["probs"].values())
        if not p.get("error"):
            gold.append(str(r.gold))
            labels.append(p.get("label"))
            conf.append(max(p["probs"].values()) if p["probs"] else None)
    try:  # what the CLI does next: a clean refusal at most
        report(gold, labels, conf, ["billing", "technical", "account"])
    except UserError:
        pass


# ----------------------------------------------------------------------------- --resume: output and manifest

COLUMNS = ["id", "label", "p_billing", "p_technical", "truncated", "line", "error"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv"])
@FUZZ
@given(
    data=st.one_of(
        hostile_bytes,
        st.lists(doc_around({"id": 1, "label": "billing"}, ["id", "label", "error"]), max_size=5).map(
            lambda rs: b"".join(dumps(r) + b"\n" for r in rs)
        ),
        hostile_lines.map(lambda b: b"id,label,p_billing,p_technical,truncated,line,error\n" + b),
    ),
    window=st.integers(1, 4),
    complete=st.one_of(st.none(), st.integers(0, 6)),
)
def test_resume_scan(work, fmt, data, window, complete):
    from mlx_slm.files.output import plan_resume
    from mlx_slm.files.readers import read_rows

    inp = _write(work / "in5.jsonl", b"".join(dumps({"text": f"item {i}"}) + b"\n" for i in range(5)))
    out = _write(work / f"out.{fmt}", data)
    try:
        keep, kept, errors, redo = plan_resume(out, fmt, COLUMNS, iter(read_rows(inp)), window, complete)
    except UserError:
        return
    assert 0 <= keep <= len(data) and 0 <= errors <= kept <= 5


MANIFEST = {"manifest_version": 1, "settings": {"labels": ["a", "b"]}, "complete": False, "rows": None}


@FUZZ
@given(
    data=st.one_of(
        hostile_bytes,
        doc_around(MANIFEST, ["manifest_version", "settings", "complete", "rows", "fitted_calibrator"]).map(dumps),
    )
)
def test_manifest(work, data):
    from mlx_slm.files.output import read_manifest

    out = str(work / "m.jsonl")
    _write(Path(out + ".mlx-slm.json"), data)
    try:
        doc = read_manifest(out)
    except UserError:
        return
    assert isinstance(doc, dict) and isinstance(doc["settings"], dict)
    assert doc.get("rows") is None or isinstance(doc["rows"], int)


# ----------------------------------------------------------------------------- the service

REQUEST = {"texts": ["a", "b"], "ids": ["x", 2], "labels": ["billing", "technical"], "system": "S", "truncate": "head"}
REQUEST_KEYS = ["text", "texts", "ids", "labels", "system", "template", "truncate", "min_confidence"]


@FUZZ
@given(data=st.one_of(hostile_bytes, doc_around(REQUEST, REQUEST_KEYS).map(dumps), json_values.map(dumps)))
def test_request_validator(data):
    pytest.importorskip("starlette")
    from mlx_slm.server import HTTPError, ServeOptions, validate_request

    try:
        texts, ids, task = validate_request(data, ServeOptions(max_items_per_request=8))
    except HTTPError as e:
        assert 400 <= e.status < 500 and e.body()["error"]["message"]
        json.dumps(e.body(), ensure_ascii=False).encode("utf-8")  # the error response can be sent
        return
    assert texts and len(ids) == len(texts)
    for t in texts:  # a text, or a (text, text_pair) pair: each part a non-empty, encodable string
        parts = t if isinstance(t, tuple) else (t,)
        assert len(parts) in (1, 2) and all(isinstance(x, str) and x.strip() for x in parts)
        for x in parts:
            x.encode("utf-8")  # encodable: the tokenizer and the JSON response can take it


RERANK = {"query": "q", "documents": ["a", {"text": "b"}], "texts": ["a"], "top_n": 1, "return_documents": False}
RERANK_KEYS = ["query", "documents", "texts", "top_n", "return_documents", "raw_scores", "truncate", "rank_fields"]


@FUZZ
@given(data=st.one_of(doc_around(RERANK, RERANK_KEYS), json_values))
def test_rerank_validators(data):
    """TEI's /rerank and the Cohere/Jina body: a 4xx naming what is wrong, or a query and
    documents that are non-empty, encodable strings (never another exception)."""
    pytest.importorskip("starlette")
    from mlx_slm.server import HTTPError, ServeOptions
    from mlx_slm.server.rerank import check_cohere, check_tei_rerank

    for check in (check_tei_rerank, check_cohere):
        try:
            query, docs, task, *_ = check(data, ServeOptions(max_items_per_request=8))
        except HTTPError as e:
            assert 400 <= e.status < 500 and e.body("tei")["error"] and e.body("openai")["error"]["message"]
            json.dumps(e.body(), ensure_ascii=False).encode("utf-8")
            continue
        assert task.rerank and 1 <= len(docs) <= 8
        for x in (query, *docs):
            assert isinstance(x, str) and x.strip()
            x.encode("utf-8")


@pytest.fixture(scope="module")
def app_client(tiny_qwen_mlx):
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from mlx_slm.server import ServeOptions, Service, classifier_loader, create_app

    service = Service(classifier_loader(str(tiny_qwen_mlx)), ServeOptions(max_wait_ms=0, max_items_per_request=8))
    with TestClient(create_app(service)) as client:
        import time

        end = time.time() + 60
        while client.get("/health").status_code != 200:
            assert time.time() < end
            time.sleep(0.05)
        yield client


@settings(FUZZ, max_examples=max(10, EXAMPLES // 10))
@given(data=st.one_of(doc_around({**REQUEST, "template": "T: {text}\nC:"}, REQUEST_KEYS).map(dumps), hostile_bytes))
def test_requests_through_the_app(app_client, data):
    r = app_client.post("/v1/classify", content=data, headers={"content-type": "application/json"})
    assert r.status_code < 500, r.text[:300]
    if r.status_code == 200:
        assert all(x.get("label") or x.get("error") for x in r.json()["results"])
    else:
        assert r.json()["error"]["status"] == r.status_code
