"""The slow, obvious path that every fast path is checked against.

PyTorch/Transformers, float32, one item at a time, no batching, no padding, no cache.
It loads a Hugging Face directory (including one we converted, so the weight values
are exactly ours) or the original `.gguf` (dequantized by Transformers).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..ground.errors import MissingExtra
from ..text.labels import LabelSet, log_softmax
from ..text.prompts import (
    _QWEN3_PREFIX,
    _QWEN3_SUFFIX,
    QWEN3_RERANKER_INSTRUCTION,
    PromptFormat,
    prompt_messages,
    render,
)


def _torch() -> Any:
    try:
        import torch  # lazy: optional, heavy
    except ImportError as e:  # the reference path is an extra
        raise MissingExtra("the Transformers reference path needs PyTorch: pip install 'mlx-slm[reference]'") from e
    return torch


def require_torch() -> None:
    """Raise `MissingExtra` (exit 2, naming the pip command) when PyTorch is not installed,
    checked here (without importing it) before a child process is started for it."""

    if importlib.util.find_spec("torch") is None:
        raise MissingExtra("the Transformers reference path needs PyTorch: pip install 'mlx-slm[reference]'")


class Reference:
    def __init__(self, src: str | Path, dtype: str = "float32", threads: int | None = None):
        torch = _torch()
        from transformers import AutoModelForCausalLM  # lazy: a slow import
        from transformers.utils import logging as hf_logging  # lazy: a slow import

        hf_logging.disable_progress_bar()
        torch.set_num_threads(threads or os.cpu_count() or 1)
        self.torch = torch
        self.dtype = getattr(torch, dtype)
        p = Path(src).expanduser()
        if p.suffix == ".gguf":
            self.model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=self.dtype)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(str(p), dtype=self.dtype)
        self.model.eval()

    def last_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Full-vocabulary logits at the last position of one unpadded prompt (float32)."""
        return self.logits(ids, last_only=True)[-1]

    def logits(self, ids: Sequence[int], last_only: bool = False) -> np.ndarray:
        """Logits of every position, or of the last only (`logits_to_keep=1`: the LM head
        over 151,936 rows at every position would add about a third to a Qwen 0.5B pass)."""
        torch = self.torch
        kw = {"logits_to_keep": 1} if last_only else {}
        with torch.inference_mode():
            out = self.model(torch.tensor([list(ids)]), use_cache=False, **kw).logits[0]
        return out.float().numpy()

    def label_scores(self, ids: Sequence[int], labelset: LabelSet) -> tuple[np.ndarray, np.ndarray]:
        """(scores, full last logits). First-token mode: label logits. Sequence mode: the
        exact sum of log-probabilities of each label's tokens (prompt + label, run afresh)."""
        last = self.last_logits(ids)
        if labelset.mode == "first-token":
            return last[labelset.first_ids].astype(np.float64), last
        first_lp = log_softmax(last)
        scores = []
        for toks in labelset.token_ids:
            s = first_lp[toks[0]]
            if len(toks) > 1:
                lg = log_softmax(self.logits(list(ids) + list(toks[:-1]))[len(ids) :])
                s += sum(lg[k, toks[k + 1]] for k in range(len(toks) - 1))
            scores.append(s)
        return np.array(scores, dtype=np.float64), last


class SeqClsReference:
    """A sequence classifier as Transformers runs it: `AutoModelForSequenceClassification` in
    float32, one item at a time (no batch, no padding, no cache), its inputs encoded and its
    probabilities computed by the text-classification pipeline's own `preprocess` and
    `postprocess` (default `function_to_apply`), on the same weights."""

    def __init__(self, src: str | Path, dtype: str = "float32", threads: int | None = None):
        torch = _torch()
        from transformers import (
            AutoModelForSequenceClassification,
            AutoTokenizer,
            TextClassificationPipeline,
        )  # lazy: a slow import
        from transformers.utils import logging as hf_logging  # lazy: a slow import

        hf_logging.disable_progress_bar()
        torch.set_num_threads(threads or os.cpu_count() or 1)
        self.torch = torch
        path = str(Path(src).expanduser())
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.pipeline = TextClassificationPipeline(model=self.model, tokenizer=self.tokenizer)
        self.labels = tuple(self.model.config.id2label[i] for i in range(self.model.config.num_labels))

    def encode(self, text: str, pair: str | None = None, chat: dict[str, Any] | None = None) -> list[int]:
        """The ids the pipeline feeds the model for a text (or a text pair); with `chat` (a
        prompt's "system" and "template", as an export records it under `mlx_slm.prompt`), the
        chat template on those messages as the export's model card says: the system message,
        the template with `{text}` (and `{pair}`) filled, the generation prompt."""
        if chat is None:
            item = text if pair is None else {"text": text, "text_pair": pair}
            return self.pipeline.preprocess(item)["input_ids"][0].tolist()

        fmt = PromptFormat(chat.get("system"), chat["template"])
        if not getattr(self.tokenizer, "chat_template", None):  # a base model: the plain prompt
            return list(self.tokenizer(render(self.tokenizer, fmt, text, pair), add_special_tokens=False)["input_ids"])
        msgs = prompt_messages(self.tokenizer, fmt, text, pair)  # as ours: a refused system turn folded
        got = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        return list(got["input_ids"] if hasattr(got, "keys") else got)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """The head's logits (num_labels,) float32 for one unpadded prompt (read by Transformers
        at its last token that is not the pad id)."""
        torch = self.torch
        with torch.inference_mode():
            return self.model(torch.tensor([list(ids)]), use_cache=False).logits[0].float().numpy()

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The pipeline's scores of one item's logits, in label order (float64)."""
        out = {"logits": self.torch.tensor(np.asarray(logits, dtype=np.float32)[None])}
        scored = self.pipeline.postprocess(out, top_k=None, _legacy=True)  # every label, in id order
        return np.array([d["score"] for d in scored], dtype=np.float64)

    def classify(
        self, texts: Sequence[str], pairs: Sequence[str | None] | None = None, chat: dict[str, Any] | None = None
    ) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
        """(ids per item, logits (n, k) float32, probabilities (n, k) float64), one item at a time
        (`chat`: the chat prompt each is encoded in, see `encode`)."""
        ids = [self.encode(t, None if pairs is None else pairs[i], chat) for i, t in enumerate(texts)]
        logits = np.array([self.logits(x) for x in ids], dtype=np.float32).reshape(len(ids), len(self.labels))
        return ids, logits, np.array([self.probabilities(x) for x in logits]).reshape(logits.shape)


def hidden(
    ref: Reference, ids: Sequence[int], layers: Sequence[int], poolings: Sequence[str] = (), start: int = 0
) -> np.ndarray:
    """Transformers' `hidden_states[l]` for each of `layers`, (len(layers), D), pooled as the
    matching entry of `poolings` (default all "last"): at the last position, or ("mean")
    the mean over positions `start`.. (in float64, then float32)."""
    torch = ref.torch
    with torch.inference_mode():
        hs = ref.model(torch.tensor([list(ids)]), use_cache=False, output_hidden_states=True).hidden_states
    poolings = list(poolings) or ["last"] * len(layers)
    return np.stack(
        [
            (hs[x][0, start:].double().mean(0) if p == "mean" else hs[x][0, -1]).float().numpy()
            for x, p in zip(layers, poolings)
        ]
    )


def run_in_child(args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """`python ARGS` in a child process without our OpenBLAS preload (MLX_SLM_BLAS=none).

    In the global symbol scope that library also takes over PyTorch's BLAS calls, which made
    Transformers about 3.6x slower on a 2-core machine (measured): every Transformers run
    that shares a machine with MLX goes through here (the parity reference, the benchmark)."""
    env = {**os.environ, "MLX_SLM_BLAS": "none", **kwargs.pop("env", {})}
    return subprocess.run([sys.executable, *args], env=env, **kwargs)


def score_in_child(
    src: str | Path, prompts: Sequence[Sequence[int]], labelset: LabelSet
) -> tuple[np.ndarray, np.ndarray, float]:
    """`label_scores` for every prompt, run in a child process: (scores (n, k), last logits (n, V), seconds).

    The child skips our OpenBLAS preload (see `run_in_child`).
    """
    require_torch()
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        out = Path(tmp) / "out.npz"
        job.write_text(
            json.dumps(
                {
                    "src": str(src),
                    "prompts": [list(map(int, p)) for p in prompts],
                    "labels": list(labelset.labels),
                    "token_ids": [list(t) for t in labelset.token_ids],
                    "mode": labelset.mode,
                }
            )
        )
        done = run_in_child(["-m", "mlx_slm.parity.reference", str(job), str(out)])
        if done.returncode != 0:
            raise RuntimeError(f"the Transformers reference failed on {src} (exit status {done.returncode})")
        data = np.load(out)
        return data["scores"], data["logits"], float(data["seconds"])


def score_blocks_in_child(
    src: str | Path, blocks: Sequence[tuple[Sequence[Sequence[int]], LabelSet]]
) -> tuple[list[np.ndarray], float]:
    """`label_scores` of several prompt sets, each with its own label set (one per question
    branch), in one child process (one model load): ([(n, k) per block], seconds)."""
    require_torch()
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        out = Path(tmp) / "out.npz"
        spec = [
            {
                "prompts": [list(map(int, p)) for p in prompts],
                "labels": list(ls.labels),
                "token_ids": [list(t) for t in ls.token_ids],
                "mode": ls.mode,
            }
            for prompts, ls in blocks
        ]
        job.write_text(json.dumps({"src": str(src), "blocks": spec}))
        done = run_in_child(["-m", "mlx_slm.parity.reference", str(job), str(out)])
        if done.returncode != 0:
            raise RuntimeError(f"the Transformers reference failed on {src} (exit status {done.returncode})")
        data = np.load(out)
        return [data[f"scores{i}"] for i in range(len(blocks))], float(data["seconds"])


def hidden_in_child(
    src: str | Path,
    prompts: Sequence[Sequence[int]],
    layers: Sequence[int],
    poolings: Sequence[str] = (),
    start: int = 0,
) -> tuple[np.ndarray, float]:
    """`hidden` for every prompt, in a child process (see `run_in_child`): ((n, len(layers), D), seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        out = Path(tmp) / "out.npz"
        job.write_text(
            json.dumps(
                {
                    "src": str(src),
                    "prompts": [list(map(int, p)) for p in prompts],
                    "layers": list(layers),
                    "poolings": list(poolings),
                    "start": int(start),
                }
            )
        )
        done = run_in_child(["-m", "mlx_slm.parity.reference", str(job), str(out)])
        if done.returncode != 0:
            raise RuntimeError(f"the Transformers reference failed on {src} (exit status {done.returncode})")
        data = np.load(out)
        return data["hidden"], float(data["seconds"])


def seqcls_in_child(
    src: str | Path,
    prompts: Sequence[Sequence[int]] | None = None,
    texts: Sequence[str] | None = None,
    pairs: Sequence[str | None] | None = None,
    chat: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`SeqClsReference` in a child process (see `run_in_child`), on token ids (`prompts`) or
    on texts (and pairs) it encodes itself (in the chat prompt `chat`, when given): {"logits":
    (n, k), "probs": (n, k), "labels", "seconds", and for texts "ids": the encoding of each}."""
    require_torch()
    if (prompts is None) == (texts is None):
        raise ValueError("give either prompts (token ids) or texts")
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.npz"
        spec: dict[str, Any] = {"src": str(src), "seqcls": True}
        if prompts is not None:
            spec["prompts"] = [list(map(int, p)) for p in prompts]
        else:
            spec["texts"], spec["pairs"] = list(texts or []), None if pairs is None else list(pairs)
            spec["chat"] = chat
        job.write_text(json.dumps(spec))
        done = run_in_child(["-m", "mlx_slm.parity.reference", str(job), str(out)])
        if done.returncode != 0:
            raise RuntimeError(f"the Transformers reference failed on {src} (exit status {done.returncode})")
        data = np.load(out)
        got: dict[str, Any] = {k: data[k] for k in ("logits", "probs")}
        got["labels"], got["seconds"] = [str(x) for x in data["labels"]], float(data["seconds"])
        if "ids" in data:
            ends = np.cumsum(data["lengths"]).tolist()
            got["ids"] = [data["ids"][e - n : e].tolist() for n, e in zip(data["lengths"].tolist(), ends)]
        return got


def _seqcls_child(job: dict[str, Any], out_path: str) -> None:
    ref = SeqClsReference(job["src"])
    t = time.perf_counter()
    if "texts" in job:
        ids, logits, probs = ref.classify(job["texts"], job.get("pairs"), job.get("chat"))
        extra = {"ids": np.array([i for x in ids for i in x], dtype=np.int64), "lengths": [len(x) for x in ids]}
    else:
        logits = np.array([ref.logits(p) for p in job["prompts"]], dtype=np.float32)
        logits = logits.reshape(len(job["prompts"]), len(ref.labels))
        probs, extra = np.array([ref.probabilities(x) for x in logits]).reshape(logits.shape), {}
    seconds = time.perf_counter() - t
    np.savez(out_path, logits=logits, probs=probs, labels=np.array(ref.labels), seconds=seconds, **extra)


def rerank_in_child(
    src: str | Path,
    scorer: str,
    queries: Sequence[str],
    documents: Sequence[str],
    instruction: str | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Transformers' relevance of each (query, document), every pair alone, in a child process
    (see `run_in_child`): {"scores": (n,) float64, "logits": (n,) the one logit or the yes-no
    log-odds, "seconds"}. `scorer` "seqcls": `SeqClsReference` on the pair as its pipeline
    encodes it (the sigmoid of the one logit); "qwen3": `AutoModelForCausalLM` on the
    Qwen3-Reranker model card's own encoding of its prompt (`_qwen3_card_ids`), P(yes) the
    softmax over the `no` and `yes` logits at the last position; "question": the same P(yes)
    on the token ids given (`prompts`: our rendering of a prompt of one's own)."""
    require_torch()
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.npz"
        spec: dict[str, Any] = {
            "src": str(src),
            "rerank": scorer,
            "queries": list(queries),
            "documents": list(documents),
            "instruction": instruction,
            "prompts": None if prompts is None else [list(map(int, p)) for p in prompts],
        }
        job.write_text(json.dumps(spec))
        done = run_in_child(["-m", "mlx_slm.parity.reference", str(job), str(out)])
        if done.returncode != 0:
            raise RuntimeError(f"the Transformers reference failed on {src} (exit status {done.returncode})")
        data = np.load(out)
        return {"scores": data["scores"], "logits": data["logits"], "seconds": float(data["seconds"])}


def _qwen3_card_ids(tokenizer: Any, query: str, document: str, instruction: str | None) -> list[int]:
    """The Qwen3-Reranker model card's encoding of one pair, as its example code makes it: the
    system prefix and the suffix encoded alone, the formatted pair between them."""

    body = f"<Instruct>: {QWEN3_RERANKER_INSTRUCTION if instruction is None else instruction}\n<Query>: {query}\n"
    body += f"<Document>: {document}"
    return (
        tokenizer.encode(_QWEN3_PREFIX, add_special_tokens=False)
        + tokenizer(body)["input_ids"]
        + tokenizer.encode(_QWEN3_SUFFIX, add_special_tokens=False)
    )


def _rerank_child(job: dict[str, Any], out_path: str) -> None:
    """A reranker's reference scores, by its scorer (`_RERANK_REFERENCES`)."""
    _RERANK_REFERENCES[job["rerank"]](job, out_path)


def _seqcls_pairs_child(job: dict[str, Any], out_path: str) -> None:
    """A sequence-classifier reranker: each (query, document) as the text-classification pipeline encodes a pair."""
    ref = SeqClsReference(job["src"])
    t = time.perf_counter()
    _, logits, probs = ref.classify(job["queries"], job["documents"])
    np.savez(out_path, scores=probs[:, 0], logits=logits[:, 0].astype(np.float64), seconds=time.perf_counter() - t)


def _qwen3_card_child(job: dict[str, Any], out_path: str) -> None:
    """The Qwen3-Reranker card's prompt for each pair, P(yes) against "no"."""
    tok = _tokenizer(job["src"])
    prompts = [_qwen3_card_ids(tok, q, d, job["instruction"]) for q, d in zip(job["queries"], job["documents"])]
    _yes_no_child(job["src"], tok, prompts, out_path)


def _question_child(job: dict[str, Any], out_path: str) -> None:
    """A question prompt of ours: the token ids we ran, P(yes) against "no"."""
    _yes_no_child(job["src"], _tokenizer(job["src"]), job["prompts"], out_path)


def _tokenizer(src: str) -> Any:
    from transformers import AutoTokenizer  # lazy: the reference's child process alone loads Transformers' models

    return AutoTokenizer.from_pretrained(src)


def _yes_no_child(src: str, tok: Any, prompts: Sequence[Sequence[int]], out_path: str) -> None:
    ref = Reference(src)
    no, yes = tok.convert_tokens_to_ids("no"), tok.convert_tokens_to_ids("yes")  # as the card finds them
    t = time.perf_counter()
    two = np.array([ref.last_logits(p)[[no, yes]] for p in prompts], dtype=np.float64).reshape(len(prompts), 2)
    e = np.exp(two - two.max(axis=1, keepdims=True))
    scores = e[:, 1] / e.sum(axis=1)
    np.savez(out_path, scores=scores, logits=two[:, 1] - two[:, 0], seconds=time.perf_counter() - t)


# A reranker's reference, by its scorer (kinds.rerank.RERANKERS): one entry each.
_RERANK_REFERENCES = {"seqcls": _seqcls_pairs_child, "qwen3": _qwen3_card_child, "question": _question_child}


def transformers_decisions(src: str, config: dict[str, Any] | None, requests: Sequence[dict[str, Any]]) -> list[Any]:
    """Transformers' typed-decision path on each System One request ({state, questions}), as its
    decision pipeline's `_forward` runs it (`parity.decisions` says why it is the reference):
    {question key: [probability per option]}, or the error text Transformers gave."""
    torch = _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: a slow import
    from transformers.decision import DecisionConfig as HFConfig  # lazy: a slow import
    from transformers.decision import label_token_ids, prepare_inputs  # lazy: a slow import
    from transformers.decision.modeling_utils import process_scores  # lazy: a slow import
    from transformers.utils import logging as hf_logging  # lazy: a slow import

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(src)
    cfg = HFConfig(**config) if config is not None else HFConfig.from_pretrained(src)
    out: list[Any] = []
    for req in requests:
        try:
            got: dict[str, list[float]] = {}
            for inputs, questions in prepare_inputs(cfg, req, tok):
                inputs = dict(inputs)
                marks = inputs.pop("marks")
                with torch.inference_mode():
                    logits = model(**inputs, use_cache=False, logits_to_keep=marks - 1).logits[0]
                labels = [logits[i, label_token_ids(tok, tuple(q.labels))] for i, q in enumerate(questions)]
                scores = process_scores(cfg, inputs["input_ids"], marks, questions, labels)
                got |= {q.name: s.softmax(-1).tolist() for q, s in zip(questions, scores)}
            out.append(got)
        except ValueError as e:  # a label that is not one token, more options than labels, ...
            out.append(str(e))
    return out


def decisions_in_child(
    src: str | Path, config: dict[str, Any] | None, requests: Sequence[dict[str, Any]]
) -> tuple[list[Any], float]:
    """`transformers_decisions` in a child process (see `run_in_child`): (each request's answers
    or Transformers' error, seconds). `config`: `transformers.decision.DecisionConfig`'s fields
    (None: the folder's own decision.json)."""
    require_torch()
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        spec = {"src": str(src), "decisions": True, "config": config, "requests": list(requests)}
        job.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
        done = run_in_child(["-m", "mlx_slm.parity.reference", str(job), str(out)])
        if done.returncode != 0:
            raise RuntimeError(f"the Transformers decision reference failed on {src} (exit status {done.returncode})")
        got = json.loads(out.read_text(encoding="utf-8"))
        return got["answers"], float(got["seconds"])


def _child(job_path: str, out_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    if job.get("decisions"):  # typed decisions: Transformers' own decision path
        t = time.perf_counter()
        answers = transformers_decisions(job["src"], job["config"], job["requests"])
        Path(out_path).write_text(json.dumps({"answers": answers, "seconds": time.perf_counter() - t}))
        return
    if job.get("seqcls"):  # a sequence classifier's head
        _seqcls_child(job, out_path)
        return
    if job.get("rerank"):  # (query, document) relevance, each pair alone
        _rerank_child(job, out_path)
        return
    if "layers" in job:  # hidden states (learned heads)
        ref = Reference(job["src"])
        t = time.perf_counter()
        poolings, start = job.get("poolings", []), job.get("start", 0)
        hs = np.array([hidden(ref, p, job["layers"], poolings, start) for p in job["prompts"]])
        np.savez(out_path, hidden=hs, seconds=time.perf_counter() - t)
        return
    if "blocks" in job:  # several questions: each branch's full prompts with its own options
        ref = Reference(job["src"])
        t = time.perf_counter()
        got = {}
        for i, b in enumerate(job["blocks"]):
            ls = LabelSet(tuple(b["labels"]), tuple(tuple(x) for x in b["token_ids"]), b["mode"])
            got[f"scores{i}"] = np.array([ref.label_scores(p, ls)[0] for p in b["prompts"]])
        np.savez(out_path, seconds=time.perf_counter() - t, **got)
        return
    ls = LabelSet(tuple(job["labels"]), tuple(tuple(t) for t in job["token_ids"]), job["mode"])
    ref = Reference(job["src"])
    t = time.perf_counter()
    scores, logits = zip(*(ref.label_scores(p, ls) for p in job["prompts"]))
    np.savez(out_path, scores=np.array(scores), logits=np.array(logits), seconds=time.perf_counter() - t)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
