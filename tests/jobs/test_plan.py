"""The command line's plan (issue 48): options and a task file resolved once into a frozen
`classifier.Plan` (`jobs.plan.resolve`), which loading, the manifest and saving a task read.
The model reference is one value (`ModelRef`): an option that reaches the engine touches four files."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from mlx_slm.classifier.plan import Plan
from mlx_slm.jobs import plan as plans
from mlx_slm.jobs.plan import TaskOptions
from mlx_slm.kinds import KindArgs
from mlx_slm.weights.registry import ModelRef

PACKAGE = Path(__file__).resolve().parents[2] / "mlx_slm"
ENGINE_OPTION = {
    "keep_quantized",
    "dequantize",
}  # --keep-quantized/--dequantize, as the option and as the engine's word


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
    """`classify --dequantize` from the command line to the engine: the click option
    (cli/options.py), `TaskOptions` and its resolution into the plan's model (jobs/plan.py:
    `model_ref`), `ModelRef` (weights/registry.py) and `Engine.load` (engine/engine.py). Every
    module between them (the command, the job, the plan, the classifier, Ray's workers) carries
    the `ModelRef` whole, so a new engine option is added in those four files and nowhere else."""
    o = TaskOptions(model=str(tiny_qwen_mlx), dtype="float32", keep_quantized=False, given=frozenset({"model"}))
    plan = plans.resolve(o, lambda _m: None)
    assert plan.model == ModelRef(str(tiny_qwen_mlx), "float32", True)
    assert plans.load(plan).engine.compute_dtype == "float32"

    path = ["cli/classify.py", "cli/options.py", "jobs/classify.py", "jobs/plan.py", "classifier/plan.py"]
    path += ["ray.py", "weights/registry.py", "engine/engine.py"]
    naming = {p for p in path if _names(ast.parse((PACKAGE / p).read_text())) & ENGINE_OPTION}
    # The classifier on the way: `from_plan` and the constructor take the plan's ModelRef whole
    # (`Classifier.load`'s own `dequantize=` is the Python API's, not on this path).
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


# Where the load choice of an MLX-quantized model (--keep-quantized/--dequantize) may be named
# as an identifier: the option, the `ModelRef` field, `Engine.load`, and the loader below it
# (`models.load_model`, mlx-lm's class, the rule in `models.quant`); every module between the
# option and the engine carries the `ModelRef` whole. The two others name another library's
# function or keyword of the same word: mlx-lm's `LoRALinear.fuse(dequantize=)`, gguf's `dequantize`.
LOAD_CHOICE_NAMED = {
    "cli/options.py",
    "weights/registry.py",
    "engine/engine.py",
    "models/__init__.py",
    "models/mlxlm.py",
    "models/quant.py",
}
OTHER_LIBRARIES = {"weights/adapters.py", "weights/convert.py"}


def test_the_load_choice_is_named_only_from_the_option_to_the_loader():
    naming = {
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "dequantize" in _names(ast.parse(p.read_text()))
    }
    assert naming == LOAD_CHOICE_NAMED | OTHER_LIBRARIES


def test_the_python_loaders_take_the_load_choice_by_its_name(monkeypatch):
    """`Classifier.load`, `Classifier.from_task` and `Embedder.load` still take `dequantize=`
    (and `dtype=`): `ModelRef.take` reads them into the reference `Engine.load` gets."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.classifier.embedder import Embedder
    from mlx_slm.classifier.task import Task
    from mlx_slm.engine.engine import Engine

    seen: list[ModelRef] = []

    class Loaded(Exception):
        pass

    def load(cls, model, dtype=None, dequantize=None):
        seen.append(ModelRef.of(model, dtype, dequantize))
        raise Loaded

    monkeypatch.setattr(Engine, "load", classmethod(load))
    with pytest.raises(Loaded):
        Classifier.load("m", ["a", "b"], dtype="float32", dequantize=True)
    with pytest.raises(Loaded):
        Classifier.load(ModelRef("m", "float16", False), dequantize=True)
    with pytest.raises(Loaded):
        Classifier.from_task(Task("t", ("a", "b"), None, "{text}"), dequantize=False, batch_size=4)
    with pytest.raises(Loaded):
        Embedder.load("e", dequantize=True)
    assert seen == [
        ModelRef("m", "float32", True),
        ModelRef("m", "float16", True),
        ModelRef("t", None, False),
        ModelRef("e", None, True),
    ]
