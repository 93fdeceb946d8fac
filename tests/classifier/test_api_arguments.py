"""What a caller hands the Python API and the CLI (labels, prompts, texts, few-shot examples,
`from_task` keywords, a labels file): every bad argument ends in a clear message (a TypeError
or UserError naming the field and the fix, or exit 2), never a traceback, a silent wrong
answer or a dropped row. One test per class of failure found by trying them as a careless
user would."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.labels import LabelError
from mlx_slm.text.prompts import PromptError
from tests.hostile import LABELS, SYSTEM, TEMPLATE
from tests.hostile import task_clf as _clf


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
