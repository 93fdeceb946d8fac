"""Rendering prompts with the chat template, tokenizing them, and finding the shared head.

The shared prefix is found on *token ids of whole prompts*: a BPE merge can cross the
boundary between the fixed head and the item text, so tokenizing the head alone could
give ids that no real prompt starts with. We render a few probe prompts whose texts
differ in their first character, take the common token prefix of their ids, and then
check every real prompt against it (`starts_with`); a prompt that does not start with
it simply runs without the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

DEFAULT_SYSTEM = "You classify support tickets. Answer with exactly one of: billing, technical, account."
DEFAULT_TEMPLATE = "Ticket: {text}\nCategory:"
DEFAULT_LABELS = ("billing", "technical", "account")

# Probe texts: different first characters (letter, digit, punctuation, space, newline),
# so the common prefix stops before anything the item text can merge with.
_PROBES = ("a", "Z9", "1 x", "\u00e9t\u00e9", "? ok", " lead", "\nnl")


class PromptError(ValueError):
    pass


@dataclass(frozen=True)
class PromptFormat:
    """How one item becomes a prompt: optional system message and a user template."""

    system: str | None = DEFAULT_SYSTEM
    template: str = DEFAULT_TEMPLATE

    def __post_init__(self) -> None:
        if "{text}" not in self.template:
            raise PromptError(
                f"the template {self.template!r} has no {{text}} placeholder: write where the item goes, "
                "e.g. --template 'Ticket: {text}\\nCategory:'"
            )

    def messages(self, text: str) -> list[dict[str, str]]:
        # str.replace, not str.format: templates and texts may hold other braces.
        user = self.template.replace("{text}", text)
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": user}]


def render(tokenizer: Any, fmt: PromptFormat, text: str) -> str:
    """The prompt string the model sees, ending with the generation prompt."""
    msgs = fmt.messages(text)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    # A base model without a chat template: plain text, system first.
    return "\n\n".join(m["content"] for m in msgs)


def tokenize(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of whole rendered prompts (batched; the template already holds special tokens)."""
    if not prompts:
        return []
    return [list(x) for x in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]


def common_prefix(seqs: Sequence[Sequence[int]]) -> list[int]:
    if not seqs:
        return []
    first = seqs[0]
    n = min(len(s) for s in seqs)
    i = 0
    while i < n and all(s[i] == first[i] for s in seqs):
        i += 1
    return list(first[:i])


def shared_prefix(tokenizer: Any, fmt: PromptFormat) -> list[int]:
    """Token ids every prompt of this format starts with (found on whole probe prompts)."""
    return common_prefix(tokenize(tokenizer, [render(tokenizer, fmt, t) for t in _PROBES]))


def starts_with(ids: Sequence[int], prefix: Sequence[int]) -> bool:
    # Strictly longer: the last prompt position must be a suffix token we run.
    return len(ids) > len(prefix) and list(ids[: len(prefix)]) == list(prefix)
