"""The package root (`mlx_slm/__init__.py`): the optimized BLAS loaded first, the public names listed and
loaded lazily (no MLX imported for `dir` or `help`), and Transformers' notice about PyTorch silenced."""

import os
import subprocess
import sys
from pathlib import Path


def test_transformers_no_torch_notice_is_silenced_and_other_warnings_pass():
    code = "import sys; sys.modules['torch'] = None; {}import transformers"
    # mlx_lm's import sets TRANSFORMERS_NO_ADVISORY_WARNINGS in os.environ (an earlier test imports it), which
    # silences the notice in the child by itself: the children start without it, as a user's shell does.
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    env["MLX_SLM_BLAS"] = "none"
    plain = subprocess.run([sys.executable, "-c", code.format("")], capture_output=True, text=True, env=env)
    assert "PyTorch was not found" in plain.stderr  # what a user without PyTorch saw
    ours = subprocess.run(
        [sys.executable, "-c", code.format("import mlx_slm; ")], capture_output=True, text=True, env=env
    )
    assert ours.returncode == 0 and "PyTorch was not found" not in ours.stderr, ours.stderr
    other = "import mlx_slm, transformers; transformers.logging.get_logger('transformers').warning('a real warning')"
    got = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, env=env)
    assert "a real warning" in got.stderr


def test_dir_and_help_of_the_package_list_the_public_names_without_importing_mlx():
    code = (
        "import sys, pydoc, mlx_slm\n"
        "d = dir(mlx_slm)\n"
        "assert {'Classifier', 'Embedder', 'Task', 'Engine', 'train_head'} <= set(d), d\n"
        "assert set(mlx_slm.__all__) <= set(d)\n"
        "assert 'mlx.core' not in sys.modules and 'mlx_slm.classifier' not in sys.modules\n"
        "text = pydoc.render_doc(mlx_slm, renderer=pydoc.plaintext)\n"
        "assert all(f'class {n}' in text for n in ('Classifier', 'Embedder', 'Task')), text[:2000]\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert got.returncode == 0, got.stderr
