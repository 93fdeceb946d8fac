"""The command line's plan (`jobs/plan.py`, issue 48): options and a task file resolved once into a frozen
`classifier.Plan` (`jobs.plan.resolve`), which loading, the manifest and saving a task read.
The model reference is one value (`ModelRef`): an option that reaches the engine touches four files. Options a run would ignore are refused by name
(--warmup without a warm-up calibration, --calibration-data without fit or em), and a task given its
own model, labels or prompt is not "changed"."""

from __future__ import annotations

import ast
import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import pytest

from mlx_slm.classifier.plan import Plan
from mlx_slm.classifier.task import Task
from mlx_slm.ground.errors import UserError
from mlx_slm.jobs import plan as plans
from mlx_slm.jobs.plan import TaskOptions, resolve
from mlx_slm.kinds import KindArgs
from mlx_slm.text.calibration import Calibrator
from mlx_slm.weights.registry import ModelRef
from tests.hostile import invoke, refused_cleanly, write

PACKAGE = Path(__file__).resolve().parents[2] / "mlx_slm"
ENGINE_OPTION = {"keep_quantized"}  # --keep-quantized/--dequantize: one name from the option to the loader


def _names(node: ast.AST) -> set[str]:
    """Every identifier, attribute, keyword and option string under `node`."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.update(w.strip("-").replace("-", "_") for w in n.value.split("/"))
    return out


def test_an_engine_option_touches_four_files(tiny_qwen_mlx):
    """`classify --keep-quantized` from the command line to the engine: the click option
    (cli/options.py), `TaskOptions` and its resolution into the plan's model (jobs/plan.py:
    `model_ref`), `ModelRef` (weights/registry.py) and `Engine.load` (engine/engine.py). Every
    module between them (the command, the job, the plan, the classifier, Ray's workers) carries
    the `ModelRef` whole, so a new engine option is added in those four files and nowhere else."""
    o = TaskOptions(model=str(tiny_qwen_mlx), dtype="float32", keep_quantized=False, given=frozenset({"model"}))
    plan = plans.resolve(o, lambda _m: None)
    assert plan.model == ModelRef(str(tiny_qwen_mlx), "float32", False)
    assert plans.load(plan).engine.compute_dtype == "float32"

    path = ["cli/classify.py", "cli/options.py", "jobs/classify.py", "jobs/plan.py", "classifier/plan.py"]
    path += ["ray.py", "weights/registry.py", "engine/engine.py"]
    naming = {p for p in path if _names(ast.parse((PACKAGE / p).read_text())) & ENGINE_OPTION}
    # The classifier on the way: `from_plan` and the constructor take the plan's ModelRef whole
    # (`Classifier.load`'s own `keep_quantized=` is the Python API's, not on this path).
    tree = ast.parse((PACKAGE / "classifier/classifier.py").read_text())
    on_path = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in ("from_plan", "__init__")]
    assert on_path and not any(_names(f) & ENGINE_OPTION for f in on_path)
    assert naming == {"cli/options.py", "jobs/plan.py", "weights/registry.py", "engine/engine.py"}


def test_resolve_gives_one_frozen_plan_with_its_labels_filled_once(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("refund\tmoney back\ndelivery\n")
    o = TaskOptions(
        labels_file=str(labels),
        system="One of {labels}.\n{label_descriptions}",
        id_column="rid",
        given=frozenset({"labels_file", "system", "id_column"}),
    )
    plan = plans.resolve(o, lambda _m: None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.window = 2  # type: ignore[misc]
    assert plan.system == "One of refund, delivery.\n- refund: money back\n- delivery" and plan.labels_filled
    assert isinstance(plan.kind, KindArgs) and plan.labels == ("refund", "delivery")
    assert plan.read.id_required and plan.read.id_column == "rid"  # an id column typed must be there
    assert plan.origin == "here" and plan.task is None


def test_fitting_or_resuming_calibration_returns_a_new_plan():
    plan = Plan()
    resumed = plan.with_calibration("batch", "resume")
    assert plan.calibration.method == "none" and plan.origin == "here"
    assert resumed.calibration.method == "batch" and resumed.origin == "resume"


# Where the word `dequantize` may be an identifier (issue 54: at most 4 files). The load choice of
# an MLX-quantized model is `keep_quantized` from the option to the loader (`ModelRef`'s field,
# `Engine.load`, `models.load_model`, `models.quant`); `dequantize` is left to the option's
# off-switch (--dequantize), the Python loaders' deprecated keyword (read in `ModelRef.take`
# only), and the operation itself: `models.quant` calls MLX's `mx.dequantize`. Two more name
# another library's function or keyword of the same word: mlx-lm's `LoRALinear.fuse(dequantize=)`
# and gguf's `dequantize`.
DEQUANTIZE_NAMED = {"cli/options.py", "weights/registry.py", "models/quant.py"}
OTHER_LIBRARIES = {"weights/adapters.py", "weights/convert.py"}


def test_dequantize_is_named_only_by_the_option_the_deprecation_and_the_operation():
    naming = {
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "dequantize" in _names(ast.parse(p.read_text()))
    }
    assert naming == DEQUANTIZE_NAMED | OTHER_LIBRARIES


def test_the_python_loaders_take_the_load_choice_by_its_name(monkeypatch):
    """`Classifier.load`, `Classifier.from_task` and `Embedder.load` take `keep_quantized=` (and
    `dtype=`): `ModelRef.take` reads them into the reference `Engine.load` gets. 0.1's
    `dequantize=` (its opposite) still works, with a DeprecationWarning."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.embedder import Embedder
    from mlx_slm.classifier.task import Task
    from mlx_slm.engine.engine import Engine

    seen: list[ModelRef] = []

    class Loaded(Exception):
        pass

    def load(cls, model, dtype=None, keep_quantized=None):
        seen.append(ModelRef.of(model, dtype, keep_quantized))
        raise Loaded

    monkeypatch.setattr(Engine, "load", classmethod(load))
    with pytest.raises(Loaded):
        Classifier.load("m", ["a", "b"], dtype="float32", keep_quantized=False)
    with pytest.raises(Loaded):
        Classifier.load(ModelRef("m", "float16", True), keep_quantized=False)
    with pytest.raises(Loaded):
        Classifier.from_task(Task("t", ("a", "b"), None, "{text}"), keep_quantized=True, batch_size=4)
    with pytest.raises(Loaded):
        Embedder.load("e", keep_quantized=False)
    with pytest.warns(DeprecationWarning, match="keep_quantized="), pytest.raises(Loaded):
        Classifier.load("m", ["a", "b"], dequantize=True)
    with pytest.warns(DeprecationWarning), pytest.raises(Loaded):
        Embedder.load("e", dequantize=False)
    assert seen == [
        ModelRef("m", "float32", False),
        ModelRef("m", "float16", False),
        ModelRef("t", None, True),
        ModelRef("e", None, False),
        ModelRef("m", None, False),
        ModelRef("e", None, True),
    ]


# --warmup only where a prior is fitted on the input (hostile round eight, issue 53).


# ----------------------------------------------------------------------------- options nothing reads


def _input(tmp_path):
    p = tmp_path / "in.jsonl"
    rows = [{"id": i, "text": f"ticket {i}", "label": ("billing", "tech")[i % 2]} for i in range(4)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("command", ["classify", "eval"])
@pytest.mark.parametrize(
    "extra, says",
    [
        ((), "(none)"),
        (("--calibrate", "fit", "--calibration-data", "CAL"), "(fit)"),
    ],
)
def test_warmup_without_a_warm_up_calibration_is_refused(tmp_path, tiny_qwen_mlx, command, extra, says):
    inp = _input(tmp_path)
    extra = [str(inp) if x == "CAL" else x for x in extra]
    r = invoke([command, inp, "--model", tiny_qwen_mlx, "--labels", "billing,tech", "--warmup", "3", *extra, "-q"])
    refused_cleanly(r, "--warmup", says, "--calibrate batch|em")


def test_warmup_is_taken_where_a_prior_is_fitted_on_the_input():
    for calibrate in ("batch", "em"):
        o = TaskOptions(calibrate=calibrate, warmup=7, given=frozenset({"calibrate", "warmup"}))
        if calibrate == "em":
            o = replace(o, calibration_data=__file__, given=o.given | {"calibration_data"})
        assert resolve(o, print).calibration.warmup == 7


def test_warmup_reaches_the_questions_batch_prior(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"name": "topic", "question": "Which?", "labels": ["a", "b"]}\n')
    o = TaskOptions(
        questions_file=str(q), calibrate="batch", warmup=5, given=frozenset({"questions_file", "calibrate", "warmup"})
    )
    assert resolve(o, print).calibration.warmup == 5  # was the default 512: --warmup ignored with --questions
    with pytest.raises(UserError, match="--warmup"):
        resolve(replace(o, calibrate="none", given=o.given - {"calibrate"}), print)


def test_warmup_with_a_task_of_a_fitted_prior_is_refused(tmp_path):
    t = tmp_path / "t.json"
    prior = Calibrator("batch", ("billing", "tech"), (-0.5, -0.9))
    Task(model="m", labels=["billing", "tech"], system="Route.", template="{text}", calibration=prior).save(t)
    with pytest.raises(UserError, match="the task's fitted prior"):
        resolve(TaskOptions(task_file=str(t), warmup=5, given=frozenset({"task_file", "warmup"})), print)
    resolve(
        TaskOptions(
            task_file=str(t), calibrate="batch", warmup=5, given=frozenset({"task_file", "calibrate", "warmup"})
        ),
        print,
    )


# The right refusal, once (hostile round five, issue 33, items 4 and 5).


def test_a_task_given_its_own_model_labels_or_prompt_is_not_changed(head_task, tiny_qwen_mlx, tiny_qwen_hf, tmp_path):
    data = write(tmp_path / "in.jsonl", '{"text": "My card was charged twice"}\n')
    task = json.loads(head_task.read_text())
    same = [["--model", tiny_qwen_mlx], ["--model", str(tiny_qwen_mlx) + "/"], ["--template", task["template"]],
            ["--labels", ",".join(task["labels"])]]  # fmt: skip
    for extra in same:
        r = invoke(["classify", data, "--task", head_task, *extra, "-q"])
        assert r.exit_code == 0, (extra, r.output)
    # Other weights are refused once compared by sha256 (equal weights elsewhere are the task's own: issue 47).
    refused_cleanly(
        invoke(["classify", data, "--task", head_task, "--model", tiny_qwen_hf, "-q"]), "does not carry over"
    )
    refused_cleanly(invoke(["classify", data, "--task", head_task, "--template", "T: {text}", "-q"]),
                    "with --template changed")  # fmt: skip


def test_calibration_data_without_fit_or_em_is_refused(tmp_path):
    data = write(tmp_path / "in.jsonl", '{"text": "hi", "label": "a"}\n')
    for extra in ([], ["--calibrate", "batch"]):
        r = invoke(["classify", data, "--labels", "a,b", "--calibration-data", data, *extra, "--model", tmp_path / "m"])
        refused_cleanly(r, "--calibration-data is fitted by --calibrate fit or em only")
