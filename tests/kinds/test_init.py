"""The kinds' table (`kinds/__init__.py`, issue 34): one table chooses the kind once; a new kind is one module and one
table line, and runs through the classifier, the pipeline and the task file unchanged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from mlx_slm import kinds
from mlx_slm.classifier.classifier import Classifier
from mlx_slm.classifier.task import Task
from mlx_slm.engine.engine import Engine
from mlx_slm.kinds import KindArgs, arguments, spec_of
from mlx_slm.kinds.base import KindSettings, KindSpec, OnePrompt, TaskError, count
from mlx_slm.text.heads import Head
from mlx_slm.text.predictions import Prediction
from mlx_slm.text.questions import Question

LABELS = ("billing", "technical", "account")


def _head(labels=LABELS, dim=64) -> Head:
    k = len(labels)
    rng = np.random.default_rng(0)
    return Head(
        tuple(labels), (2,), np.zeros(dim, np.float32), np.ones(dim, np.float32),
        rng.normal(size=(k, dim)).astype(np.float32), np.zeros(k, np.float32), poolings=("last",),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (dict(labels=LABELS), "labels"),
        (dict(labels=LABELS, head=_head()), "head"),
        (dict(labels=LABELS, features_only=True), "features"),
        (dict(questions=(Question("team", "Which team?", "choice", LABELS),)), "questions"),
        (dict(labels=LABELS, reranker="auto"), "rerank"),
    ],
)
def test_the_table_chooses_the_kind_once_from_the_arguments(args, name):
    """Named arguments (the Python API's) go through the one translator to typed settings."""
    typed = arguments(kinds.ModelFacts(loaded=False), **args)
    assert spec_of(typed).name == name
    assert kinds.BY_NAME[name] is type(spec_of(typed))
    assert all(isinstance(s, KindSettings) for s in typed.own)  # typed, never a bag of strings


def test_an_argument_no_kind_takes_is_refused_by_name():
    with pytest.raises(TypeError, match="unknown scoring argument.*colour"):
        arguments(labels=LABELS, colour="red")


def test_a_setting_the_chosen_kind_cannot_use_is_refused_by_name():
    """One rule for every front end: a kind's settings the chosen kind does not take are refused."""
    with pytest.raises(Exception, match="threshold"):
        spec_of(arguments(labels=LABELS, threshold=0.5))  # a multi-label head's setting, on label scoring


def test_each_kind_reads_back_its_own_task_section():
    """A kind's `to_task` section, read by the table, gives back the same kind."""
    from mlx_slm.text.calibration import CalibrationSpec

    for args in (
        arguments(labels=LABELS, scoring="first-token", examples=(("card charged", "billing"),)),
        arguments(labels=LABELS, head=_head()),
        arguments(questions=(Question("team", "Which team?", "choice", LABELS),)),
    ):
        spec = spec_of(args)
        d = {"examples": [], **spec.to_task()}
        section = kinds.read_task(d, "task", list(spec.labels), CalibrationSpec.of("none"))
        own = section["section"].named() if section.get("section") is not None else {}
        again = spec_of(arguments(labels=tuple(d["labels"]), scoring=args.scoring,
                                  examples=section.get("examples", ()), **own))  # fmt: skip
        assert type(again) is type(spec) and again.labels == spec.labels


# --------------------------------------------------------------------------- a new kind: one module, one line


@dataclass(frozen=True)
class ShorterSettings(KindSettings):
    """The toy kind's own typed settings: the prompt length that cuts short from long (`cut=`)."""

    cut: int

    NAMES = ("cut",)

    @classmethod
    def take(cls, named):
        return None if named.get("cut") is None else cls(int(named["cut"]))

    def named(self, home=None):
        return {"cut": self.cut}


@dataclass(frozen=True)
class ShorterSpec(KindSpec):
    """A toy kind: 'short' or 'long' by the prompt's token count against a cut (no model call)."""

    cut: int = 40
    name = "shorter"  # type: ignore[misc]
    Settings = ShorterSettings
    task_fields = ("shorter",)
    calibrates = False  # type: ignore[misc]
    no_calibration = "a toy kind"  # type: ignore[misc]

    @classmethod
    def wants(cls, args: KindArgs) -> bool:
        return args.get(ShorterSettings) is not None

    @classmethod
    def from_args(cls, args: KindArgs) -> ShorterSpec:
        return cls(args.get(ShorterSettings).cut)

    @property
    def labels(self) -> tuple[str, ...]:
        return ("short", "long")

    def to_task(self, path=None):
        return {"labels": list(self.labels), "shorter": {"cut": self.cut}}

    def task_kwargs(self, mode):
        return {"labels": self.labels, "section": ShorterSettings(self.cut)}

    @classmethod
    def read_task(cls, d, where, labels, calibration):
        if "shorter" not in d:
            return None
        if not isinstance(d["shorter"], dict) or not isinstance(d["shorter"].get("cut"), int):
            raise TaskError(f"{where}: field 'shorter' must be {{'cut': an integer}}")
        return {"section": ShorterSettings(d["shorter"]["cut"])}

    def bind(self, engine: Engine, fmt: Any, run: Any) -> ShorterKind:
        return ShorterKind(self, engine, fmt, run)


class ShorterKind(OnePrompt):
    def __init__(self, spec: ShorterSpec, engine: Engine, fmt: Any, run: Any):
        super().__init__(spec, engine, fmt, run)
        self._settle()

    def score(self, batch, items, prefix, st):
        count(st, batch, 0)
        out = []
        for it in items:
            p = 1.0 if len(it.ids) < self.spec.cut else 0.0
            out.append(Prediction(it.index, "short" if p else "long", {"short": p, "long": 1 - p}, {}, len(it.ids)))
        return out


def test_a_new_kind_is_one_module_and_one_table_line(tiny_qwen_mlx, monkeypatch):
    from transformers import AutoTokenizer

    from mlx_slm.models import load_model

    monkeypatch.setattr(kinds, "KINDS", (ShorterSpec, *kinds.KINDS))
    engine = Engine(load_model(tiny_qwen_mlx), AutoTokenizer.from_pretrained(str(tiny_qwen_mlx)))
    texts = ["hi", "a much longer ticket about invoices and payments that goes on " * 3, "", "ok"]
    probe = Classifier(engine, cut=0)  # its own argument, by name, through the one translator
    n = [len(it.ids) for it in probe.prepare(texts) if not it.error]  # the prompts' lengths
    clf = Classifier(engine, cut=(n[0] + n[1]) // 2)
    assert clf.spec.name == "shorter" and clf.labels == ("short", "long")
    preds = clf.classify(texts)
    assert [p.index for p in preds] == [0, 1, 2, 3]  # input order, whatever the batch plan did
    assert [p.label for p in preds] == ["short", "long", None, "short"] and preds[2].error
    # the record shape and the calibration come from the base contract, unchanged
    assert clf.spec.record_shape().columns[:4] == ["id", "label", "p_short", "p_long"]
    with pytest.raises(Exception, match="a toy kind"):
        clf.classify(texts, calibration="batch")
    # a task file holds its section, read back by the kind through the table: Task and the classifier unchanged
    fmt = clf.format
    task = Task(model=str(tiny_qwen_mlx), system=fmt.system, template=fmt.template, **clf.spec.task_kwargs(clf.mode))
    again = Task.from_dict(task.to_dict(), "task")
    assert again.section == ShorterSettings(clf.spec.cut) and again.kind == clf.spec
    assert Classifier.from_task(again, engine=engine).classify(texts)[1].label == "long"
