"""Several questions per text in one pass (`text/questions.py`; the branches' packing is in
test_branches.py).

The promise: every answer equals the same question asked alone and Transformers scoring
that question's full prompt afresh, on every architecture (sliding windows included), with
texts whose last token merges with the question's first across the boundary; bad question
files are named with their line and field; the CLI writes answers in every format.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.text.questions import (
    Question,
    QuestionError,
    check_questions,
    check_template,
    read_questions,
)
from tests.hostile import invoke, refused_cleanly, write

YN = ("y", "n")  # one token each in the tiny test tokenizer ("yes" is three there)
QUESTIONS = [
    Question("team", "Which team should handle it?", "choice", ("billing", "technical", "account"),
             descriptions={"billing": "charges and refunds"}),
    Question("urgent", "Is it urgent?", "yesno", YN),
    Question("mood", "How upset is the customer?", "scale", ("1", "2", "3", "4", "5")),
    Question("tags", "Does it mention {label}?", "multi", ("card", "app", "email"), answers=YN),
    Question("product", "Which product?", "choice", ("mobile app", "web site"), none="none of these"),
]  # fmt: skip
# Texts ending in a newline or spaces: their last token merges with the question's first.
TEXTS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.\n",
    "I need to change the email address on my profile  ",
    "refund please\n\n",
    "x",
]


# --------------------------------------------------------------------------- pure: questions
def test_question_kinds_and_answers():
    q = Question("mood", "How?", "scale", ("1", "2", "3"))
    a = q.answer([np.log([0.2, 0.3, 0.5])])
    assert a["label"] == "3" and a["expected"] == pytest.approx(0.2 + 0.6 + 1.5)
    words = Question("size", "How big?", "scale", ("small", "big"))
    assert words.answer([np.log([0.25, 0.75])])["expected"] == pytest.approx(1.75)  # ranks 1..n
    none = Question("p", "Which?", "choice", ("a", "b"), none="none of these")
    a = none.answer([np.log([0.3, 0.1, 0.6])])
    assert a["label"] is None and a["abstain"] == pytest.approx(0.6) and a["probs"]["a"] == pytest.approx(0.75)
    assert none.answer([np.log([0.5, 0.1, 0.4])])["label"] == "a"
    multi = Question("t", "Mentions {label}?", "multi", ("x", "y"), threshold=0.6)
    a = multi.answer([np.log([0.7, 0.3]), np.log([0.55, 0.45])])
    assert a["labels"] == ["x"] and a["probs"]["y"] == pytest.approx(0.55)
    yn = Question("u", "Urgent?", "yesno", ("yes", "no"))
    assert yn.answer([np.log([0.2, 0.8])]) == {"label": "no", "probs": {"yes": pytest.approx(0.2), "no": 0.8}}
    assert [b[1] for b in multi.blocks()] == [("yes", "no")] * 2 and "Mentions y?" in multi.blocks()[1][0]


@pytest.mark.parametrize(
    "obj, needle",
    [
        ({"name": "a", "question": "", "labels": ["x", "y"]}, "'question' must be a non-empty string"),
        ({"name": "id", "question": "Q?", "labels": ["x", "y"]}, "clashes with an output field"),
        ({"name": "a b", "question": "Q?", "labels": ["x", "y"]}, "use letters, digits"),
        ({"name": "a", "question": "Q?", "kind": "scale", "levels": ["1"]}, "has 1 level(s)"),
        ({"name": "a", "question": "Q?", "labels": ["x", "x"]}, "given twice"),
        ({"name": "a", "question": "Q?", "labels": ["x", "y"], "thresold": 0.3}, "did you mean 'threshold'"),
        ({"name": "a", "question": "Q?", "kind": "multi", "labels": ["x", "y"]}, "must hold {label}"),
        ({"name": "a", "question": "Q?", "kind": "poll", "labels": ["x", "y"]}, "not one of choice"),
        ({"name": "a", "question": "Q?", "kind": "yesno", "answers": ["yes"]}, "two strings"),
        ({"name": "a", "question": "Q?", "labels": ["x", "y"], "none": 3}, "'none' is a string"),
        ({"name": "a", "question": "Q?", "labels": ["x", "y"], "threshold": 0.2}, "only a multi"),
        (["not", "an", "object"], "a question is a JSON object"),
    ],
)
def test_bad_questions_are_named(obj, needle):
    with pytest.raises(QuestionError) as e:
        Question.from_dict(obj, "q.jsonl line 3")
    assert needle in str(e.value) and "line 3" in str(e.value)


def test_question_sets_and_files(tmp_path):
    with pytest.raises(QuestionError, match="given twice"):
        check_questions([QUESTIONS[0], QUESTIONS[0]])
    with pytest.raises(QuestionError, match="at most 256"):
        check_questions([Question(f"q{i}", "Q?", "choice", ("a", "b")) for i in range(257)])
    with pytest.raises(QuestionError, match="no questions"):
        check_questions([])
    with pytest.raises(QuestionError, match="must come after {text}"):
        check_template("{question}\n{text}")
    check_template("Ticket: {text}\n{question}")
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps(q.to_dict()) for q in QUESTIONS) + "\n")
    assert read_questions(str(f)) == tuple(QUESTIONS)
    g = tmp_path / "q.json"
    g.write_text(json.dumps([q.to_dict() for q in QUESTIONS]))
    assert read_questions(str(g)) == tuple(QUESTIONS)
    f.write_text(json.dumps(QUESTIONS[0].to_dict()) + "\n{oops\n")
    with pytest.raises(QuestionError, match="line 2: malformed JSON"):
        read_questions(str(f))
    f.write_text("")
    with pytest.raises(QuestionError, match="holds no questions"):
        read_questions(str(f))


# --------------------------------------------------------------------------- exactness, every architecture
SLOW = pytest.mark.slow


@pytest.fixture(scope="module", params=["qwen2", pytest.param("llama", marks=SLOW), pytest.param("qwen3", marks=SLOW),
                                        pytest.param("gemma3", marks=SLOW)])  # fmt: skip
def tiny_engine(request, tiny_arch):
    from mlx_slm.engine.engine import Engine

    return Engine.load(str(tiny_arch.mlx(request.param)), "float32")


def _close(a: dict, b: dict, tol: float) -> bool:
    same = a.get("label") == b.get("label") and a.get("labels") == b.get("labels")
    return same and max(abs(a["probs"][k] - b["probs"][k]) for k in a["probs"]) <= tol


def test_every_answer_equals_the_question_alone_and_transformers(tiny_engine):
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.parity.reference import Reference
    from mlx_slm.text.prompts import render, tokenize
    from mlx_slm.text.workload import tickets

    texts = TEXTS + [t for t, _ in tickets(6)]  # workload tickets: long enough to leave the window (16)
    clf = Classifier(tiny_engine, questions=QUESTIONS, batch_size=4, max_batch_tokens=None)
    assert clf.prefix is not None
    preds = clf.classify(texts)
    for q in QUESTIONS:
        alone = Classifier(tiny_engine, questions=[q], batch_size=3).classify(texts)
        for p, a in zip(preds, alone):
            assert _close(p.answers[q.name], a.answers[q.name], 1e-4), (q.name, p.answers[q.name], a.answers[q.name])
    ref = Reference(tiny_engine.path, threads=1)
    for p, text in zip(preds, texts):
        got: dict[int, list] = {}
        for b in clf.kind.plan.blocks:  # each question's full prompt, run afresh by Transformers
            ids = tokenize(tiny_engine.tokenizer, [render(tiny_engine.tokenizer, b.fmt, text)])[0]
            got.setdefault(b.question, []).append(ref.label_scores(ids, b.options)[0])
        for qi, q in enumerate(QUESTIONS):
            assert _close(q.answer(got[qi]), p.answers[q.name], 1e-3), (q.name, text)


def test_one_question_in_the_old_shape_is_unchanged(tiny_qwen_mlx):
    """labels= is still one question: the same predictions as before, no answers."""
    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.load(str(tiny_qwen_mlx), dtype="float32")
    p = clf.classify(TEXTS[:2])
    assert p[0].answers is None and set(p[0].probs) == {"billing", "technical", "account"}


def test_refused_settings_and_the_context(tiny_qwen_mlx):
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.engine.engine import Engine

    eng = Engine.load(str(tiny_qwen_mlx), "float32")
    with pytest.raises(QuestionError, match="does not go with labels"):
        Classifier(eng, ["a", "b"], questions=QUESTIONS[:1])
    from mlx_slm.text.calibration import CalibrationError

    with pytest.raises(CalibrationError, match="'em' with several questions is not supported yet"):
        Classifier(eng, questions=QUESTIONS[:1], calibration="em")
    with pytest.raises(QuestionError, match="not one token each"):
        Classifier(eng, questions=[Question("u", "Urgent?", "yesno", ("yes", "no"))])
    clf = Classifier(eng, questions=QUESTIONS[:2], max_length=200)
    long, short = clf.classify(["word " * 200, "short"])
    assert "over the model's context of 200" in long.error and short.ok and set(short.answers) == {"team", "urgent"}
    many = [Question(f"q{i}", f"Is this about topic {i}?", "yesno", YN) for i in range(300)]
    with pytest.raises(QuestionError, match="at most 256"):
        Classifier(eng, questions=many)
    big = Classifier(eng, questions=many[:256], max_batch_tokens=512)
    (p,) = big.classify(["My card was charged twice."])
    assert p.ok and len(p.answers) == 256


# --------------------------------------------------------------------------- the CLI
def test_cli_classify_questions_in_every_format(tiny_qwen_mlx, tmp_path):
    from mlx_slm.cli import main

    qf = tmp_path / "q.jsonl"
    qf.write_text("\n".join(json.dumps(q.to_dict()) for q in QUESTIONS) + "\n")
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) for i, t in enumerate(TEXTS[:3])).replace("}{", "}\n{"))
    inp.write_text(inp.read_text() + '\n{"id": 9, "text": ""}\n')
    run = CliRunner().invoke
    base = ["classify", str(inp), "--model", str(tiny_qwen_mlx), "--questions", str(qf), "-q"]
    r = run(main, [*base, "-o", str(tmp_path / "o.jsonl"), "--on-error", "skip"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [x["id"] for x in rows] == [0, 1, 2, 9] and "error" in rows[3]
    assert set(rows[0]["answers"]) == {q.name for q in QUESTIONS}
    assert isinstance(rows[0]["answers"]["tags"]["labels"], list) and "expected" in rows[0]["answers"]["mood"]
    r = run(main, [*base, "-o", str(tmp_path / "o.csv"), "--on-error", "skip"])
    assert r.exit_code == 0, r.output
    import csv

    flat = list(csv.DictReader((tmp_path / "o.csv").open()))
    assert flat[0]["team"] == rows[0]["answers"]["team"]["label"]
    assert float(flat[0]["mood.expected"]) == rows[0]["answers"]["mood"]["expected"]
    assert "product.abstain" in flat[0] and flat[3]["error"]
    manifest = json.loads((tmp_path / "o.jsonl.mlx-slm.json").read_text())
    assert [q["name"] for q in manifest["settings"]["questions"]] == [q.name for q in QUESTIONS]
    r = run(main, [*base, "--labels", "a,b"])
    assert r.exit_code == 2 and "--questions does not go with --labels" in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "a", "question": "Q?", "labels": ["x", "y"]}\n{"name": "a", "question": "Q?", "labels": ["x", "y"]}\n')  # fmt: skip
    r = run(main, [*base[:-3], "--questions", str(bad)])
    assert r.exit_code == 2 and "given twice" in r.output


# --------------------------------------------------------------------------- learned heads among the questions
@pytest.mark.parametrize("poolings", [("last", "last"), ("last", "mean")])  # layer 2, then layer 1
def test_a_head_question_equals_the_head_alone(tiny_qwen_mlx, poolings):
    """A learned head asked beside zero-shot questions reads the text's own prompt (its last
    position, its mean after the shared head) through the branches: the head alone's answers."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.engine.engine import Engine
    from mlx_slm.text.heads import Head, fit_linear, head_input
    from mlx_slm.text.workload import tickets

    eng = Engine.load(str(tiny_qwen_mlx), "float32")
    labels, system, template = ("billing", "technical", "account"), "You classify tickets.", "Ticket: {text}"
    texts = [t for t, _ in tickets(18)] + TEXTS
    base = Classifier(eng, labels, system, template, features_only=True) if _has_features_only() else None
    feats_clf = base or Classifier(eng, labels, system, template)
    got, _, _ = feats_clf.features(texts, [1, 2], poolings=sorted(set(poolings)))
    shape = Head(labels, (2, 1), np.zeros(128), np.ones(128),
                 np.zeros((3, 128)), np.zeros(3), poolings=poolings)  # fmt: skip
    x = head_input(got, [1, 2], shape).reshape(len(texts), -1)
    head = Head(labels, (2, 1), *fit_linear(x, np.arange(len(texts)) % 3, 3, "lda"), poolings=poolings, estimator="lda")
    alone = Classifier(eng, labels, system, template, head=head).classify(texts)
    qs = [Question("routed", "", "head", labels, head=head), QUESTIONS[0], QUESTIONS[3]]
    mixed = Classifier(eng, questions=qs, system=system, template=template, batch_size=5).classify(texts)
    for p, a in zip(mixed, alone):
        ans = p.answers["routed"]
        assert ans["label"] == a.label
        np.testing.assert_allclose([ans["probs"][k] for k in labels], [a.probs[k] for k in labels], atol=1e-4)
    d = qs[0].to_dict()
    assert d["kind"] == "head" and Question.from_dict(json.loads(json.dumps(d))).head.sha256 == head.sha256


def _has_features_only() -> bool:
    import inspect

    from mlx_slm.classifier.classifier import Classifier

    return "features_only" in inspect.signature(Classifier).parameters


def test_a_task_of_questions_round_trips_with_a_head(tiny_qwen_mlx, tmp_path):
    """classify --questions --save-task, then --task: the same answers; a task holding a head
    question takes more zero-shot questions with --questions; the file's mistakes are named."""
    from mlx_slm.classifier.task import Task
    from mlx_slm.cli import main
    from mlx_slm.engine.engine import Engine
    from mlx_slm.jobs.train import head_classifier
    from mlx_slm.kinds.base import TaskError
    from mlx_slm.text.heads import Head, fit_linear
    from mlx_slm.text.workload import tickets
    from mlx_slm.weights.convert import weights_sha256

    run = CliRunner().invoke
    m = str(tiny_qwen_mlx)
    qf = tmp_path / "q.jsonl"
    qf.write_text("\n".join(json.dumps(q.to_dict()) for q in QUESTIONS[:3]) + "\n")
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, (t, _) in enumerate(tickets(8))))
    task = tmp_path / "task.json"
    r = run(main, ["classify", str(inp), "--model", m, "--questions", str(qf), "-o", str(tmp_path / "a.jsonl"),
                   "--save-task", str(task), "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    saved = json.loads(task.read_text())
    assert saved["labels"] == [] and [q["name"] for q in saved["questions"]] == ["team", "urgent", "mood"]
    r = run(main, ["classify", str(inp), "--task", str(task), "-o", str(tmp_path / "b.jsonl"), "-q"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    # a head question (trained on the task's own prompt) beside three zero-shot ones
    t = Task.load(task)
    eng = Engine.load(m)
    texts = [x for x, _ in tickets(24)]
    feats, _, _ = head_classifier(eng, ("billing", "technical", "account"), t.system, t.template).features(texts, [2])
    y = np.arange(len(texts)) % 3
    head = Head(
        ("billing", "technical", "account"), (2,), *fit_linear(feats["last"][:, 0], y, 3, "lda"), estimator="lda"
    )
    with_head = Task(m, (), t.system, t.template, weights_sha256=weights_sha256(tiny_qwen_mlx),
                     questions=(Question("routed", "", "head", head.labels, head=head),))  # fmt: skip
    with_head.save(tmp_path / "head.json")
    r = run(main, ["classify", str(inp), "--task", str(tmp_path / "head.json"), "--questions", str(qf),
                   "--save-task", str(tmp_path / "mixed.json"), "-o", str(tmp_path / "c.jsonl"), "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert list(rows[0]["answers"]) == ["routed", "team", "urgent", "mood"]
    mixed = Task.load(tmp_path / "mixed.json")
    assert [q.type.name for q in mixed.questions] == ["head", "choice", "yesno", "scale"]
    r = run(main, ["classify", str(inp), "--task", str(tmp_path / "mixed.json"), "-o", str(tmp_path / "d.jsonl"), "-q"])
    assert r.exit_code == 0 and (tmp_path / "c.jsonl").read_text() == (tmp_path / "d.jsonl").read_text()
    manifest = json.loads((tmp_path / "d.jsonl.mlx-slm.json").read_text())
    assert manifest["settings"]["questions"][0]["sha256"] == head.sha256  # a head by its hash, not its weights
    r = run(main, ["classify", str(inp), "--task", str(tmp_path / "mixed.json"), "--template", "X {text}"])
    assert r.exit_code == 2 and "head was trained on its own model, labels and prompt" in r.output
    bad = dict(saved, questions=[dict(saved["questions"][0], kind="pick")])
    with pytest.raises(TaskError, match="question 1.*kind 'pick'"):
        Task.from_dict(bad, "task file t.json")
    with pytest.raises(TaskError, match="has no labels, head or fitted prior of its own"):
        Task.from_dict(dict(saved, labels=["a", "b"]), "t.json")


def test_eval_reports_each_question_named_by_its_gold_field(tiny_qwen_mlx, tmp_path):
    """eval --questions Q --gold-field team=team_gold --gold-field urgent: one report per question
    from one run; a name that is no question, a missing gold field and a multi question are named."""
    from mlx_slm.cli import main
    from mlx_slm.text.workload import tickets

    qf = tmp_path / "q.jsonl"
    qf.write_text("\n".join(json.dumps(q.to_dict()) for q in QUESTIONS[:4]) + "\n")
    data = tmp_path / "gold.jsonl"
    rows = [{"text": t, "team_gold": lab, "urgent": "y" if i % 2 else "n"} for i, (t, lab) in enumerate(tickets(9))]
    rows[4].pop("team_gold")
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["eval", str(data), "--model", str(tiny_qwen_mlx), "--questions", str(qf), "-q"]
    r = CliRunner().invoke(
        main, [*base, "--gold-field", "team=team_gold", "--gold-field", "urgent", "--json", str(tmp_path / "e.json")]
    )
    assert r.exit_code == 0, r.output
    assert "== team (choice, gold field 'team_gold')" in r.output and "== urgent (yesno" in r.output
    rep = json.loads((tmp_path / "e.json").read_text())["questions"]
    assert rep["team"]["n"] == 8 and rep["team"]["errors"] == 1 and rep["urgent"]["n"] == 9
    assert "line 5: no gold label in 'team_gold'" in r.output
    # the same reports from a classify output read back, JSONL and CSV (no model run)
    for ext in ("jsonl", "csv"):
        pred = tmp_path / f"pred.{ext}"
        r = CliRunner().invoke(main, ["classify", str(data), "--model", str(tiny_qwen_mlx), "--questions", str(qf),
                                      "-o", str(pred), "-q"])  # fmt: skip
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(main, [*base, "--predictions", str(pred), "--gold-field", "team=team_gold",
                                      "--gold-field", "urgent", "--json", str(tmp_path / "p.json")])  # fmt: skip
        assert r.exit_code == 0, r.output
        again = json.loads((tmp_path / "p.json").read_text())["questions"]
        for name in ("team", "urgent"):
            assert again[name]["accuracy"] == rep[name]["accuracy"] and again[name]["n"] == rep[name]["n"]
    r = CliRunner().invoke(main, [*base, "--gold-field", "colour=c"])
    assert r.exit_code == 2 and "'colour' is not a question" in r.output
    r = CliRunner().invoke(main, [*base, "--gold-field", "tags=t"])
    assert r.exit_code == 2 and "multi questions" in r.output
    r = CliRunner().invoke(
        main, ["eval", str(data), "--model", str(tiny_qwen_mlx), "--gold-field", "a", "--gold-field", "b"]
    )
    assert r.exit_code == 2 and "one field for a task with one question" in r.output


def test_batch_calibration_and_abstain_per_question(tiny_qwen_mlx, tmp_path):
    """--calibrate batch with questions: one prior per question (per branch), fitted on the run's
    warm-up, divided out of every answer (raw probabilities kept); --min-confidence abstains per
    question on the probabilities as written; heads are left as they are."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.cli import main
    from mlx_slm.engine.engine import Engine
    from mlx_slm.text.answers import QuestionCalibration, block_log_probs
    from mlx_slm.text.calibration import CalibrationError
    from mlx_slm.text.workload import tickets

    eng = Engine.load(str(tiny_qwen_mlx), "float32")
    texts = [t for t, _ in tickets(30)]
    clf = Classifier(eng, questions=QUESTIONS, batch_size=8)
    raw = clf.classify(texts)
    cal = clf.classify(texts, calibration="batch")
    from mlx_slm.text.calibration import fit_batch

    for q in QUESTIONS:
        # each branch's own prior, from all 30 texts (the warm-up covers them), divided out
        for b, options in enumerate(o for _, o in q.blocks()):
            lp_raw = np.array([block_log_probs(q, p.answers[q.name])[b] for p in raw])
            want = fit_batch(lp_raw, options).probs(lp_raw)
            got = np.exp([block_log_probs(q, p.answers[q.name])[b] for p in cal])
            np.testing.assert_allclose(got, want, atol=1e-9)
        assert all(c.answers[q.name]["raw_probs"] == r.answers[q.name]["probs"] for c, r in zip(cal, raw))
        for p in raw:  # block_log_probs reads an answer back: the answer again
            again = q.answer(block_log_probs(q, p.answers[q.name]))
            assert again.get("label") == p.answers[q.name].get("label")
    # the bar lies strictly between two distinct written confidences: no row sits on it, on any machine
    tops = sorted(round(max(p.answers["team"]["probs"].values()), 6) for p in raw)
    k = next(i for i in range(5, len(tops) - 1) if tops[i] < tops[i + 1])
    bar = (tops[k] + tops[k + 1]) / 2
    out = Classifier(eng, questions=QUESTIONS, min_confidence=bar).classify(texts)
    for p in out:
        a = p.answers["team"]
        assert a.get("abstained", False) == (max(a["probs"].values()) < bar) and (a["label"] is None) == a.get(
            "abstained", False
        )
    assert sum(bool(p.answers["team"].get("abstained")) for p in out) == k + 1
    with pytest.raises(CalibrationError, match="not supported yet"):
        QuestionCalibration("fit", QUESTIONS)
    qf = tmp_path / "q.jsonl"
    qf.write_text("\n".join(json.dumps(q.to_dict()) for q in QUESTIONS) + "\n")
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    r = CliRunner().invoke(main, ["classify", str(inp), "--model", str(tiny_qwen_mlx), "--questions", str(qf),
                                  "--calibrate", "batch", "--min-confidence", "0.5", "-o", str(tmp_path / "o.csv")])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "batch calibration per question (priors from the first 30 items" in r.output
    import csv

    head = next(csv.reader((tmp_path / "o.csv").open()))
    assert "team.raw_p_billing" in head and "team.abstained" in head and "tags.abstained" not in head
    r = CliRunner().invoke(main, ["classify", str(inp), "--model", str(tiny_qwen_mlx), "--questions", str(qf),
                                  "--calibrate", "em"])  # fmt: skip
    assert r.exit_code == 2 and "--calibrate em with several questions is not supported yet" in r.output


def test_shards_merge_and_resume_with_questions(tiny_qwen_mlx, tmp_path):
    """--shard parts of a questions run merge to the single run's output (JSONL byte for byte,
    Parquet with each question's typed columns), and --resume of a cut output finishes it."""
    import pyarrow.parquet as pq

    from mlx_slm.cli import main
    from mlx_slm.text.workload import tickets

    run = CliRunner().invoke
    qf, inp = tmp_path / "q.jsonl", tmp_path / "in.jsonl"
    qf.write_text("\n".join(json.dumps(q.to_dict()) for q in QUESTIONS) + "\n")
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, (t, _) in enumerate(tickets(30))))
    base = ["--model", str(tiny_qwen_mlx), "--questions", str(qf), "--window", "8", "-q"]
    whole = tmp_path / "all.jsonl"
    assert run(main, ["classify", str(inp), "-o", str(whole), *base]).exit_code == 0
    for i in range(2):
        r = run(main, ["classify", str(inp), "-o", str(tmp_path / f"p{i}.jsonl"), "--shard", f"{i}/2", *base])
        assert r.exit_code == 0, r.output
    parts = [str(tmp_path / f"p{i}.jsonl") for i in range(2)]
    assert run(main, ["merge", *parts, "-o", str(tmp_path / "m.jsonl"), "-q"]).exit_code == 0
    assert (tmp_path / "m.jsonl").read_bytes() == whole.read_bytes()
    r = run(main, ["merge", *parts, "-o", str(tmp_path / "m.parquet"), "-q"])
    assert r.exit_code == 0, r.output
    t = pq.read_table(tmp_path / "m.parquet")
    first = json.loads(whole.read_text().splitlines()[0])["answers"]
    assert t.column("team").to_pylist()[0] == first["team"]["label"]
    assert t.column("mood.expected").to_pylist()[0] == first["mood"]["expected"]
    assert str(t.schema.field("product.abstain").type) == "double"
    lines = whole.read_text().splitlines(True)
    whole.write_text("".join(lines[:11]) + lines[11][:15])  # cut mid-row, as a crash leaves it
    m = json.loads((tmp_path / "all.jsonl.mlx-slm.json").read_text())
    m["complete"] = False
    (tmp_path / "all.jsonl.mlx-slm.json").write_text(json.dumps(m))
    r = run(main, ["classify", str(inp), "-o", str(whole), "--resume", *base])
    assert r.exit_code == 0, r.output
    assert whole.read_bytes() == (tmp_path / "m.jsonl").read_bytes()


def test_train_one_head_per_field_in_one_pass(tiny_qwen_mlx, tmp_path, monkeypatch):
    """train --label-field team --label-field urgent: one forward pass over the texts, a head per
    field, a task of head questions that classify --task runs (with more --questions too); a
    row without one field's gold label, a field named like an output field, --labels: named."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.task import Task
    from mlx_slm.cli import main
    from mlx_slm.text.workload import tickets

    run = CliRunner().invoke
    rows = [{"text": t, "team": lab, "urgent": "yes" if i % 3 else "no"} for i, (t, lab) in enumerate(tickets(30))]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = []
    real = Classifier.features
    monkeypatch.setattr(Classifier, "features", lambda self, *a, **k: calls.append(len(a[0])) or real(self, *a, **k))
    task = tmp_path / "t.json"
    base = ["train", str(data), "--model", str(tiny_qwen_mlx), "--layers", "1,3", "--folds", "3"]
    r = run(main, [*base, "--label-field", "team", "--label-field", "urgent", "--save-task", str(task)])
    assert r.exit_code == 0, r.output
    assert calls == [30], calls  # one pass over the 30 texts for both heads
    assert "== team" in r.stdout and "== urgent" in r.stdout
    t = Task.load(task)
    assert [(q.name, q.type.name, q.labels) for q in t.questions] == [
        ("team", "head", ("account", "billing", "technical")), ("urgent", "head", ("no", "yes"))]  # fmt: skip
    assert t.questions[1].head.info["gold_field"] == "urgent"
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows[:5]))
    qf = tmp_path / "q.jsonl"
    qf.write_text(json.dumps(QUESTIONS[2].to_dict()) + "\n")
    r = run(main, ["classify", str(inp), "--task", str(task), "--questions", str(qf), "-o", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 0, r.output
    got = [json.loads(x)["answers"] for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert list(got[0]) == ["team", "urgent", "mood"]
    # each head alone (Classifier with head=) gives the same answers
    clf = Classifier.load(str(tiny_qwen_mlx), t.questions[0].head.labels, t.system, t.template,
                          head=t.questions[0].head)  # fmt: skip
    for p, a in zip(clf.classify([r["text"] for r in rows[:5]]), got):
        assert p.label == a["team"]["label"] and p.probs == pytest.approx(a["team"]["probs"], abs=1e-4)
    rows[7].pop("urgent")
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run(main, [*base, "--label-field", "team", "--label-field", "urgent", "--save-task", str(task)])
    assert r.exit_code == 2 and "line 8: no gold label in 'urgent'" in r.output
    r = run(main, [*base, "--label-field", "team", "--label-field", "id", "--save-task", str(task)])
    assert r.exit_code == 2 and "clashes with an output field" in r.output
    r = run(
        main, [*base, "--label-field", "team", "--label-field", "urgent", "--labels", "a,b", "--save-task", str(task)]
    )
    assert r.exit_code == 2 and "--labels goes with one --label-field" in r.output


def test_classify_frame_with_questions(tiny_qwen_mlx):
    """A DataFrame gets each question's columns, as the CSV output has them; an empty text its error."""
    import pandas as pd

    from mlx_slm.classifier.classifier import Classifier

    clf = Classifier.load(str(tiny_qwen_mlx), questions=QUESTIONS, dtype="float32")
    df = pd.DataFrame({"text": TEXTS[:3] + [""]})
    out = clf.classify_frame(df, min_confidence=0.5)
    preds = clf.classify(TEXTS[:3], min_confidence=0.5)
    assert out["team"].tolist()[:3] == [p.answers["team"]["label"] for p in preds]
    assert out["tags"].tolist()[:3] == [";".join(p.answers["tags"]["labels"]) for p in preds]
    assert out["mood.expected"].tolist()[:3] == pytest.approx([p.answers["mood"]["expected"] for p in preds])
    assert "team.abstained" in out.columns and out["error"].tolist()[3] and np.isnan(out["mood.expected"].tolist()[3])


@pytest.mark.parametrize(
    ("question", "words"),
    [
        ({"name": "team", "question": "Is it about {label}?", "labels": ["a", "b"]}, ["{label}", "only a multi"]),
        ({"name": "u", "question": "Urgent ({labels})?", "kind": "yesno"}, ["{labels}", "choice or scale"]),
        ({"name": "m", "question": "Mentions {label}: {labels}?", "kind": "multi", "labels": ["a", "b"]},
         ["{labels}"]),
        ({"name": "s", "question": "Size of {label}?", "kind": "scale", "levels": ["1", "2"]}, ["{label}"]),
        ({"name": "d", "question": "One of {label_descriptions}", "labels": ["a", "b"]}, ["{label_descriptions}"]),
    ],
)  # fmt: skip
def test_a_placeholder_the_question_kind_does_not_fill_is_refused(question, words, tmp_path):
    q = write(tmp_path / "q.jsonl", json.dumps(question) + "\n")
    r = invoke(["classify", write(tmp_path / "in.jsonl", '{"text": "hi"}\n'), "--questions", q,
                "--model", tmp_path / "no-model"])  # fmt: skip
    refused_cleanly(r, f"--questions {q} line 1", question["name"], *words)
    assert "no-model" not in r.output
