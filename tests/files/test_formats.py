"""What format an input is (`files/formats.py`): the sniffer's rules, and a JSON array read as JSONL
refused as a whole (through `read_rows`, from a file of each extension and from stdin)."""

import pytest

from mlx_slm.files.formats import guess_format, json_array_start, sniff
from mlx_slm.ground.textfiles import BOM, InputError
from tests.files.test_readers import read_bytes


@pytest.mark.parametrize(
    ("line", "opens"),
    [
        ("[", True),
        ('  [ {"text": "a"},', True),
        ('[{"text": "a"}]', True),
        ("[1, 2, 3]", True),
        ("[URGENT] charged twice", False),
        ("[ ] empty", False),
        ('{"text": "[a]"}', False),
        ("", False),
    ],
)
def test_json_array_start(line, opens):
    assert json_array_start(line) is opens


def test_the_sniffer_reads_a_json_array_as_jsonl_only_on_the_first_line():
    assert sniff([(1, "["), (2, '  {"text": "a"}')]) == "jsonl"
    assert sniff([(1, ""), (2, "[")]) == "text"  # a blank first line: not an array document's start
    assert guess_format("-", b'[\n{"text": "a"}\n]\n') == "jsonl" and guess_format("x.txt", b"[\n") == "text"


@pytest.mark.parametrize(
    "data",
    [
        b'[{"id": 1, "text": "a"}, {"id": 2, "text": "b"}]\n',  # an array on one line
        b'[\n  {"id": 1, "text": "a"},\n  {"id": 2, "text": "b"}\n]\n',  # json.dump(indent=2)
        b'[{"id": 1, "text": "a"},\n{"id": 2, "text": "b"}]',  # one object a line, in brackets
        BOM + b'[\n{"text": "a"}\n]\n',
    ],
)
@pytest.mark.parametrize("name", ["in.json", "in.jsonl", "in.dat", None])
def test_a_json_array_read_as_jsonl_is_refused_saying_how_to_convert_it(data, name, tmp_path):
    """Not one error row a line (or, sniffed, every line a text to classify): the input as a whole."""
    with pytest.raises(InputError, match=r"one JSON array, not JSON Lines.*jq -c"):
        read_bytes(data, None, name, tmp_path)


@pytest.mark.parametrize(
    "data",
    [b"[URGENT] charged twice\nsecond\n", b"[ ] empty brackets\n", b"[1, 2\n"],
)
def test_text_that_starts_with_a_bracket_is_still_text(data, tmp_path):
    rows = read_bytes(data, None, None, tmp_path)
    assert [r.text for r in rows] == data.decode().splitlines() and all(r.error is None for r in rows)


def test_a_json_array_is_text_when_the_format_says_text_and_a_later_array_line_is_one_error_row(tmp_path):
    rows = read_bytes(b'[{"text": "a"}]\n', "text", None, tmp_path)
    assert [r.text for r in rows] == ['[{"text": "a"}]']
    rows = read_bytes(b'{"text": "a"}\n["b"]\n', None, "in.jsonl", tmp_path)
    assert rows[0].text == "a" and "got list" in rows[1].error
