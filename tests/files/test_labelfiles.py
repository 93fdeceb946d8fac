"""Label files (`files/labelfiles.py`): `--labels-file`, a label a line with an optional description after
a tab, or JSONL objects; a bad file names its line."""

from __future__ import annotations

import pytest

from mlx_slm.files.readers import read_label_descriptions, read_labels_file
from mlx_slm.ground.errors import UserError


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
