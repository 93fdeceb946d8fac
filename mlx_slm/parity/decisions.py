"""`parity --decisions`: our typed decisions against Transformers' own decision path.

The reference is `transformers.decision` exactly as `transformers serve` and the decision
pipeline run it, in a child process (`reference.run_in_child`: no OpenBLAS preload) and in
float32: `prepare_inputs` (the generic DECISION_PROMPT as the one user message of the
model's chat template, the generation prompt, control tokens in user text as text), the
model's forward with `logits_to_keep` at each prompt's mark, the label tokens' logits
(`label_token_ids`), the decision config's temperature per question type
(`process_scores`), and the softmax. One prompt per question, one request at a time, no
batch, no padding, no cache: the slow, obvious path.

Ours is a `Decider` (the state once, each question a branch, several states a batch). The
report gives, per question, the largest difference of any option's probability, whether
the top option agrees, and the questions Transformers cannot ask (more options than its
26 letters: ours then scores the options' own names; options a System One object cannot
hold apart, an OpenAI choice of `"true"` and `true`), which are left out and named.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.decision_plan import DecisionPlan
from ..text.decisions.methods import Methods
from ..text.decisions.questions import DecisionQuestion, DecisionRequest, option_text
from ..text.heads import head_input
from .reference import decisions_in_child, hidden_in_child

# Largest |delta p| allowed, by compute dtype: the goal (1e-4 in float32; 2e-3 with float16 weights).
TOLERANCE = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 2e-2}


def as_systemone(q: DecisionQuestion) -> tuple[dict[str, Any] | None, str | None]:
    """`q` as System One's question object, which is what Transformers' path reads, or (None, why not)."""
    if q.type == "noul":
        return {
            "type": "noul",
            "instructions": q.instructions,
            "criteria": {str(o): d for o, d in zip(q.options, q.descriptions)},
        }, None
    if q.type == "score":
        return {"type": "score", "instructions": q.instructions, "criteria": list(q.descriptions)}, None
    names = [option_text(o) for o in q.options]
    if len(set(names)) != len(names):
        return None, "its options are distinct only by type (a string and a boolean): System One cannot hold them"
    if len(names) > 26:
        return None, f"{len(names)} options: Transformers reads at most 26 (its letters); ours scores their names"
    return {"type": "choice", "instructions": q.instructions, "criteria": dict(zip(names, q.descriptions))}, None


# ---------------------------------------------------------------------------- the report
def run_decision_parity(
    plan: DecisionPlan,
    states: Sequence[Any],
    *,
    reference: str | None = None,
    progress: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Every state's raw answers, ours (the plan's `Decider`: the letters, each question once, as
    Transformers asks them) against Transformers' (on `reference`: by default the model's own
    folder when it is a Hugging Face one, else the converted weights we run, so both hold the
    same values). The report is JSON-safe; `ok` is whether every compared probability is within
    `TOLERANCE[dtype]` and every top option agrees."""
    engine = plan.engine()
    plan = plan.loaded(engine)
    trained = plan.methods
    plan = replace(plan, methods=Methods())  # the raw letters: Transformers' path
    model, dtype = plan.model.name, engine.compute_dtype
    questions, config = plan.questions, plan.config
    src = reference or (model if (Path(model).expanduser() / "config.json").is_file() else str(engine.path))
    asked = {q.key: as_systemone(q) for q in questions}
    compared = [q for q in questions if asked[q.key][0] is not None]
    skipped = {q.key: asked[q.key][1] for q in questions if asked[q.key][0] is None}
    progress(f"ours: {len(states)} state(s) x {len(questions)} question(s) on {model} ({dtype})")
    t = time.perf_counter()
    ours = plan.decider(engine, state_cache=0).decide([DecisionRequest(s, tuple(questions)) for s in states])
    our_s = time.perf_counter() - t
    progress(f"Transformers' decision path on {src} (float32, one prompt per question, in a child process)")
    reqs = [{"state": s, "questions": {q.key: asked[q.key][0] for q in compared}} for s in states]
    theirs, ref_s = decisions_in_child(src, config.to_record(), reqs) if compared else ([{}] * len(states), 0.0)
    report = compare(questions, compared, skipped, ours, theirs, Sides(model, src, dtype, our_s, ref_s))
    heads = [(q, m.head) for q in questions for m in [trained.for_question(q)[0]] if m.head is not None]
    tuned = {q.key: m.tuned for q in questions for m in [trained.for_question(q)[0]] if m.tuned is not None}
    report["tuned"] = {k: f"a classifier of its own: mlx-slm parity --task {path}" for k, path in tuned.items()}
    # a question asked under a trained one's id but worded otherwise: its raw answers are compared, its method
    # is not (the task's method would not answer it): said, never left out unseen
    changed = {q.key: note for q in questions for m, note in [trained.for_question(q)] if note and "trained" in note}
    report["tuned"].update(changed)
    if heads:
        report = _with_heads(report, replace(plan, methods=trained), engine, states, heads, src, progress)
    return report


def _with_heads(
    report: dict[str, Any], plan: DecisionPlan, engine: Any, states: Sequence[Any], heads: list, src: str, progress: Any
) -> dict[str, Any]:
    """A task's trained questions checked too: our answers (the head on the branch's hidden states,
    in the pass that answers every question) against the head applied to Transformers'
    `hidden_states` at the end of each question's whole prompt, one prompt at a time."""
    decider = plan.decider(engine, state_cache=0)
    ours = decider.decide([DecisionRequest(s, plan.questions) for s in states])
    index = {q.key: i for i, q in enumerate(plan.questions)}
    out = dict(report)
    for q, head in heads:
        prompts = [decider.planner.prompts(s, [q], ["letters"])[0] for s in states]
        progress(f"trained question {q.key!r}: Transformers' hidden states at layers {list(head.layers)}")
        hs, _ = hidden_in_child(src, prompts, sorted(set(head.layers)))
        want = np.exp(head.log_probs(head_input({"last": hs}, sorted(set(head.layers)), head)))
        got = np.stack([np.asarray(r.probabilities[index[q.key]], dtype=np.float64) for r in ours])
        d = float(np.max(np.abs(got - want)))
        dis = [i for i in range(len(states)) if int(np.argmax(got[i])) != int(np.argmax(want[i]))]
        out["per_question"] = {
            **out["per_question"],
            f"{q.key} (trained)": {"type": q.type, "options": len(q.options), "max_abs_dprob": d, "disagreements": dis},
        }
        out["compared"] = [*out["compared"], f"{q.key} (trained)"]
        out["max_abs_dprob"] = max(out["max_abs_dprob"], d)
        out["top_option_agrees"] = out["top_option_agrees"] and not dis
    out["ok"] = out["max_abs_dprob"] <= out["tolerance"] and out["top_option_agrees"] and not out["reference_errors"]
    return out


@dataclass(frozen=True)
class Sides:
    """What the report says of the two runs compared: our `model` at `dtype`, Transformers on
    `reference`, and the seconds each took."""

    model: str
    reference: str
    dtype: str
    ours_seconds: float
    reference_seconds: float


def compare(
    questions: Sequence[DecisionQuestion],
    compared: Sequence[DecisionQuestion],
    skipped: dict[str, Any],
    ours: Sequence[Any],
    theirs: Sequence[Any],
    sides: Sides,
) -> dict[str, Any]:
    """The figures of `run_decision_parity` from both sides' probabilities."""
    index = {q.key: i for i, q in enumerate(questions)}
    per: dict[str, dict[str, Any]] = {
        q.key: {"type": q.type, "options": len(q.options), "max_abs_dprob": 0.0, "disagreements": []} for q in compared
    }
    errors: list[str] = []
    for i, (mine, ref) in enumerate(zip(ours, theirs)):
        if isinstance(ref, str):
            errors.append(f"state {i}: Transformers refused it: {ref}")
            continue
        for q in compared:
            a = np.asarray(mine.probabilities[index[q.key]], dtype=np.float64)
            b = np.asarray(ref[q.key], dtype=np.float64)
            d = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")
            r = per[q.key]
            r["max_abs_dprob"] = max(r["max_abs_dprob"], d)
            if a.shape != b.shape or int(np.argmax(a)) != int(np.argmax(b)):
                r["disagreements"].append(i)
    tol = TOLERANCE.get(sides.dtype, TOLERANCE["float32"])
    worst = max((r["max_abs_dprob"] for r in per.values()), default=0.0)
    agree = not any(r["disagreements"] for r in per.values())
    return {
        "model": sides.model,
        "reference": sides.reference,
        "dtype": sides.dtype,
        "states": len(ours),
        "questions": len(questions),
        "compared": [q.key for q in compared],
        "skipped": skipped,
        "per_question": per,
        "max_abs_dprob": worst,
        "tolerance": tol,
        "top_option_agrees": agree,
        "reference_errors": errors,
        "ours_seconds": sides.ours_seconds,
        "reference_seconds": sides.reference_seconds,
        "ok": bool(compared) and worst <= tol and agree and not errors,
    }


def format_decision_report(r: dict[str, Any]) -> str:
    """The report in a few lines: the largest difference, per question, what was left out."""
    lines = [
        f"decisions: {r['states']} state(s) x {r['questions']} question(s); ours {r['model']} ({r['dtype']}) "
        f"vs Transformers' decision path on {r['reference']} (float32)",
        f"largest |delta p| {r['max_abs_dprob']:.3g} (tolerance {r['tolerance']:g}); top option "
        + ("agrees everywhere" if r["top_option_agrees"] else "DISAGREES somewhere")
        + f"; ours {r['ours_seconds']:.2f} s, Transformers {r['reference_seconds']:.2f} s",
        "",
        f"{'question':<24} {'type':<7} {'options':>7} {'max |dp|':>10}  disagreements",
    ]
    for key, q in r["per_question"].items():
        dis = ", ".join(map(str, q["disagreements"][:8])) or "-"
        lines.append(f"{key[:24]:<24} {q['type']:<7} {q['options']:>7} {q['max_abs_dprob']:>10.3g}  {dis}")
    for key, why in {**r["skipped"], **{f"{k} (trained)": why for k, why in r.get("tuned", {}).items()}}.items():
        lines.append(f"{key[:24]:<24} not compared: {why}")
    lines += [f"error: {e}" for e in r["reference_errors"][:5]]
    lines.append(
        "" if r["ok"] else "FAIL: " + ("nothing compared" if not r["compared"] else "past tolerance or a disagreement")
    )
    return "\n".join(lines).rstrip() + "\n"
