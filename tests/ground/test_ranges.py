"""Every number at the door (issue 33, item 2): each numeric option and parameter of the CLI, the
service, task files, the classifier and the estimator has one range (`mlx_slm.ground.ranges.RANGES`);
NaN, the infinities, zero where it is no count, and values out of range are refused before any
work, naming the option and the fix (exit 2 on the CLI, a ValueError in Python)."""

from __future__ import annotations

import json
import math

import click
import pytest

from mlx_slm.cli import main
from mlx_slm.ground.ranges import RANGES, RangeError, check, check_waits
from tests.hostile import invoke, refused_cleanly, write

BAD_FLOATS = [math.nan, math.inf, -math.inf]


def _numeric_options():
    """(command, option, range name) for every numeric option of every command."""
    out = []
    for cname, cmd in sorted(main.commands.items()):
        for p in cmd.params:
            if isinstance(p, click.Option) and getattr(p.type, "range_name", None):
                out.append((cname, p.opts[0], p.type.range_name))
    return out


OPTIONS = _numeric_options()


def test_every_numeric_option_of_every_command_takes_its_range_from_the_one_table():
    """No number slips past: an option whose type is an int or a float is one of `ranges`'
    (convert's --quantize and --group-size are choices among a few sizes, checked as such)."""
    assert len(OPTIONS) >= 25
    for cname, cmd in main.commands.items():
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.opts[0] in ("--quantize", "--group-size"):
                continue
            numeric = isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))
            assert not numeric or getattr(p.type, "range_name", None), (cname, p.opts)


def test_every_numeric_options_help_shows_the_range_it_checks():
    """--help printed --none-target's range as 0.0<x<=1.0 while 1 was refused (issue 47): the bounds
    click shows are the range's own, each end open or closed as it checks."""
    for cname, cmd in main.commands.items():
        for p in cmd.params:
            name = getattr(p.type, "range_name", None)
            if not isinstance(p, click.Option) or name is None:
                continue
            r = RANGES[name]
            t = p.type
            assert (t.min, t.max, t.min_open, t.max_open) == (r.lo, r.hi, r.lo_open, r.hi_open), (cname, p.opts)
            for end, is_open in ((r.lo, r.lo_open), (r.hi, r.hi_open)):
                if end is not None:  # the end itself passes the check exactly when --help shows it closed
                    v = int(end) if r.integer else float(end)
                    assert (r.problem(v) is None) == (not is_open), (cname, p.opts, v)


def _out_of_range(name: str) -> list[str]:
    r = RANGES[name]
    vals = ["nan", "inf", "-inf", "1e309"] if not r.integer else ["nan", "1.5"]
    if r.lo is not None:
        vals.append(str(int(r.lo) - 1 if r.integer else (r.lo if r.lo_open else r.lo - 1)))
    if r.hi is not None:
        vals.append(str(int(r.hi) + 1 if r.integer else r.hi * 2))
    return vals


@pytest.mark.parametrize(("command", "option", "name"), OPTIONS, ids=[f"{c}{o}" for c, o, _ in OPTIONS])
def test_every_numeric_option_refuses_nan_infinities_and_out_of_range_at_the_door(command, option, name, tmp_path):
    data = write(tmp_path / "in.jsonl", '{"text": "hi", "label": "a"}\n')
    args = {"classify": [data], "eval": [data], "train": [data, "--save-task", tmp_path / "t.json"],
            "merge": [data, "-o", tmp_path / "m.jsonl"]}.get(command, [])  # fmt: skip
    for value in _out_of_range(name):
        r = invoke([command, *args, "--model", tmp_path / "no-model", f"{option}={value}"])
        refused_cleanly(r, option)
        assert "no-model" not in r.output  # refused before the model is looked for


def test_the_service_options_refuse_what_killed_or_hung_the_worker():
    """--request-timeout nan killed the worker (every request 504 behind a 200 /health); inf or
    1e309 and --max-wait-ms inf overflowed a thread wait; --max-wait-ms nan never answered."""
    from mlx_slm.service import ServeOptions

    for field in ("request_timeout_s", "max_wait_ms", "drain_timeout_s"):
        for v in BAD_FLOATS:
            with pytest.raises(RangeError, match=RANGES[field].flag):
                ServeOptions(**{field: v})
    for field in ("max_batch_items", "max_queue_items", "max_items_per_request", "max_body_bytes", "task_cache"):
        with pytest.raises(RangeError, match=RANGES[field].flag):
            ServeOptions(**{field: 0})
    with pytest.raises(RangeError, match="--request-timeout"):
        ServeOptions(request_timeout_s=0)
    with pytest.raises(RangeError, match="lone request would time out"):
        ServeOptions(max_wait_ms=5000, request_timeout_s=2)
    check_waits(5, 60)
    ServeOptions(max_batch_tokens=None)  # None: the classifier's budget


def test_the_serve_command_refuses_a_wait_as_long_as_the_timeout(tmp_path):
    r = invoke(["serve", "--model", tmp_path / "no-model", "--max-wait-ms", "60000", "--request-timeout", "30"])
    refused_cleanly(r, "--max-wait-ms", "--request-timeout")


def test_python_apis_refuse_the_same_numbers(engine):
    from mlx_slm.jobs.plan import TaskOptions
    from tests.hostile import task_clf

    with pytest.raises(RangeError, match="--window"):
        TaskOptions(window=0)
    with pytest.raises(RangeError, match="--min-confidence"):
        TaskOptions(min_confidence=math.nan)
    for kw in ({"batch_size": 0}, {"batch_size": 2.5}, {"max_batch_tokens": math.nan}, {"max_batch_tokens": -1}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            task_clf(engine, **kw)


@pytest.mark.parametrize(
    "params",
    [{"batch_size": 0}, {"max_batch_tokens": math.nan}, {"max_batch_tokens": 0}, {"folds": 1}, {"batch_size": True},
     {"random_state": -1}],
)  # fmt: skip
def test_the_estimator_refuses_numbers_out_of_range_before_loading_a_model(params, tmp_path):
    pytest.importorskip("sklearn")
    from mlx_slm.sklearn import SLMClassifier

    est = SLMClassifier(model=str(tmp_path / "no-model"), **params)
    with pytest.raises(ValueError, match=next(iter(params))):
        est.fit(["a b", "c d", "e f", "g h"], ["x", "y", "x", "y"])


@pytest.mark.parametrize(
    ("field", "value"), [("warmup", "NaN"), ("warmup", "Infinity"), ("warmup", "1"), ("min_confidence", "NaN"),
                         ("min_confidence", "-Infinity"), ("min_confidence", "1.5")],
)  # fmt: skip
def test_a_task_files_numbers_have_the_same_ranges(field, value, tmp_path):
    from mlx_slm.classifier.task import Task
    from mlx_slm.kinds.base import TaskError

    doc = {"format": "mlx-slm.task", "version": 1, "model": "m", "labels": ["a", "b"], "template": "{text}"}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc)[:-1] + f', "{field}": {value}}}')
    with pytest.raises(TaskError, match=f"field '{field}' must be"):
        Task.load(str(p))


def test_a_range_names_its_bounds_and_takes_numpy_numbers():
    np = pytest.importorskip("numpy")
    assert check("batch_size", np.int64(8)) == 8
    assert check("min_confidence", np.float32(0.5)) == np.float32(0.5)
    with pytest.raises(
        RangeError, match=r"--batch-size must be an integer from 1 to 2147483647 \(rows per batch\), got 0"
    ):
        check("batch_size", 0)
    with pytest.raises(RangeError, match=r"above 0 and at most 86400 \(seconds\), got nan: e.g. --request-timeout 60"):
        check("request_timeout", math.nan)
