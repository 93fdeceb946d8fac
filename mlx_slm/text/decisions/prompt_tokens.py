"""A decision question's prompt as token ids, exactly as `transformers.decision.prepare_inputs`
tokenizes it, and the labels the model reads.

Transformers renders DECISION_PROMPT's text as the ONE user message of the model's chat
template (`add_generation_prompt=True`, `enable_thinking=False`, no system message) with
`sanitize_control_tokens=True`: a control token written in the state or the question (e.g.
"<|im_end|>", or the decision sentinels "<|mark|>" and "<|split|>" it adds to its tokenizer)
is encoded as text, and the text on either side of it is encoded apart (so no BPE merge
crosses it). `prompt_ids` does the same on our tokenizer, without adding the sentinels to it:
they are no token of ours, so they are text anyway, and only where the text is cut matters.

Labels: A, B, ... and Yes/No are read as Transformers reads them (`label_token_ids`: each label
tokenized alone, one token each, the first-token logits); labels that are not one token each
(an option's own name, beyond the 26 letters) are scored whole after the prompt (the label trie).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..labels import LabelError, LabelSet, build_labelset
from ..prompts import tokenize
from .errors import DecisionError
from .questions import option_text

MARK, SPLIT = "<|mark|>", "<|split|>"  # Transformers' decision sentinels (added to its tokenizer as special tokens)
# The private-use characters Transformers wraps a user's control tokens in (`mark_control_tokens`).
START, END = "\U000f0000", "\U000f0001"


def drop_sentinels(s: str) -> str:
    """`s` without Transformers' decision sentinels: what it does to user text when control
    tokens are not sanitized (`sanitize_control_tokens: false`), here and in a model's own template."""
    return s.replace(MARK, "").replace(SPLIT, "")


@lru_cache(maxsize=16)
def _template_literals(template: str) -> str:
    """The literal strings of a chat template (its text and string constants), joined by NULs:
    an added token found there is a control token (Transformers' `_get_template_literal_text`)."""

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    try:
        ast = env.parse(template)
    except jinja2.TemplateError:  # a tag of Transformers' own ({% generation %}): the raw text
        return template
    found = {n.data for n in ast.find_all(jinja2.nodes.TemplateData)}
    found |= {n.value for n in ast.find_all(jinja2.nodes.Const) if isinstance(n.value, str)}
    return "\0".join(found)


def control_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokens a user's text may not write (Transformers' `_get_control_tokens`): the special
    added tokens, the added ones the chat template writes (or `chat_control_tokens`), and the
    decision sentinels."""
    got = getattr(tokenizer, "_mlx_slm_control_tokens", None)
    if got is not None:
        return got
    added = list(getattr(tokenizer, "added_tokens_decoder", {}).values())
    listed = getattr(tokenizer, "chat_control_tokens", None)
    if listed is not None:
        keep = set(listed)
        out = [t.content for t in added if t.special or t.content in keep]
    else:
        literal = _template_literals(getattr(tokenizer, "chat_template", None) or "")
        out = [t.content for t in added if t.special or (t.content in literal and not t.content.isspace())]
    got = tuple(dict.fromkeys([*out, MARK, SPLIT]))
    try:
        tokenizer._mlx_slm_control_tokens = got
    except AttributeError:
        pass
    return got


def _patterns(tokenizer: Any) -> tuple[re.Pattern, re.Pattern]:
    """A regex of the control tokens (longest first) and one of a marked token or a lone marker
    (over every added token, as Transformers' `encode_marked_chat` splits)."""
    got = getattr(tokenizer, "_mlx_slm_control_patterns", None)
    if got is not None:
        return got
    ctl = sorted(control_tokens(tokenizer), key=len, reverse=True)
    ctl_re = re.compile("|".join(map(re.escape, ctl)) or "(?!)")
    added = sorted({*getattr(tokenizer, "added_tokens_encoder", {}), MARK, SPLIT}, key=len, reverse=True)
    any_re = "|".join(map(re.escape, added))
    markers = re.compile(f"{START}({any_re}){END}|[{START}{END}]")
    got = (ctl_re, markers)
    try:
        tokenizer._mlx_slm_control_patterns = got
    except AttributeError:
        pass
    return got


def render_chat(tokenizer: Any, user: str) -> str:
    """The user message in the model's chat template, no system message, ending with the
    generation prompt (thinking off); plain text for a model without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return user
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )


def _encode_piece(tokenizer: Any, piece: str, as_text: bool, newline: list[int]) -> list[int]:
    """A piece from the middle of a chat, encoded after a newline that is then dropped (so a
    SentencePiece tokenizer adds no prefix space), as Transformers' `_encode_chat_piece`."""
    kw = {"add_special_tokens": False, "split_special_tokens": True} if as_text else {"add_special_tokens": False}
    ids = list(tokenizer.encode("\n" + piece, **kw))
    if ids[: len(newline)] == newline:
        return ids[len(newline) :]
    return list(tokenizer.encode(piece, **kw))


def prompt_ids(tokenizer: Any, users: Sequence[str], sanitize: bool = True) -> list[list[int]]:
    """Token ids of each user message's full prompt, as Transformers' decision path encodes it.
    A message without control tokens is encoded whole (batched); one with some, piece by piece."""
    out: list[list[int] | None] = [None] * len(users)
    plain = [i for i, u in enumerate(users) if not sanitize or not has_controls(tokenizer, u)]
    for i, ids in zip(plain, tokenize(tokenizer, [render_chat(tokenizer, users[i]) for i in plain])):
        out[i] = ids
    for i, u in enumerate(users):
        if out[i] is None:
            out[i] = encode_marked(tokenizer, render_chat(tokenizer, mark_controls(tokenizer, u)))
    return out  # type: ignore[return-value]


def has_controls(tokenizer: Any, s: str) -> bool:
    """Whether `s` holds a control token of `tokenizer` (or one of the markers `mark_controls` writes)."""
    ctl_re, _ = _patterns(tokenizer)
    return bool(ctl_re.search(s)) or START in s or END in s


def mark_controls(tokenizer: Any, s: str) -> str:
    """User text `s` with each control token wrapped in Transformers' private-use markers (stray
    markers dropped): once rendered into the chat, `encode_marked` reads those tokens as text."""
    ctl_re, _ = _patterns(tokenizer)
    return ctl_re.sub(lambda m: f"{START}{m.group(0)}{END}", s.replace(START, "").replace(END, ""))


def encode_marked(tokenizer: Any, rendered: str) -> list[int]:
    """A rendered chat whose user text was marked (`mark_controls`) as ids: the template's own control
    tokens as control tokens, the marked ones as text, each piece encoded apart (so no BPE merge
    crosses a control token), as Transformers' `encode_marked_chat`."""
    _, markers = _patterns(tokenizer)
    pieces = markers.split(rendered)
    newline = list(tokenizer.encode("\n", add_special_tokens=False))
    ids = list(tokenizer.encode(pieces[0], add_special_tokens=False))
    for k, piece in enumerate(pieces[1:], start=1):
        if piece:
            got = _encode_piece(tokenizer, piece, k % 2 == 1, newline)
            if k % 2 == 1 and tokenizer.convert_tokens_to_ids(piece) in got:
                raise DecisionError(("body",), f"{piece!r} cannot be written as text by this model's tokenizer")
            ids += got
    return ids


def label_set(tokenizer: Any, labels: Sequence[str], probe: str) -> LabelSet:
    """How a question's labels are read: one token each, as Transformers' `label_token_ids`
    finds them (each label tokenized alone), by their first-token logits; else each label whole
    after the prompt (`probe`: a rendered prompt), its first token and its later tokens' trie."""
    ids = tokenizer(list(labels), add_special_tokens=False)["input_ids"]
    unk = getattr(tokenizer, "unk_token_id", None)
    single = [t[0] for t in ids if len(t) == 1 and t[0] != unk]
    if len(single) == len(labels) and len(set(single)) == len(single):
        return LabelSet(tuple(labels), tuple((int(t),) for t in single), "first-token")
    try:
        ls = build_labelset(tokenizer, list(labels), probe, "auto")
    except LabelError as e:
        raise DecisionError(("body", "questions"), f"the options cannot be read as labels: {e}") from None
    return labels_as_text(tokenizer, ls)


def labels_as_text(tokenizer: Any, ls: LabelSet) -> LabelSet:
    """`ls` with each label holding a control token read as text (as it is written in the prompt),
    scored as a sequence; `ls` itself when none does."""
    ctl_re, _ = _patterns(tokenizer)
    if not any(ctl_re.search(lab) for lab in ls.labels):
        return ls
    newline = list(tokenizer.encode("\n", add_special_tokens=False))
    ids = tuple(
        tuple(_encode_piece(tokenizer, lab, True, newline)) if ctl_re.search(lab) else t
        for lab, t in zip(ls.labels, ls.token_ids)
    )
    if len(set(ids)) != len(ids):
        raise DecisionError(("body", "questions"), "two options tokenize identically: make them differ")
    return LabelSet(ls.labels, ids, "sequence")


# --------------------------------------------------------------------------- a model's own decision template


def sentinel_tokenizer(tokenizer: Any) -> Any:
    """A copy of `tokenizer` with Transformers' decision sentinels added (as `prepare_inputs`
    adds them), for a model folder's own `decision_template.jinja`: its prompts are encoded by
    Transformers' own `apply_chat_template`, and the sentinels dropped from the ids (`read_marks`).
    The engine's tokenizer is never changed: its vocabulary stays the model's."""
    from transformers import AddedToken  # lazy: transformers takes seconds to import; only a folder's template needs it

    tok = copy.deepcopy(tokenizer)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in (MARK, SPLIT)])
    return tok


def template_inputs(q: Any) -> dict[str, Any]:
    """A question as Transformers' `asdict(Question)` hands it to a decision template."""
    return {
        "name": q.key,
        "type": q.type,
        "instructions": q.instructions,
        "options": [option_text(o) for o in q.options],
        "labels": list(q.labels),
        "descriptions": list(q.descriptions),
    }


def template_prompts(tok: Any, template: str, state: Any, questions: Sequence[Any], sanitize: bool) -> list[list[int]]:
    """Each question's prompt under a model's own decision template (`tok`: `sentinel_tokenizer`),
    cut at the position Transformers reads it (its `<|mark|>`, or the end when the template has
    none): the logits there depend on nothing after it. A template that reads `questions` renders
    them all in one prompt, question i read at its i-th mark."""
    if not sanitize:  # as Transformers: the sentinels dropped from the request, nothing escaped
        state = json.loads(drop_sentinels(json.dumps(state, ensure_ascii=False)))
    together = "questions" in _template_variables(template)
    groups = [list(questions)] if together else [[q] for q in questions]
    mark, split = tok.convert_tokens_to_ids([MARK, SPLIT])
    out: list[list[int]] = []
    for group in groups:
        kwargs = {"state": state, "question": template_inputs(group[0])}
        if together:
            kwargs["questions"] = [template_inputs(q) for q in group]
        ids = tok.apply_chat_template(
            [{"role": "user", "content": ""}],
            chat_template=template,
            add_generation_prompt=True,
            enable_thinking=False,
            sanitize_control_tokens=sanitize,
            tokenize=True,
            return_dict=False,
            **kwargs,
        )
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        kept = [t for t in ids if t not in (mark, split)]
        marks, n = [], 0
        for t in ids:
            if t == mark:
                marks.append(n)
            elif t != split:
                n += 1
        if not marks:
            marks = [len(kept)]
        if len(marks) < len(group):
            raise DecisionError(
                ("body", "questions"),
                f"the model's decision template marks {len(marks)} places to read for {len(group)} questions",
            )
        out += [kept[: marks[i]] for i in range(len(group))]
    return out


@lru_cache(maxsize=16)
def _template_variables(template: str) -> frozenset[str]:

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))
    except jinja2.TemplateError:
        return frozenset()
