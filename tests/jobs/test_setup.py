"""The right refusal, once (issue 33, items 4 and 5): a task naming the model it was given is not
"changed"; a placeholder a question kind does not fill is refused (it reached the model as written);
a question no text fits is one usage error, not an error row per text; a damaged head says what is
damaged; the estimator checks its examples and template as the CLI does, before loading a model;
options a run would ignore are refused by name (--calibration-data without fit|em, eval
--predictions with run options), and eval --questions applies every option as classify, reading
stdin once.

From hostile round five (issue 33); was tests/test_refusals_round5.py."""

from __future__ import annotations

import json

import pytest

from mlx_slm.text.workload import tickets
from tests.hostile import invoke, refused_cleanly, write


@pytest.fixture(scope="module")
def head_task(tiny_qwen_mlx, tmp_path_factory):
    d = tmp_path_factory.mktemp("head")
    data = write(d / "lab.jsonl", "".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in tickets(36)))
    r = invoke(["train", data, "--save-task", d / "head.json", "--model", tiny_qwen_mlx, "--layers", "1,2",
                "--folds", "3", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    return d / "head.json"


def test_a_task_given_its_own_model_labels_or_prompt_is_not_changed(head_task, tiny_qwen_mlx, tiny_qwen_hf, tmp_path):
    data = write(tmp_path / "in.jsonl", '{"text": "My card was charged twice"}\n')
    task = json.loads(head_task.read_text())
    same = [["--model", tiny_qwen_mlx], ["--model", str(tiny_qwen_mlx) + "/"], ["--template", task["template"]],
            ["--labels", ",".join(task["labels"])]]  # fmt: skip
    for extra in same:
        r = invoke(["classify", data, "--task", head_task, *extra, "-q"])
        assert r.exit_code == 0, (extra, r.output)
    # Other weights are refused once compared by sha256 (equal weights elsewhere are the task's own: issue 47).
    refused_cleanly(
        invoke(["classify", data, "--task", head_task, "--model", tiny_qwen_hf, "-q"]), "does not carry over"
    )
    refused_cleanly(invoke(["classify", data, "--task", head_task, "--template", "T: {text}", "-q"]),
                    "with --template changed")  # fmt: skip


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


def test_a_question_no_text_fits_is_one_usage_error(tiny_qwen_mlx, tmp_path):
    q = write(tmp_path / "q.jsonl", json.dumps({"name": "big", "question": "why " * 25_000, "labels": ["a", "b"]}))
    out = tmp_path / "o.jsonl"
    data = write(tmp_path / "in.jsonl", "".join(json.dumps({"text": t}) + "\n" for t, _ in tickets(5)))
    r = invoke(["classify", data, "--questions", q, "--model", tiny_qwen_mlx, "-o", out])
    refused_cleanly(r, "question 'big'", "over the model's context of 1024", "shorten the question")
    assert not out.exists() and r.output.count("error") == 1


@pytest.mark.parametrize(
    ("head", "words"),
    [({}, ["field 'kind'"]), ({"kind": None}, ["field 'kind'"]), ({"kind": "lda", "pooling": 3}, ["field 'pooling'"]),
     ({"kind": "lda", "pooling": []}, ["field 'pooling'"]), ({"kind": "newer"}, ["'newer' head", "upgrade mlx-slm"])],
)  # fmt: skip
def test_a_damaged_head_names_the_field_and_only_a_newer_one_says_upgrade(head, words, head_task, tmp_path):
    task = json.loads(head_task.read_text())
    task["head"] = {**task["head"], **head} if head else {}
    if "pooling" in head and head["pooling"] == []:
        task["head"]["pooling"] = []
    if head == {"kind": None}:
        task["head"]["kind"] = None
    bad = write(tmp_path / "t.json", json.dumps(task))
    r = invoke(["classify", write(tmp_path / "in.jsonl", '{"text": "hi"}\n'), "--task", bad])
    refused_cleanly(r, f"task file {bad}", *words)
    assert "None" not in r.output and ("upgrade" in r.output) == ("upgrade mlx-slm" in words)


@pytest.mark.parametrize(
    ("params", "words"),
    [({"examples": [("a",)]}, ["example 1", "(text, label) pair"]),
     ({"examples": [("charged twice", "zzz")]}, ["example 1", "'zzz' is not one of the labels"]),
     ({"examples": [(3, "x")]}, ["example 1", "its text is int"]),
     ({"examples": "charged,x"}, ["examples must be a list"]),
     ({"template": "Ticket:"}, ["no {text} placeholder"]),
     ({"template": "{text} {labels}"}, ["{labels}"])],
)  # fmt: skip
def test_the_estimator_checks_examples_and_template_at_fit_before_any_model(params, words, tmp_path):
    pytest.importorskip("sklearn")
    from mlx_slm.sklearn import SLMClassifier

    est = SLMClassifier(model=str(tmp_path / "no-model"), method="labels", **params)
    with pytest.raises(ValueError) as e:
        est.fit(["charged twice", "app crashes", "card lost", "login fails"], ["x", "y", "x", "y"])
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert "no-model" not in str(e.value)


def test_calibration_data_without_fit_or_em_is_refused(tmp_path):
    data = write(tmp_path / "in.jsonl", '{"text": "hi", "label": "a"}\n')
    for extra in ([], ["--calibrate", "batch"]):
        r = invoke(["classify", data, "--labels", "a,b", "--calibration-data", data, *extra, "--model", tmp_path / "m"])
        refused_cleanly(r, "--calibration-data is fitted by --calibrate fit or em only")


@pytest.fixture
def gold(tmp_path):
    rows = [
        {"text": t, "team": ("a", "b")[i % 2], "urgent": ("yes", "no")[i % 3 == 0]}
        for i, (t, _) in enumerate(tickets(12))
    ]
    data = write(tmp_path / "gold.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    q = write(tmp_path / "q.jsonl", json.dumps({"name": "team", "question": "Which team?", "labels": ["a", "b"]}) + "\n"
              + json.dumps({"name": "urgent", "question": "Urgent?", "labels": ["yes", "no"]}) + "\n")  # fmt: skip
    return data, q


def test_eval_questions_applies_calibration_abstain_and_save_task_as_classify(tiny_qwen_mlx, gold, tmp_path):
    data, q = gold
    base = ["eval", "-", "--model", tiny_qwen_mlx, "--questions", q, "--gold-field", "team", "--gold-field",
            "urgent", "-q"]  # fmt: skip
    stdin = data.read_text()
    raw = invoke([*base, "--json", tmp_path / "raw.json"], input=stdin)  # stdin read once for both fields
    assert raw.exit_code == 0, raw.output
    task = tmp_path / "t.json"
    cal = invoke([*base, "--calibrate", "batch", "--warmup", "4", "--min-confidence", "0.9", "--save-task", task,
                  "--json", tmp_path / "cal.json"], input=stdin)  # fmt: skip
    assert cal.exit_code == 0, cal.output
    r0, r1 = (json.loads((tmp_path / f).read_text())["questions"] for f in ("raw.json", "cal.json"))
    assert r0 != r1  # the options changed the report, as they change classify's labels
    saved = json.loads(task.read_text())
    assert saved["calibration"] == "batch" and saved["warmup"] == 4 and saved["min_confidence"] == 0.9
    out = tmp_path / "o.jsonl"  # the same abstentions as classify with the same flags
    c = invoke(["classify", data, "--model", tiny_qwen_mlx, "--questions", q, "--calibrate", "batch", "--warmup", "4",
                "--min-confidence", "0.9", "-q", "-o", out])  # fmt: skip
    abstained = sum(1 for ln in out.read_text().splitlines() if json.loads(ln)["answers"]["team"]["label"] is None)
    assert c.exit_code == 0 and r1["team"]["abstained"] == abstained > 0 and r0["team"]["abstained"] == 0


def test_eval_questions_refuses_a_question_given_twice_and_run_options_with_predictions(tiny_qwen_mlx, gold, tmp_path):
    data, q = gold
    base = ["eval", data, "--model", tiny_qwen_mlx, "--questions", q]
    refused_cleanly(invoke([*base, "--gold-field", "team", "--gold-field", "team=urgent"]),
                    "--gold-field team=urgent", "question 'team' is given twice")  # fmt: skip
    preds = write(tmp_path / "p.jsonl", "")
    for flag in (["--calibrate", "batch"], ["--min-confidence", "0.5"], ["--save-task", tmp_path / "t.json"]):
        r = invoke([*base, "--gold-field", "team", "--predictions", preds, *flag])
        refused_cleanly(r, "--predictions scores a classify output as it was written", flag[0])


def test_a_text_far_over_the_context_is_refused_by_its_size_before_tokenizing(engine, monkeypatch):
    """The tiny model: tokens of at most 13 characters, a context of 1024: a text of more than
    2 x 13 x 1024 characters cannot fit, and is an error row without being tokenized (a 20 MB line
    took 26 s and 3.6 GB to be refused); a shorter over-long one is tokenized and refused as before;
    with truncation both are cut, not refused."""
    from mlx_slm.text.prompts import max_token_chars
    from tests.hostile import task_clf

    per = max_token_chars(engine.tokenizer)
    assert per == max(len(t) for t in engine.tokenizer.get_vocab())
    huge, long = "word " * (2 * per * 1024 // 5 + 10), "word " * 1500
    seen: list[int] = []
    clf = task_clf(engine)
    kind = type(clf.kind)
    real = kind.encode
    monkeypatch.setattr(
        kind, "encode", lambda self, texts, pairs=None: seen.extend(map(len, texts)) or real(self, texts, pairs)
    )
    preds = list(clf.run([huge, long, "My card was charged twice"]))
    assert "characters, far over the model's context of 1024" in preds[0].error
    assert "prompt is" in preds[1].error and preds[2].ok
    assert max(seen) < len(huge)  # the huge text never reached the tokenizer
    cut = list(task_clf(engine, truncate="head").run([huge, long]))
    assert all(p.ok and p.truncated for p in cut)
