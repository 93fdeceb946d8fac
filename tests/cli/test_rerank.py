"""`mlx-slm rerank`'s inputs and options (issue 40): a queries file read as classify reads a
JSONL input (a lone surrogate, bad ids and duplicates are error rows naming their line, never a
traceback); the options a reranker's scorer cannot use refused by name (one rule, in
`kinds/rerank.py`, for rerank, classify, serve and the Python API); an empty input and an -o
named for another format refused (exit 2, nothing written)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.cli import main
from mlx_slm.ground.errors import UserError
from tests.conftest import make_tiny


def run(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _records(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def cross(tiny_arch):
    return tiny_arch.seqcls_mlx("qwen2", 1)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A tiny causal LM with one-token yes and no, named as a reranker (auto: the qwen3 scorer)."""
    from mlx_slm.weights.convert import convert

    base = tmp_path_factory.mktemp("rr-lm")
    hf = make_tiny(base / "hf", "qwen2", words=("yes", "no"))
    return convert(hf, base / "tiny-Qwen3-Reranker", dtype="float32", progress=None)


@pytest.fixture
def docs(tmp_path):
    p = tmp_path / "docs.jsonl"
    p.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(3)))
    return p


def test_a_queries_file_is_read_as_classify_reads_its_input(cross, tmp_path):
    """ids as classify's (a string or an integer, unique; a bad one: an error row with a null id)
    and a query or document that is not valid Unicode: error rows naming the line, no traceback."""
    lines = [
        {"id": 1, "query": "card charged", "documents": ["a", "b"]},
        {"id": 1, "query": "again", "documents": ["a"]},  # a duplicate id
        {"id": {"x": 1}, "query": "q", "documents": ["a"]},
        {"id": 1.5, "query": "q", "documents": ["a"]},
        {"id": True, "query": "q", "documents": ["a"]},
        {"query": "\ud800", "documents": ["a"]},  # a lone surrogate, escaped in the JSON
        {"query": "fine", "documents": ["\ud800"]},
        {"id": "z", "query": "last", "documents": ["c"]},
    ]
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    r = run(["rerank", queries, "--model", cross, "-o", out, "-q"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    rows = _records(out)
    errors = [x for x in rows if "error" in x]
    assert [(x["query_id"], x["line"]) for x in errors] == [(None, 2), (None, 3), (None, 4), (None, 5), (6, 6), (7, 7)]
    assert "duplicate id 1" in errors[0]["error"] and "got dict" in errors[1]["error"]
    assert "got float" in errors[2]["error"] and "got bool" in errors[3]["error"]
    assert "line 6" in errors[4]["error"] and "surrogate" in errors[4]["error"]
    assert "line 7" in errors[5]["error"] and "documents[0]" in errors[5]["error"]
    assert [x["query_id"] for x in rows if "rank" in x] == [1, 1, "z"]
    # the same ids through classify: the same error rows
    inp = tmp_path / "c.jsonl"
    inp.write_text("".join(json.dumps({**({"id": x["id"]} if "id" in x else {}), "text": "t"}) + "\n" for x in lines))
    c = [json.loads(x) for x in run(["classify", inp, "--model", cross, "-q"]).stdout.splitlines()]
    assert [(x["id"], x["line"]) for x in c if "error" in x] == [(None, 2), (None, 3), (None, 4), (None, 5)]


def test_the_kind_refuses_a_lone_surrogate_in_any_item():
    """The Python API: a text, pair, query or document with a lone surrogate is an error item."""
    from mlx_slm.kinds.base import check_texts

    got = check_texts(None, ["\ud800", ("x", "\ud800"), ("x", 5), "ok"], 0)
    assert ["surrogate" in (i.error or "") for i in got] == [True, True, False, False]
    assert "must be a string, got int" in got[2].error and got[3].error is None


def test_a_surrogate_item_is_an_error_row_in_the_api(cross):
    clf = Classifier.load(str(cross), reranker="auto")
    preds = list(clf.run([("\ud800", "d"), ("q", "\ud800"), ("q", "d")]))
    assert [p.ok for p in preds] == [False, False, True] and "surrogate" in preds[0].error


@pytest.mark.parametrize(
    "which, args, named",
    [
        ("cross", ["--template", "Q: {text}"], "--template"),
        ("cross", ["--system", "Be brief."], "--system"),
        ("cross", ["--instruction", "Find it"], "--instruction"),
        ("lm", ["--template", "Q: {text}"], "--template"),  # auto: the qwen3 scorer, the card's own prompt
        ("lm", ["--reranker", "qwen3", "--system", "hi"], "--system"),
        ("lm", ["--reranker", "question", "--instruction", "x"], "--instruction"),
    ],
)
def test_a_setting_the_scorer_cannot_use_is_refused_by_name(which, args, named, cross, lm, docs, tmp_path):
    model = cross if which == "cross" else lm
    out = tmp_path / "out.jsonl"
    r = run(["rerank", "--query", "q", docs, "--model", model, *args, "-o", out])
    assert r.exit_code == 2 and named in r.output and "drop " + named in r.output, r.output
    assert not out.exists()
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"text": "q", "text_pair": "d"}) + "\n")
    c = run(["classify", pairs, "--model", model, "--reranker", "auto", *args])  # the same rule in classify
    if "--reranker" not in args:
        assert c.exit_code == 2 and named in c.output, c.output
    key = named.removeprefix("--")  # and in the Python API
    with pytest.raises(UserError, match=named):
        Classifier.load(str(model), reranker=args[1] if args[0] == "--reranker" else "auto", **{key: args[-1]})


def test_serve_refuses_them_too(cross):
    r = run(["serve", "--model", cross, "--reranker", "auto", "--template", "Q: {text}"])
    assert r.exit_code == 2 and "--template" in r.output


def test_the_settings_the_scorer_takes_still_run(lm, docs):
    assert run(["rerank", "--query", "q", docs, "--model", lm, "--instruction", "Find it", "-q"]).exit_code == 0
    r = run(["rerank", "--query", "q", docs, "--model", lm, "--reranker", "question", "--system", "Say yes or no.",
             "--template", "Q: {query} D: {text}", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output


def test_instruction_without_a_reranker_is_refused(cross, docs):
    r = run(["classify", docs, "--model", cross, "--instruction", "x"])
    assert r.exit_code == 2 and "--instruction" in r.output and "--reranker" in r.output


@pytest.mark.parametrize("name", ["out.parquet", "out.csv", "out.tsv", "out.txt", "out"])
def test_rerank_output_named_for_another_format_is_refused(name, cross, docs, tmp_path):
    out = tmp_path / name
    r = run(["rerank", "--query", "q", docs, "--model", cross, "-o", out])
    assert r.exit_code == 2 and f"-o {out}" in r.output and ".jsonl" in r.output, r.output
    assert not out.exists()


def test_rerank_output_named_jsonl_is_written(cross, docs, tmp_path):
    out = tmp_path / "out.ndjson"
    assert run(["rerank", "--query", "q", docs, "--model", cross, "-o", out, "-q"]).exit_code == 0
    assert [x["rank"] for x in _records(out)] == [1, 2, 3]


def test_an_empty_input_is_refused(cross, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "out.jsonl"
    r = run(["rerank", "--query", "q", empty, "--model", cross, "-o", out])
    assert r.exit_code == 2 and "no documents" in r.output and not out.exists(), r.output
    r = run(["rerank", empty, "--model", cross, "-o", out])
    assert r.exit_code == 2 and "empty" in r.output and not out.exists(), r.output


def test_document_options_with_a_queries_file_are_refused(cross, tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"query": "q", "documents": ["a"]}) + "\n")
    r = run(["rerank", queries, "--model", cross, "--text-field", "body"])
    assert r.exit_code == 2 and "--text-field" in r.output
    named = tmp_path / "n.jsonl"
    named.write_text(json.dumps({"qid": "a", "query": "q", "documents": ["a"]}) + "\n")
    r = run(["rerank", named, "--model", cross, "--id-field", "qid", "-q"])  # --id-field names the queries' ids
    assert r.exit_code == 0 and json.loads(r.stdout.splitlines()[0])["query_id"] == "a"
