"""A fine-tuned classifier: LoRA adapters on the model's top blocks, with a score head or the labels' tokens.

`mlx-slm train --finetune lora` makes one (`finetune.finetune` -> `adapters.FineTuned`, saved
beside its task as a safetensors sidecar with its sha256). Bound to an engine, the kind runs a
model of its own: the engine's, with the adapters as LoRA layers (unfused: one base model in
memory serves several tasks; `fused` merges them into a copy of the adapted projections), every
other weight shared. That model has its own prefix cache (the adapters change the shared
head's keys and values in the adapted blocks) and shares the engine's tokenizer and lock.

Objective "score": the trained head (K, D) at the last position of the final norm, exactly
as a `*ForSequenceClassification` holds it (`mlx-slm export` writes one). Objective "labels":
the labels' own tokens, scored by the labels kind on the adapted model (trie included).
Its probabilities are fitted on labelled data: no calibration (as a learned head's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.engine import Engine
from ..text.batching import Batch
from ..text.calibration import CalibrationSpec
from ..text.labels import LabelError, NotItsLabels, check_none_label, softmax
from ..text.predictions import Item, Prediction, Stats
from ..text.prompts import DEFAULT_LABELS, PromptFormat
from ..weights.adapters import FineTuned, FinetuneError
from .base import (
    KindArgs,
    KindSettings,
    KindSpec,
    OnePrompt,
    RunSettings,
    TaskError,
    count,
    prediction,
    require_lm_head,
)
from .head import HeadSettings
from .labels import LabelsSpec
from .questions import QuestionsSettings

NO_CALIBRATION = (
    "calibration does not apply to a fine-tuned classifier (its probabilities are fitted on labelled data "
    "already): drop it; --min-confidence works on its probabilities"
)


def in_memory(tuned: Any, fused: bool = False) -> dict[str, Any]:
    """A task's 'finetune' section holding the adapters themselves (the kind takes
    either), until `to_task` saves them."""
    return {
        "tuned": tuned,
        "adapters": None,
        "sha256": None,
        "fused": fused,
        "objective": tuned.objective,
        "layers": list(tuned.lora.layers),
        "rank": tuned.lora.rank,
    }


@dataclass(frozen=True)
class FineTunedSettings(KindSettings):
    """A fine-tuned classifier to run (`finetuned=`): a `FineTuned`, the estimator's in-memory
    {"tuned": FineTuned, ...}, or a task file's 'finetune' section (its adapters file named
    relative to `home`, the task's folder); `fused`: the adapters merged into the weights."""

    source: Any
    fused: bool = False

    NAMES = ("finetuned", "fused")
    trained = "fine-tuned adapters"

    @classmethod
    def take(cls, named: Mapping[str, Any]) -> FineTunedSettings | None:
        if named.get("finetuned") is None:
            return None
        return cls(named["finetuned"], bool(named.get("fused", False)))

    def named(self, home: str | None = None) -> dict[str, Any]:
        source = self.source
        if isinstance(source, dict) and "tuned" not in source and home is not None:
            source = {**source, "home": home}  # a task's section: its adapters beside the task file
        return {"finetuned": source, **({"fused": True} if self.fused else {})}

    def weights_note(self) -> tuple[str, str] | None:
        return "adapters were trained", "fine-tune again (mlx-slm train ... --finetune lora --save-task)"


@dataclass(frozen=True)
class FinetuneSpec(KindSpec):
    """The fine-tuned weights (`tuned`), where the task keeps them (`file`, `sha256`) and whether
    they run merged into the weights (`fused`)."""

    tuned: FineTuned = field(compare=False, repr=False)
    file: str | None = None
    sha256: str | None = None
    fused: bool = False
    none_label: str | None = None  # type: ignore[assignment]  # its label meaning "none of these"

    name = "finetune"  # type: ignore[misc]
    Settings = FineTunedSettings
    task_fields = ("finetune",)
    calibrates = False  # type: ignore[misc]
    no_calibration = NO_CALIBRATION  # type: ignore[misc]

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        return args.get(FineTunedSettings) is not None

    @classmethod
    def from_args(cls, args: KindArgs) -> FinetuneSpec:
        own = args.get(FineTunedSettings)
        assert own is not None
        got = own.source
        if isinstance(got, FineTuned):
            tuned, file, sha, fused = got, None, None, own.fused
        elif isinstance(got, dict) and isinstance(got.get("tuned"), FineTuned):  # in memory (the estimator's)
            tuned, file, sha, fused = got["tuned"], got.get("adapters"), got.get("sha256"), bool(got.get("fused"))
        else:
            tuned, file, sha, fused = _load(got)
        other = args.get(QuestionsSettings) is not None or args.get(HeadSettings) is not None
        if other or args.examples or args.scoring != "auto":
            raise LabelError(
                "a fine-tuned classifier scores its own labels with its own prompt: drop questions, heads, "
                "examples and scoring"
            )
        if tuple(args.labels) not in ((), DEFAULT_LABELS, tuple(tuned.labels)):
            raise NotItsLabels(
                "the fine-tuned classifier", tuned.labels, args.labels, "fine-tune again for other labels"
            )
        return cls(tuned, file, sha, fused, check_none_label(args.none_label, tuned.labels))

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.tuned.labels)

    @property
    def mode(self) -> str:
        return f"finetune ({self.tuned.objective})"

    def _section(self) -> dict[str, Any]:
        t = self.tuned
        return {
            "adapters": self.file,
            "sha256": self.sha256,
            "fused": self.fused,
            "objective": t.objective,
            "layers": list(t.lora.layers),
            "rank": t.lora.rank,
        }

    def info(self) -> dict[str, Any]:
        return {"labels": list(self.labels), "finetune": self._section()}

    def for_request(self, labels: tuple[str, ...], same_prompt: bool) -> KindSpec | None:
        """The adapters hold for their own labels and the prompt they were trained in only; any
        other labels or prompt are scored zero-shot on the base model (None)."""
        return self if labels == self.labels and same_prompt else None

    def manifest(self, mode: str) -> dict[str, Any]:
        s = self._section()
        return {
            "labels": list(self.labels),
            "scoring": mode,
            "examples": [],
            "finetune": {"sha256": s["sha256"], "objective": s["objective"]},
        }

    def to_task(self, path: Any = None) -> dict[str, Any]:
        if self.file is None:
            raise FinetuneError("these adapters were never saved: save them (FineTuned.save) and name the file")
        section = self._section()
        # adapters beside the task are named by their file name (`beside`): the two move together
        return {"labels": list(self.labels), "finetune": section if path is None else beside(section, path)}

    def task_kwargs(self, mode: str) -> dict[str, Any]:
        return {"labels": self.labels, "section": FineTunedSettings(self._section())}

    @classmethod
    def read_task(
        cls, d: dict[str, Any], where: str, labels: list[str], calibration: CalibrationSpec
    ) -> dict[str, Any] | None:
        section = d.get("finetune")
        if section is None:
            return None
        if (
            not isinstance(section, dict)
            or not isinstance(section.get("adapters"), str)
            or not isinstance(section.get("sha256"), str)
        ):
            raise TaskError(
                f"{where}: field 'finetune' must name its adapters file and sha256 "
                '({"adapters": "task.adapters.safetensors", "sha256": "..."}): save the task again'
            )
        if calibration.applies:
            raise TaskError(f"{where}: a fine-tuned task takes no calibration: set 'calibration' to \"none\"")
        return {"section": FineTunedSettings(section)}

    def bind(self, engine: Engine, fmt: PromptFormat, run: RunSettings) -> FinetuneKind:
        return FinetuneKind(self, engine, fmt, run)


def _load(section: dict[str, Any]) -> tuple[FineTuned, str, str, bool]:
    """The adapters a task's section names (relative to the task file's folder, `home`), checked
    against its sha256; their file as an absolute path (what `to_task` writes: `beside` names
    it by its file name again in a task saved in the same folder)."""
    file = str(section["adapters"])
    home = section.get("home")
    path = (Path(file) if Path(file).is_absolute() or home is None else Path(home) / file).absolute()
    if not path.is_file():
        raise TaskError(
            f"the task's adapters file {path} (its field 'finetune') is missing: put it back beside the task "
            "(train --finetune saves the two together; copy both), or fine-tune again"
        )
    return FineTuned.load(path, section.get("sha256")), str(path), section.get("sha256"), bool(section.get("fused"))


def beside(section: dict[str, Any], task_path: str | Path) -> dict[str, Any]:
    """A task file's 'finetune' section as saved at `task_path`: adapters in the task's own
    folder named by their file name (the two move together), others by their absolute path."""
    file = Path(str(section.get("adapters") or ""))
    if file.is_absolute() and file.resolve().parent == Path(task_path).resolve().parent:
        return {**section, "adapters": file.name}
    return section


class FinetuneKind(OnePrompt):
    """The fine-tuned model on the engine's weights (see the module docstring)."""

    spec: FinetuneSpec

    def __init__(self, spec: FinetuneSpec, engine: Engine, fmt: PromptFormat, run: RunSettings):
        t = spec.tuned
        sha = engine.weights_sha256 if engine.path is not None else None
        # Adapters for other weights: refused here, naming their file (`apply` and `merge` check again).
        t.check_model(engine.model, sha, where=f"the adapters {spec.file or '(in memory)'}")
        t.check_finite(f"the adapters {spec.file or '(in memory)'}")  # a diverged fine-tune's: NaN everywhere
        model = t.merge(engine.model, sha) if spec.fused else t.apply(engine.model, sha)
        own = Engine(model, engine.tokenizer, engine.path)
        own.lock = engine.lock  # one tokenizer and one set of weights: one lock
        super().__init__(spec, own, fmt, run)
        self.inner: Any = None
        if t.objective == "labels":  # the labels kind on the adapted model: label scoring as it is
            require_lm_head(own)

            self.inner = LabelsSpec(tuple(t.labels)).bind(own, fmt, run)
            if tuple(self.inner.labelset.token_ids) != tuple(t.label_tokens or ()):
                raise FinetuneError(
                    "the labels tokenize differently under this prompt than when the adapters were trained: "
                    "use the task's own prompt (its system message and template)"
                )
            self.prefix_tokens, self.pool_from = self.inner.prefix_tokens, self.inner.pool_from
            self.format_error = self.inner.format_error
        else:
            self._settle()

    @property
    def mode(self) -> str:
        return self.spec.mode

    @property
    def label_extra(self) -> int:
        return self.inner.label_extra if self.inner is not None else 0

    @property
    def row_extra(self) -> int:
        return self.inner.row_extra if self.inner is not None else 0

    def items(self, texts: Sequence[Any], start: int = 0) -> list[Item]:
        return self.inner.items(texts, start) if self.inner is not None else super().items(texts, start)

    def score(self, batch: Batch, items: list[Item], prefix: Any, st: Stats) -> list[Prediction]:
        if self.inner is not None:
            return self.inner.score(batch, items, prefix, st)
        hidden = self.engine.last_hidden(batch, prefix)
        logits = np.array(self.spec.tuned.scores(self.engine.model, hidden).astype(mx.float32), dtype=np.float64)
        count(st, batch, 0)
        labels = self.spec.labels
        return [prediction(it, labels, logits[r], softmax(logits[r])) for r, it in enumerate(items)]
