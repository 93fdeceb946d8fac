"""The classifier (`classifier/classifier.py`): the fast path equals one item at a time and
Transformers, every switch gives the same labels, runs stream in order, count themselves and share one
engine; and what a caller hands the Python API (labels, prompts, examples, `from_task` keywords)
ends in a clear message naming the field and the fix."""

import re

import numpy as np
import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.cli import main
from mlx_slm.engine.engine import Engine
from mlx_slm.models import load_model
from mlx_slm.parity.reference import Reference
from mlx_slm.text.labels import LabelError
from mlx_slm.text.prompts import PromptError
from mlx_slm.text.workload import tickets
from tests.hostile import LABELS, SYSTEM, TEMPLATE
from tests.hostile import task_clf as _clf

TEXTS = [t for t, _ in tickets(24)]


def make(path, labels, **kw):
    return Classifier(Engine(load_model(path), AutoTokenizer.from_pretrained(str(path))), labels, **kw)


LABELSETS = {"first-token": ["a", "b", "c"], "sequence": ["ab", "ac", "b", "a"]}


@pytest.mark.parametrize("mode", ["first-token", "sequence"])
def test_fast_path_equals_one_at_a_time(tiny_mlx, mode):
    slow = make(tiny_mlx, LABELSETS[mode], batch_size=1, use_prefix_cache=False)
    fast = make(tiny_mlx, LABELSETS[mode], batch_size=8, max_batch_tokens=400)
    assert slow.mode == fast.mode == mode
    ra, rb = slow.run(TEXTS, window=len(TEXTS)), fast.run(TEXTS, window=len(TEXTS))
    a, b = list(ra), list(rb)
    assert [p.index for p in b] == list(range(len(TEXTS)))  # input order
    assert [p.label for p in a] == [p.label for p in b]
    for x, y in zip(a, b):
        for lab in x.probs:
            assert abs(x.probs[lab] - y.probs[lab]) < 1e-5
    assert rb.stats.prefix_saved_tokens > 0 and rb.stats.batches < ra.stats.batches
    assert len({p.label for p in a}) > 1  # the random model must not be constant
    if mode == "sequence":  # a shared first token and a multi-token label
        assert fast.labelset.token_ids[0][0] == fast.labelset.token_ids[3][0] and len(fast.labelset.token_ids[0]) > 1


@pytest.mark.parametrize("mode", ["first-token", "sequence"])
def test_matches_transformers_reference(tiny_mlx, mode):
    clf = make(tiny_mlx, LABELSETS[mode])
    preds = clf.classify(TEXTS[:8])
    ref = Reference(tiny_mlx, threads=1)
    for p, item in zip(preds, clf.prepare(TEXTS[:8])):
        s, _ = ref.label_scores(item.ids, clf.labelset)
        probs = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        assert clf.labels[int(np.argmax(s))] == p.label
        np.testing.assert_allclose([p.probs[lab] for lab in clf.labels], probs, atol=1e-5)


def test_every_switch_gives_the_same_labels(tiny_qwen_mlx):
    labels = LABELSETS["first-token"]
    base = [p.label for p in make(tiny_qwen_mlx, labels).classify(TEXTS)]
    for kw in (
        dict(sort=False),
        dict(use_prefix_cache=False),
        dict(max_batch_tokens=None, batch_size=32),
        dict(max_batch_tokens=64),
    ):
        assert [p.label for p in make(tiny_qwen_mlx, labels, **kw).classify(TEXTS)] == base, kw


def test_prefix_cache_unchanged_after_batches(tiny_qwen_mlx):
    clf = make(tiny_qwen_mlx, LABELSETS["sequence"])
    before = [(np.array(k), np.array(v)) for k, v in clf.prefix.kv]
    clf.classify(TEXTS)
    for (k0, v0), (k1, v1) in zip(before, clf.prefix.kv):
        np.testing.assert_array_equal(k0, np.array(k1))
        np.testing.assert_array_equal(v0, np.array(v1))


def test_classify_iter_streams_in_order_across_windows(tiny_qwen_mlx):
    clf = make(tiny_qwen_mlx, LABELSETS["first-token"])
    whole = clf.classify(TEXTS)
    streamed = list(clf.classify_iter(iter(TEXTS), window=5))
    assert [p.index for p in streamed] == list(range(len(TEXTS)))
    assert [p.label for p in streamed] == [p.label for p in whole]


def test_bad_items_become_error_predictions(tiny_qwen_mlx):
    clf = make(tiny_qwen_mlx, LABELSETS["first-token"], max_length=150)
    long = " ".join(["word"] * 200)
    preds = clf.classify(["fine", "   ", long])
    assert preds[0].ok and "empty" in preds[1].error and "--truncate" in preds[2].error


@pytest.mark.parametrize("side", ["head", "tail", "middle"])
def test_truncation_marks_rows(tiny_qwen_mlx, side):
    clf = make(tiny_qwen_mlx, LABELSETS["first-token"], max_length=150, truncate=side)
    long = " ".join(f"w{i}" for i in range(200))
    p = clf.classify([long])[0]
    assert p.ok and p.truncated and p.n_tokens <= 150


def test_token_accounting(tiny_qwen_mlx):
    clf = make(tiny_qwen_mlx, LABELSETS["first-token"], batch_size=4, max_batch_tokens=None)
    run = clf.run(TEXTS[:8])
    list(run)
    st, p = run.stats, len(clf.prefix)
    lengths = [len(it.ids) for it in clf.prepare(TEXTS[:8])]
    assert st.prompt_tokens == sum(lengths)
    assert st.prefix_saved_tokens == 8 * p - p  # net of computing the prefix once
    assert st.processed_tokens == p + sum(lengths) - 8 * p + st.padding_tokens


def test_public_api_import():
    from mlx_slm import Classifier as C
    from mlx_slm import Prediction

    assert C is Classifier and Prediction.__name__ == "Prediction"


def test_runs_count_themselves_and_share_one_engine(tiny_qwen_mlx):
    """Run figures come back per run; two tasks on one engine keep their own prefixes."""
    a = make(tiny_qwen_mlx, LABELSETS["first-token"], batch_size=4, max_batch_tokens=None)
    b = Classifier(a.engine, ["x", "y"], "Another task.", "Q: {text}\nA:")
    r1, r2 = a.run(TEXTS[:6]), b.run(TEXTS[:6])
    p1, p2 = list(r1), list(r2)
    assert r1.stats.items == r2.stats.items == 6 and a.prefix_tokens != b.prefix_tokens
    # A second run on the same engine reuses the cached prefix: no prefix cost counted again.
    r3 = a.run(TEXTS[:6])
    assert [p.label for p in r3] == [p.label for p in p1]
    assert r3.stats.prefix_saved_tokens == 6 * len(a.prefix_tokens)
    assert r1.stats.prefix_saved_tokens == 5 * len(a.prefix_tokens)
    assert {p.label for p in p2} <= {"x", "y"}
    # Time spent by the consumer between predictions is not the run's.
    import time

    r4 = a.run(TEXTS[:3])
    t0 = time.perf_counter()
    for _ in r4:
        time.sleep(0.2)
    assert r4.stats.seconds < time.perf_counter() - t0 - 0.5


def test_threads_share_one_classifier(tiny_qwen_mlx):
    from concurrent.futures import ThreadPoolExecutor

    clf = make(tiny_qwen_mlx, LABELSETS["first-token"], batch_size=3, max_batch_tokens=None)
    want = [p.label for p in clf.classify(TEXTS)]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda _: [p.label for p in clf.classify(TEXTS)], range(4)))
    assert all(g == want for g in got)


# What a caller hands the Python API and the CLI (labels, prompts, few-shot examples, `from_task`
# keywords, a labels file): every bad argument ends in a clear message (a TypeError or UserError naming
# the field and the fix, or exit 2), never a traceback, a silent wrong answer or a dropped row.


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
    from mlx_slm.text.prompts import fill_labels

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


def test_from_task_keywords_and_the_weights_it_names(engine, tiny_qwen_mlx):
    """from_task(task, scoring=...) was Python's "got multiple values for keyword argument";
    min_confidence= could not override the task's; and the weights refusal named the task's
    model, not the engine's weights it was refusing."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.task import Task
    from mlx_slm.kinds.base import TaskError
    from mlx_slm.text.heads import Head

    t = Task(str(tiny_qwen_mlx), LABELS, SYSTEM, TEMPLATE, min_confidence=0.9)
    with pytest.raises(TypeError, match="from_task takes scoring from the task"):
        Classifier.from_task(t, engine=engine, scoring="sequence")
    assert Classifier.from_task(t, engine=engine, min_confidence=0.2).min_confidence == 0.2
    d = 64
    head = Head(tuple(LABELS), (1,), np.zeros(d), np.ones(d), np.zeros((3, d)), np.zeros(3))
    other = Task("/elsewhere/model", LABELS, SYSTEM, TEMPLATE, weights_sha256="0" * 64, head=head)
    with pytest.raises(TaskError, match=re.escape(f"but the model loaded ({tiny_qwen_mlx}) has")):
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
