"""One prediction as every output shows it: the one home of a run's record shape.

A run's `RecordShape` is made once, from its labels or its questions, whether it is
calibrated (the model's own probabilities kept as `raw_probs`) and whether it abstains (a
confidence threshold given), and for Ray whether the raw label scores go back too. It
gives the run's flat columns (CSV/TSV/Parquet), and each prediction (or error row) as:

* the JSON object written (`record`): probabilities with `calibration.PROB_DIGITS`
  decimals, an error row as `{"id", "line", "error"}`;
* the flat row of a record (`flat`): `p_<label>`, or a question's `team`, `team.p_billing`,
  ..., as the CSV/TSV/Parquet writers take it;
* `classify_frame`'s row (`frame_row`): unrounded, NaN where there is no value;
* the Arrow fields and row values Ray appends to a batch (`arrow_fields`, `arrow_row`):
  unrounded, structs per label and per question, null where there is no value.

The columns of the shapes agree: the frame's are the flat ones less `id` and `line`, and
Ray's, its structs flattened, are the frame's less `calibration`, plus `n_tokens` (and
`scores`). pyarrow is imported only by the Arrow methods.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .calibration import PROB_DIGITS, written
from .predictions import Prediction
from .questions import TYPES, QuestionType


@dataclass(frozen=True)
class QuestionColumns:
    """What the record shape needs of a question: its name, type, options and none option."""

    name: str
    type: QuestionType | str = "choice"  # a `questions.QuestionType` (or its name)
    labels: tuple[str, ...] = ()
    none: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.type, str):
            object.__setattr__(self, "type", TYPES[self.type])

    @classmethod
    def of(cls, q: Any) -> QuestionColumns:
        """From a `questions.Question` (or anything with its name, type, labels and none)."""
        return cls(q.name, q.type, tuple(q.labels), q.none)

    @classmethod
    def recorded(cls, r: dict[str, Any]) -> QuestionColumns:
        """From a question as a manifest records it (`Question.record`)."""
        labels = r.get("labels") or r.get("levels") or r.get("answers") or ["yes", "no"]
        return cls(r["name"], r.get("kind", "choice"), tuple(labels), r.get("none"))

    def columns(self, raw: bool, abstain: bool) -> list[str]:
        """This question's flat columns (see `flat_answers`): a head question has no raw
        probabilities, a multi question no abstained flag."""
        n = self.name
        cols = [n, *(f"{n}.p_{lab}" for lab in self.labels)]
        t = self.type
        cols += [f"{n}.raw_p_{lab}" for lab in self.labels] if raw and t.calibrates else []  # type: ignore[union-attr]
        cols += [f"{n}.abstained"] if abstain and t.abstains else []  # type: ignore[union-attr]
        cols += [f"{n}.expected"] if t.expects else []  # type: ignore[union-attr]
        cols += [f"{n}.abstain"] if self.none else []
        return cols


# A record's forms: one label per row ("label"), the labels at or above a threshold of a
# multi-label head ("multi"), one score of a one-output head ("score"); answers per question
# are the `questions` shape; a `decide` run's typed answers ("decisions": System One's or OpenAI's
# answers as they are, a flat row holding them as one JSON text column, `answers`).
FORMS = ("label", "multi", "score", "decisions")
TAIL = ("truncated", "line", "error")  # every flat row's last columns but a decide run's


@dataclass(frozen=True)
class RecordShape:
    """A run's output shape: labels, or `questions` (then labels are unused); `calibrated`:
    raw probabilities kept; `abstains`: a confidence threshold given; `scores`: Ray also
    returns the raw label log-scores (a list in label order); `form`: see `FORMS`.

    The form's layout (`_Layout`: its columns, its frame cells, its Arrow fields and values) is
    chosen once, when the shape is made: every method below reads it, none asks the form again."""

    labels: tuple[str, ...] = ()
    questions: tuple[QuestionColumns, ...] | None = None
    calibrated: bool = False
    abstains: bool = False
    scores: bool = False
    form: str = "label"
    _layout: _Layout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.questions is not None:  # the one choice: answers per question, else one of the label forms
            object.__setattr__(self, "questions", tuple(QuestionColumns.of(q) for q in self.questions))
            layout: _Layout = _QUESTIONS
        else:
            layout = _LABEL_FORMS.get(self.form, _LABEL)
        object.__setattr__(self, "_layout", layout)

    @classmethod
    def of(
        cls,
        labels: Sequence[str] = (),
        questions: Sequence[Any] | None = None,
        *,
        calibrated: bool = False,
        abstains: bool = False,
        scores: bool = False,
        form: str = "label",
    ) -> RecordShape:
        """The shape of a run on `labels`, or on `questions` (`questions.Question`s, or anything
        with their name, type, labels and none) when they are given."""
        return cls(tuple(labels), questions, calibrated, abstains, scores, form)  # type: ignore[arg-type]

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> RecordShape:
        """The shape of a run from its manifest's settings (labels, or questions as recorded)."""
        calibrated = settings.get("calibration", "none") != "none"
        abstains = settings.get("min_confidence") is not None
        if settings.get("questions"):
            qs = tuple(QuestionColumns.recorded(r) for r in settings["questions"])
            return cls((), qs, calibrated, abstains)
        return cls(tuple(settings["labels"]), None, calibrated, abstains, form=settings.get("form", "label"))

    # ------------------------------------------------------------------ columns
    @property
    def columns(self) -> list[str]:
        """The flat (CSV/TSV/Parquet) header: calibrated runs add the raw probabilities,
        abstaining runs a flag; with questions, each question's columns."""
        return self._layout.columns(self)

    @property
    def frame_columns(self) -> list[str]:
        """`classify_frame`'s new columns: the flat ones but the input's `id` and `line`."""
        return [c for c in self.columns if c not in ("id", "line")]

    # ------------------------------------------------------------------ JSONL and flat rows
    def record(self, row: Any, pred: Prediction | None, calibration: str = "none") -> dict[str, Any]:
        """The JSON object written for one input row (see `result_record`)."""
        return result_record(row, pred, calibration)

    @staticmethod
    def flat(rec: dict[str, Any]) -> dict[str, Any]:
        """A written record as its flat row (see `flat_record`)."""
        return flat_record(rec)

    # ------------------------------------------------------------------ pandas
    def frame_row(self, p: Prediction, calibration: str | None = None) -> dict[str, Any]:
        """One prediction as `classify_frame`'s row (`frame_columns`): unrounded, NaN where
        there is no value, `truncated` (and `abstained`) always a bool; `calibration` names
        the calibration of a calibrated run (None on an error row)."""
        nan = float("nan")
        row: dict[str, Any] = {"label": p.label, "truncated": bool(p.truncated), "error": p.error}
        row.update(self._layout.frame_cells(p))
        for lab in self.labels:
            row[f"p_{lab}"] = p.probs.get(lab, nan)
            if self.calibrated:
                row[f"raw_p_{lab}"] = (p.raw_probs or {}).get(lab, nan)
        if self.calibrated:
            row["calibration"] = None if p.error else calibration
        if self.abstains:
            row["abstained"] = bool(p.abstained)
        if p.answers is not None:
            row.update(flat_answers(p.answers))
        return {c: row.get(c, nan) for c in self.frame_columns}

    def frame(self, preds: Iterable[Prediction], calibration: str | None = None) -> dict[str, list[Any]]:
        """The predictions as `classify_frame`'s columns, one list per column (see `frame_row`)."""
        cols: dict[str, list[Any]] = {c: [] for c in self.frame_columns}
        for p in preds:
            for c, v in self.frame_row(p, calibration).items():
                cols[c].append(v)
        return cols

    # ------------------------------------------------------------------ Ray (Arrow)
    def arrow_fields(self) -> list[tuple[str, Any]]:
        """The (name, pyarrow type) of each column Ray appends: `label` and a `probs` struct (one
        field per label; `raw_probs` when calibrated, `abstained` with a threshold), or one
        `answers` struct; `n_tokens`, `truncated`, `error`; `scores` on request (labels only)."""
        import pyarrow as pa  # lazy: pyarrow is an optional extra, read by the Arrow methods only

        tail = [("n_tokens", pa.int64()), ("truncated", pa.bool_()), ("error", pa.string())]
        return self._layout.arrow_fields(self, pa, tail)

    def answers_type(self) -> Any:
        """The `answers` column: a struct with one field per question, as JSONL writes them
        (`label` or a multi question's `labels`, `probs` one field per option, a scale's
        `expected`, a none option's `abstain`; calibrated: `raw_probs`; with a threshold: `abstained`)."""
        import pyarrow as pa  # lazy: pyarrow is an optional extra, read by the Arrow methods only

        per = []
        for q in self.questions or ():
            fields = [("labels", pa.list_(pa.string()))] if q.type.many else [("label", pa.string())]
            probs = pa.struct([(lab, pa.float64()) for lab in q.labels])
            fields.append(("probs", probs))
            fields += [("raw_probs", probs)] if self.calibrated and q.type.calibrates else []
            fields += [("abstained", pa.bool_())] if self.abstains and q.type.abstains else []
            fields += [("expected", pa.float64())] if q.type.expects else []
            fields += [("abstain", pa.float64())] if q.none else []
            per.append((q.name, pa.struct(fields)))
        return pa.struct(per)

    def arrow_row(self, p: Prediction) -> dict[str, Any]:
        """One prediction's values for `arrow_fields`, unrounded; an error row's are null but
        `n_tokens`, `truncated` and `error`."""
        layout = self._layout
        row = layout.arrow_row(self, p, p.ok)
        row.update(n_tokens=p.n_tokens, truncated=p.truncated, error=p.error)
        row.update(layout.arrow_after(self, p, p.ok))
        return row

    def arrow_columns(self, preds: Iterable[Prediction]) -> list[tuple[Any, Any]]:
        """The predictions as the Arrow columns Ray appends: (pyarrow field, array) pairs."""
        import pyarrow as pa  # lazy: pyarrow is an optional extra, read by the Arrow methods only

        fields = self.arrow_fields()
        cols: dict[str, list[Any]] = {name: [] for name, _ in fields}
        for p in preds:
            for name, v in self.arrow_row(p).items():
                cols[name].append(v)
        return [(pa.field(name, typ), pa.array(cols[name], type=typ)) for name, typ in fields]


# ---------------------------------------------------------------------------- the forms' layouts
class _Layout:
    """One form's layout, as `RecordShape` reads it: one label per row (this class), and the
    forms below it. `s` is the shape (its labels, questions and flags); `pa` is pyarrow."""

    def columns(self, s: RecordShape) -> list[str]:
        return [
            "id",
            "label",
            *(f"p_{lab}" for lab in s.labels),
            *(f"raw_p_{lab}" for lab in s.labels if s.calibrated),
            *(["calibration"] if s.calibrated else []),
            *(["abstained"] if s.abstains else []),
            *TAIL,
        ]

    def frame_cells(self, p: Prediction) -> dict[str, Any]:
        """The form's own cells of `classify_frame`'s row (the shared ones are `frame_row`'s)."""
        return {}

    def arrow_fields(self, s: RecordShape, pa: Any, tail: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        prob = pa.struct([(lab, pa.float64()) for lab in s.labels])
        fields: list[tuple[str, Any]] = [("label", pa.string()), ("probs", prob)]
        fields += [("raw_probs", prob)] if s.calibrated else []
        fields += [("abstained", pa.bool_())] if s.abstains else []
        fields += tail
        fields += [("scores", pa.list_(pa.float64()))] if s.scores else []
        return fields

    def arrow_row(self, s: RecordShape, p: Prediction, ok: bool) -> dict[str, Any]:
        row = {"label": p.label, "probs": p.probs if ok else None}
        if s.calibrated:
            row["raw_probs"] = p.raw_probs if ok else None
        if s.abstains:
            row["abstained"] = p.abstained if ok else None
        return row

    def arrow_after(self, s: RecordShape, p: Prediction, ok: bool) -> dict[str, Any]:
        """Values after the shared tail: the raw label scores Ray returns on request."""
        if not s.scores:
            return {}
        return {"scores": [p.scores[lab] for lab in s.labels] if ok else None}


class _Decisions(_Layout):
    """A `decide` run's typed answers: one JSON text column in a flat row."""

    def columns(self, s: RecordShape) -> list[str]:
        return ["id", "answers", "line", "error"]

    def arrow_after(self, s: RecordShape, p: Prediction, ok: bool) -> dict[str, Any]:
        return {}


class _Multi(_Layout):
    """A multi-label head: the labels at or above its threshold, and every label's probability."""

    def columns(self, s: RecordShape) -> list[str]:
        return ["id", "labels", *(f"p_{lab}" for lab in s.labels), *TAIL]

    def frame_cells(self, p: Prediction) -> dict[str, Any]:
        return {"labels": None if p.labels is None else ";".join(p.labels)}

    def arrow_fields(self, s: RecordShape, pa: Any, tail: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        prob = pa.struct([(lab, pa.float64()) for lab in s.labels])
        return [("labels", pa.list_(pa.string())), ("probs", prob), *tail]

    def arrow_row(self, s: RecordShape, p: Prediction, ok: bool) -> dict[str, Any]:
        return {"labels": p.labels if ok else None, "probs": p.probs if ok else None}

    def arrow_after(self, s: RecordShape, p: Prediction, ok: bool) -> dict[str, Any]:
        return {}


class _Score(_Layout):
    """A one-output head: its label, its score and the raw logit."""

    def columns(self, s: RecordShape) -> list[str]:
        return ["id", "label", "score", "logit", *TAIL]

    def frame_cells(self, p: Prediction) -> dict[str, Any]:
        score, logit = _score(p)
        return {"score": score, "logit": logit}

    def arrow_fields(self, s: RecordShape, pa: Any, tail: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        return [("label", pa.string()), ("score", pa.float64()), ("logit", pa.float64()), *tail]

    def arrow_row(self, s: RecordShape, p: Prediction, ok: bool) -> dict[str, Any]:
        score, logit = _score(p)
        return {"label": p.label, "score": score if ok else None, "logit": logit if ok else None}

    def arrow_after(self, s: RecordShape, p: Prediction, ok: bool) -> dict[str, Any]:
        return {}


class _Questions(_Layout):
    """Answers per question: each question's columns, one typed `answers` struct for Ray."""

    def columns(self, s: RecordShape) -> list[str]:
        per = [c for q in s.questions or () for c in q.columns(s.calibrated, s.abstains)]
        return ["id", *per, *TAIL]

    def arrow_fields(self, s: RecordShape, pa: Any, tail: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        return [("answers", s.answers_type()), *tail]

    def arrow_row(self, s: RecordShape, p: Prediction, ok: bool) -> dict[str, Any]:
        return {"answers": p.answers if ok else None}

    def arrow_after(self, s: RecordShape, p: Prediction, ok: bool) -> dict[str, Any]:
        return {}


_LABEL, _QUESTIONS = _Layout(), _Questions()
_LABEL_FORMS: dict[str, _Layout] = {"label": _LABEL, "multi": _Multi(), "score": _Score(), "decisions": _Decisions()}


def question_columns(questions: Sequence[Any], raw: bool = False, abstain: bool = False) -> list[str]:
    """CSV/TSV/Parquet header of a run that asks several questions (see `flat_answers`): with
    calibration each question's raw probabilities too, with a confidence threshold its flag."""
    return RecordShape.of(questions=questions, calibrated=raw, abstains=abstain).columns


def columns_of(settings: dict[str, Any]) -> list[str]:
    """The flat columns of a run, from its manifest's settings (labels, or questions as recorded)."""
    return RecordShape.from_settings(settings).columns


def csv_columns(labels: Sequence[str], raw: bool = False, abstain: bool = False) -> list[str]:
    """CSV/TSV header: calibrated runs add the raw probabilities, abstaining runs a flag."""
    return RecordShape.of(labels, calibrated=raw, abstains=abstain).columns


def result_record(row: Any, pred: Any | None, calibration: str = "none") -> dict[str, Any]:
    """The output object for one input row (a prediction, or an error row).

    A calibrated row says which calibration made `probs`, and keeps the model's own as
    `raw_probs`, so nothing is hidden."""
    if row.error is not None or pred is None or pred.error is not None:
        err = row.error if row.error is not None else (pred.error if pred is not None else "not processed")
        if not err.startswith("line "):
            err = f"line {row.line}: {err}"
        return {"id": row.id, "line": row.line, "error": err}
    if pred.answers is not None:
        rec: dict[str, Any] = {"id": row.id, "answers": answer_record(pred.answers)}
        if pred.truncated:
            rec["truncated"] = True
        return rec
    if pred.value is not None:  # a one-output head: its score, and the raw logit
        score, logit = _score(pred)
        rec = {"id": row.id, "label": pred.label, "score": round(score, PROB_DIGITS), "logit": logit}
    elif pred.labels is not None:  # a multi-label head: the labels at or above its threshold
        rec = {"id": row.id, "labels": list(pred.labels), "probs": written(pred.probs)}
    else:
        rec = {"id": row.id, "label": pred.label, "probs": written(pred.probs)}
    if pred.raw_probs is not None:
        rec["raw_probs"] = written(pred.raw_probs)
        rec["calibration"] = calibration
    if pred.abstained:
        rec["abstained"] = True
    if pred.truncated:
        rec["truncated"] = True
    return rec


def _score(p: Any) -> tuple[float, float]:
    """A one-output prediction's (score, raw logit); NaN on an error row."""
    if p.value is None:
        return float("nan"), float("nan")
    return float(p.value), float(next(iter(p.scores.values())))


def answer_record(answers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Answers as written: probabilities (and expected levels) with `calibration.PROB_DIGITS` decimals."""
    out = {}
    for name, a in answers.items():
        a = dict(a)
        a["probs"] = written(a["probs"])
        if "raw_probs" in a:
            a["raw_probs"] = written(a["raw_probs"])
        for k in ("expected", "abstain"):
            if k in a:
                a[k] = round(a[k], PROB_DIGITS)
        out[name] = a
    return out


def flat_answers(answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An answers record as flat columns: `team`, `team.p_billing`, ..., a multi question's
    labels joined by ';', `q.expected` for a scale, `q.abstain` with a none option."""
    flat: dict[str, Any] = {}
    for name, a in answers.items():
        flat[name] = ";".join(a["labels"]) if "labels" in a else a["label"]
        for key, prefix in (("probs", "p_"), ("raw_probs", "raw_p_")):
            for lab, p in (a.get(key) or {}).items():
                flat[f"{name}.{prefix}{lab}"] = p
        if a.get("abstained"):
            flat[f"{name}.abstained"] = True
        for k in ("expected", "abstain"):
            if k in a:
                flat[f"{name}.{k}"] = a[k]
    return flat


def flat_record(rec: dict[str, Any]) -> dict[str, Any]:
    """An output record as one flat row (CSV/TSV/Parquet): `p_<label>` per label, or a question's columns."""
    flat = {k: v for k, v in rec.items() if k not in ("probs", "raw_probs", "answers")}
    if isinstance(rec.get("labels"), list):  # a multi-label head's labels, joined as a question's are
        flat["labels"] = ";".join(rec["labels"])
    for key, prefix in (("probs", "p_"), ("raw_probs", "raw_p_")):
        for lab, p in (rec.get(key) or {}).items():
            flat[prefix + lab] = p
    ans = rec.get("answers")
    if isinstance(ans, str):  # a decide run's answers, as one JSON text
        flat["answers"] = ans
    elif (
        isinstance(ans, list)
        or isinstance(ans, dict)
        and any(isinstance(a, dict) and "type" in a for a in ans.values())
    ):
        flat["answers"] = json.dumps(ans, ensure_ascii=False)  # typed decisions (OpenAI's list, System One's "type")
    elif ans:
        flat.update(flat_answers(ans))
    return flat
