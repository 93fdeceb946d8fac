"""The saved task: everything that defines a classifier, in one JSON file.

`--save-task task.json` writes it; `--task task.json` (and `Classifier.from_task`) reads
it back. It names the model and pins its weights by hash (a prior fitted for one set of
weights means nothing for another), and holds the labels, prompt, scoring, few-shot
examples, calibration (a fitted prior, or the method to fit on each input) and the
confidence threshold, with the library versions that made it. The service and the
scale-out runner take the same file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._fs import utc_now, write_json_atomic
from .calibration import DEFAULT_WARMUP, Calibrator
from .errors import UserError

FORMAT = "mlx-slm.task"
VERSION = 1


class TaskError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class Task:
    model: str
    labels: tuple[str, ...]
    system: str | None
    template: str
    scoring: str = "auto"
    examples: tuple[tuple[str, str], ...] = ()
    # "none", "batch" (fit on each input's warm-up), a fitted Calibrator applied as is, or
    # ("em", base): the base's offsets with each input's own label mix re-estimated.
    calibration: str | Calibrator | tuple[str, Calibrator] = "none"
    warmup: int = DEFAULT_WARMUP
    min_confidence: float | None = None
    weights_sha256: str | None = None
    versions: dict[str, str] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["labels"] = list(self.labels)
        d["examples"] = [{"text": t, "label": lab} for t, lab in self.examples]
        c = self.calibration
        if isinstance(c, Calibrator):
            d["calibration"] = c.to_dict()
        elif isinstance(c, tuple):
            d["calibration"] = {"method": "em", "base": c[1].to_dict()}
        else:
            d["calibration"] = c
        return {"format": FORMAT, "version": VERSION, "created": utc_now(), **d}

    @classmethod
    def from_dict(cls, d: Any, where: str = "task") -> Task:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TaskError(f'{where} is not an mlx-slm task file (no "format": "{FORMAT}")')
        if d.get("version", VERSION) > VERSION:
            raise TaskError(
                f"{where} is task format version {d['version']}; this mlx-slm reads up to {VERSION}: upgrade it"
            )
        for key, kind in (("model", str), ("labels", list), ("template", str)):
            if not isinstance(d.get(key), kind):
                raise TaskError(f"{where}: field {key!r} is missing or not a {kind.__name__}")
        cal = d.get("calibration", "none")
        if isinstance(cal, dict) and cal.get("method") == "em" and isinstance(cal.get("base"), dict):
            cal = ("em", Calibrator.from_dict(cal["base"]))
        elif isinstance(cal, dict):
            cal = Calibrator.from_dict(cal)
        elif cal not in ("none", "batch"):
            raise TaskError(f"{where}: field 'calibration' must be 'none', 'batch' or a fitted calibrator, not {cal!r}")
        try:
            examples = tuple((str(e["text"]), str(e["label"])) for e in d.get("examples", []))
        except (TypeError, KeyError):
            raise TaskError(f'{where}: field \'examples\' must be a list of {{"text", "label"}} objects') from None
        return cls(
            model=d["model"],
            labels=tuple(d["labels"]),
            system=d.get("system"),
            template=d["template"],
            scoring=d.get("scoring", "auto"),
            examples=examples,
            calibration=cal,
            warmup=int(d.get("warmup", DEFAULT_WARMUP)),
            min_confidence=d.get("min_confidence"),
            weights_sha256=d.get("weights_sha256"),
            versions=d.get("versions", {}),
        )

    def save(self, path: str | os.PathLike) -> None:
        try:
            write_json_atomic(path, self.to_dict())
        except OSError as e:
            raise TaskError(f"cannot write the task file {path} ({e.strerror})") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> Task:
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TaskError(f"task file {path} does not exist") from None
        except json.JSONDecodeError as e:
            raise TaskError(f"task file {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(d, str(path))

    def check_weights(self, weights_sha256: str | None, model: str | None = None) -> None:
        """The task's prior was fitted on its weights: refuse to apply it to others."""
        if self.weights_sha256 and weights_sha256 and weights_sha256 != self.weights_sha256:
            raise TaskError(
                f"the task's prior was fitted on weights sha256 {self.weights_sha256[:12]}..., but {model or self.model} "
                f"has {weights_sha256[:12]}...: it does not carry over; recalibrate (--calibrate ... --save-task)"
            )
