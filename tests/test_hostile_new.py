"""Hostile input against this round's features (issues 20-22): the label trie and labels with
descriptions, learned heads, the drop-in routes and the Python API. Each test is one class of
failure found by trying them as a careless user would; every bad input must end in a clear
message (exit 2, a 4xx, or a TypeError/UserError naming the field and the fix), never a
traceback, a silent wrong answer or a dropped row."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.labels import LabelError
from mlx_slm.prompts import PromptError

LABELS = ["billing", "technical", "account"]
SYSTEM = "Route the ticket."
TEMPLATE = "Ticket: {text}\nCategory:"


@pytest.fixture(scope="module")
def engine(tiny_qwen_mlx):
    from mlx_slm.engine import Engine

    return Engine.load(str(tiny_qwen_mlx))


def _clf(engine, labels=LABELS, **kw):
    from mlx_slm.classifier import Classifier

    return Classifier(engine, labels, kw.pop("system", SYSTEM), kw.pop("template", TEMPLATE), **kw)


def test_labels_as_one_string_a_generator_or_whitespace_twins(engine):
    """One str was iterated into characters ("label 'l' is given twice"); a generator was read
    twice (the second time empty: "need at least two labels, got []"); "a" and "a " were two
    labels in the API while the CLI and the service strip them into one."""
    with pytest.raises(LabelError, match=r"got one str 'billing,technical'.*\['billing', 'technical'\]"):
        _clf(engine, "billing,technical")
    assert _clf(engine, (x for x in LABELS)).labels == tuple(LABELS)
    with pytest.raises(LabelError, match="differ only in surrounding whitespace"):
        _clf(engine, ["billing", "billing ", "account"])
    with pytest.raises(LabelError, match="labels must be a list of strings, got int"):
        _clf(engine, 5)


def test_label_placeholders_in_the_template_are_refused(engine, tiny_qwen_mlx, tmp_path):
    """`{labels}` in --template reached the model as the literal braces, silently."""
    with pytest.raises(PromptError, match=r"the template holds \{labels\}.*system"):
        _clf(engine, template="Ticket: {text}\nOne of {labels}:")
    with pytest.raises(PromptError, match=r"\{label_descriptions\}"):
        _clf(engine, template="{label_descriptions}\n{text}")
    r = CliRunner().invoke(
        main,
        ["classify", "--model", str(tiny_qwen_mlx), "-q", "--template", "T: {text} pick {labels}"],
        input="hello\n",
    )
    assert r.exit_code == 2 and "the template holds {labels}" in r.output and "Traceback" not in r.output


def test_prompt_arguments_of_the_wrong_type(engine):
    """A non-str system or template, descriptions that are not a mapping of strings, and
    descriptions of unknown labels (checked only when the system message was set) were an
    AttributeError, a TypeError without a field, or nothing at all."""
    with pytest.raises(PromptError, match="system message must be a string"):
        _clf(engine, system=5)
    with pytest.raises(PromptError, match="template must be a string"):
        _clf(engine, template=None)
    with pytest.raises(PromptError, match="must be a mapping"):
        _clf(engine, system="{label_descriptions}", label_descriptions=["billing"])
    with pytest.raises(PromptError, match="description of 'billing' is int"):
        _clf(engine, system="{label_descriptions}", label_descriptions={"billing": 5})
    with pytest.raises(PromptError, match="not among the labels"):
        _clf(engine, system=None, label_descriptions={"refund": "money back"})
    # A label holding a placeholder's text is not filled a second time.
    from mlx_slm.prompts import fill_labels

    assert fill_labels("{labels}|{label_descriptions}", ["a{label_descriptions}", "b"]) == (
        "a{label_descriptions}, b|- a{label_descriptions}\n- b"
    )


def test_api_examples_with_an_unknown_label_are_refused(engine):
    """--examples and task files refuse an example whose label is not a label; the Python API
    took it silently (a few-shot turn answering a label the model may not choose)."""
    with pytest.raises(PromptError, match="example 2: label 'refund' is not one of the labels"):
        _clf(engine, examples=[("charged twice", "billing"), ("money back", "refund")])
    with pytest.raises(PromptError, match="example 1: the example's text is empty"):
        _clf(engine, examples=[("  ", "billing")])


def test_texts_not_iterable_and_windows_that_read_nothing(engine):
    """classify(None) said "'NoneType' object is not iterable"; window=0 yielded no prediction
    at all for any input (every input row must give a row); window=-1 was islice's error."""
    clf = _clf(engine)
    for bad in (None, 5, 2.5):
        with pytest.raises(TypeError, match="texts must be an iterable of str"):
            clf.classify(bad)
    for w in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="window must be an integer of at least 1"):
            list(clf.classify_iter(["a", "b"], window=w))
        with pytest.raises(ValueError, match="window must be an integer"):
            clf.run(["a"], window=w)
        with pytest.raises(ValueError, match="window must be an integer"):
            clf.features(["a"], [1], window=w)
    assert [p.index for p in clf.classify_iter(["a", "b", "c"], window=np.int64(2))] == [0, 1, 2]


def test_missing_texts_say_missing(engine):
    """A NaN or None text in a frame was 'text must be a string, got float'."""
    pd = pytest.importorskip("pandas")
    clf = _clf(engine)
    df = pd.DataFrame({"text": ["my card was charged", float("nan"), None, "", 3]})
    out = clf.classify_frame(df)
    assert out["label"].notna().tolist() == [True, False, False, False, False]
    err = out["error"].tolist()
    assert "missing" in err[1] and "missing" in err[2] and "empty" in err[3] and "got int" in err[4]
    with pytest.raises(ValueError, match="2 columns named 'text'"):
        clf.classify_frame(pd.DataFrame([["a", "b"]], columns=["text", "text"]))


def test_from_task_keywords_and_the_weights_it_names(engine, tiny_qwen_mlx):
    """from_task(task, scoring=...) was Python's "got multiple values for keyword argument";
    min_confidence= could not override the task's; and the weights refusal named the task's
    model, not the engine's weights it was refusing."""
    from mlx_slm.classifier import Classifier
    from mlx_slm.heads import Head
    from mlx_slm.task import Task, TaskError

    t = Task(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE, min_confidence=0.9)
    with pytest.raises(TypeError, match="from_task takes scoring from the task"):
        Classifier.from_task(t, engine=engine, scoring="sequence")
    assert Classifier.from_task(t, engine=engine, min_confidence=0.2).min_confidence == 0.2
    d = 64
    head = Head(tuple(LABELS), (1,), np.zeros(d), np.ones(d), np.zeros((3, d)), np.zeros(3))
    other = Task("/elsewhere/model", LABELS, SYSTEM, TEMPLATE, weights_sha256="0" * 64, head=head)
    with pytest.raises(TaskError, match=f"but {tiny_qwen_mlx} has"):
        Classifier.from_task(other, engine=engine)


def test_cli_labels_file_notes_and_empty_file(tiny_qwen_mlx, tmp_path):
    """Descriptions without {label_descriptions} in --system were dropped without a word; an
    empty --labels-file said 'need at least two labels ... got []' without naming the file."""
    labels = tmp_path / "labels.tsv"
    labels.write_text("ab\tthe first kind\nac\tthe second kind\n")
    base = ["classify", "--model", str(tiny_qwen_mlx), "--labels-file", str(labels)]
    r = CliRunner().invoke(main, base, input="hello\n")
    assert r.exit_code == 0 and "has no {label_descriptions}" in r.stderr
    r = CliRunner().invoke(main, [*base, "--system", "Kinds:\n{label_descriptions}"], input="hello\n")
    assert r.exit_code == 0 and "label_descriptions" not in r.stderr
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n  \n")
    r = CliRunner().invoke(main, ["classify", "--model", str(tiny_qwen_mlx), "--labels-file", str(empty)], input="x\n")
    assert r.exit_code == 2 and f"--labels-file {empty} holds no labels" in r.output


def test_head_server_request_with_its_own_prompt(engine, tiny_qwen_mlx):
    """On a server whose task has a learned head, a request with the head's labels and its own
    system or template was a 422 "scoring mode 'head' is not one of auto, first-token,
    sequence"; it now scores those labels (the head holds for its own prompt only)."""
    from mlx_slm.heads import Head
    from mlx_slm.server import ServeOptions, Service, classifier_loader

    d = int(engine.model.args.hidden_size)
    rng = np.random.default_rng(0)
    head = Head(tuple(LABELS), (1,), np.zeros(d), np.ones(d), rng.normal(size=(3, d)), np.zeros(3))
    service = Service(
        classifier_loader(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE, head=head), ServeOptions(max_wait_ms=5)
    )
    service._load()
    assert service.front_classifier(service.default_key).mode == "head"
    for key in (
        service.task_key(None, "Another system message.", None, None),
        service.task_key(None, None, "Message: {text}\nQueue:", None),
    ):
        front = service.front_classifier(key)
        assert front.head is None and front.mode in ("first-token", "sequence")
        assert front.classify(["my card was charged twice"])[0].ok


def test_server_batches_count_the_label_trie(tiny_qwen_mlx):
    """The service's micro-batch budget and time estimate counted a request's prompt tokens
    only, not the label trie each row runs beside them (the classifier's own plan counts it):
    with many multi-token labels the estimate was the trie's share too low."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from test_server import ThreadServer

    from mlx_slm.server import ServeOptions, Service, classifier_loader

    service = Service(classifier_loader(str(tiny_qwen_mlx)), ServeOptions(max_wait_ms=5))
    seen: list[list[int]] = []
    submit = service.submit

    def spy(job, texts, key, costs, hits):
        seen.append(list(costs))
        return submit(job, texts, key, costs, hits)

    service.submit = spy  # type: ignore[method-assign]
    s = ThreadServer(service).start()
    try:
        labels = ["card arrival late", "card arrival", "lost or stolen card", "refund request status", "top up"]
        body = {"texts": ["my card has not come"], "labels": labels}
        r = httpx.post(s.url + "/v1/classify", json=body, timeout=60)
        assert r.status_code == 200, r.text
        front = service.front_classifier(service.task_key(labels, None, None, None))
        assert front.mode == "sequence" and front.row_extra > 0
        item = front.prepare(body["texts"])[0]
        assert seen[-1] == [len(item.ids) - len(front.prefix_tokens) + front.row_extra]
    finally:
        s.stop()


def test_trie_scores_equal_the_per_label_passes_on_random_label_sets(engine):
    """The claim behind the trie, checked on random label sets (shared prefixes, a label that is
    a prefix of another, unicode, tabs and newlines inside labels, tiny trie chunks): the same
    labels and scores as one batched pass per label."""
    rng = np.random.default_rng(7)
    words = ["card", "arrival", "late", "refund", "status", "pin", "top up", "é", "日本", "a", "ab", "\tx", "new\nline"]
    texts = ["my card was charged twice", "app crashes", "where is my refund?", "x", "hello world " * 6]
    for _ in range(4):
        labels = list(
            dict.fromkeys(" ".join(rng.choice(words, rng.integers(1, 4))) for _ in range(rng.integers(2, 14)))
        )
        if len(labels) < 2:
            continue
        trie = _clf(engine, labels, scoring="sequence", batch_size=int(rng.choice([1, 2, 8])))
        trie.labelset = dataclasses.replace(trie.labelset, max_trie_nodes=int(rng.choice([1, 3, 256])))
        per = _clf(engine, labels, scoring="sequence", label_pass="per-label")
        for a, b in zip(trie.classify(texts), per.classify(texts)):
            assert a.label == b.label
            assert max(abs(a.scores[k] - b.scores[k]) for k in labels) < 1e-3, labels


def test_training_gold_labels_with_spaces_around_them(tmp_path):
    """A gold ' billing' beside 'billing' became a label of its own (a head with two billings,
    each with half the examples); it is now named with its line."""
    from mlx_slm.train import TrainError, read_training_data

    rows = [{"text": f"t{i}", "label": lab} for i, lab in enumerate(["billing", "account"] * 5)]
    rows.append({"text": "charged twice", "label": " billing"})
    p = tmp_path / "train.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for labels in (None, ["billing", "account"]):
        with pytest.raises(TrainError, match="line 11: gold label ' billing' has spaces around it"):
            read_training_data(str(p), labels, folds=2)
