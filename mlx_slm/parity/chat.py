"""`mlx-slm parity --chat`: the chat-completion route's answers against their references.

Every text becomes a conversation (the system message, then the template filled with the text
as the user's turn) and is answered as `/v1/chat/completions` answers it (`kinds/chat.py`,
batched, each conversation's head cached), then checked three ways:

* prompt: our token ids are Transformers' own chat-template encoding
  (`tokenizer.apply_chat_template(messages, add_generation_prompt=True)`);
* next token (`max_tokens: 1`): the greedy token and the top-20 log-probabilities over the
  whole vocabulary against Transformers' float32 logits on the same weight values (a
  quantized model's dequantized), each prompt alone, log-softmax in float64;
* choice (`guided_choice` of the labels): the answer and probabilities against `classify`'s
  for the same prompt and labels (the same engine), and against Transformers' label scores.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np

from ..classifier.classifier import Classifier
from ..classifier.pipeline import DEFAULT_BATCH_SIZE
from ..ground.errors import UserError
from ..kinds import chat_spec
from ..text.chat import Conversation
from ..text.labels import log_softmax, softmax
from ..text.prompts import PromptFormat
from .labels import TOLERANCE, Ours, _label_list, _same_values
from .reference import score_in_child
from .seqcls import SEQCLS_TOLERANCE, _loaded

TOP = 20  # the top log-probabilities compared (OpenAI's most)
# Max |d prob| of the choices, by compute dtype, against classify (the same sums, batched and split
# otherwise: 2.7e-06 measured on qwen2.5-coder-0.5b in float32) and against Transformers.
PROB_TOLERANCE = SEQCLS_TOLERANCE


def conversations(texts: Sequence[str], fmt: PromptFormat) -> list[Conversation]:
    """Each text as the chat route gets it: the system message, and the template filled as the
    user's turn (the messages `classify` renders for the same prompt format)."""
    return [Conversation(tuple((m["role"], m["content"]) for m in fmt.messages(t))) for t in texts]


def run_chat_parity(
    model: str,
    texts: Sequence[str],
    labels: Sequence[str],
    system: str | None,
    template: str,
    ours: Ours = Ours(),
) -> dict[str, Any]:
    from transformers import AutoTokenizer  # lazy: a slow import

    ours = replace(ours, batch_size=DEFAULT_BATCH_SIZE)  # the chat route's batches, whatever `ours` says
    progress = ours.progress
    clf, path, q = _loaded(model, ours, None, labels=labels, system=system, template=template)
    compute = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[clf.model.compute_dtype]
    convs = conversations(texts, clf.format)
    next_clf = Classifier(clf.engine, system=None, template="{text}", kind=chat_spec(()))
    choice_clf = Classifier(clf.engine, system=None, template="{text}", kind=chat_spec(tuple(clf.labels)))
    t0 = time.perf_counter()
    nexts, choices, classified = (_run(c, x) for c, x in ((next_clf, convs), (choice_clf, convs), (clf, texts)))
    t_ours = time.perf_counter() - t0
    ids = [it.ids for it in next_clf.prepare(convs)]
    tok = AutoTokenizer.from_pretrained(str(path))
    theirs_ids = [_template_ids(tok, c) for c in convs]
    same_ids = sum(a == b == it.ids for a, b, it in zip(ids, theirs_ids, clf.prepare(texts)))
    with tempfile.TemporaryDirectory() as tmp:
        progress("reference: Transformers float32, one prompt at a time")
        scores, logits, t_ref = score_in_child(_same_values(path, q is not None, tmp, progress), ids, clf.labelset)
    tol, ptol = TOLERANCE[compute], PROB_TOLERANCE[compute]
    a = _next_token(nexts, logits)
    b = _choices(choices, classified, scores, list(clf.labels))
    return {
        "model": str(path),
        "n": len(texts),
        "labels": list(clf.labels),
        "scoring": choice_clf.mode,
        "compute_dtype": compute,
        "tolerance": tol,
        "tolerance_prob": ptol,
        "prompt_ids_equal": same_ids,
        "next_token": a,
        "choice": b,
        "ok": same_ids == len(texts)
        and a["greedy_agree"] == len(texts)
        and a["max_abs_dlogprob"] <= tol
        and b["agree_classify"] == b["agree_transformers"] == len(texts)
        and b["max_abs_dprob_classify"] <= ptol
        and b["max_abs_dprob_transformers"] <= ptol,
        "seconds": {"ours": round(t_ours, 2), "reference": round(t_ref, 2)},
    }


def _run(clf: Any, items: Sequence[Any]) -> list[Any]:
    preds = list(clf.run(items, window=max(1, len(items))))
    bad = [p for p in preds if not p.ok]
    if bad:
        raise UserError(f"item {bad[0].index}: {bad[0].error}")
    return preds


def _template_ids(tok: Any, conv: Conversation) -> list[int]:
    got = tok.apply_chat_template(conv.messages(), add_generation_prompt=True, tokenize=True)
    return list(got["input_ids"] if hasattr(got, "keys") else got)


def _next_token(ours: Sequence[Any], logits: np.ndarray) -> dict[str, Any]:
    """Greedy agreement, max |d log-probability| over our top 20, and how many top-20 sets are equal."""
    agree = same_top = 0
    worst = 0.0
    for p, row in zip(ours, logits):
        lp = log_softmax(row)
        theirs = np.argsort(-lp, kind="stable")[:TOP]
        mine = [t[0] for t in p.tokens[:TOP]]
        agree += mine[0] == int(theirs[0])
        same_top += set(mine) == {int(x) for x in theirs}
        worst = max(worst, max(abs(t[2] - float(lp[t[0]])) for t in p.tokens[:TOP]))
    return {"greedy_agree": agree, "top20_sets_equal": same_top, "max_abs_dlogprob": worst}


def _choices(chat: Sequence[Any], classified: Sequence[Any], scores: np.ndarray, labels: list[str]) -> dict[str, Any]:
    """The chat route's choices against classify's (the same engine) and Transformers' label scores."""
    mine = np.array([[p.probs[lab] for lab in labels] for p in chat])
    clf = np.array([[p.probs[lab] for lab in labels] for p in classified])
    ref = softmax(scores)
    return {
        "agree_classify": sum(a.label == b.label for a, b in zip(chat, classified)),
        "agree_transformers": sum(p.label == labels[int(np.argmax(s))] for p, s in zip(chat, scores)),
        "max_abs_dprob_classify": float(np.abs(mine - clf).max()),
        "max_abs_dprob_transformers": float(np.abs(mine - ref).max()),
    }


def format_chat_report(r: dict[str, Any]) -> str:
    a, b, n = r["next_token"], r["choice"], r["n"]
    return "\n".join(
        [
            f"model      {r['model']}",
            f"prompts {n} conversations rendered by the model's chat template, compute {r['compute_dtype']}",
            "",
            f"prompt ids equal to Transformers' apply_chat_template (and classify's)  {r['prompt_ids_equal']}/{n}",
            "next token (max_tokens 1) vs Transformers float32, each prompt alone:",
            f"    greedy token         {a['greedy_agree']}/{n}",
            f"    max |d logprob|      {a['max_abs_dlogprob']:.3g} over our top {TOP}   (tolerance {r['tolerance']:g})",
            f"    top-{TOP} sets equal    {a['top20_sets_equal']}/{n}",
            f"choice (guided_choice {_label_list(r['labels'])}, {r['scoring']} scoring):",
            f"    as classify          {b['agree_classify']}/{n}, max |d prob| {b['max_abs_dprob_classify']:.3g}"
            f"   (tolerance {r['tolerance_prob']:g})",
            f"    as Transformers      {b['agree_transformers']}/{n}, max |d prob| "
            f"{b['max_abs_dprob_transformers']:.3g}   (tolerance {r['tolerance_prob']:g})",
            f"-> {'PASS' if r['ok'] else 'FAIL'}",
            f"time: ours {r['seconds']['ours']} s, reference {r['seconds']['reference']} s",
        ]
    )
