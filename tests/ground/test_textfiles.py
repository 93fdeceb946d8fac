"""One text file a user named, read as UTF-8 with its problems named (`ground/textfiles.py`): a BOM,
bytes that are not UTF-8, a lone surrogate, a folder, a JSON error's place."""

import json

import pytest

from mlx_slm.classifier.task import Task
from mlx_slm.files.labelfiles import read_label_descriptions
from mlx_slm.files.readers import read_rows
from mlx_slm.ground.errors import UserError
from mlx_slm.text.prompts import read_examples
from mlx_slm.text.questions import read_questions
from tests.classify_run import cli, run


def test_json_errors_say_where_without_a_doubled_at(tiny_qwen_mlx, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "a", "text": "never closed\n')
    r = run(["classify", str(inp), *cli(tiny_qwen_mlx)])
    err = json.loads(r.stdout.splitlines()[0])["error"]
    assert "Unterminated string starting at column 21" in err and "at at" not in err


def test_read_text_file_drops_a_bom_and_names_a_bad_byte_by_line_and_column(tmp_path):
    from mlx_slm.ground.textfiles import BOM, InputError, read_text_file

    good = tmp_path / "labels.txt"
    good.write_bytes(BOM + b"a\nb\n")
    assert read_text_file(str(good), "--labels-file") == "a\nb\n"
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a\nbc\xffd\n")
    with pytest.raises(InputError, match=r"--labels-file .*bad.txt line 2: invalid UTF-8 \(byte 0xff at column 3\)"):
        read_text_file(str(bad), "--labels-file")
    with pytest.raises(InputError, match="is a folder, not a file"):
        read_text_file(str(tmp_path), "task file")
    with pytest.raises(InputError, match="does not exist: check the path"):
        read_text_file(str(tmp_path / "nope.json"), "task file")


def test_text_that_is_not_utf8_is_named_where_it_stops():
    from mlx_slm.ground.textfiles import has_lone_surrogate, not_utf8, text_problem

    assert not has_lone_surrogate("café") and not_utf8("café") is None
    assert not_utf8("ab\udcffc") == "byte 0xff at position 3"  # a byte kept by surrogateescape
    assert not_utf8("a\ud800") == "a lone surrogate \\ud800 at position 2"  # half a pair from a JSON escape
    assert text_problem({"ok": ["x", {"k\ud800": 1}]}) == "a lone surrogate \\ud800 at position 2"
    assert text_problem({"ok": [1, 2.5, None, "fine"]}) is None


def test_check_json_text_names_the_line_of_the_lone_escape():
    from mlx_slm.ground.textfiles import InputError, check_json_text, lone_escape_line

    text = '{"a": "ok",\n "b": "\\ud83d\\ude00",\n "c": "\\ud800"}'
    assert lone_escape_line(text) == 3  # the pair on line 2 is whole
    with pytest.raises(InputError, match=r"task file t.json line 3: a string holds a lone surrogate"):
        check_json_text(json.loads(text), "task file t.json", text)
    check_json_text(json.loads('{"a": "\\ud83d\\ude00"}'), "task file", "")  # a whole pair is text


def test_json_error_words_each_fault():
    from mlx_slm.ground.textfiles import json_error

    with pytest.raises(json.JSONDecodeError) as e:
        json.loads('{"a": }')
    assert json_error(e.value) == "Expecting value at column 7"
    assert json_error(e.value, line=True) == "Expecting value at line 1, column 7"
    assert json_error(RecursionError()) == "nested too deeply"
    assert json_error(ValueError("Exceeds the limit")).startswith("a number too long to read")


# A number too long for Python to read is said so in every JSON reader (hostile round eight, issue 53),
# not as Python's `sys.set_int_max_str_digits` advice, which no user of a file can follow.


HUGE = "9" * 5000


def _fault(fn, path) -> str:
    with pytest.raises(UserError) as e:
        fn(str(path))
    return str(e.value)


@pytest.mark.parametrize(
    "name, line, read",
    [
        ("input.jsonl", f'{{"text": "a", "n": {HUGE}}}', lambda p: next(iter(read_rows(p))).error),
        (
            "examples.jsonl",
            f'{{"text": "a", "label": "x", "n": {HUGE}}}',
            lambda p: _fault(lambda q: read_examples(q, ["x", "y"]), p),
        ),
        ("labels.jsonl", f'{{"label": "x", "n": {HUGE}}}', lambda p: _fault(read_label_descriptions, p)),
        ("questions.jsonl", f'{{"name": "q", "n": {HUGE}}}', lambda p: _fault(read_questions, p)),
        ("questions.json", f'[{{"name": "q", "n": {HUGE}}}]', lambda p: _fault(read_questions, p)),
        ("task.json", f'{{"model": "m", "n": {HUGE}}}', lambda p: _fault(Task.load, p)),
    ],
)
def test_every_json_reader_says_a_number_is_too_long(tmp_path, name, line, read):
    p = tmp_path / name
    p.write_text(line + "\n")
    said = read(p)
    assert "number too long" in said and "set_int_max_str_digits" not in said, said
