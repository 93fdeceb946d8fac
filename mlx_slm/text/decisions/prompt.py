"""A decision question's prompt text: Transformers' generic DECISION_PROMPT, exactly (the default,
"letters" style), and the opt-in "names" style that asks for an option's own name.

DECISION_PROMPT: the state, a blank line, the question's instructions, its options as labelled
lines (`A. name: description`, or `Yes: ...` for a noul), and the answer line ("Answer with the
letter of the option that fits best (A to C) only."), as the ONE user message of the model's
chat template. The labels' logits at the answer position are the answer (`prompt_tokens`).

The "names" style lists the options by name (`- name: description`) and asks for the name: the
options' own words carry more of what a small model knows than arbitrary letters do (classify
scores label words the same way); each name is scored whole after the prompt.

The "prompt" style asks the names style's question text as the SYSTEM message and the state alone
as the user's (`classify`'s own prompt shape, and the prompt a question's trained classifier
reads: `methods.tuned_prompt`): the question is the cached head every state continues, so many
options cost little, and the raw answers were far more right than the letters' on the seed's
tickets (0.937 against 0.667 on 540 of them, default model); each question is its own pass over the state."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .questions import LETTERS, YES_NO, DecisionQuestion, text

STYLES = ("letters", "names", "prompt")


def question_text(q: DecisionQuestion) -> str:
    """DECISION_PROMPT after the state: the instructions, the labelled options and the answer line."""
    labels = list(q.labels)
    lines = [text(q.instructions)]
    for option, label, description in zip(q.option_names(), labels, q.descriptions):
        answer = text(description)
        if q.type == "noul":
            answer = answer or (option if labels != list(YES_NO) else "")
            if answer:
                lines.append(f"{label}: {answer}")
        else:
            if q.type == "choice":
                answer = f"{option}: {answer}" if answer else option
            lines.append(f"{label}. {answer}")
    out = "\n".join(x for x in lines if x) + "\n"
    if q.type == "noul":
        return out + f"Answer {labels[0]} or {labels[1]} only."
    answer_word = "letter" if labels == list(LETTERS[: len(labels)]) else "label"
    what = "option" if q.type == "choice" else "level"
    return out + f"Answer with the {answer_word} of the {what} that fits best ({labels[0]} to {labels[-1]}) only."


def names(q: DecisionQuestion) -> tuple[str, ...] | None:
    """The names the "names" style scores for `q`: a choice's option names (`answer_names`), a
    score's level labels (OpenAI's) or descriptions (System One's); None where the style does not
    apply (a noul, read as Yes/No either way; levels whose texts are not distinct or empty)."""
    if q.type == "choice":
        return q.answer_names()
    return q.level_names()


def styled(q: DecisionQuestion, style: str) -> DecisionQuestion:
    """`q` as `style` asks it: the same question, its labels the names it scores ("names"), or as
    given ("letters", or a question the names style does not apply to, see `names`)."""
    got = names(q) if style in ("names", "prompt") else None
    return q if got is None else replace(q, labels=got)


def names_text(q: DecisionQuestion) -> str:
    """The "names" style after the state (`q` from `styled`): the instructions, each option by its
    name (a choice's with its description), and an answer line asking for one of the names."""
    if names(q) is None or tuple(q.labels) != names(q):
        return question_text(q)
    lines = [text(q.instructions)]
    for label, description in zip(q.labels, q.descriptions):
        extra = text(description) if q.type == "choice" else ""
        lines.append(f"- {label}: {extra}" if extra else f"- {label}")
    listed = ", ".join(q.labels[:-1]) + f" or {q.labels[-1]}"
    return "\n".join(x for x in lines if x) + f"\nAnswer with exactly one of: {listed}."


def render_user_message(state: Any, q: DecisionQuestion, style: str = "letters") -> str:
    """The user message for `state` and `q`: exactly DECISION_PROMPT's text (what Transformers
    sends) in the "letters" style, or the "names" style's."""
    return text(state) + "\n\n" + (names_text(q) if style == "names" else question_text(q))
