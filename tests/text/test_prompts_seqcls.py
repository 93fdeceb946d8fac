"""What a sequence classifier and a reranker are fed (mlx_slm/prompts.py): a text or a text
pair as the model's tokenizer encodes it (no chat template), and the Qwen3-Reranker model
card's prompt, split at the document for the prefix cache."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers.processors import TemplateProcessing
from transformers import AutoTokenizer

from mlx_slm.text import prompts
from mlx_slm.text.prompts import (
    QWEN3_RERANKER_INSTRUCTION,
    encode_texts,
    qwen3_reranker_document,
    qwen3_reranker_ids,
    qwen3_reranker_query,
    tokenize,
)
from tests.conftest import make_tokenizer


def encode_pair(tokenizer, text, pair):
    """A (text, text_pair) as the tokenizer encodes a pair (its pair template, or the two
    encodings one after the other when it has none)."""
    return encode_texts(tokenizer, [text], [pair])[0]


def encode_text(tokenizer, text):
    """One text as the tokenizer encodes it, with its special tokens (no chat template)."""
    return encode_texts(tokenizer, [text])[0]


def pair_is_concatenation(tokenizer):
    """Whether the tokenizer joins a pair with nothing around or between the two texts (each
    encoded alone, one after the other: Qwen2's and SmolLM2's)."""
    a, b = "Query text.", "Document text."
    return encode_pair(tokenizer, a, b) == sum(tokenize(tokenizer, [a, b]), [])


def qwen3_reranker_prompt(query, document, instruction=None):
    """The whole prompt string of the model card for one (query, document): its two parts joined."""
    return qwen3_reranker_query(query, instruction) + qwen3_reranker_document(document)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """The tiny models' byte-level BPE tokenizer, as saved and loaded back (transformers 5 gives
    it the plain template: a pair is the two encodings one after the other, as Qwen2's)."""
    out = tmp_path_factory.mktemp("tok")
    make_tokenizer(out)
    return AutoTokenizer.from_pretrained(str(out))


@pytest.fixture(scope="module")
def bos_tok(tmp_path_factory, tok):
    """The same with Llama 3's template: a BOS before the text, and another before a pair's second text."""
    out = tmp_path_factory.mktemp("bos-tok")
    bos = tok.convert_tokens_to_ids("<|im_start|>")
    tok.save_pretrained(str(out))
    t = AutoTokenizer.from_pretrained(str(out))
    t._tokenizer.post_processor = TemplateProcessing(
        single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|>:1 $B:1", special_tokens=[("<|im_start|>", bos)]
    )
    t.save_pretrained(str(out))
    return AutoTokenizer.from_pretrained(str(out))


def test_a_text_as_the_tokenizer_encodes_it_with_its_special_tokens(tok, bos_tok):
    text = "Ticket: refund request status"
    plain = tok(text, add_special_tokens=False)["input_ids"]
    assert encode_text(tok, text) == plain  # nothing added, no chat template
    assert encode_text(bos_tok, text) == [bos_tok.convert_tokens_to_ids("<|im_start|>"), *plain]


def test_a_pair_as_the_tokenizer_encodes_a_pair(tok, bos_tok):
    """Each text encoded alone, then joined by the tokenizer's pair template: not the encoding
    of the two strings run together (a merge across them would differ)."""
    a, b = "refund sta", "tus"
    ea, eb = (tok(x, add_special_tokens=False)["input_ids"] for x in (a, b))
    assert encode_pair(tok, a, b) == ea + eb != tok(a + b)["input_ids"]
    bos = bos_tok.convert_tokens_to_ids("<|im_start|>")
    assert encode_pair(bos_tok, a, b) == [bos, *ea, bos, *eb]
    assert pair_is_concatenation(tok) and not pair_is_concatenation(bos_tok)
    # an empty second text is no pair for the tokenizer called on one item (as the pipeline calls it)
    assert encode_pair(bos_tok, a, "") == encode_text(bos_tok, a) == bos_tok(a, "")["input_ids"] == [bos, *ea]
    assert encode_texts(bos_tok, [a, a], ["", b]) == [[bos, *ea], [bos, *ea, bos, *eb]]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.tuples(st.text(max_size=30), st.text(max_size=30)), min_size=1, max_size=6))
def test_batched_encodings_equal_each_item_alone(tok, bos_tok, items):
    texts, pairs = [a for a, _ in items], [b for _, b in items]
    for t in (tok, bos_tok):
        assert encode_texts(t, texts, pairs) == [t(a, b)["input_ids"] for a, b in items]
        assert encode_texts(t, texts) == [t(a)["input_ids"] for a in texts]


def test_encode_texts_edges(tok):
    assert encode_texts(tok, []) == [] and encode_texts(tok, [], []) == []
    with pytest.raises(ValueError, match="2 texts but 1 pairs"):
        encode_texts(tok, ["a", "b"], ["c"])


# --------------------------------------------------------------------------- Qwen3-Reranker

CARD_PROMPT = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: What is the capital of China?\n"
    "<Document>: The capital of China is Beijing.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def test_qwen3_reranker_prompt_is_the_model_cards_string():
    q, d = "What is the capital of China?", "The capital of China is Beijing."
    assert qwen3_reranker_prompt(q, d) == CARD_PROMPT
    assert qwen3_reranker_prompt(q, d, QWEN3_RERANKER_INSTRUCTION) == CARD_PROMPT
    head = qwen3_reranker_query(q)
    assert head + qwen3_reranker_document(d) == CARD_PROMPT
    assert head.endswith("<Query>: What is the capital of China?\n") and "<Document>" not in head
    assert qwen3_reranker_document(d).startswith("<Document>: The capital")
    other = qwen3_reranker_prompt(q, d, "Find the answer")
    assert "<Instruct>: Find the answer\n<Query>: " in other and QWEN3_RERANKER_INSTRUCTION not in other
    assert "<Instruct>: \n" in qwen3_reranker_prompt(q, d, "")  # the card replaces None only
    assert prompts.QWEN3_RERANKER_ANSWERS == ("no", "yes")


def _card_ids(tok, query, doc, instruction=QWEN3_RERANKER_INSTRUCTION):
    """The model card's own encoding: prefix and suffix alone, the formatted pair between."""
    prefix = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
        'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    )
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    body = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"
    return (
        tok.encode(prefix, add_special_tokens=False)
        + tok(body)["input_ids"]
        + tok.encode(suffix, add_special_tokens=False)
    )


def test_qwen3_reranker_ids_split_at_the_document(tok):
    q = "refund request status"
    docs = ["billing question", "Ticket: card declined", ""]
    head, rests = qwen3_reranker_ids(tok, q, docs)
    for d, rest in zip(docs, rests):
        assert head + rest == _card_ids(tok, q, d)
        assert len(rest) >= 5  # the document's own tokens and the suffix always follow the head
    assert tok.decode(head).endswith(f"<Query>: {q}\n")  # the whole query part is shared
    assert qwen3_reranker_ids(tok, q, []) == (_card_ids(tok, q, "")[: len(head)], [])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query=st.text(max_size=40),
    docs=st.lists(st.text(max_size=40), min_size=1, max_size=4),
    instruction=st.one_of(st.none(), st.text(max_size=20)),
)
def test_qwen3_reranker_ids_are_always_the_cards(tok, query, docs, instruction):
    head, rests = qwen3_reranker_ids(tok, query, docs, instruction)
    inst = QWEN3_RERANKER_INSTRUCTION if instruction is None else instruction
    assert len(rests) == len(docs)
    for d, rest in zip(docs, rests):
        assert head + rest == _card_ids(tok, query, d, inst) and rest
