"""The saved task: everything that defines a classifier, in one JSON file.

`--save-task task.json` writes it; `--task task.json` (and `Classifier.from_task`) reads
it back. It names the model and pins its weights by hash (a prior fitted for one set of
weights means nothing for another), and holds the labels, prompt, scoring, few-shot
examples, calibration (a fitted prior, or the method to fit on each input) and the
confidence threshold, with the library versions that made it. The service and the
scale-out runner take the same file.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .calibration import Calibrator
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
    # "none", "batch" (fit on each input's warm-up), or a fitted Calibrator applied as is.
    calibration: str | Calibrator = "none"
    warmup: int = 512
    min_confidence: float | None = None
    weights_sha256: str | None = None
    versions: dict[str, str] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["labels"] = list(self.labels)
        d["examples"] = [{"text": t, "label": lab} for t, lab in self.examples]
        d["calibration"] = self.calibration.to_dict() if isinstance(self.calibration, Calibrator) else self.calibration
        return {"format": FORMAT, "version": VERSION, "created": _now(), **d}

    @classmethod
    def from_dict(cls, d: Any, where: str = "task") -> "Task":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TaskError(f"{where} is not an mlx-slm task file (no \"format\": \"{FORMAT}\")")
        if d.get("version", VERSION) > VERSION:
            raise TaskError(f"{where} is task format version {d['version']}; this mlx-slm reads up to {VERSION}: upgrade it")
        for key, kind in (("model", str), ("labels", list), ("template", str)):
            if not isinstance(d.get(key), kind):
                raise TaskError(f"{where}: field {key!r} is missing or not a {kind.__name__}")
        cal = d.get("calibration", "none")
        if isinstance(cal, dict):
            cal = Calibrator.from_dict(cal)
        elif cal not in ("none", "batch"):
            raise TaskError(f"{where}: field 'calibration' must be 'none', 'batch' or a fitted calibrator, not {cal!r}")
        try:
            examples = tuple((str(e["text"]), str(e["label"])) for e in d.get("examples", []))
        except (TypeError, KeyError):
            raise TaskError(f"{where}: field 'examples' must be a list of {{\"text\", \"label\"}} objects") from None
        return cls(
            model=d["model"], labels=tuple(d["labels"]), system=d.get("system"), template=d["template"],
            scoring=d.get("scoring", "auto"), examples=examples, calibration=cal, warmup=int(d.get("warmup", 512)),
            min_confidence=d.get("min_confidence"), weights_sha256=d.get("weights_sha256"),
            versions=d.get("versions", {}),
        )

    def save(self, path: str | os.PathLike) -> None:
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, p)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Task":
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TaskError(f"task file {path} does not exist") from None
        except json.JSONDecodeError as e:
            raise TaskError(f"task file {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(d, str(path))

    def check_weights(self, weights_sha256: str | None) -> None:
        if self.weights_sha256 and weights_sha256 and weights_sha256 != self.weights_sha256:
            raise TaskError(
                f"the task was made with weights sha256 {self.weights_sha256[:12]}..., but {self.model} now has "
                f"{weights_sha256[:12]}...: its calibration does not carry over; refit it (--calibrate ... --save-task)"
            )


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    got = {}
    for pkg in ("mlx-slm", "mlx", "transformers", "numpy"):
        try:
            got[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return got


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
