"""jobs/decide.py on a tiny random model: rows in, answers out in input order, error rows, both
shapes, CSV/Parquet, exact --resume, --shard + merge, a task's temperatures, a state too long."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mlx_slm.classifier.decider import Decider
from mlx_slm.classifier.task import Task
from mlx_slm.engine import Engine
from mlx_slm.files.output import manifest_path
from mlx_slm.files.sharding import merge_parts
from mlx_slm.ground.errors import UserError
from mlx_slm.jobs.decide import DecideSettings, decide
from mlx_slm.text.decisions.files import read_questions_file
from mlx_slm.text.decisions.metrics import apply_temperature
from mlx_slm.text.decisions.questions import DecisionRequest
from mlx_slm.text.workload import tickets

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does it need an answer today?", "criteria": {"true": "Blocked"}},
    "team": {"type": "choice", "instructions": "Which team?",
             "criteria": {"billing": "Payments", "technical": None, "account": {"scope": ["login", "profile"]}}},
    "anger": {"type": "score", "instructions": "How angry?", "criteria": ["Calm", "Annoyed", "Furious"]},
}  # fmt: skip
TEXTS = [t for t, _ in tickets(9)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny qwen2 whose tokenizer has Yes and No as tokens, converted to float32 MLX."""
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    hf = make_tiny(tmp_path_factory.mktemp("hf-decide"), "qwen2", words=("Yes", "No"))
    return str(convert(hf, tmp_path_factory.mktemp("mlx-decide") / "m", dtype="float32", progress=None))


@pytest.fixture()
def files(tmp_path):
    q = tmp_path / "q.json"
    q.write_text(json.dumps(QUESTIONS))
    rows = [
        {"id": "a", "state": TEXTS[0]},
        {"id": "b", "text": TEXTS[1]},  # no state field: its text is the state
        {"id": "c", "state": {"subject": "refund", "body": TEXTS[2]}},
        {"id": "d", "state": None},
        {"id": "e", "state": [TEXTS[3], 2]},
        {"id": "f", "other": 1},
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        "\n".join(json.dumps(r) for r in rows[:3]) + "\n{broken\n" + "\n".join(json.dumps(r) for r in rows[3:]) + "\n"
    )
    return inp, q


def _run(tiny, inp, q, out=None, **kw):
    kw.setdefault("given", frozenset({"model"}))
    s = DecideSettings(input=str(inp), questions_file=str(q), output=None if out is None else str(out), model=tiny,
                       quiet=True, **kw)  # fmt: skip
    return decide(s, lambda m: None)


def _direct(tiny, states, q, shape="systemone"):
    """The Decider asked directly: each state's probabilities per question."""
    d = Decider(Engine.load(tiny), state_cache=0)
    qs = read_questions_file(str(q), d.config)
    return [r.probabilities for r in d.decide([DecisionRequest(s, qs) for s in states])], qs


def test_rows_in_input_order_error_rows_named(tiny, files, tmp_path):
    inp, q = files
    out = tmp_path / "out.jsonl"
    assert _run(tiny, inp, q, out) == 3
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["a", "b", "c", None, "d", "e", "f"]
    assert recs[3]["line"] == 4 and "malformed JSON" in recs[3]["error"]
    assert "line 5: field 'state'" in recs[4]["error"] and "got null" in recs[4]["error"]
    assert "line 7: missing field 'state'" in recs[6]["error"] and "--state-field" in recs[6]["error"]
    states = [TEXTS[0], TEXTS[1], {"subject": "refund", "body": TEXTS[2]}, [TEXTS[3], 2]]
    probs, qs = _direct(tiny, states, q)
    for rec, ps in zip([recs[i] for i in (0, 1, 2, 5)], probs):
        a = rec["answers"]
        assert list(a) == ["urgent", "team", "anger"]
        assert a["urgent"] == {"type": "noul", "noul": pytest.approx(float(ps[0][0]), abs=1e-12)}
        assert list(a["team"]["probabilities"]) == ["billing", "technical", "account"]
        np.testing.assert_allclose(list(a["team"]["probabilities"].values()), ps[1], atol=1e-12)
        assert a["team"]["choice"] == ["billing", "technical", "account"][int(np.argmax(ps[1]))]
        assert a["anger"]["legend"] == {"0": "Calm", "1": "Annoyed", "2": "Furious"}
        assert a["anger"]["score"] == pytest.approx(float(np.dot(np.arange(3), ps[2])))
    m = json.loads(manifest_path(str(out)).read_text())
    assert m["complete"] and m["rows"] == 7 and m["settings"]["form"] == "decisions"
    assert m["settings"]["decision_questions"] == QUESTIONS and m["settings"]["methods"]["saved"] == []
    assert m["settings"]["methods"]["default"] == {"style": "letters", "permute": 1, "calibration": "none"}


def test_openai_shape_and_csv_parquet(tiny, files, tmp_path):
    inp, q = files
    out = tmp_path / "o.jsonl"
    _run(tiny, inp, q, out, shape="openai")
    first = json.loads(out.read_text().splitlines()[0])["answers"]
    assert [a["type"] for a in first] == ["predicate", "choice", "score"]
    assert [a["name"] for a in first] == ["urgent", "team", "anger"]  # System One keys name OpenAI's answers
    assert [p["value"] for p in first[2]["probabilities"]] == [0, 1, 2]
    csv_in = tmp_path / "in.csv"
    csv_in.write_text("id,text\n1," + TEXTS[0].replace(",", " ") + "\n2,\n")
    _run(tiny, csv_in, q, tmp_path / "o.csv")
    import csv

    rows = list(csv.DictReader((tmp_path / "o.csv").open()))
    assert list(rows[0]) == ["id", "answers", "line", "error"]
    assert json.loads(rows[0]["answers"])["team"]["type"] == "choice" and rows[1]["error"]
    pq = pytest.importorskip("pyarrow.parquet")
    _run(tiny, inp, q, tmp_path / "o.parquet")
    t = pq.read_table(str(tmp_path / "o.parquet")).to_pylist()
    assert [r["id"] for r in t] == ["a", "b", "c", None, "d", "e", "f"]
    assert json.loads(t[0]["answers"])["urgent"]["type"] == "noul"


def test_resume_is_byte_identical(tiny, files, tmp_path):
    inp, q = files
    whole = tmp_path / "whole.jsonl"
    _run(tiny, inp, q, whole, window=2)
    part = tmp_path / "part.jsonl"
    _run(tiny, inp, q, part, window=2)
    lines = part.read_bytes().splitlines(keepends=True)
    part.write_bytes(b"".join(lines[:3]) + lines[3][:10])  # interrupted mid-row
    m = json.loads(manifest_path(str(part)).read_text())
    m["complete"] = False
    manifest_path(str(part)).write_text(json.dumps(m))
    _run(tiny, inp, q, part, window=2, resume=True)
    assert part.read_bytes() == whole.read_bytes()


def test_shards_merge_into_the_single_run(tiny, files, tmp_path):
    inp, q = files
    whole = tmp_path / "whole.jsonl"
    _run(tiny, inp, q, whole, window=1)
    parts = []
    for i in range(2):
        parts.append(str(tmp_path / f"p{i}.jsonl"))
        _run(tiny, inp, q, parts[-1], window=1, shard=f"{i}/2")
    merge_parts(parts, str(tmp_path / "merged.jsonl"))
    assert (tmp_path / "merged.jsonl").read_bytes() == whole.read_bytes()
    pq = pytest.importorskip("pyarrow.parquet")
    merge_parts(parts, str(tmp_path / "merged.parquet"))  # the decisions form's columns, typed
    t = pq.read_table(str(tmp_path / "merged.parquet"))
    assert t.column_names == ["id", "answers", "line", "error"]
    want = [json.loads(x) for x in whole.read_text().splitlines()]
    assert [json.loads(a) if a else None for a in t.column("answers").to_pylist()] == [w.get("answers") for w in want]


def test_task_temperatures_apply_to_its_own_questions(tiny, files, tmp_path):
    inp, q = files
    engine = Engine.load(tiny)
    task = Task(model=tiny, labels=("a", "b"), system=None, template="{text}", weights_sha256=engine.weights_sha256,
                decisions={"questions": QUESTIONS, "temperatures": {"team": 3.0}, "fit": {}})  # fmt: skip
    task.save(tmp_path / "t.json")
    raw, cal = tmp_path / "raw.jsonl", tmp_path / "cal.jsonl"
    _run(tiny, inp, q, raw)
    s = DecideSettings(input=str(inp), output=str(cal), task_file=str(tmp_path / "t.json"), quiet=True)
    decide(s, lambda m: None)  # the task's model and questions
    a, b = (json.loads(x.read_text().splitlines()[0])["answers"] for x in (raw, cal))
    assert a["urgent"] == b["urgent"] and a["anger"] == b["anger"]  # no temperature: raw, exactly
    p = np.array(list(a["team"]["probabilities"].values()))
    np.testing.assert_allclose(list(b["team"]["probabilities"].values()), apply_temperature(p[None], 3.0)[0], atol=1e-9)
    assert b["team"]["x_raw_probabilities"] == a["team"]["probabilities"]  # the raw answer kept, exactly
    assert b["team"]["x_method"] == {
        "style": "letters",
        "permute": 1,
        "calibration": "fit",
        "fitted": True,
        "fitted_as": "team",
    }
    team = read_questions_file(str(q))[1]  # the questions file's second question
    ((saved, content),) = json.loads(manifest_path(str(cal)).read_text())["settings"]["methods"]["saved"]
    assert saved == team.digest and len(content) == 16


def test_a_state_too_long_is_an_error_row_or_a_refusal(tiny, files, tmp_path):
    _, q = files
    inp = tmp_path / "long.jsonl"
    inp.write_text(
        json.dumps({"id": 1, "state": TEXTS[0]}) + "\n" + json.dumps({"id": 2, "state": "word " * 3000}) + "\n"
    )
    out = tmp_path / "long-out.jsonl"
    assert _run(tiny, inp, q, out) == 1
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert "answers" in recs[0] and recs[1]["line"] == 2 and "line 2:" in recs[1]["error"]
    out2 = tmp_path / "long-openai.jsonl"
    assert _run(tiny, inp, q, out2, shape="openai") == 0
    refused = json.loads(out2.read_text().splitlines()[1])["answers"]
    assert [a["type"] for a in refused] == ["refusal"] * 3 and refused[0]["name"] == "urgent"


def test_no_questions_is_a_usage_error(tiny, files):
    inp, _ = files
    from mlx_slm.ground.errors import UsageError

    with pytest.raises(UsageError, match="--questions"):
        decide(DecideSettings(input=str(inp), model=tiny, quiet=True), lambda m: None)
    assert Path(inp).exists()


@pytest.mark.slow
def test_ray_writes_the_local_output(tiny, files, tmp_path):
    """decide --ray (a local Ray, two workers, one Decider each) writes the local run's rows."""
    pytest.importorskip("ray")
    import ray

    import mlx_slm.ray as mray

    inp, q = files
    local, spread = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    _run(tiny, inp, q, local)
    mray.init(num_cpus=2)
    try:
        assert _run(tiny, inp, q, spread, ray=True, workers=2) == 3
    finally:
        ray.shutdown()
    a = [json.loads(x) for x in local.read_text().splitlines()]
    b = [json.loads(x) for x in spread.read_text().splitlines()]
    assert [r["id"] for r in a] == [r["id"] for r in b]
    for x, y in zip(a, b):
        if "error" in x:
            assert x == y
            continue
        for key, ans in x["answers"].items():
            assert ans["type"] == y["answers"][key]["type"]
            got = y["answers"][key].get("probabilities") or {"noul": y["answers"][key]["noul"]}
            want = ans.get("probabilities") or {"noul": ans["noul"]}
            np.testing.assert_allclose(list(got.values()), list(want.values()), atol=1e-6)


SHARED = [t for t, _ in tickets(12)]  # three base tickets and a shared filler: states that start alike


def test_the_batch_prior_waits_for_warmup_answered_states_not_rows_tried(tiny, files, tmp_path):
    """A state too long for the model is an error row, not an answer: the warm-up goes on past it
    until --warmup states have answered, so the prior is found on as many as asked for."""
    _, q = files
    inp = tmp_path / "in.jsonl"
    states = ["word " * 3000, *TEXTS[:5]]
    inp.write_text("".join(json.dumps({"id": i, "state": st}) + "\n" for i, st in enumerate(states)))
    out = tmp_path / "out.jsonl"
    assert _run(tiny, inp, q, out, window=3, calibrate="batch", warmup=3, given=frozenset({"model", "warmup"})) == 1
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert "error" in recs[0] and all("answers" in r for r in recs[1:])
    priors = json.loads(manifest_path(str(out)).read_text())["settings"]["priors"]
    assert {p["n"] for p in priors.values()} == {3}


def _shared_input(tmp_path):
    inp = tmp_path / "shared.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "state": t}) + "\n" for i, t in enumerate(SHARED)))
    return inp


def _interrupt(out, keep_rows):
    """`out` as a run stopped by a signal leaves it: `keep_rows` rows and half of the next, unfinished."""
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:keep_rows]) + lines[keep_rows][:10])
    m = json.loads(manifest_path(str(out)).read_text())
    m["complete"] = False
    manifest_path(str(out)).write_text(json.dumps(m))


@pytest.mark.parametrize("cut", [4, 7])
def test_resume_and_shards_are_byte_exact_with_the_state_cache_on(tiny, files, tmp_path, cut):
    """States that start alike hit the state cache (the default, 64): the answers must not depend on
    what the cache held from earlier windows, so a resumed run and merged shards write the
    uninterrupted run's bytes (issue 53: ~6 % of rows moved by ~4e-7 before the cache was emptied
    at every window)."""
    _, q = files
    inp = _shared_input(tmp_path)
    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    _run(tiny, inp, q, whole, window=3)
    _run(tiny, inp, q, part, window=3)
    _interrupt(part, cut)
    _run(tiny, inp, q, part, window=3, resume=True)
    assert part.read_bytes() == whole.read_bytes()
    parts = [str(tmp_path / f"s{i}.jsonl") for i in range(2)]
    for i, p in enumerate(parts):
        _run(tiny, inp, q, p, window=3, shard=f"{i}/2")
    merge_parts(parts, str(tmp_path / "merged.jsonl"))
    assert (tmp_path / "merged.jsonl").read_bytes() == whole.read_bytes()


def test_batch_calibration_divides_by_the_first_states_mean_answer_and_resumes_with_it(tiny, files, tmp_path):
    _, q = files
    inp = _shared_input(tmp_path)
    raw, cal = tmp_path / "raw.jsonl", tmp_path / "cal.jsonl"
    _run(tiny, inp, q, raw, window=2)
    said = []
    s = DecideSettings(input=str(inp), questions_file=str(q), output=str(cal), model=tiny, window=2,
                       calibrate="batch", warmup=5, given=frozenset({"model", "warmup"}))  # fmt: skip
    decide(s, said.append)
    assert "team: batch calibration (prior from the first 5 states)" in said[-1]  # the prior found, as used
    a = [json.loads(x)["answers"] for x in raw.read_text().splitlines()]
    b = [json.loads(x)["answers"] for x in cal.read_text().splitlines()]
    team = np.array([list(r["team"]["probabilities"].values()) for r in a])
    prior = team[:5].mean(axis=0)  # the first --warmup states' raw answers
    want = team / prior
    want /= want.sum(axis=1, keepdims=True)
    got = np.array([list(r["team"]["probabilities"].values()) for r in b])
    np.testing.assert_allclose(got, want, atol=1e-9)
    assert [r["team"]["x_raw_probabilities"] for r in b] == [r["team"]["probabilities"] for r in a]
    assert b[0]["team"]["x_method"]["calibration"] == "batch"
    m = json.loads(manifest_path(str(cal)).read_text())["settings"]
    assert m["methods"]["prior"] == "batch" and m["methods"]["warmup"] == 5 and len(m["priors"]) == 3
    whole = cal.read_bytes()
    _interrupt(cal, 8)  # after the warm-up: the recorded prior is applied to the rest
    _run(tiny, inp, q, cal, window=2, calibrate="batch", warmup=5, resume=True, given=frozenset({"model", "warmup"}))
    assert cal.read_bytes() == whole
    from mlx_slm.files.output import OutputError

    _interrupt(cal, 8)
    with pytest.raises(OutputError, match="other settings") as e:
        _run(tiny, inp, q, cal, window=2, calibrate="contextual", resume=True)
    assert "--calibrate was batch, now contextual; --warmup was 5, now unset" in str(e.value), (
        e.value
    )  # words, not dicts


def test_options_in_another_order_are_another_question_to_resume_and_merge(tiny, files, tmp_path):
    """A JSON object's key order is not compared, but an option's order is the question's (its letter):
    a resume or a merge of parts asked with the options reordered is refused, naming the question; a
    resume whose manifest lost the prior its written rows were divided by is refused too."""
    from mlx_slm.files.output import OutputError

    _, q = files
    inp = _shared_input(tmp_path)
    moved = json.loads(q.read_text())
    moved["team"]["criteria"] = dict(reversed(list(moved["team"]["criteria"].items())))
    q2 = tmp_path / "q2.json"
    q2.write_text(json.dumps(moved))
    out = tmp_path / "o.jsonl"
    _run(tiny, inp, q, out, window=2, calibrate="batch", warmup=5, given=frozenset({"model", "warmup"}))
    _interrupt(out, 8)
    with pytest.raises(OutputError, match=r"question 'team' differs \(its options, their order"):
        _run(
            tiny, inp, q2, out, window=2, calibrate="batch", warmup=5, resume=True, given=frozenset({"model", "warmup"})
        )
    m = json.loads(manifest_path(str(out)).read_text())
    manifest_path(str(out)).write_text(json.dumps({**m, "settings": {**m["settings"], "priors": {}}}))
    with pytest.raises(OutputError, match=r"8 row\(s\) were answered with a batch prior that its manifest does not"):
        _run(
            tiny, inp, q, out, window=2, calibrate="batch", warmup=5, resume=True, given=frozenset({"model", "warmup"})
        )
    parts = [str(tmp_path / f"p{i}.jsonl") for i in range(2)]
    for i, qs in enumerate((q, q2)):
        _run(tiny, inp, qs, parts[i], window=3, shard=f"{i}/2")
    with pytest.raises(UserError, match=r"other settings than .*\(decision_digests\)"):
        merge_parts(parts, str(tmp_path / "merged.jsonl"))


def test_a_batch_prior_that_cannot_be_found_says_why(tiny, files, tmp_path):
    """Every warm-up row an error: the prior's refusal names them; a question over the context for
    every state: more states would not help, so it says to shorten it; a --warmup below the options:
    raise it."""
    _, q = files
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "state": null}\n{"id": 2, "state": ""}\n')
    with pytest.raises(UserError, match=r"got 0 .*2 row\(s\) of the warm-up were error rows; the first: line 1"):
        _run(tiny, bad, q, calibrate="batch")
    long = tmp_path / "long.json"
    long.write_text(json.dumps({"p": {"type": "noul", "instructions": "word " * 3000}, "team": QUESTIONS["team"]}))
    inp = _shared_input(tmp_path)
    with pytest.raises(UserError, match=r"question 'p': refused for every one of the warm-up's \d+ state"):
        _run(tiny, inp, long, calibrate="batch", shape="openai", refuse="question")
    with pytest.raises(UserError, match=r"needs at least 3 states, got 2 .*raise --warmup to 3 or more$"):
        _run(tiny, inp, q, calibrate="batch", warmup=2, given=frozenset({"model", "warmup"}))


def test_a_changed_question_is_said_in_words_as_fitted_or_trained():
    """The summary says which of the task's settings a changed question goes without (as its note does)."""
    from mlx_slm.jobs.decide import method_words
    from mlx_slm.text.decisions.answers import RAW_METHOD

    for made in ("fitted", "trained"):
        note = f"question 'team' differs from the one {made} under that id (...)"
        said = method_words({**RAW_METHOD, "note": note})
        assert said == f"raw, NOT the task's {made} settings: the question changed"


def test_a_resume_of_an_output_without_question_digests_says_so():
    from types import SimpleNamespace

    from mlx_slm.jobs.decide import DecideJob

    job = SimpleNamespace(plan=None)
    for was in (None, "edited", [["team"]]):
        said = DecideJob.said_change(job, "decision_digests", was, [["team", "d1"]])  # type: ignore[arg-type]
        assert said == "its manifest records no digest of each question (an older mlx-slm made it, or it was edited)"
    said = DecideJob.said_change(job, "decision_digests", [["b", "1"], ["a", "2"]], [["a", "2"], ["b", "1"]])  # type: ignore[arg-type]
    assert said == "the questions differ (then: b, a; now: a, b)"


def test_what_would_change_nothing_is_refused(tiny, files, tmp_path):
    from mlx_slm.ground.errors import UsageError

    inp, q = files
    with pytest.raises(UsageError, match="--warmup .* needs --calibrate batch"):
        _run(tiny, inp, q, warmup=8, given=frozenset({"model", "warmup"}))
    with pytest.raises(UsageError, match="--refuse question needs --shape openai"):
        _run(tiny, inp, q, refuse="question")
    only_noul = tmp_path / "noul.json"
    only_noul.write_text(json.dumps({"u": QUESTIONS["urgent"]}))
    with pytest.raises(UsageError, match="--permute 2 reorders a choice"):
        _run(tiny, inp, only_noul, permute=2)
    # each shard would find its own prior (the parts would not merge): refused before anything runs
    with pytest.raises(UsageError, match="--shard with --calibrate batch .* --fit-prior"):
        _run(tiny, inp, q, tmp_path / "part0.jsonl", calibrate="batch", shard="0/2")
    assert not (tmp_path / "part0.jsonl").exists()


def test_a_batch_prior_from_fewer_states_than_options_is_refused(tiny, files, tmp_path):
    """Refused before anything is written: an output already there (a run of before) and its manifest
    are left as they were, not emptied by a run that could not start."""
    from mlx_slm.files.output import manifest_path

    big, q = files
    out = tmp_path / "o.jsonl"
    _run(tiny, big, q, out)
    before, made = out.read_bytes(), manifest_path(str(out)).read_bytes()
    inp = tmp_path / "two.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "state": t}) + "\n" for i, t in enumerate(SHARED[:2])))
    with pytest.raises(UserError, match="question 'team': a prior over 3 options needs at least 3 states, got 2"):
        _run(tiny, inp, q, out, calibrate="batch")
    assert out.read_bytes() == before and manifest_path(str(out)).read_bytes() == made


def test_options_that_cannot_be_read_as_labels_are_refused_before_any_state(tiny, files, tmp_path):
    """Two options apart only in spaces are one label in the names style: the run is refused when it
    starts, naming the question, not answered with an error row per state."""
    from mlx_slm.text.decisions.errors import DecisionError

    inp, _ = files
    q = tmp_path / "q.json"
    q.write_text(json.dumps({"t": {"type": "choice", "criteria": {"billing": None, "billing ": None, "sales": None}}}))
    out = tmp_path / "o.jsonl"
    with pytest.raises(DecisionError, match="question 't': the options cannot be read as labels.*whitespace"):
        _run(tiny, inp, q, out, style="names")
    assert not out.exists() or out.read_text() == ""


def test_a_question_over_the_context_alone_is_refused_per_state_with_refuse_question(tiny, files, tmp_path):
    """The run's start checks that its questions' options can be read as labels, and no more: a
    question whose prompt is over the context even alone is OpenAI's refusal in each row (--refuse
    question), the other questions answered, as before."""
    inp, _ = files
    q = tmp_path / "q.json"
    long = {"type": "predicate", "name": "long", "instructions": "word " * 3000}
    q.write_text(json.dumps([long, {"type": "predicate", "name": "short", "instructions": "Spam?"}]))
    out = tmp_path / "o.jsonl"
    _run(tiny, inp, q, out, shape="openai", refuse="question", given=frozenset({"model", "refuse", "shape"}))
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    ok = [r for r in rows if "answers" in r]
    assert ok and all(r["answers"][0]["type"] == "refusal" and r["answers"][1]["type"] != "refusal" for r in ok)


def test_a_resume_refusal_words_the_methods_of_any_manifest_without_a_traceback():
    """`methods_change`: two runs' methods apart in the options' words; a manifest of another shape
    (an older mlx-slm's saved digests, a hand edit) is said otherwise or as recorded, never a crash."""
    from mlx_slm.jobs.decide import methods_change
    from mlx_slm.text.decisions.methods import Method, Methods

    now = {"default": {"style": "names", "permute": 1}, "prior": "none", "warmup": None, "saved": [["d1", "m2"]]}
    methods = Methods.of([Method(key="team", digest="d1")])
    was = {"default": {"style": "letters", "permute": 1}, "prior": "batch", "warmup": 64, "saved": [["d1", "m1"]]}
    said = methods_change(was, now, methods)
    assert said == (
        "--style was letters, now names; --calibrate was batch, now none; --warmup was 64, now unset; "
        "the task's questions differ: 'team' fitted or trained again"
    )
    assert "answered them without" in methods_change({**now, "saved": []}, now, methods)
    for saved in (["0123456789abcdef"], [None], 5, [[["a"], "c"]], [["a", "b", "c"]], {"d1": "c1"}):
        assert "recorded otherwise" in methods_change({**now, "saved": saved}, now, methods)
    for odd in (None, 5, "x", {"default": None}, {}):
        assert methods_change(odd, now, methods) is None
    assert methods_change({"default": {}}, now, methods) is None  # nothing it can compare: said as recorded


def test_decide_style_prompt_answers_each_question_by_its_own_classifier(tiny, tmp_path):
    """--style prompt: each question asked as its own classifier's prompt (the question as the system
    message, the state as the user's); the summary and each answer say so; with --calibrate batch the
    prior divides those answers (x_raw_probabilities beside them)."""
    from tests.decision_cli import QUESTIONS, run

    q = tmp_path / "q.json"
    q.write_text(json.dumps(QUESTIONS))
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "state": f"ticket {i}: refund please"}) + "\n" for i in range(4)))
    r = run(["decide", str(inp), "--questions", str(q), "--model", tiny, "--style", "prompt"])
    assert r.exit_code == 0 and "prompt style" in r.output, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert all(a["x_method"]["style"] == "prompt" for row in rows for a in row["answers"].values())
    r = run(["decide", str(inp), "--questions", str(q), "--model", tiny, "--style", "prompt",
             "--calibrate", "batch", "--warmup", "4", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    team = json.loads(r.stdout.splitlines()[0])["answers"]["team"]
    assert team["x_method"]["calibration"] == "batch" and "x_raw_probabilities" in team
