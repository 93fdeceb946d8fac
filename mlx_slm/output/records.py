"""Output records and columns: one prediction (or error row) as the JSON object written, and as
the flat CSV/TSV/Parquet row, with the columns of a run (its labels, or its questions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..calibration import PROB_DIGITS, written


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
    rec = {"id": row.id, "label": pred.label, "probs": written(pred.probs)}
    if pred.raw_probs is not None:
        rec["raw_probs"] = written(pred.raw_probs)
        rec["calibration"] = calibration
    if pred.abstained:
        rec["abstained"] = True
    if pred.truncated:
        rec["truncated"] = True
    return rec


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
    """An answers record as CSV/TSV/Parquet columns: `team`, `team.p_billing`, ..., a multi
    question's labels joined by ';', `q.expected` for a scale, `q.abstain` with a none option."""
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


def question_columns(questions: Sequence[Any], raw: bool = False, abstain: bool = False) -> list[str]:
    """CSV/TSV/Parquet header of a run that asks several questions (see `flat_answers`): with
    calibration each question's raw probabilities too, with a confidence threshold its flag."""
    cols = ["id"]
    for q in questions:
        cols.append(q.name)
        cols += [f"{q.name}.p_{lab}" for lab in q.labels]
        cols += [f"{q.name}.raw_p_{lab}" for lab in q.labels] if raw and q.kind != "head" else []
        cols += [f"{q.name}.abstained"] if abstain and q.kind != "multi" else []
        cols += [f"{q.name}.expected"] if q.kind == "scale" else []
        cols += [f"{q.name}.abstain"] if q.none else []
    return cols + ["truncated", "line", "error"]


def flat_record(rec: dict[str, Any]) -> dict[str, Any]:
    """An output record as one flat row (CSV/TSV/Parquet): `p_<label>` per label, or a question's columns."""
    flat = {k: v for k, v in rec.items() if k not in ("probs", "raw_probs", "answers")}
    for key, prefix in (("probs", "p_"), ("raw_probs", "raw_p_")):
        for lab, p in (rec.get(key) or {}).items():
            flat[prefix + lab] = p
    if rec.get("answers"):
        flat.update(flat_answers(rec["answers"]))
    return flat


def columns_of(settings: dict[str, Any]) -> list[str]:
    """The flat columns of a run, from its manifest's settings (labels, or questions as recorded)."""
    from types import SimpleNamespace

    raw = settings.get("calibration", "none") != "none"
    abstain = settings.get("min_confidence") is not None
    if settings.get("questions"):
        qs = [
            SimpleNamespace(
                name=r["name"],
                kind=r.get("kind", "choice"),
                none=r.get("none"),
                labels=r.get("labels") or r.get("levels") or r.get("answers") or ["yes", "no"],
            )
            for r in settings["questions"]
        ]
        return question_columns(qs, raw=raw, abstain=abstain)
    return csv_columns(settings["labels"], raw=raw, abstain=abstain)


def csv_columns(labels: Sequence[str], raw: bool = False, abstain: bool = False) -> list[str]:
    """CSV/TSV header: calibrated runs add the raw probabilities, abstaining runs a flag."""
    return [
        "id",
        "label",
        *(f"p_{lab}" for lab in labels),
        *(f"raw_p_{lab}" for lab in labels if raw),
        *(["calibration"] if raw else []),
        *(["abstained"] if abstain else []),
        "truncated",
        "line",
        "error",
    ]
