"""`parity --model DIR` on our own export (issue 40, item 2): the export records the prompt it was
fine-tuned with (`mlx_slm.prompt`), `classify --model DIR` runs that prompt, and parity's
reference encodes the same prompt (the chat template with that system message and template, as
the model card says): the encodings equal, the probabilities within tolerance, exit 0. (One aspect of
`parity/seqcls.py`, beside tests/parity/test_seqcls.py.)"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.text.workload import tickets

FAST = ["--adapt-layers", "2", "--epochs", "2", "--lr", "1e-3", "--head-lr", "1e-2", "--val-fraction", "0.2", "-q"]


def run(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_qwen_mlx):
    d = tmp_path_factory.mktemp("exported")
    mp = pytest.MonkeyPatch()
    mp.setenv("MLX_SLM_HOME", str(d / "home"))  # the export's conversion goes there
    data = d / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in tickets(30)))
    task, out = d / "task.json", d / "exp"
    r = run(["train", data, "--finetune", "lora", "--model", tiny_qwen_mlx, "--save-task", task, *FAST])
    assert r.exit_code == 0, r.output
    r = run(["export", task, "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    yield out
    mp.undo()


@pytest.mark.slow
def test_parity_on_our_own_export_compares_the_recorded_prompt(exported, tmp_path):
    pytest.importorskip("torch")
    r = run(["parity", "--model", exported, "--n", "6", "--json"])
    assert r.stdout, r.output
    rep = json.loads(r.stdout)
    a = rep["forward_exactness"]
    assert a["encodings_equal"] == a["total"] == 6, rep
    assert rep["prompt"].startswith("the prompt it records") and rep["forward_ok"] and r.exit_code == 0
    # pairs on a template without {pair}: each is an error of ours, named; with --input of plain texts it passes
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t, _ in tickets(5)))
    r = run(["parity", "--model", exported, "--input", inp, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["forward_exactness"]["encodings_equal"] == 5


@pytest.mark.slow
def test_parity_with_a_typed_prompt_checks_its_encoding_too(exported):
    """A typed --system/--template (a chat prompt of the user's) is encoded by the reference the same way."""
    pytest.importorskip("torch")
    r = run(["parity", "--model", exported, "--n", "4", "--json", "--system", "Sort it.", "--template", "T: {text}"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["forward_exactness"]["encodings_equal"] == 4 and rep["prompt"] == "chat (typed)"
