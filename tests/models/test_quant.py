"""MLX-quantized checkpoints (mlx-lm's format): convert --quantize, load, and exactness.

On the tiny random qwen2 (untied head: a QuantizedLinear) and llama (tied head: a
QuantizedEmbedding) checkpoints of conftest, 4 and 8 bits, group size 32 (it divides
every input size: hidden 64, MLP 160), float32 scales:

* `convert --quantize` writes what mlx-lm writes, and `mlx_lm.load` reads it;
* our labels equal mlx-lm's own forward on the directory, dequantized at load and kept
  packed (measured: max |d logit| <= 2e-5 on both paths);
* dequantized at load, our logits equal Transformers' on the dequantized values (float32,
  max |d logit| <= 1e-3; measured <= 1e-5); kept packed (MLX's quantized matmul) within
  KEPT_TOL = 1e-4 (measured <= 2e-5: only the summation order differs);
* a directory written by mlx-lm itself, with per-layer widths (its mixed_4_6 recipe),
  loads and classifies as mlx-lm's forward does;
* the CLI: convert --quantize (default group size 64: the MLP's 160-wide down_proj stays
  in floating point), classify with the one-line CPU note, parity with its (c) section,
  and clear errors for bad --quantize/--group-size values.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

from mlx_slm.classifier.classifier import Classifier
from mlx_slm.cli import main
from mlx_slm.engine.engine import Engine
from mlx_slm.models import load_model
from mlx_slm.models.quant import quantization_of
from mlx_slm.parity.labels import mlxlm_scores
from mlx_slm.text.labels import softmax
from mlx_slm.text.workload import tickets
from mlx_slm.weights.convert import ConversionError, convert, dequantized_copy

TOL = 1e-3  # dequantized at load, float32, against Transformers on the same values
KEPT_TOL = 1e-4  # kept packed: MLX's quantized matmul sums in another order (measured <= 2e-5)
LENGTHS = [45, 7, 23, 60]
TEXTS = [t for t, _ in tickets(10)]
LABELS = ["billing", "technical", "account"]
NOTE = "dequantized to float32 at load"
MAX_DIFF: dict[str, float] = {}  # name -> max |diff| seen (in the run's summary)


def cli(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


@pytest.fixture(scope="module")
def tiny_llama_hf(tiny_arch) -> Path:
    return tiny_arch.hf("llama")


class Quantized:
    """One quantized conversion and everything compared on it (loaded once per module)."""

    def __init__(self, hf: Path, bits: int, tmp: Path):
        self.bits = bits
        self.name = f"{tmp.name.split('-')[1]}-{bits}bit"  # tmp: quant-ARCH-BITSn
        self.dir = convert(hf, tmp / f"q{bits}", dtype="float32", quantize=bits, group_size=32, progress=None)
        self.deq_dir = dequantized_copy(self.dir, tmp / f"q{bits}-dequantized")
        self.hf = AutoModelForCausalLM.from_pretrained(str(self.deq_dir), dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(str(self.dir))
        vocab = json.loads((self.dir / "config.json").read_text())["vocab_size"]
        rng = np.random.default_rng(3)
        self.prompts = [[int(t) for t in rng.integers(3, vocab, size=n)] for n in LENGTHS]
        self._mlxlm: dict = {}

    def ref(self, ids) -> np.ndarray:
        with torch.no_grad():
            return self.hf(torch.tensor([ids]), use_cache=False).logits[0, -1].numpy()

    def mlxlm(self, ids, labelset):
        """mlx-lm's forward on this directory (`mlxlm_scores`), run once per prompts and labels:
        the dequantized and kept tests compare against the very same reference."""
        key = (tuple(map(tuple, ids)), labelset.labels, labelset.token_ids, labelset.mode)
        if key not in self._mlxlm:
            self._mlxlm[key] = mlxlm_scores(self.dir, ids, labelset)
        return self._mlxlm[key]


@pytest.fixture(
    scope="module", params=[("qwen2", 4), ("qwen2", 8), ("llama", 4), ("llama", 8)], ids=lambda p: f"{p[0]}-{p[1]}bit"
)
def q(request, tiny_qwen_hf, tiny_llama_hf, tmp_path_factory) -> Quantized:
    arch, bits = request.param
    hf = tiny_qwen_hf if arch == "qwen2" else tiny_llama_hf
    return Quantized(hf, bits, tmp_path_factory.mktemp(f"quant-{arch}-{bits}"))


def _batch_logits(model, prompts) -> np.ndarray:
    """Last-position full-vocab logits of a left-padded batch (per-row RoPE offsets)."""
    L = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), L), dtype=np.int32)
    mask = np.zeros((len(prompts), L), dtype=bool)
    for r, p in enumerate(prompts):
        ids[r, L - len(p) :] = p
        mask[r, L - len(p) :] = True
    offsets = mx.array(-(L - mask.sum(axis=1)).astype(np.int32))
    h, _ = model(mx.array(ids), mx.array(mask), offsets)
    return np.array(model.logits(h).astype(mx.float32))


# --------------------------------------------------------------------------- format


def test_convert_writes_mlxlm_format(q):
    cfg = json.loads((q.dir / "config.json").read_text())
    want = {"group_size": 32, "bits": q.bits, "mode": "affine"}
    assert cfg["quantization"] == want and cfg["quantization_config"] == want
    rec = json.loads((q.dir / "conversion.json").read_text())
    assert rec["quantization"] == want and rec["weights_sha256"]
    w = mx.load(str(q.dir / "model.safetensors"))
    assert w["model.layers.0.self_attn.q_proj.weight"].dtype == mx.uint32
    assert w["model.layers.0.self_attn.q_proj.weight"].shape[-1] == 64 * q.bits // 32
    assert {"model.embed_tokens.scales", "model.embed_tokens.biases", "model.layers.0.mlp.down_proj.scales"} <= set(w)
    assert w["model.norm.weight"].dtype == mx.float32 and "model.norm.scales" not in w  # norms stay
    if cfg["model_type"] == "qwen2":
        assert w["model.layers.0.self_attn.q_proj.bias"].dtype == mx.float32  # biases stay
        assert w["lm_head.weight"].dtype == mx.uint32
    else:
        assert not any(k.startswith("lm_head") for k in w)  # tied

    from mlx_lm import load

    model, _ = load(str(q.dir))
    kinds = {type(m).__name__ for _, m in model.named_modules()}
    assert {"QuantizedLinear", "QuantizedEmbedding"} <= kinds and "Linear" not in kinds


def test_quantization_entry_forms():
    assert quantization_of({"quantization": {"group_size": 64, "bits": 4}}) == {"group_size": 64, "bits": 4}
    assert quantization_of({"quantization_config": {"group_size": 32, "bits": 8, "mode": "affine"}})["bits"] == 8
    assert quantization_of({"model_type": "qwen2"}) is None
    with pytest.raises(ValueError, match="'gptq' is not supported"):
        quantization_of({"quantization_config": {"quant_method": "gptq", "bits": 4}})


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("keep", [False, True], ids=["dequantized", "kept"])
def test_logits_equal_transformers_on_the_dequantized_values(q, keep):
    m = load_model(q.dir, keep_quantized=keep)
    assert m.compute_dtype == mx.float32
    assert (m.quantized is None) == (not keep)
    got = _batch_logits(m, q.prompts)
    worst = max(float(np.abs(got[r] - q.ref(p)).max()) for r, p in enumerate(q.prompts))
    MAX_DIFF[f"{q.name}/{'kept' if keep else 'dequantized'}/transformers"] = worst
    assert worst <= (KEPT_TOL if keep else TOL), worst
    # Label rows only (what the classifier asks for): the packed rows, dequantized alone.
    rows = mx.array([3, 17, 200])
    h, _ = m(mx.array([q.prompts[2]]))
    np.testing.assert_allclose(np.array(m.logits(h, rows)), np.array(m.logits(h))[:, [3, 17, 200]], atol=1e-5)


@pytest.mark.parametrize("keep", [False, True], ids=["dequantized", "kept"])
def test_labels_equal_mlxlm_forward(q, keep):
    model = load_model(q.dir, keep_quantized=keep)
    for labels in (LABELS, ["a", "b", "c"]):  # multi-token labels (sequence scoring), then single tokens
        clf = Classifier(Engine(model, q.tok), labels, keep_logits=True, batch_size=4)
        ours = clf.classify(TEXTS)
        ids = [it.ids for it in clf.prepare(TEXTS)]
        scores, logits, _ = q.mlxlm(ids, clf.labelset)
        assert [p.label for p in ours] == [labels[int(np.argmax(s))] for s in scores]
        worst = max(float(np.abs(p.logits - lg).max()) for p, lg in zip(ours, logits))
        MAX_DIFF[f"{q.name}/{'kept' if keep else 'dequantized'}/mlx-lm/{clf.mode}"] = worst
        assert worst <= KEPT_TOL, worst
        # Label probabilities (scores may differ by a per-item constant: first-token logits vs log-probs).
        got = [[p.probs[lab] for lab in labels] for p in ours]
        np.testing.assert_allclose(got, [softmax(s) for s in scores], atol=KEPT_TOL)


def test_dir_written_by_mlxlm_with_per_layer_widths(tiny_qwen_hf, tmp_path, monkeypatch):
    """mlx-lm's own convert, mixed 4/6-bit recipe: per-module entries in "quantization"."""
    from mlx_lm import convert as mlxlm_convert

    monkeypatch.setenv("MLX_SLM_HOME", str(tmp_path / "home"))
    out = tmp_path / "mlxlm-mixed"
    mlxlm_convert(
        str(tiny_qwen_hf),
        str(out),
        quantize=True,
        q_group_size=32,
        q_bits=4,
        dtype="float32",
        quant_predicate="mixed_4_6",
    )
    cfg = json.loads((out / "config.json").read_text())
    per_layer = {k: v for k, v in cfg["quantization"].items() if isinstance(v, dict)}
    assert {v["bits"] for v in per_layer.values()} == {4, 6}
    tok = AutoTokenizer.from_pretrained(str(out))
    mlxlm = None  # mlx-lm's forward on the directory: the same prompts and labels on both paths, run once
    for keep in (False, True):
        m = load_model(out, keep_quantized=keep)
        if keep:
            assert (
                m.layers[2].mlp.down_proj.bits == 6 and m.layers[0].mlp.down_proj.bits == 4
            )  # recipe: last layer wider
        clf = Classifier(Engine(m, tok), LABELS, keep_logits=True)
        ours = clf.classify(TEXTS)
        ids = [it.ids for it in clf.prepare(TEXTS)]
        if mlxlm is None or mlxlm[0] != ids:
            mlxlm = (ids, mlxlm_scores(out, ids, clf.labelset))
        scores, logits, _ = mlxlm[1]
        assert [p.label for p in ours] == [LABELS[int(np.argmax(s))] for s in scores]
        assert max(float(np.abs(p.logits - lg).max()) for p, lg in zip(ours, logits)) <= KEPT_TOL
    # Through the loader users call: an mlx-lm directory has no record of ours, so it is
    # copied (as stored, packed) into the cache once, then loaded from there.
    clf = Classifier.load(str(out), LABELS)
    assert json.loads((clf.path / "conversion.json").read_text())["quantization"] == cfg["quantization"]
    assert [p.label for p in clf.classify(TEXTS)] == [p.label for p in ours]


def test_gpu_default_keeps_packed(q, monkeypatch, capsys):
    """The default on a GPU (decided by the default device): kept packed, and no CPU note."""
    import mlx_slm.models as models

    monkeypatch.setattr(models.mx, "default_device", lambda: mx.gpu)
    m = load_model(q.dir, dtype=mx.float32)
    assert m.quantized == f"{q.bits}-bit (group 32)"
    assert "note" not in capsys.readouterr().err


# --------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def cli_q4(tiny_qwen_hf, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli-q") / "q4"
    r = cli(["convert", str(tiny_qwen_hf), "--out", str(out), "--quantize", "4", "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    assert "4-bit, group size 64" in r.stderr
    assert "3 left unquantized (input size not a multiple of 64)" in r.stderr  # the MLP's down_proj (160 wide)
    return out


def test_cli_convert_quantize_and_classify(cli_q4, tmp_path):
    from mlx_lm import load

    model, _ = load(str(cli_q4))
    assert type(model.model.layers[0].mlp.down_proj).__name__ == "Linear"
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"

    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(TEXTS[:4]) + "\n")
    r = cli(["classify", str(inp), "--model", str(cli_q4), "--labels", ",".join(LABELS)])
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.stderr.splitlines() if "note" in ln]
    assert len(notes) == 1 and NOTE in notes[0] and "--keep-quantized" in notes[0], r.stderr
    kept = cli(["classify", str(inp), "--model", str(cli_q4), "--labels", ",".join(LABELS), "--keep-quantized"])
    assert kept.exit_code == 0, kept.output
    assert "note" not in kept.stderr
    labels = [json.loads(x)["label"] for x in r.stdout.splitlines()]
    assert labels == [json.loads(x)["label"] for x in kept.stdout.splitlines()]


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--quantize", "3"], "--quantize 3: quantize to 4 or 8 bits"),
        (["--quantize", "4", "--group-size", "48"], "--group-size 48: use 32, 64, 128"),
        (["--group-size", "64"], "add --quantize 4|8"),
        (["--quantize", "4", "--group-size", "128"], "group size 128 divides the input size of none"),
        (["--quantize", "four"], "'four' is not a valid integer"),
    ],
)
def test_cli_convert_bad_quantize_values(tiny_qwen_hf, tmp_path, extra, msg):
    out = tmp_path / "out"
    r = cli(["convert", str(tiny_qwen_hf), "--out", str(out), *extra])
    assert r.exit_code == 2 and msg in r.output, r.output
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_requantizing_is_refused(cli_q4, tmp_path):
    with pytest.raises(ConversionError, match="already 4-bit .* quantized"):
        convert(cli_q4, tmp_path / "again", quantize=8, progress=None)


@pytest.mark.slow
def test_cli_parity_on_a_quantized_dir(cli_q4):
    r = cli(["parity", "--model", str(cli_q4), "--n", "4", "--labels", ",".join(LABELS)])
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "weights 4-bit (group 64), dequantized at load" in out
    assert "(a) forward exactness: ours vs Transformers on the same weight values (dequantized, float32)" in out
    assert "(b) conversion drift" in out and "reference  " + str(tiny_source(cli_q4)) in out
    assert "(c) mlx-lm: ours vs mlx-lm's own forward" in out and "labels agree        4/4" in out
    assert out.count("-> PASS") == 2


def tiny_source(qdir: Path) -> str:
    return json.loads((qdir / "conversion.json").read_text())["source_path"]


def _gpu() -> bool:
    cuda = getattr(mx, "cuda", None)
    return bool(mx.metal.is_available() or (cuda is not None and cuda.is_available()))


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="no Metal or CUDA device for MLX here")
def test_gpu_default_keeps_packed_and_agrees_with_mlxlm(tiny_qwen_hf, tmp_path):
    """On a GPU: kept packed by default, in the scales' half type, within the float16 parity
    tolerance of mlx-lm's forward (labels may differ only on a near-tie)."""
    from mlx_slm.parity.labels import TOLERANCE

    qdir = convert(tiny_qwen_hf, tmp_path / "q4", dtype="float16", quantize=4, group_size=32, progress=None)
    before = mx.default_device()
    mx.set_default_device(mx.gpu)
    try:
        m = load_model(qdir)
        assert m.quantized == "4-bit (group 32)" and m.compute_dtype == mx.float16
        clf = Classifier(Engine(m, AutoTokenizer.from_pretrained(str(qdir))), LABELS, keep_logits=True)
        ours = clf.classify(TEXTS)
        scores, logits, _ = mlxlm_scores(qdir, [it.ids for it in clf.prepare(TEXTS)], clf.labelset, m.compute_dtype)
    finally:
        mx.set_default_device(before)
    tol = TOLERANCE["float16"]
    assert max(float(np.abs(p.logits - lg).max()) for p, lg in zip(ours, logits)) <= tol
    for p, s in zip(ours, scores):
        if p.label != LABELS[int(np.argmax(s))]:
            top = sorted(s)[-2:]
            assert top[1] - top[0] <= 2 * tol
