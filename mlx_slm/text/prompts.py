"""Rendering prompts with the chat template, tokenizing them, and finding the shared head.

The shared prefix is found on *token ids of whole prompts*: a BPE merge can cross the
boundary between the fixed head and the item text, so tokenizing the head alone could
give ids that no real prompt starts with. We render a few probe prompts whose texts
differ in their first character, take the common token prefix of their ids, and then
check every real prompt against it (`starts_with`); a prompt that does not start with
it simply runs without the cache.
"""

from __future__ import annotations

import difflib
import json
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2.exceptions import TemplateError

from ..ground.errors import UserError
from ..ground.notices import notice
from ..ground.textfiles import InputError, has_lone_surrogate, json_error, read_text_file
from .labels import gold_problem

DEFAULT_SYSTEM = "You classify support tickets. Answer with exactly one of: billing, technical, account."
DEFAULT_TEMPLATE = "Ticket: {text}\nCategory:"
DEFAULT_LABELS = ("billing", "technical", "account")

# Probe texts: different first characters (letter, digit, punctuation, space, newline),
# so the common prefix stops before anything the item text can merge with.
PROBES = ("a", "Z9", "1 x", "\u00e9t\u00e9", "? ok", " lead", "\nnl")


# How an over-long text is cut to fit the context (`--truncate`): keep its head, its tail, or both ends.
TRUNCATE_MODES = ("head", "tail", "middle")


class PromptError(UserError, ValueError):
    pass


# What a chat template (the model's own program) may raise on our messages: its `raise_exception`, a
# syntax error, an undefined name (jinja's `TemplateError`s), or a Python error inside an expression.
TEMPLATE_FAULTS = (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError)


@dataclass(frozen=True)
class PromptFormat:
    """How one item becomes a prompt: optional system message and a user template."""

    system: str | None = DEFAULT_SYSTEM
    template: str = DEFAULT_TEMPLATE
    # Few-shot examples, (text, label) pairs rendered as earlier chat turns. They sit
    # before the item in every prompt, so the prefix cache computes them once.
    examples: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.system is not None and not isinstance(self.system, str):
            raise PromptError(f"the system message must be a string (or None), got {type(self.system).__name__}")
        if not isinstance(self.template, str):
            raise PromptError(
                f"the template must be a string holding {{text}}, got {type(self.template).__name__}: "
                "e.g. 'Ticket: {text}\\nCategory:'"
            )
        for ph in (LABELS_PLACEHOLDER, DESCRIPTIONS_PLACEHOLDER):
            if ph in self.template:  # it would reach the model as the literal braces
                raise PromptError(
                    f"the template holds {ph}, which is filled in the system message only: move it there "
                    "(--system, or a request's 'system'; e.g. 'Answer with one of: {labels}.') and keep {text} "
                    "in the template"
                )
        if "{text}" not in self.template:
            raise PromptError(
                f"the template {self.template!r} has no {{text}} placeholder: write where the item goes, "
                "e.g. --template 'Ticket: {text}\\nCategory:'"
            )

    @property
    def pairs(self) -> bool:
        """Whether the template takes a second text (`{pair}`: a premise and hypothesis, a query
        and a document)."""
        return PAIR_PLACEHOLDER in self.template

    def user(self, text: str, pair: str | None = None) -> str:
        """The user turn of one item: `{text}` (and `{pair}`) filled in one pass, so a text that
        holds the other placeholder's braces is never filled again."""
        if not self.pairs:  # str.replace, not str.format: templates and texts may hold other braces
            return self.template.replace("{text}", text)
        return _SLOTS.sub(lambda m: text if m.group(0) == "{text}" else (pair or ""), self.template)

    def messages(self, text: str, pair: str | None = None) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for ex_text, ex_label in self.examples:
            msgs += [
                {"role": "user", "content": self.user(ex_text)},
                {"role": "assistant", "content": ex_label},
            ]
        return msgs + [{"role": "user", "content": self.user(text, pair)}]


LABELS_PLACEHOLDER = "{labels}"
DESCRIPTIONS_PLACEHOLDER = "{label_descriptions}"
PAIR_PLACEHOLDER = "{pair}"  # a second text (text_pair), for templates of pairs
_SLOTS = re.compile(r"\{text\}|\{pair\}")


def fill_labels(system: str | None, labels: Sequence[str], descriptions: Mapping[str, str] | None = None) -> str | None:
    """The system message with `{labels}` (the labels, comma-separated) and
    `{label_descriptions}` (one line a label: `- label: description`) filled in.

    Only those two exact placeholders are replaced, in one pass (other braces stay). With
    many labels, telling the model what each one means is the cheap way to better answers;
    scoring stays on the label names."""
    if system is not None and not isinstance(system, str):
        raise PromptError(f"the system message must be a string (or None), got {type(system).__name__}")
    descriptions = descriptions or {}
    if not isinstance(descriptions, Mapping):
        raise PromptError(
            f"label descriptions must be a mapping of label to description, got {type(descriptions).__name__}: "
            "e.g. {'card arrival': 'the new card has not come'}"
        )
    bad = [k for k, v in descriptions.items() if not isinstance(v, str)]
    if bad:
        raise PromptError(
            f"the description of {bad[0]!r} is {type(descriptions[bad[0]]).__name__}: descriptions are strings"
        )
    unknown = [k for k in descriptions if k not in labels]
    if unknown:
        raise PromptError(
            f"descriptions given for {unknown[:5]!r}, which are not among the labels {list(labels)[:10]!r}"
        )
    if not system:
        return system
    lines = "\n".join(f"- {lab}: {descriptions[lab]}" if descriptions.get(lab) else f"- {lab}" for lab in labels)
    fill = {LABELS_PLACEHOLDER: ", ".join(labels), DESCRIPTIONS_PLACEHOLDER: lines}
    # One pass: a label or description that holds a placeholder's text is not filled again.
    return re.sub("|".join(map(re.escape, fill)), lambda m: fill[m.group(0)], system)


# --------------------------------------------------------------------------- placeholders typed by a person
#
# `--system` and `--template` as typed on the command line are checked: a `{word}` that is
# not a placeholder (`{label}` for `{labels}`, `{txt}`) would reach the model as literal
# braces, so it is refused, naming the known ones; `{{` and `}}` write literal braces, as in
# str.format. Only the message and the template are read so: an item's text (and a few-shot
# example's) is put in as it is, braces and all. Task files and the Python API take
# strings as they are (`fill_labels`).

_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
SYSTEM_PLACEHOLDERS = ("labels", "label_descriptions")
TEMPLATE_PLACEHOLDERS = ("text", "pair")


def _fill_typed(
    text: str, values: Mapping[str, str], what: str, elsewhere: Mapping[str, str], no_literal: Sequence[str]
) -> str:
    """`text` with its placeholders filled from `values` and `{{`/`}}` made single braces, in
    one pass; a `{word}` not in `values` is a `PromptError` (`elsewhere`: placeholders that
    belong to another part, and where). `no_literal`: names whose literal `{name}`, made by
    escapes, would be filled (or refused) by a later step: refused here."""

    known = ", ".join("{" + k + "}" for k in values)

    def one(m: re.Match[str]) -> str:
        tok, name = m.group(0), m.group(1)
        if name is None:
            return tok[0]  # {{ or }}
        if name in values:
            return values[name]
        if name in elsewhere:
            literal = "" if name in no_literal else f"; write {{{tok}}} for the literal text {tok}"
            raise PromptError(
                f"{what} holds {tok}, which is filled in {elsewhere[name]} only: move it there "
                f"(here the placeholders are {known}{literal})"
            )
        close = difflib.get_close_matches(name, [*values, *elsewhere], n=1)
        hint = f" (did you mean {{{close[0]}}}?)" if close else ""
        raise PromptError(
            f"{what} holds {tok}, which is not a placeholder{hint}: the placeholders are {known}; "
            f"write {{{tok}}} for the literal text {tok} (doubled braces are single braces)"
        )

    out = _TOKEN.sub(one, text)
    # The same pass with each filled placeholder a NUL: a placeholder's name in braces left
    # there was made by the escapes, and a later fill would take it for a placeholder.
    shadow = _TOKEN.sub(lambda m: m.group(0)[0] if m.group(1) is None else "\0", text)
    for name in no_literal:
        if "{" + name + "}" in shadow:
            raise PromptError(
                f"{what} holds an escaped {{{name}}}: a literal {{{name}}} cannot be written there, as mlx-slm "
                f"fills it later; reword it (e.g. <{name}>)"
            )
    return out


def fill_system(
    system: str | None, labels: Sequence[str], descriptions: Mapping[str, str] | None = None, what: str = "--system"
) -> str | None:
    """A system message typed by a person: `fill_labels`, with every `{word}` checked (only
    `{labels}` and `{label_descriptions}` are placeholders) and `{{`/`}}` as literal braces."""
    fill_labels(None, labels, descriptions)  # the descriptions checked
    if not system:
        return system
    descriptions = descriptions or {}
    lines = "\n".join(f"- {lab}: {descriptions[lab]}" if descriptions.get(lab) else f"- {lab}" for lab in labels)
    values = {"labels": ", ".join(labels), "label_descriptions": lines}
    return _fill_typed(system, values, what, {"text": "the template (--template)"}, SYSTEM_PLACEHOLDERS)


def check_template(
    template: str, what: str = "the template", placeholders: Sequence[str] = TEMPLATE_PLACEHOLDERS
) -> str:
    """A template typed by a person: every `{word}` checked (only `{text}` is a placeholder,
    kept for each item, and `{question}` with --questions), `{{`/`}}` made literal braces."""
    elsewhere = {k: "the system message (--system)" for k in SYSTEM_PLACEHOLDERS}
    keep = {k: "{" + k + "}" for k in placeholders}
    return _fill_typed(template, keep, what, elsewhere, (*placeholders, *SYSTEM_PLACEHOLDERS))


def check_plain_system(system: str | None, what: str = "--system") -> str | None:
    """A system message typed by a person for several questions: it has no placeholders (each
    question lists its own options); `{{`/`}}` are literal braces."""
    if not system:
        return system
    elsewhere = {"text": "the template (--template)", "question": "the template (--template)"}
    return _fill_typed(system, {}, what, elsewhere, ())


def render(tokenizer: Any, fmt: PromptFormat, text: str, pair: str | None = None) -> str:
    """The prompt string the model sees, ending with the generation prompt (`pair`: the second
    text, where the template has `{pair}`)."""
    msgs = prompt_messages(tokenizer, fmt, text, pair)
    try:
        return render_messages(tokenizer, msgs)
    except TEMPLATE_FAULTS as e:  # the model's program refused our messages: say so, not a traceback
        raise PromptError(
            f"the model's chat template refused the prompt ({e}): give a system message and template it takes "
            "(--system '' drops the system turn; --template shapes the user turn)"
        ) from None


def prompt_messages(tokenizer: Any, fmt: PromptFormat, text: str, pair: str | None = None) -> list[dict[str, str]]:
    """The chat messages of one item as the model is given them: `fmt.messages`, with the system
    text folded into the first user turn when the model's chat template refuses a system role
    (`refuses_system`). Every path that renders a task's prompt (ours, and the Transformers
    reference of `parity`) takes its messages here, so both see the same prompt."""
    msgs = fmt.messages(text, pair)
    if msgs and msgs[0]["role"] == "system" and refuses_system(tokenizer):
        return fold_system(msgs)
    return msgs


def fold_system(msgs: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """The messages without their system turn, its text put before the first user turn's (a blank
    line between), as Transformers' users write a system message for a template that has none."""
    system, rest = msgs[0]["content"], [dict(m) for m in msgs[1:]]
    for m in rest:
        if m["role"] == "user":
            m["content"] = f"{system}\n\n{m['content']}"
            break
    return rest


def folds_system(tokenizer: Any, system: str | None) -> bool:
    """Whether prompts with this system text carry it in the user turn (`refuses_system`): what a
    task and a manifest record."""
    return bool(system) and refuses_system(tokenizer)


_FOLD_PROBE_SYSTEM = "You classify."
_NOTED: set[str] = set()  # the chat templates whose refusal was said


def refuses_system(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template refuses a system turn that its user turn takes
    (Mistral-v0.1's "Conversation roles must alternate user/assistant/user/assistant/..."), tried
    once per tokenizer on a probe conversation; the first time it does, a notice says the system
    text goes into the user turn. A base model without a chat template refuses nothing."""
    got = getattr(tokenizer, "_mlx_slm_refuses_system", None)
    if got is not None:
        return got
    got = False
    if getattr(tokenizer, "chat_template", None):
        system = [{"role": "system", "content": _FOLD_PROBE_SYSTEM}, {"role": "user", "content": "a"}]
        try:
            render_messages(tokenizer, system)
        except TEMPLATE_FAULTS:
            try:
                render_messages(tokenizer, fold_system(system))
                got = True
            except TEMPLATE_FAULTS:
                got = False  # it refuses the user turn too: rendering says so (`render`)
    if got and tokenizer.chat_template not in _NOTED:  # said once a template, however many tokenizers hold it
        _NOTED.add(tokenizer.chat_template)
        notice(
            "mlx-slm: note: the model's chat template refuses a system message: the system text is put at the "
            "start of the first user turn (as Transformers' users do); the task and the manifest record it"
        )
    try:
        tokenizer._mlx_slm_refuses_system = got
    except AttributeError:
        pass
    return got


def render_messages(tokenizer: Any, msgs: Sequence[Mapping[str, str]]) -> str:
    """Chat messages ({"role", "content"}) as the prompt string the model sees, ending with the
    generation prompt: the model's chat template, or (a base model without one) plain text."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(msgs), tokenize=False, add_generation_prompt=True)
    # A base model without a chat template: plain text, system first; an example's
    # label follows its prompt on the same line, as the scored label will.
    parts: list[str] = []
    for m in msgs:
        if m["role"] == "assistant" and parts:
            parts[-1] += " " + m["content"]
        else:
            parts.append(m["content"])
    return "\n\n".join(parts)


def tokenize(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of whole rendered prompts (batched; the template already holds special tokens)."""
    if not prompts:
        return []
    return [list(x) for x in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` can stand for (its longest vocabulary entry,
    bytes counted as characters: a character is at least one byte), read once per tokenizer."""
    got = getattr(tokenizer, "_mlx_slm_max_token_chars", None)
    if got is None:
        try:
            got = max((len(t) for t in tokenizer.get_vocab()), default=0) or 0
        except (AttributeError, TypeError):
            got = 0
        try:
            tokenizer._mlx_slm_max_token_chars = got
        except AttributeError:
            pass
    return got


def size_problem(tokenizer: Any, text: str, max_length: int) -> str | None:
    """Why `text` is over the context before it is tokenized, or None: every token stands for at
    most `max_token_chars` characters, so a text of more than twice context x that many
    characters has more tokens than the context holds, whatever they are (twice: a margin for a
    tokenizer that folds characters together; byte-level BPE folds none). A 20 MB line is refused here at once, not after
    tokenizing it (26 s and 3.6 GB for the default model)."""
    per = max_token_chars(tokenizer)
    if per <= 0 or len(text) <= 2 * per * max_length:
        return None
    return (
        f"the text is {len(text):,} characters, far over the model's context of {max_length} tokens (a token is "
        "at most a few characters): shorten the text, or pass --truncate head|tail|middle"
    )


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
    return common_prefix(tokenize(tokenizer, [render(tokenizer, fmt, t) for t in PROBES]))


def starts_with(ids: Sequence[int], prefix: Sequence[int]) -> bool:
    # Strictly longer: the last prompt position must be a suffix token we run.
    return len(ids) > len(prefix) and list(ids[: len(prefix)]) == list(prefix)


def read_examples(path: str, labels: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Few-shot examples from JSONL (`text` and `label` on each line); every label must be known.

    Every problem (the file cannot be read, a byte that is not UTF-8, a line that is not a
    JSON object with string fields `text` and `label`, an unknown label) is a `PromptError`
    naming the file, the line and the fix."""

    try:
        text = read_text_file(path, "--examples")
    except InputError as e:
        raise PromptError(str(e)) from None
    out = []
    for n, line in enumerate(text.split("\n"), 1):  # only \n ends a line, as in every input
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, an over-long integer, nesting too deep
            raise PromptError(f"--examples {path} line {n}: malformed JSON ({json_error(e)}): fix the line") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not isinstance(obj.get("label"), str):
            raise PromptError(
                f'--examples {path} line {n}: an example is a JSON object with string fields "text" and "label", '
                f'e.g. {{"text": "I was charged twice", "label": "{labels[0] if labels else "billing"}"}}: fix the line'
            )
        problem = example_problem(obj["text"], obj["label"], labels)
        if problem:
            raise PromptError(f"--examples {path} line {n}: {problem}")
        out.append((obj["text"], obj["label"]))
    if not out:
        raise PromptError(
            f"--examples {path} holds no examples: give JSONL lines with text and label, or drop --examples"
        )
    return tuple(out)


def check_examples(examples: Any, labels: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Few-shot examples given in Python (the classifier, the estimator): (text, label) pairs,
    each checked as `--examples` lines are (`example_problem`); a `PromptError` names the example.
    An integer label (a scikit-learn class) is its text; None is no examples."""
    if examples is None:
        return ()
    if isinstance(examples, (str, bytes, Mapping)) or not isinstance(examples, Iterable):
        raise PromptError(
            f"examples must be a list of (text, label) pairs, e.g. [('I was charged twice', 'billing')]; "
            f"got {type(examples).__name__}"
        )
    out = []
    for n, ex in enumerate(examples, 1):
        if isinstance(ex, (str, bytes, Mapping)) or not isinstance(ex, Sequence) or len(ex) != 2:
            raise PromptError(
                f"example {n} is {ex!r:.60}: give a (text, label) pair, e.g. ('I was charged twice', "
                f"{(list(labels) or ['billing'])[0]!r})"
            )
        text, label = ex
        if isinstance(label, numbers.Integral) and not isinstance(label, bool):
            label = str(label)
        if not isinstance(text, str) or not isinstance(label, str):
            bad, what = (text, "text") if not isinstance(text, str) else (label, "label")
            raise PromptError(f"example {n}: its {what} is {type(bad).__name__} {bad!r:.40}, not a string")
        problem = example_problem(text, label, labels)
        if problem:
            raise PromptError(f"example {n}: {problem}")
        out.append((text, label))
    return tuple(out)


def example_problem(text: str, label: str, labels: Sequence[str]) -> str | None:
    """Why a few-shot example cannot be used (its text is empty or not valid Unicode, its label is
    not one of the task's labels), or None if it can; shared by `--examples` and task files."""
    if not text.strip():
        return "the example's text is empty: give it some text, or drop the example"
    if has_lone_surrogate(text) or has_lone_surrogate(label):
        return "the example holds an unpaired surrogate escape (not valid Unicode): fix it"

    if gold_problem(label, labels) is not None:
        return f"label {label!r} is not one of the labels {list(labels)}: fix the example, or add the label"
    return None


# --------------------------------------------------------------------------- plain encodings
#
# A sequence classifier (a cross-encoder, an NLI model, a reward model) is fed its text the
# way Transformers' text-classification pipeline (`tokenizer(text, text_pair)`) and vLLM feed
# it: with the tokenizer's own special tokens (its post-processor's single or pair
# template), no chat template. Qwen2's and SmolLM2's tokenizers (transformers 5) add nothing
# to a text and join a pair by concatenating the two encodings, each tokenized on its own.


def encode_texts(tokenizer: Any, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[list[int]]:
    """Token ids of each text, or each (text, pair), exactly as `tokenizer(text, pair)` gives
    them one item at a time, as the pipeline calls it (batched: a fast tokenizer encodes a
    batch as it encodes each item alone). An empty pair is no pair there (`if text_pair`)."""
    if pairs is not None and len(pairs) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
    out: list[list[int]] = [[] for _ in texts]
    paired = [i for i in range(len(texts)) if pairs is not None and pairs[i]]
    single = [i for i in range(len(texts)) if not (pairs is not None and pairs[i])]
    if paired:
        got = tokenizer([texts[i] for i in paired], [pairs[i] for i in paired])["input_ids"]  # type: ignore[index]
        for i, ids in zip(paired, got):
            out[i] = list(ids)
    if single:
        for i, ids in zip(single, tokenizer([texts[i] for i in single])["input_ids"]):
            out[i] = list(ids)
    return out


# --------------------------------------------------------------------------- Qwen3-Reranker
#
# The Qwen3-Reranker model card's prompt (a causal LM asked yes or no): the system line, the
# user turn `<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}`, and the
# assistant turn opened with an empty think block; the relevance is P(yes), the softmax over
# the `no` and `yes` logits at the last position. Split as vLLM's and OpenVINO's examples
# split it: the query's part (every document of a query shares it: the prefix-cache key)
# ends with the newline after the query, the document's part starts at `<Document>: `.

QWEN3_RERANKER_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that "
    'the answer can only be "yes" or "no".'
)
QWEN3_RERANKER_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_RERANKER_ANSWERS = ("no", "yes")  # the card's tokens: P(yes) = softmax over (no, yes) logits
_QWEN3_PREFIX = f"<|im_start|>system\n{QWEN3_RERANKER_SYSTEM}<|im_end|>\n<|im_start|>user\n"
_QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def qwen3_reranker_query(query: str, instruction: str | None = None) -> str:
    """The prompt up to the document: system turn, instruction and query (None: the card's
    web-search instruction)."""
    if instruction is None:
        instruction = QWEN3_RERANKER_INSTRUCTION
    return f"{_QWEN3_PREFIX}<Instruct>: {instruction}\n<Query>: {query}\n"


def qwen3_reranker_document(document: str) -> str:
    """The prompt from the document on: the document and the opened assistant turn."""
    return f"<Document>: {document}{_QWEN3_SUFFIX}"


def qwen3_reranker_ids(
    tokenizer: Any, query: str, documents: Sequence[str], instruction: str | None = None
) -> tuple[list[int], list[list[int]]]:
    """(the query's ids, each document's ids after them): `head + rest[i]` is exactly the
    card's encoding of document i's prompt (the system prefix and the suffix encoded alone,
    the user text between them as one piece). `head` is the longest run of ids every one of
    them starts with, so a merge across the split can never make a cached head wrong."""
    if instruction is None:
        instruction = QWEN3_RERANKER_INSTRUCTION
    head_text = qwen3_reranker_query(query, instruction)[len(_QWEN3_PREFIX) :]
    prefix, suffix = tokenize(tokenizer, [_QWEN3_PREFIX, _QWEN3_SUFFIX])
    bodies = [head_text, *(head_text + f"<Document>: {d}" for d in documents)]
    query_ids, *encoded = (list(x) for x in tokenizer(bodies)["input_ids"])
    full = [prefix + body + suffix for body in encoded]
    head = common_prefix([prefix + query_ids, *full])
    return head, [f[len(head) :] for f in full]
