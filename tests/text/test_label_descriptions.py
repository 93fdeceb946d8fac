"""Labels with descriptions: the labels file's two shapes, the `{labels}` / `{label_descriptions}`
placeholders, and the CLI end to end (the saved task holds the message the model saw)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.readers import read_label_descriptions, read_labels_file
from mlx_slm.ground.errors import UserError
from mlx_slm.text.prompts import PromptError, fill_labels


def test_tab_separated_and_bare_labels(tmp_path):
    p = tmp_path / "labels.tsv"
    p.write_text(
        "card arrival\tThe customer's new card has not come yet\n\nrefund\n lost or stolen card \t  gone  \r\n"
    )
    assert read_label_descriptions(str(p)) == {
        "card arrival": "The customer's new card has not come yet",
        "refund": "",
        "lost or stolen card": "gone",
    }
    assert read_labels_file(str(p)) == ["card arrival", "refund", "lost or stolen card"]


def test_jsonl_labels(tmp_path):
    p = tmp_path / "labels.jsonl"
    p.write_text('{"label": "a", "description": "first"}\n{"label": "b"}\n')
    assert read_label_descriptions(str(p)) == {"a": "first", "b": ""}


@pytest.mark.parametrize(
    "body,needle",
    [
        ('{"label": "a"}\n{"label": 3}\n', "line 2"),
        ('{"label": "a"}\n{"label": "b", "description": ["x"]}\n', "line 2"),
        ('{"label": "a"}\n{broken\n', "malformed JSON"),
        ("a\tx\n\tno name\n", "line 2: the label is empty"),
        ("a\nb\na\tagain\n", "given twice"),
    ],
)
def test_bad_labels_files_name_the_line(tmp_path, body, needle):
    p = tmp_path / "labels.txt"
    p.write_text(body)
    with pytest.raises(UserError, match=needle):
        read_label_descriptions(str(p))


def test_placeholders_filled_and_other_braces_kept():
    labels = ["card arrival", "refund"]
    system = "Route {this}. One of: {labels}.\nMeanings:\n{label_descriptions}"
    got = fill_labels(system, labels, {"card arrival": "the card has not come"})
    assert (
        got == "Route {this}. One of: card arrival, refund.\nMeanings:\n- card arrival: the card has not come\n- refund"
    )
    assert fill_labels(None, labels) is None and fill_labels("plain", labels) == "plain"
    with pytest.raises(PromptError, match="not among the labels"):
        fill_labels(system, labels, {"other": "x"})


def test_cli_descriptions_reach_the_prompt_and_the_task(tiny_qwen_mlx, tmp_path):
    labels = tmp_path / "labels.tsv"
    labels.write_text("ab\tthe first kind\nac\tthe second kind\nb\n")
    task = tmp_path / "task.json"
    args = ["classify", "--model", str(tiny_qwen_mlx), "--labels-file", str(labels), "-q"]
    sys_msg = "Answer with one of: {labels}.\n{label_descriptions}"
    r = CliRunner().invoke(main, [*args, "--system", sys_msg, "--save-task", str(task)], input="hello there\n")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    assert set(row["probs"]) == {"ab", "ac", "b"}  # scored on the names
    saved = json.loads(task.read_text())
    assert saved["system"] == "Answer with one of: ab, ac, b.\n- ab: the first kind\n- ac: the second kind\n- b"
    # The same run from the saved task gives the same row: the filled message is what was saved.
    r2 = CliRunner().invoke(main, ["classify", "--task", str(task), "-q"], input="hello there\n")
    assert r2.exit_code == 0, r2.output
    assert r2.stdout == r.stdout
