"""A decision run's settings (`classifier/decision_plan.py`): a task's `decisions` section (eval --decisions --fit --save-task): saved, read back, checked, and
read into the methods a Decider takes (`decision_plan.task_methods`: a task of before's temperatures
by key as temperature-only fits of those questions), pinned to the weights."""

from __future__ import annotations

import json

import pytest

from mlx_slm.classifier.decision_plan import DecisionPlan, task_methods
from mlx_slm.classifier.task import Task
from mlx_slm.ground.errors import UserError
from mlx_slm.kinds.base import TaskError
from mlx_slm.text.decisions.files import questions_of
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.weights.registry import ModelRef


def temperatures(t):
    """Each saved method's temperature, by the key of the question it was fitted for."""
    return {m.key: m.calibrator.temperature for m in task_methods(t, DecisionConfig()).saved.values()}


SHA = "ab" * 32
QUESTIONS = {"spam": {"type": "noul", "instructions": "Is it spam?"},
             "team": {"type": "choice", "criteria": {"billing": None, "sales": "Buying"}}}  # fmt: skip


def _task(**kw):
    sec = {"questions": QUESTIONS, "temperatures": {"spam": 1.7, "team": 0.8}, "fit": {"spam": {"n": 40}}}
    return Task(model="tiny", labels=(), system=None, template="{text}", weights_sha256=SHA, decisions=sec, **kw)


def test_saved_and_read_back(tmp_path):
    p = tmp_path / "t.json"
    _task().save(p)
    d = json.loads(p.read_text())
    assert d["decisions"]["temperatures"] == {"spam": 1.7, "team": 0.8}
    assert d["decisions"]["questions"] == QUESTIONS and d["weights_sha256"] == SHA
    t = Task.load(p)
    assert t.decisions_only and t.pins_weights and t.trained is None
    assert temperatures(t) == {"spam": 1.7, "team": 0.8}
    by_digest = task_methods(t, DecisionConfig()).saved
    assert set(by_digest) == {q.digest for q in questions_of(QUESTIONS, DecisionConfig())}


def test_no_section_no_temperatures(tmp_path):
    t = Task(model="tiny", labels=("a", "b"), system=None, template="{text}")
    assert temperatures(t) == {} and task_methods(None, DecisionConfig()).is_raw
    assert "decisions" not in t.to_dict()


def test_other_weights_refused():
    class Engine:
        path, weights_sha256 = None, "cd" * 32

    plan = DecisionPlan(ModelRef("tiny"), task=_task(), methods=task_methods(_task(), DecisionConfig()))
    with pytest.raises(
        TaskError, match=r"decision questions were fitted on weights sha256 abab.*the model loaded \(tiny\) has cdcd"
    ):
        plan.loaded(Engine())


@pytest.mark.parametrize(
    "section, match",
    [
        ({"questions": {}, "temperatures": {}}, "not empty"),
        ({"questions": QUESTIONS, "temperatures": {"spam": 0}}, "above 0|positive number"),
        ({"questions": QUESTIONS, "temperatures": {"spam": True}}, "above 0|positive number"),
        ({"questions": QUESTIONS, "temperatures": {"spam": float("inf")}}, "above 0|positive number"),
        ({"questions": QUESTIONS, "temperatures": [1.0]}, "decisions"),
        ({"questions": QUESTIONS, "extra": 1}, "decisions"),
        ({"questions": QUESTIONS, "settings": []}, "settings"),
        ({"questions": QUESTIONS, "settings": {"labels": ["A"]}}, "settings"),
        ({"questions": QUESTIONS, "settings": {"temperature": {"noul": "hot"}}}, "settings"),
        ({"questions": QUESTIONS, "settings": {"temperature": {"noul": float("nan")}}}, "settings"),
        ("spam", "decisions"),
    ],
)
def test_bad_sections_named(section, match):
    d = _task().to_dict()
    d["decisions"] = section
    with pytest.raises(TaskError, match=match):
        Task.from_dict(d, "task file t.json")


def test_a_task_made_under_another_decision_json_is_refused(tmp_path):
    """A task's questions are bound to the decision settings they were fitted or trained under (a
    model folder's decision.json: labels, temperatures, template): the same weights under other
    settings give other raw answers, so the task is refused naming both and the fix; a task of
    before (no settings recorded) is not checked."""
    from mlx_slm.classifier.task import decisions_section

    class Engine:
        path, weights_sha256 = None, SHA

    own = DecisionConfig()
    sec = decisions_section(QUESTIONS, [], own)
    t = Task(model="tiny", labels=(), system=None, template="{text}", weights_sha256=SHA,
             decisions={**sec, "temperatures": {"spam": 1.7}})  # fmt: skip
    t.save(tmp_path / "t.json")
    t = Task.load(tmp_path / "t.json")
    assert t.decisions["settings"] == own.to_record(template=False)
    plan = DecisionPlan(ModelRef("tiny"), task=t, methods=task_methods(t, own))
    assert plan.loaded(Engine()).model_config  # the same settings: read as saved
    # a setting no fitted question reads (a score's temperature) changes nothing: not refused
    assert plan.loaded(_with_config(Engine, tmp_path, {"temperature": {"score": 5}})).config.temperature == {"score": 5}

    other = DecisionConfig(temperature={"noul": 5.0})
    with pytest.raises(
        TaskError,
        match=r"fitted under other decision settings .*temperature: \{'noul': 1.0\} then, \{'noul': 5.0\} now.*fit them again",
    ):
        plan.with_config(other).loaded(_with_config(Engine, tmp_path, {"temperature": {"noul": 5}}))
    (tmp_path / "decision_template.jinja").write_text("{{ state }}")  # the template's text alone differs: said
    with pytest.raises(TaskError, match=r"chat_template: None then, '[0-9a-f]{64}' now"):
        plan.loaded(_with_config(Engine, tmp_path, {}))
    (tmp_path / "decision_template.jinja").unlink()
    before = Task(model="tiny", labels=(), system=None, template="{text}", weights_sha256=SHA,
                  decisions={"questions": QUESTIONS, "temperatures": {"spam": 1.7}})  # fmt: skip
    plan = DecisionPlan(ModelRef("tiny"), task=before, methods=task_methods(before, own))
    assert plan.loaded(_with_config(Engine, tmp_path, {"temperature": {"noul": 5}})).config == other


def test_a_trained_task_under_other_settings_says_train_and_its_own_classifiers_read_none():
    """A head on the decision prompt reads the labels' prompt: refused under other settings, saying
    train; a question answered by its own classifier (`tuned`) reads no decision.json: not checked."""
    from mlx_slm.classifier.task import check_decision_settings

    was = DecisionConfig().to_record(template=False)
    head = {"key": "spam", "digest": "d", "head": {"weights": []}}
    t = Task(model="tiny", labels=(), system=None, template="{text}", weights_sha256=SHA,
             decisions={"questions": QUESTIONS, "methods": [head], "settings": was})  # fmt: skip
    other = DecisionConfig(labels={"noul": ("Oui", "Non")})
    with pytest.raises(TaskError, match=r"were trained under other decision settings .*labels.*train them again"):
        check_decision_settings(t, other, "m")
    with pytest.raises(
        UserError, match=r"decision questions were trained on weights .*train them again \(mlx-slm train"
    ):
        t.check_weights("cd" * 32)  # other weights: the fix is training, not fitting
    own = {"key": "spam", "digest": "d", "tuned": "t.spam.json"}
    t = Task(model="tiny", labels=(), system=None, template="{text}", weights_sha256=SHA,
             decisions={"questions": QUESTIONS, "methods": [own], "settings": was})  # fmt: skip
    check_decision_settings(t, other, "m")


def test_a_task_made_under_a_models_noul_order_loads_with_that_model(tmp_path):
    """A noul's digest depends on the model's decision settings (its options' order, decision.json's
    noul_options): a task fitted under them is read first under the defaults (before the model loads)
    and its method is matched under the model's own once it has (not refused as edited); a method for a
    question the task does not record is refused then, naming the question."""
    from mlx_slm.classifier.task import decisions_section
    from mlx_slm.text.calibration import Calibrator
    from mlx_slm.text.decisions.methods import Method

    class Engine:
        path, weights_sha256 = None, SHA

    cfg = DecisionConfig(noul_options=("false", "true"))
    qs = {"spam": QUESTIONS["spam"]}
    (q,) = questions_of(qs, cfg)
    assert q.digest != questions_of(qs, DecisionConfig())[0].digest  # the premise: the digest moves with them
    cal = Calibrator("fit", q.answer_names(), (0.1, -0.1), 1.5, 20)
    m = Method(calibrator=cal, key="spam", digest=q.digest).to_dict()
    t = Task(model="tiny", labels=(), system=None, template="{text}", weights_sha256=SHA,
             decisions=decisions_section(qs, [m], cfg))  # fmt: skip
    plan = DecisionPlan(ModelRef("tiny"), task=t, methods=task_methods(t, DecisionConfig()))
    got = plan.loaded(_with_config(Engine, tmp_path, {"noul_options": ["false", "true"]}))
    assert q.digest in got.methods.saved
    t.decisions["methods"] = [{**m, "digest": "0" * 16}]
    plan = DecisionPlan(ModelRef("tiny"), task=t, methods=task_methods(t, DecisionConfig()))
    with pytest.raises(TaskError, match="method for question 'spam' was made for a question the task does not record"):
        plan.loaded(_with_config(Engine, tmp_path, {"noul_options": ["false", "true"]}))


def _with_config(engine: type, folder, decision: dict):
    """`engine` whose converted folder holds this decision.json (what `loaded` reads)."""
    (folder / "decision.json").write_text(json.dumps(decision))
    e = engine()
    e.path = str(folder)
    return e


# ----------------------------------------------------------------------------- the weights check


def test_a_task_from_other_weights_names_the_model_loaded_beside_its_sha256():
    from mlx_slm.classifier.decision_plan import DecisionPlan, task_methods
    from mlx_slm.text.decisions.settings import DecisionConfig
    from mlx_slm.weights.registry import ModelRef

    sec = {"questions": {"spam": {"type": "noul", "instructions": "Spam?"}}, "temperatures": {"spam": 1.5}}
    t = Task(model="/models/a", labels=(), system=None, template="{text}", weights_sha256="ab" * 32, decisions=sec)
    with pytest.raises(UserError) as e:  # a task's own check, without the name of the model loaded
        t.check_weights("cd" * 32)
    said = str(e.value)
    assert (
        "/models/a has cdcd" not in said
        and "abababababab... (/models/a)" in said
        and "the model loaded has cdcd" in said
    )

    class Loaded:
        path, weights_sha256 = None, "cd" * 32

    plan = DecisionPlan(ModelRef("/models/b"), task=t, methods=task_methods(t, DecisionConfig()))
    with pytest.raises(UserError) as e:  # decide, eval and serve load the plan: the model's name is said
        plan.loaded(Loaded())
    assert "the model loaded (/models/b) has cdcdcdcdcdcd" in str(e.value) and "/models/a has" not in str(e.value)


def test_a_task_without_a_sha256_loads_only_with_the_model_it_names(tmp_path):
    """A task that records no weights sha256 (edited by hand, or saved from an engine without a path)
    cannot show that other weights are its own: loaded under another model's name, refused; under its
    own name (or a path to the same folder), loaded; an engine without a sha256 is never compared."""
    from mlx_slm.classifier.decision_plan import DecisionPlan, task_methods
    from mlx_slm.weights.registry import ModelRef

    (tmp_path / "a").mkdir()
    sec = {"questions": {"spam": {"type": "noul", "instructions": "Spam?"}}, "temperatures": {"spam": 1.5}}
    t = Task(model=str(tmp_path / "a"), labels=(), system=None, template="{text}", decisions=sec)

    class Loaded:
        path, weights_sha256 = None, "cd" * 32

    def load(name, engine=Loaded):
        DecisionPlan(ModelRef(name), task=t, methods=task_methods(t, DecisionConfig())).loaded(engine())

    with pytest.raises(UserError, match=r"fitted on the model '.*a', and it records no weights sha256 .*\(qwen"):
        load("qwen")
    load(str(tmp_path / "a"))
    load(str(tmp_path / "." / "a"))  # the same folder, spelt otherwise
    Loaded.weights_sha256 = None
    load("qwen")
    t.check_weights("cd" * 32, "qwen")  # without by_name (a classifier's own task, its model its path): as before


def test_the_manifest_record_tells_a_saved_method_from_its_retrained_self():
    """A resumed run must match how its answers were made: the same question under another none
    threshold (a task trained again) records differently, the same method the same."""
    from mlx_slm.text.decisions.methods import Method, Methods, NoneOf

    (q,) = questions_of(
        {"t": {"type": "choice", "instructions": "?", "criteria": {"a": None, "none": None}}}, DecisionConfig()
    )

    def record(t):
        m = Method(key="t", digest=q.digest, none=NoneOf("none", t))
        return DecisionPlan(ModelRef("x"), methods=Methods.of([m])).record()

    assert record(0.3) == record(0.3) and record(0.3) != record(0.9)


def test_the_names_style_is_refused_under_a_models_own_decision_template(tmp_path):
    """A model's decision_template.jinja renders every question its own way (its letters): a plan that
    asks in the names style would answer in the letters and say "names", so it is refused when it loads;
    the letters and the prompt style load."""
    from mlx_slm.text.decisions.errors import DecisionError
    from mlx_slm.text.decisions.methods import Method, Methods

    class Engine:
        path, weights_sha256 = None, SHA

    (tmp_path / "decision_template.jinja").write_text("{{ state }}")
    qs = questions_of(QUESTIONS, DecisionConfig())
    for style in ("letters", "prompt"):
        plan = DecisionPlan(ModelRef("tiny"), questions=qs, methods=Methods(default=Method(style=style)))
        assert plan.loaded(_with_config(Engine, tmp_path, {})).config.chat_template == "{{ state }}"
    plan = DecisionPlan(ModelRef("tiny"), questions=qs, methods=Methods(default=Method(style="names")))
    with pytest.raises(DecisionError, match=r"decision_template.jinja renders every question its own way"):
        plan.loaded(_with_config(Engine, tmp_path, {}))


def test_a_tuned_methods_manifest_digest_is_its_files_bytes_not_its_place(tmp_path):
    """A resumed run compares each saved method's digest: a task folder moved between the two runs is
    the same method; its classifier trained again (other bytes) is not."""
    from mlx_slm.classifier.decision_plan import _content
    from mlx_slm.text.decisions.methods import Method

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "t.team.json").write_text('{"trained": 1}')
    m = Method(key="team", digest="d" * 16, tuned=str(tmp_path / "a" / "t.team.json"))
    moved = Method(key="team", digest="d" * 16, tuned=str(tmp_path / "b" / "t.team.json"))
    assert _content(m) == _content(moved)
    (tmp_path / "b" / "t.team.json").write_text('{"trained": 2}')
    assert _content(m) != _content(moved)
