"""One record shape for every output: a prediction's flat CSV/TSV/Parquet row, its
`classify_frame` row and its Ray row (flattened) hold the same values under the same columns,
in the same order, for labels (calibrated or not, abstaining or not), error rows, and
questions of every kind. Predictions are built directly: no model."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_slm.files.output import columns_of, csv_columns, flat_record, question_columns, result_record
from mlx_slm.text.calibration import PROB_DIGITS, written
from mlx_slm.text.predictions import Prediction
from mlx_slm.text.questions import Question
from mlx_slm.text.records import QuestionColumns, RecordShape

pa = pytest.importorskip("pyarrow")

NAMES = ["billing", "technical", "account", "x", "y_2", "Low-1"]
FLAGS = ("truncated", "abstained")
CALIBRATION = "batch"
ROW = SimpleNamespace(id="r7", line=9, error=None)
probs_of = st.floats(0.0, 1.0, allow_nan=False)


@st.composite
def label_runs(draw: Any) -> tuple[RecordShape, list[Prediction]]:
    """A labels run (calibrated or not, abstaining or not, Ray scores or not) and its predictions."""
    labels = draw(st.lists(st.sampled_from(NAMES), min_size=2, max_size=4, unique=True))
    shape = RecordShape.of(
        labels, calibrated=draw(st.booleans()), abstains=draw(st.booleans()), scores=draw(st.booleans())
    )
    preds = []
    for i in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            preds.append(_error(draw, i))
            continue
        probs = {lab: draw(probs_of) for lab in labels}
        abstained = shape.abstains and draw(st.booleans())
        if shape.abstains:  # the threshold is decided on the written probabilities
            probs = written(probs)
        preds.append(
            Prediction(
                i,
                label=None if abstained else max(probs, key=probs.__getitem__),
                probs=probs,
                scores={lab: draw(st.floats(-30.0, 0.0)) for lab in labels},
                n_tokens=draw(st.integers(1, 500)),
                truncated=draw(st.booleans()),
                raw_probs={lab: draw(probs_of) for lab in labels} if shape.calibrated else None,
                abstained=abstained,
            )
        )
    return shape, preds


def _error(draw: Any, i: int) -> Prediction:
    # An error row is never also truncated: the output's error record has no `truncated`.
    return Prediction(i, error=draw(st.sampled_from(["text is empty", "over the model's context of 200"])))


question_columns_of = st.builds(
    QuestionColumns,
    name=st.sampled_from(["team", "urgent", "mood", "tags", "routed", "abstained"]),
    type=st.sampled_from(["choice", "yesno", "scale", "multi", "head"]),
    labels=st.lists(st.sampled_from(NAMES), min_size=2, max_size=4, unique=True).map(tuple),
)


@st.composite
def question_runs(draw: Any) -> tuple[RecordShape, list[Prediction]]:
    """A run of several questions (every kind; a choice question maybe with a none option) and its predictions."""
    qs = draw(st.lists(question_columns_of, min_size=1, max_size=4, unique_by=lambda q: q.name))
    qs = [
        QuestionColumns(q.name, q.type, q.labels, "none" if q.type.name == "choice" and draw(st.booleans()) else None)
        for q in qs
    ]
    shape = RecordShape.of(questions=qs, calibrated=draw(st.booleans()), abstains=draw(st.booleans()))
    preds = []
    for i in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            preds.append(_error(draw, i))
            continue
        answers = {q.name: _answer(draw, shape, q) for q in qs}
        preds.append(Prediction(i, n_tokens=draw(st.integers(1, 500)), truncated=draw(st.booleans()), answers=answers))
    return shape, preds


def _answer(draw: Any, shape: RecordShape, q: QuestionColumns) -> dict[str, Any]:
    """One question's answer as `Question.answer` and `answers.QuestionCalibration` make it."""
    probs = {lab: draw(probs_of) for lab in q.labels}
    if q.type.many:
        a: dict[str, Any] = {"labels": [lab for lab in q.labels if probs[lab] >= 0.5], "probs": probs}
    else:
        a = {"label": draw(st.sampled_from([*q.labels, None])) if q.none else q.labels[0], "probs": probs}
    if q.none:
        a["abstain"] = draw(probs_of)
    if q.type.expects:
        a["expected"] = draw(st.floats(1.0, 5.0))
    if shape.calibrated and q.type.calibrates:
        a["raw_probs"] = {lab: draw(probs_of) for lab in q.labels}
    if shape.abstains and q.type.abstains:
        a["probs"] = written(a["probs"])
        if draw(st.booleans()):
            a.update(label=None, abstained=True)
    return a


def arrow_flat(fields: list[tuple[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    """A Ray row as flat columns, led by the Arrow types alone: a struct's fields become
    `p_<label>` (or `<question>.p_<label>`), a multi question's labels join with ';'."""
    out: dict[str, Any] = {}

    def struct(prefix: str, typ: Any, value: dict[str, Any] | None) -> None:
        for f in typ:
            v = (value or {}).get(f.name)
            if f.name in ("probs", "raw_probs"):
                pre = "p_" if f.name == "probs" else "raw_p_"
                for lab in f.type:
                    out[f"{prefix}{pre}{lab.name}"] = (v or {}).get(lab.name)
            elif f.name in ("label", "labels"):
                out[prefix.rstrip(".")] = ";".join(v) if f.name == "labels" and v is not None else v
            else:
                out[prefix + f.name] = v

    for name, typ in fields:
        if name == "answers":
            for qf in typ:
                struct(qf.name + ".", qf.type, (row[name] or {}).get(qf.name))
        elif name in ("probs", "raw_probs"):
            struct("", pa.struct([(name, typ)]), {name: row[name]})
        else:
            out[name] = row[name]
    return out


def _agree(col: str, csv: Any, frame: Any, ray: Any, error_row: bool) -> None:
    """One column's value in the three shapes: the CSV's written (6 decimals, absent when
    empty or false), the frame's (NaN when empty) and Ray's (null when empty), both unrounded."""
    frame = None if isinstance(frame, float) and math.isnan(frame) else frame
    if col == "error":
        assert csv == (f"line {ROW.line}: {frame}" if error_row else None) and ray == frame, col
    elif col in FLAGS or col.endswith(".abstained"):
        assert bool(csv) == bool(frame) == bool(ray), col
    elif isinstance(frame, float):
        assert csv == round(frame, PROB_DIGITS) and ray == frame, col
    elif col == "calibration":
        assert csv == frame == (None if error_row else CALIBRATION), col
    else:
        assert csv == frame == ray, col


def _table(shape: RecordShape, preds: list[Prediction]) -> Any:
    """The columns Ray appends, as one table."""
    cols = shape.arrow_columns(preds)
    return pa.Table.from_arrays([a for _, a in cols], schema=pa.schema([f for f, _ in cols]))


def _check(shape: RecordShape, preds: list[Prediction]) -> None:
    fields = shape.arrow_fields()
    table = _table(shape, preds)
    assert [n for n, _ in fields] == table.column_names  # the types Ray appends hold these values
    frame = shape.frame(preds, CALIBRATION if shape.calibrated else None)
    assert list(frame) == shape.frame_columns == [c for c in shape.columns if c not in ("id", "line")]
    for i, (p, ray_row) in enumerate(zip(preds, table.to_pylist())):
        flat = shape.flat(shape.record(ROW, p, CALIBRATION))
        assert set(flat) <= set(shape.columns), set(flat) - set(shape.columns)  # the CSV writer takes no other key
        assert flat["id"] == ROW.id and flat.get("line") == (ROW.line if not p.ok else None)
        ray = arrow_flat(fields, ray_row)
        extras = ["n_tokens", *(["scores"] if "scores" in ray else [])]
        assert [c for c in ray if c not in extras] == [c for c in shape.frame_columns if c != "calibration"]
        assert ray["n_tokens"] == p.n_tokens
        for col in shape.frame_columns:
            _agree(col, flat.get(col), frame[col][i], ray.get(col, frame[col][i]), not p.ok)


@settings(max_examples=150, deadline=None)
@given(label_runs())
def test_label_rows_agree_in_every_shape(run: tuple[RecordShape, list[Prediction]]) -> None:
    shape, preds = run
    _check(shape, preds)
    assert shape.columns == csv_columns(shape.labels, raw=shape.calibrated, abstain=shape.abstains)
    if shape.scores:  # Ray's raw scores, in label order, for a caller that calibrates
        got = _table(shape, preds).column("scores")
        assert got.to_pylist() == [[p.scores[lab] for lab in shape.labels] if p.ok else None for p in preds]


@settings(max_examples=150, deadline=None)
@given(question_runs())
def test_question_rows_agree_in_every_shape(run: tuple[RecordShape, list[Prediction]]) -> None:
    shape, preds = run
    _check(shape, preds)
    assert shape.columns == question_columns(shape.questions, raw=shape.calibrated, abstain=shape.abstains)


def test_result_record_is_the_shapes_record() -> None:
    p = Prediction(0, label="a", probs={"a": 0.1234567, "b": 0.8765433}, raw_probs={"a": 0.5, "b": 0.5}, truncated=True)
    shape = RecordShape.of(["a", "b"], calibrated=True)
    assert shape.record(ROW, p, "fit") == result_record(ROW, p, "fit")
    assert shape.record(ROW, p, "fit") == {
        "id": "r7",
        "label": "a",
        "probs": {"a": 0.123457, "b": 0.876543},
        "raw_probs": {"a": 0.5, "b": 0.5},
        "calibration": "fit",
        "truncated": True,
    }
    assert flat_record(shape.record(ROW, None)) == {"id": "r7", "line": 9, "error": "line 9: not processed"}


def test_shape_from_questions_and_from_a_manifest() -> None:
    """Real questions and the manifest's record of them give the same columns."""
    qs = [
        Question("team", "Which team?", "choice", ("billing", "technical"), none="other"),
        Question("urgent", "Is it urgent?", "yesno", ("yes", "no")),
        Question("mood", "How upset?", "scale", ("1", "2", "3")),
        Question("tags", "Does it mention {label}?", "multi", ("card", "app")),
    ]
    shape = RecordShape.of(questions=qs, calibrated=True, abstains=True)
    settings_ = {"questions": [q.record() for q in qs], "calibration": "batch", "min_confidence": 0.5}
    assert RecordShape.from_settings(settings_) == shape
    assert columns_of(settings_) == shape.columns
    assert shape.columns == [
        "id",
        *("team", "team.p_billing", "team.p_technical", "team.raw_p_billing", "team.raw_p_technical"),
        *("team.abstained", "team.abstain"),
        *("urgent", "urgent.p_yes", "urgent.p_no", "urgent.raw_p_yes", "urgent.raw_p_no", "urgent.abstained"),
        *("mood", "mood.p_1", "mood.p_2", "mood.p_3", "mood.raw_p_1", "mood.raw_p_2", "mood.raw_p_3"),
        *("mood.abstained", "mood.expected"),
        *("tags", "tags.p_card", "tags.p_app", "tags.raw_p_card", "tags.raw_p_app"),
        *("truncated", "line", "error"),
    ]
    labels = {"labels": ["a", "b"], "calibration": "none"}
    assert RecordShape.from_settings(labels) == RecordShape.of(["a", "b"])
    assert columns_of(labels) == ["id", "label", "p_a", "p_b", "truncated", "line", "error"]


def test_ray_row_types() -> None:
    """The Arrow types Ray appends: a struct of probabilities per label; one typed struct of answers."""
    shape = RecordShape.of(["a", "b"], calibrated=True, abstains=True, scores=True)
    prob = pa.struct([("a", pa.float64()), ("b", pa.float64())])
    assert shape.arrow_fields() == [
        ("label", pa.string()),
        ("probs", prob),
        ("raw_probs", prob),
        ("abstained", pa.bool_()),
        ("n_tokens", pa.int64()),
        ("truncated", pa.bool_()),
        ("error", pa.string()),
        ("scores", pa.list_(pa.float64())),
    ]
    qs = RecordShape.of(questions=[QuestionColumns("tags", "multi", ("a", "b"))], scores=True)
    assert [n for n, _ in qs.arrow_fields()] == ["answers", "n_tokens", "truncated", "error"]
    assert qs.answers_type() == pa.struct([("tags", pa.struct([("labels", pa.list_(pa.string())), ("probs", prob)]))])
