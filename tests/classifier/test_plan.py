"""A classification run's plan (`classifier/plan.py`, issue 48): `ReadSpec` (how inputs are read) and
`Plan` (a classification run, frozen; steps return new plans). (`ModelRef` is tested in
tests/weights/test_registry.py.)"""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.classifier.plan import Plan
from mlx_slm.files.readers import ReadSpec, read_rows
from mlx_slm.ground.errors import UsageError
from mlx_slm.kinds import KindArgs
from mlx_slm.text.calibration import CalibrationSpec

LABELS = ("billing", "technical", "account")


def test_a_read_spec_reads_as_the_old_keywords(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"t": "a", "label": "x", "q": "b"}\n{"t": "c", "label": "y"}\n')
    spec = ReadSpec(text_field="t").with_gold()
    new = [(r.text, r.gold) for r in read_rows(str(p), spec)]
    old = [(r.text, r.gold) for r in read_rows(str(p), None, "t", gold="label")]
    assert new == old == [("a", "x"), ("c", "y")]
    paired = ReadSpec(text_field="t", pair_field="q", pair_typed=frozenset({"pair_field"})).for_input(str(p))
    assert (paired.pair, paired.pair_required) == ("q", True)
    assert [r.error is not None for r in read_rows(str(p), paired)] == [False, True]  # a typed field must be there
    with pytest.raises(TypeError, match="spec"):
        read_rows(str(p), spec, gold="label")


def test_the_pair_rule_refuses_an_option_the_format_cannot_use(tmp_path):
    csv = tmp_path / "in.csv"
    csv.write_text("text,other\na,b\n")
    assert ReadSpec(pair_column="other").for_input(str(csv)).pair == "other"
    with pytest.raises(UsageError, match="--pair-field names a JSONL"):
        ReadSpec(pair_typed=frozenset({"pair_field"})).for_input(str(csv))
    with pytest.raises(UsageError, match="no second text"):
        ReadSpec(fmt="text", pair_typed=frozenset({"pair_column"})).for_input(None)


def test_a_plan_is_frozen_and_its_steps_return_new_plans():
    plan = Plan(system="Answer with one of: {labels}.", kind=KindArgs(LABELS))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.system = "x"  # type: ignore[misc]
    filled = plan.with_labels(LABELS)
    assert filled.system == "Answer with one of: billing, technical, account." and filled.labels_filled
    assert plan.system == "Answer with one of: {labels}." and not plan.labels_filled
    typed = Plan(system="{{x}} is {labels}").with_labels(LABELS, typed=True)  # a typed message: {{ }} literal
    assert typed.system == "{x} is billing, technical, account"
    cal = plan.with_calibration("batch", "resume")
    assert (cal.calibration.method, cal.origin, plan.origin) == ("batch", "resume", "here")
    assert cal.calibration.warmup == plan.warmup
    with pytest.raises(ValueError, match="origin"):
        plan.with_calibration("batch", "elsewhere")
    assert pickle.loads(pickle.dumps(plan.portable())) == plan  # what Ray's workers get
    assert plan.labels == LABELS and plan.questions is None


def test_the_python_api_resolves_its_keywords_into_a_plan():
    plan = Plan.of(LABELS, "S: {labels}", "T: {text}", batch_size=4, calibration="batch", warmup=7, scoring="sequence")
    assert plan.model is None and plan.batch_size == 4
    assert plan.calibration == CalibrationSpec("batch", warmup=7)
    assert isinstance(plan.kind, KindArgs) and plan.kind.scoring == "sequence" and plan.labels == LABELS
    with pytest.raises(TypeError, match=r"colour.*batch_size.*scoring"):
        Plan.of(LABELS, colour="red")
    with pytest.raises(ValueError, match="truncate"):
        Plan.of(LABELS, truncate="sideways")
    assert Plan.of(LABELS, controls_as_text=True).controls_as_text is True  # a decision client's texts
    for switch in ("sort", "use_prefix_cache", "controls_as_text"):  # "no" would read as on: refused
        with pytest.raises(TypeError, match=f"{switch} is True or False, not 'no'"):
            Plan.of(LABELS, **{switch: "no"})


def test_a_classifier_is_built_from_a_plan_and_fills_its_labels_once(engine):
    plan = Plan.of(LABELS, "Answer with one of: {labels}.", "Ticket: {text}\nCategory:")
    clf = Classifier(engine, plan=plan)
    assert clf.format.system == "Answer with one of: billing, technical, account."
    assert clf.plan.labels_filled and clf.plan.kind is clf.spec
    same = Classifier(engine, LABELS, "Answer with one of: {labels}.", "Ticket: {text}\nCategory:")
    assert same.format == clf.format
    assert Classifier.from_plan(plan, engine).format == clf.format
    with pytest.raises(TypeError, match="pass engine"):
        Classifier.from_plan(plan)
    with pytest.raises(TypeError, match="in the plan"):
        Classifier(engine, plan=plan, batch_size=2)
