"""Sentence embeddings: a model folder's pooling, read as sentence-transformers reads it, and
`Embedder`, texts -> vectors on an `Engine`, through the batch plan and the prefix cache.

What a folder says (`read_pooling`, pure: no model runs):

* a sentence-transformers folder: `modules.json` (a Transformer module at the folder's root,
  or in a subfolder as 2.x saved it (`0_Transformer/`; a conversion moves it to the root), then
  Pooling in a folder of its own (never the root: its config.json is the backbone's), then
  optionally Normalize; any other module is refused by name), the Pooling module's
  `config.json` in either layout (2.x-5.x: `pooling_mode_lasttoken`,
  `pooling_mode_mean_tokens`, `pooling_mode_cls_token`, ... booleans; 6.x: `"pooling_mode":
  "lasttoken" | "mean" | "cls"`) with `include_prompt`, `sentence_bert_config.json`
  (`max_seq_length`, a positive whole number or null; a 6.x folder whose `modality_config` has
  "message" renders each text with the chat template, its prompt as a system message, as
  sentence-transformers then does), and `config_sentence_transformers.json` (named `prompts`,
  valid Unicode strings; `default_prompt_name`, one of their names or null). Errors name the
  files as the user knows them: a cache entry's by the folder it was converted from;
* a plain causal LM (no `modules.json`, an LM head): the last token's final-norm hidden state,
  not normalized;
* anything else (a sequence classifier, a bare backbone without a pooling config): refused,
  saying what the model does instead.

How a text runs (`Embedder`): the prompt is prepended (sentence-transformers' `prompt + text`,
tokenized whole with the tokenizer's special tokens), the ids go through the pipeline's batch
plan (length-sorted, token-budgeted, left-padded, each row at its own RoPE positions), and each
row is pooled at the final norm: its last token, the mean over its tokens (the prompt's
included or not, as the folder's `include_prompt` says, counted as sentence-transformers counts
it: the prompt tokenized alone, less a trailing special token), or its first token. A prompt's
tokens shared by every text (the instruction prefix) run once: their KV is the engine's prefix
cache (`Item.prefix`), and their hidden states, when the pooling reads them, are computed once
per prompt too (`Engine.prefix_states`). `finish` then keeps the first `dimensions` values
(Matryoshka) and normalizes as the folder (or the caller) asks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.engine import Engine
from ..ground.errors import UserError
from ..ground.ranges import check_all
from ..ground.textfiles import has_lone_surrogate
from ..text.inputs import as_texts, is_frame
from ..text.predictions import Item, Stats
from ..text.prompts import common_prefix, max_token_chars, size_problem
from ..weights.registry import ModelRef, cache_dir
from ..weights.stfolder import MODULES as MODULES_FILE
from ..weights.stfolder import SETTINGS, TRANSFORMER_CONFIG, module_dir, user_folder
from . import pipeline
from .pipeline import DEFAULT_BATCH_SIZE, BatchSettings, default_max_batch_tokens

POOLINGS = ("lasttoken", "mean", "cls")
# sentence-transformers' 2.x-5.x booleans, in the order its Pooling concatenates them.
LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
MODULES = ("Transformer", "Pooling", "Normalize")
PROBES = ("alpha", "Zulu 9")  # two texts unlike at their first character: the prompt's tokens are what they share
NO_POOLING = (
    "no pooling config (a sentence-transformers folder's modules.json) and no causal LM head: this model is "
    "{what}, it does not embed: serve a sentence-transformers folder or a causal LM for embeddings"
)


class EmbeddingError(UserError, ValueError):
    """A model or a request that cannot embed: the message says why and what to do."""


@dataclass(frozen=True)
class Pooling:
    """How a model folder turns a text's hidden states into one vector (see the module docstring)."""

    mode: str  # "lasttoken", "mean" or "cls"
    dimension: int
    include_prompt: bool = True
    normalize: bool = False
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    chat: bool = False  # each text rendered by the chat template (a 6.x folder's "message" modality)
    source: str = "sentence-transformers"  # or "causal LM"

    def prompt_text(
        self, prompt_name: str | None = None, prompt: str | None = None, where: str = "--prompt-name"
    ) -> str:
        """The prompt a text gets: `prompt` as given, else the named one, else the folder's default
        (`default_prompt_name`); "" for none. A name the folder does not define is an error naming it."""
        if prompt is not None:
            given = where.replace("prompt-name", "prompt").replace("prompt_name", "prompt")
            if not isinstance(prompt, str):
                raise EmbeddingError(f"{given}: give the prompt's text (a string), not {type(prompt).__name__}")
            if has_lone_surrogate(prompt):
                raise EmbeddingError(f"{given} holds an unpaired surrogate escape (not valid Unicode text): fix it")
            return prompt
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return ""
        named = dict(self.prompts)
        if not isinstance(name, str) or name not in named:
            have = ", ".join(repr(k) for k in named) or "none"
            raise EmbeddingError(
                f"{where} {name!r}: this model defines no prompt of that name (its prompts: {have}, in "
                "config_sentence_transformers.json): give one of them, or the prompt's text itself"
            )
        return named[name]

    def info(self) -> dict[str, Any]:
        """What `/v1/model`, `doctor` and the CLI's summary say of it."""
        return {
            "source": self.source,
            "pooling": self.mode,
            "include_prompt": self.include_prompt,
            "normalize": self.normalize,
            "dimension": self.dimension,
            "prompts": dict(self.prompts),
            "default_prompt_name": self.default_prompt_name,
            "max_seq_length": self.max_seq_length,
            "chat_template": self.chat,
        }

    def describe(self) -> str:
        """One line: how it pools."""
        if self.source == "causal LM":
            return f"a causal LM: the last token's final-norm hidden state ({self.dimension} values, not normalized)"
        return (
            f"sentence-transformers: {self.mode} pooling{'' if self.include_prompt else ' (prompt excluded)'}, "
            f"{self.dimension} values{', normalized' if self.normalize else ''}"
            + (f"; prompts {', '.join(k for k, _ in self.prompts)}" if self.prompts else "")
        )


class _Files:
    """A sentence-transformers folder's files, read at `path` and named in messages as the user
    knows them: a cache entry's by its source folder (`stfolder.user_folder`), not by the copy."""

    def __init__(self, path: Path):
        self.path = path
        self.shown, self.names = user_folder(path, cache_dir())

    def name(self, rel: str) -> Path:
        """Where the user finds the file `rel` (relative to `path`, in `/` form)."""
        if self.shown == self.path:
            return self.path / rel
        return self.shown / self.names.get(rel, rel)

    def json(self, rel: str, what: str) -> Any:
        """The JSON file `rel`, or an EmbeddingError naming it (a missing file: `None`)."""
        f = self.path / rel
        if not f.is_file():
            return None
        try:
            return json.loads(f.read_text(encoding="utf-8"))
        except OSError as e:
            raise EmbeddingError(
                f"{self.name(rel)} ({what}) cannot be read ({e.strerror}): fix its permissions"
            ) from None
        except ValueError as e:
            raise EmbeddingError(
                f"{self.name(rel)} ({what}) cannot be read as JSON ({e}): fix or replace the file"
            ) from None


def _pooling_mode(cfg: Mapping[str, Any], where: Path) -> str:
    """The one pooling mode of a Pooling module's config, in either layout, as sentence-transformers reads it."""
    mode = cfg.get("pooling_mode")
    if mode is None:
        active = [m for k, m in LEGACY_POOLING.items() if cfg.get(k)]
        mode = active or ["mean"]  # sentence-transformers' default when no boolean is set
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    if not isinstance(mode, str) or mode not in POOLINGS:
        raise EmbeddingError(
            f"{where}: pooling {mode!r} is not supported: mlx-slm pools by lasttoken, mean or cls (one of them)"
        )
    return mode


def _rel(path: Path, f: Path) -> str:
    return f.relative_to(path).as_posix()


def _module_dirs(f: _Files, kinds: list[tuple[str, Any]]) -> tuple[Path, Path]:
    """(the Transformer module's folder, the Pooling module's) as modules.json names them: the
    Transformer's the root ("") or a subfolder (`0_Transformer`, sentence-transformers 2.x); the
    Pooling module's a subfolder, never the root (its config.json is the backbone's there)."""
    where = f.name(MODULES_FILE)
    tdir = module_dir(f.path, kinds[0][1])
    if tdir is None:
        raise EmbeddingError(
            f"{where}: the Transformer module's path {kinds[0][1]!r} is not a folder inside the model folder: "
            'set it to "" (the backbone at the folder\'s root) or to the subfolder holding it'
        )
    rel = kinds[1][1]
    pdir = module_dir(f.path, rel)
    if pdir is None or pdir == f.path:
        why = (
            "the folder's root, whose config.json is the backbone's, not a pooling config: sentence-transformers "
            "refuses this folder too"
            if pdir is not None
            else "no folder inside the model folder: mlx-slm reads a module only from the model's own folder"
        )
        raise EmbeddingError(
            f"{where}: the Pooling module's path is {rel!r} ({why}); set the Pooling module's \"path\" to the "
            'subfolder holding its config.json ("1_Pooling", as sentence-transformers saves it)'
        )
    return tdir, pdir


def read_pooling(
    path: Path | None, hidden_size: int, has_lm_head: bool, what: str = "a model without an LM head"
) -> Pooling:
    """The pooling a model folder says (see the module docstring); `has_lm_head`: the model is a
    causal LM (it embeds by its last token when the folder has no pooling config); `what`: how a
    model that does not embed is named in the error (its architecture). Errors name the files
    as the user knows them (a cache entry's by its source folder)."""
    if path is None or not (path / MODULES_FILE).is_file():
        if has_lm_head:
            return Pooling("lasttoken", hidden_size, source="causal LM")
        raise EmbeddingError(NO_POOLING.format(what=what))
    f = _Files(path)
    where = f.name(MODULES_FILE)
    modules = f.json(MODULES_FILE, "sentence-transformers' modules")
    if not isinstance(modules, list) or not modules:
        raise EmbeddingError(f"{where}: must be a list of modules: fix it, or save the model again")
    kinds: list[tuple[str, Any]] = []
    for m in modules:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1] if isinstance(m, dict) else ""
        if kind not in MODULES:
            raise EmbeddingError(
                f"{where}: a {kind or 'nameless'} module ({m.get('type') if isinstance(m, dict) else m!r}) is "
                f"not supported: mlx-slm embeds with {', '.join(MODULES)} modules only"
            )
        kinds.append((kind, m.get("path", "")))
    if [k for k, _ in kinds[:2]] != ["Transformer", "Pooling"]:
        raise EmbeddingError(
            f"{where}: the modules must be Transformer (the folder's own weights), Pooling, then optionally "
            f"Normalize; got {', '.join(k for k, _ in kinds)}"
        )
    tdir, pdir = _module_dirs(f, kinds)
    pool_rel = _rel(path, pdir / "config.json")
    cfg = f.json(pool_rel, "the Pooling module's config")
    if not isinstance(cfg, dict):
        raise EmbeddingError(f"{f.name(pool_rel)}: missing or not a JSON object: the Pooling module's config is needed")
    dim = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension", hidden_size))
    if dim != hidden_size:
        raise EmbeddingError(
            f"{f.name(pool_rel)}: embedding_dimension {dim!r} is not the model's hidden size {hidden_size}"
        )
    st_rel = _rel(path, tdir / TRANSFORMER_CONFIG)
    st = f.json(st_rel, "the Transformer module's config")
    st = {} if st is None else st
    chat = _chat_modality(st, f.name(st_rel))
    prompts, default = _prompts(f)
    return Pooling(
        _pooling_mode(cfg, f.name(pool_rel)),
        hidden_size,
        include_prompt=bool(cfg.get("include_prompt", True)),
        normalize=any(k == "Normalize" for k, _ in kinds[2:]),
        prompts=prompts,
        default_prompt_name=default,
        max_seq_length=_max_seq_length(st, f.name(st_rel)),
        chat=chat,
    )


def _max_seq_length(st: Mapping[str, Any], where: Path) -> int | None:
    """The Transformer module's `max_seq_length`: a positive whole number of tokens, or None
    (absent or null: the tokenizer's and the model's own limits apply)."""
    n = st.get("max_seq_length")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise EmbeddingError(
            f"{where}: max_seq_length {n!r} is not a positive whole number of tokens: set it to the longest "
            "input the model takes (e.g. 512), or remove it to use the tokenizer's own limit"
        )
    return n


def _chat_modality(st: Any, where: Path) -> bool:
    """Whether the Transformer module renders texts as chat messages (6.x: "message" in its
    `modality_config`); a lower-casing module is refused (mlx-slm sends the text as given)."""
    if not isinstance(st, dict):
        raise EmbeddingError(f"{where}: not a JSON object")
    if st.get("do_lower_case"):
        raise EmbeddingError(f"{where}: do_lower_case is not supported: lower-case the texts yourself")
    task = st.get("transformer_task", "feature-extraction")
    if task != "feature-extraction":
        raise EmbeddingError(f"{where}: transformer_task {task!r} is not supported (feature-extraction only)")
    msg = (st.get("modality_config") or {}).get("message") if isinstance(st.get("modality_config"), dict) else None
    if msg is None:
        return False
    if not isinstance(msg, dict) or msg.get("format", "flat") != "flat":
        raise EmbeddingError(f"{where}: the message modality's format must be 'flat' (a text per message)")
    return True


def _prompts(f: _Files) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """(named prompts, default prompt name) of `config_sentence_transformers.json`: names and
    texts valid Unicode strings, the default one of the names (or null)."""
    where = f.name(SETTINGS)
    cfg = f.json(SETTINGS, "sentence-transformers' settings")
    if cfg is None:
        return (), None
    if not isinstance(cfg, dict):
        raise EmbeddingError(f"{where}: not a JSON object: fix it, or save the model again")
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise EmbeddingError(f"{where}: 'prompts' must map names to prompt texts (strings)")
    bad = next((k for k, v in prompts.items() if has_lone_surrogate(k) or has_lone_surrogate(v)), None)
    if bad is not None:
        raise EmbeddingError(
            f"{where}: prompts[{bad!r}] holds an unpaired surrogate escape (not valid Unicode text): fix the "
            "prompt's name and text"
        )
    default = cfg.get("default_prompt_name")
    if default is not None and (not isinstance(default, str) or default not in prompts):
        have = ", ".join(repr(k) for k in prompts) or "none"
        raise EmbeddingError(
            f"{where}: default_prompt_name {default!r} is not one of its prompts' names (its prompts: {have}): "
            "set it to one of them, or to null for no default prompt"
        )
    return tuple(prompts.items()), default


def pooling_of(engine: Engine) -> Pooling:
    """The pooling of the engine's model folder (`read_pooling`)."""
    model = engine.model
    seqcls = getattr(model, "seqcls", None)
    what = f"a {seqcls.architecture} (a sequence classifier)" if seqcls is not None else "a bare backbone"
    return read_pooling(engine.path, int(model.args.hidden_size), bool(getattr(model, "has_lm_head", True)), what)


def finish(vectors: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
    """Pooled vectors (N, D) as asked: the first `dimensions` values (Matryoshka truncation), then
    each divided by its L2 norm if `normalize` (sentence-transformers' Normalize: norm at least 1e-12)."""
    v = np.asarray(vectors, dtype=np.float32)
    if dimensions is not None:
        v = v[:, :dimensions]
    if normalize:
        v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), np.float32(1e-12))
    return np.ascontiguousarray(v, dtype=np.float32)


@dataclass
class Embedded:
    """One item's pooled vector (full size, not normalized), or its error."""

    index: int
    vector: np.ndarray | None = None
    n_tokens: int = 0
    truncated: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Embeddings:
    """A run's result: `vectors` (N, D) float32 in input order (NaN rows where `errors` says why),
    each text's token count and truncation, and the run's figures."""

    vectors: np.ndarray
    errors: list[str | None]
    n_tokens: list[int]
    truncated: list[bool]
    stats: Stats = field(default_factory=Stats)


class EmbedRun:
    """One run over prepared items: iterate it for `Embedded`s; `stats` fills in as it goes."""

    def __init__(self, gen: Iterator[Embedded], stats: Stats):
        self._gen, self.stats = gen, stats

    def __iter__(self) -> Iterator[Embedded]:
        while True:
            t0 = time.perf_counter()
            try:
                e = next(self._gen)
            except StopIteration:
                self.stats.seconds += time.perf_counter() - t0
                return
            self.stats.seconds += time.perf_counter() - t0
            yield e


class Embedder:
    """Texts to vectors on an `Engine` (see the module docstring). Immutable once made and
    shareable by threads (the engine's lock serializes the forward passes); what a run counts
    comes back with the run.

    truncate: a text over the model's limit (the folder's `max_seq_length`, the model's context)
    is cut at it as sentence-transformers cuts it (the tokenizer's own truncation; a chat-rendered
    text keeps the template's closing tokens); False: it is an error row naming the fix."""

    def __init__(
        self,
        engine: Engine,
        pooling: Pooling | None = None,
        *,
        truncate: bool = False,
        batch_size: int | None = None,
        max_batch_tokens: int | None | str = "auto",
        sort: bool = True,
        use_prefix_cache: bool = True,
    ):
        if not isinstance(engine, Engine):
            raise TypeError(f"Embedder takes an Engine (Engine.load(name)), not {type(engine).__name__}")
        self.engine = engine
        self.pooling = pooling if pooling is not None else pooling_of(engine)
        self.truncate = bool(truncate)
        if max_batch_tokens == "auto":
            max_batch_tokens = default_max_batch_tokens()
        batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        check_all({"batch_size": batch_size, "max_batch_tokens": max_batch_tokens}, "{name}")
        self.batching = BatchSettings(batch_size, max_batch_tokens, sort)  # type: ignore[arg-type]
        self.use_prefix_cache = use_prefix_cache
        tok = engine.tokenizer
        if self.pooling.chat and not getattr(tok, "chat_template", None):
            raise EmbeddingError(
                "this sentence-transformers folder renders texts as chat messages, but its tokenizer has no chat template"
            )
        limits = [self.pooling.max_seq_length, engine.max_length]
        own = getattr(tok, "model_max_length", None)
        if isinstance(own, int) and 0 < own < 1 << 30:
            limits.append(own)
        self.max_length = min(x for x in limits if x)
        self._heads: dict[str, tuple[tuple[int, ...], int, list[int]]] = {}

    # the pipeline's view of a kind: each item carries its own head (`Item.prefix`), none is shared
    prefix_tokens: tuple[int, ...] = ()
    row_extra = 0

    @classmethod
    def load(cls, model: str | Path | ModelRef, *, dtype: str | None = None, **kwargs: Any) -> Embedder:
        """A built-in name, a model folder (a sentence-transformers folder, a causal LM), a hub id or
        a `.gguf`, converted once into the cache (`Engine.load`); `ModelRef`'s other fields are
        taken by name, as `Classifier.load` takes them."""
        ref, rest = ModelRef.take({**kwargs, "model": model, "dtype": dtype})
        return cls(Engine.load(ref), **rest)

    @property
    def dimension(self) -> int:
        return self.pooling.dimension

    @property
    def max_batch_tokens(self) -> int | None:
        return self.batching.max_batch_tokens

    def check_dimensions(self, dimensions: Any, where: str = "--dimensions") -> int | None:
        """`dimensions` as `finish` takes it (None: all), or an error naming `where` and the range."""
        if dimensions is None:
            return None
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= self.dimension:
            raise EmbeddingError(
                f"{where} {dimensions!r}: give an integer from 1 to {self.dimension} (the model's embedding size), "
                "or leave it out for all of them"
            )
        return dimensions

    # ------------------------------------------------------------------ tokens
    def _render(self, texts: Sequence[str], prompt: str) -> list[list[int]]:
        """Token ids of each text with its prompt, as sentence-transformers tokenizes them (no truncation)."""
        tok = self.engine.tokenizer
        if not texts:
            return []
        if self.pooling.chat:
            system = [{"role": "system", "content": prompt}] if prompt else []
            rendered = [
                tok.apply_chat_template(system + [{"role": "user", "content": t}], tokenize=False) for t in texts
            ]
            return [list(x) for x in tok(rendered, add_special_tokens=False)["input_ids"]]
        return [list(x) for x in tok([prompt + t for t in texts])["input_ids"]]

    def _cut(self, text: str, prompt: str) -> list[int]:
        """One over-long text cut at the limit as sentence-transformers cuts it: the tokenizer's own
        truncation; a chat-rendered text then ends with the template's closing tokens again."""
        tok, n = self.engine.tokenizer, self.max_length
        if self.pooling.chat:
            ids = self._render([text], prompt)[0]
            tail = self.prompt_head(prompt)[2]
            keep = min(len(tail), n)
            return ids[: n - keep] + tail[len(tail) - keep :] if keep else ids[:n]
        return list(tok(prompt + text, truncation=True, max_length=n)["input_ids"])

    def prompt_head(self, prompt: str) -> tuple[tuple[int, ...], int, list[int]]:
        """(the tokens every text with `prompt` starts with: its cached head; how many of a text's
        first tokens the pooling leaves out; the chat template's closing tokens), once per prompt."""
        got = self._heads.get(prompt)
        if got is None:
            a, b = self._render(list(PROBES), prompt)
            head = tuple(common_prefix([a, b]))
            tail = common_prefix([a[::-1], b[::-1]])[::-1] if self.pooling.chat else []
            skip = 0
            if prompt and not self.pooling.include_prompt and not self.pooling.chat:
                ids = self.engine.tokenizer(prompt)["input_ids"]  # sentence-transformers' prompt length
                skip = len(ids) - (1 if ids and ids[-1] in self.engine.tokenizer.all_special_ids else 0)
            got = self._heads[prompt] = (head if prompt else (), skip, tail)
        return got

    def prepare(self, texts: Sequence[Any], prompt: str = "", start: int = 0) -> list[Item]:
        """One tokenized item per text (numbered from `start`), with an error for a text that cannot
        run (not a string, empty, over the limit without `truncate`). Holds the engine's lock."""
        items = [Item(start + i, []) for i in range(len(texts))]
        tok = self.engine.tokenizer
        with self.engine.lock:
            head, skip, _ = self.prompt_head(prompt)
            per = max_token_chars(tok)
            todo: list[tuple[Item, str]] = []
            for it, t in zip(items, texts):
                if not isinstance(t, str):
                    it.error = "the text is missing (not a string): give the item some text, or drop the row"
                elif not t.strip():
                    it.error = "empty text: give the item some text, or drop the row"
                elif has_lone_surrogate(t):
                    it.error = "the text holds an unpaired surrogate escape (not valid Unicode): fix the text"
                elif size_problem(tok, t, self.max_length):
                    if not self.truncate or getattr(tok, "truncation_side", "right") != "right":
                        it.error = self._too_long(None)
                    else:  # only the head is kept: what lies far past the limit never needs tokenizing
                        todo.append((it, t[: 2 * per * self.max_length]))
                else:
                    todo.append((it, t))
            for (it, t), ids in zip(todo, self._render([t for _, t in todo], prompt)):
                if len(ids) > self.max_length:
                    if not self.truncate:
                        it.error = self._too_long(len(ids))
                        continue
                    ids, it.truncated = self._cut(t, prompt), True
                it.ids, it.skip = ids, skip
                it.prefix = head if (self.use_prefix_cache and len(head) > 1) else None
        return items

    def _too_long(self, n: int | None) -> str:
        size = f"{n} tokens with its prompt" if n is not None else "far longer than the model takes"
        return f"the text is {size}, over the model's limit of {self.max_length}: shorten it, or pass --truncate"

    def prepare_ids(self, seqs: Sequence[Any], start: int = 0) -> list[Item]:
        """Items of token ids given as they are (no prompt, no special tokens added): each a list of
        integers within the vocabulary, an error row otherwise (or cut at the limit, with `truncate`)."""
        vocab = int(self.engine.model.args.vocab_size)
        items = []
        for i, s in enumerate(seqs):
            it = Item(start + i, [])
            if not isinstance(s, (list, tuple)) or not s:
                it.error = "give a non-empty list of token ids"
            elif not all(isinstance(x, int) and not isinstance(x, bool) for x in s):
                it.error = "token ids must be integers"
            elif (bad := next((x for x in s if not 0 <= x < vocab), None)) is not None:
                it.error = (
                    f"token id {bad} is out of the vocabulary (0 to {vocab - 1}): send ids of this model's tokenizer"
                )
            elif len(s) > self.max_length and not self.truncate:
                it.error = self._too_long(len(s)).replace(" with its prompt", "")
            else:
                it.ids, it.truncated = list(s[: self.max_length]), len(s) > self.max_length
            items.append(it)
        return items

    # ------------------------------------------------------------------ running
    def run_items(self, items: Sequence[Item], *, ordered: bool = True) -> EmbedRun:
        """A run over prepared items (the service's worker runs the items its front end prepared):
        their `Embedded`s in input order, or as each batch finishes (`ordered=False`, errors first)."""
        stats = Stats()
        return EmbedRun(self._stream(items, stats, ordered), stats)

    def _stream(self, items: Sequence[Item], st: Stats, ordered: bool) -> Iterator[Embedded]:
        done: dict[int, Embedded] = {
            it.index: Embedded(it.index, n_tokens=len(it.ids), error=it.error) for it in items if it.error
        }
        pipeline.count_items(items, st)
        if not ordered:
            yield from (done.pop(it.index) for it in items if it.error)
        nxt = 0
        for batch, group, pre in pipeline.batches(self, items, self.batching, st):  # type: ignore[arg-type]
            vecs = self._pool(batch, group, pre, st)
            st.batches += 1
            st.processed_tokens += batch.padded_tokens
            st.padding_tokens += batch.padded_tokens - batch.real_tokens
            for it, v in zip(group, vecs):
                e = Embedded(it.index, v, len(it.ids), it.truncated)
                if ordered:
                    done[it.index] = e
                else:
                    yield e
            while ordered and nxt < len(items) and items[nxt].index in done:
                yield done.pop(items[nxt].index)
                nxt += 1
        while ordered and nxt < len(items):
            yield done.pop(items[nxt].index)
            nxt += 1

    def _pool(self, batch: Any, group: list[Item], pre: Any, st: Stats) -> np.ndarray:
        """One batch's pooled vectors (B, D) float32, each row after its cached head (if any)."""
        mode = self.pooling.mode
        if mode == "lasttoken":  # the last column is each row's last real token (left padded)
            return np.array(self.engine.last_hidden(batch, pre).astype(mx.float32))
        heads = [pipeline.head_of(self, it) if pre is not None else () for it in group]
        states: list[np.ndarray | None] = []
        for h in heads:
            if not h:
                states.append(None)
                continue
            cache, _ = self.engine.prefix(h)
            got, computed = self.engine.prefix_states(cache)
            st.processed_tokens += len(h) if computed else 0
            states.append(got)
        B, L = batch.ids.shape
        real = batch.mask.astype(bool)
        n = real.sum(axis=1)
        pos = np.cumsum(real, axis=1) - 1 + np.array([len(h) for h in heads])[:, None]  # each token's place in its text
        skip = np.array([it.skip for it in group])[:, None]
        if mode == "mean":
            w = real & (pos >= skip)
        else:  # cls: the first token not left out (sentence-transformers: position 0 when every one is)
            first = np.array([it.skip if it.skip < len(h) + k else 0 for it, h, k in zip(group, heads, n)])[:, None]
            w = real & (pos == first)
        total = self.engine.weighted_sum(batch, pre, w.astype(np.float32))
        count = w.sum(axis=1).astype(np.float32)
        for r, (h, s) in enumerate(zip(heads, states)):
            if s is None:
                continue
            lo = min(group[r].skip, len(h))
            if mode == "mean":
                total[r] += s[lo:].sum(axis=0, dtype=np.float32)
                count[r] += len(h) - lo
            elif first[r, 0] < len(h):
                total[r], count[r] = s[first[r, 0]], 1.0
        return total / np.maximum(count, np.float32(1e-9))[:, None] if mode == "mean" else total

    def embed(
        self,
        texts: Sequence[Any] | str,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        window: int = 1024,
    ) -> Embeddings:
        """Every text's vector, in input order (NaN rows for the texts that cannot run, `errors`
        says why). The prompt: `prompt` as given, else the folder's prompt named `prompt_name`,
        else its default. `dimensions`: keep the first N values; `normalize`: None as the folder
        says (its Normalize module), but `dimensions` then normalizes (Matryoshka: truncated, then
        normalized); False never. One `str` is one text (one row), as `Classifier.classify` takes
        it (`text.inputs.as_texts`, the one check): never a row per character."""
        text = self.pooling.prompt_text(prompt_name, prompt, "prompt_name")
        dims = self.check_dimensions(dimensions, "dimensions")
        norm = (self.pooling.normalize or dims is not None) if normalize is None else bool(normalize)
        if is_frame(texts):
            raise TypeError("a pandas DataFrame iterates over its column names, not its rows: pass df['text']")
        texts = list(as_texts(texts, None))
        st = Stats()
        t0 = time.perf_counter()
        out = np.full((len(texts), dims or self.dimension), np.nan, dtype=np.float32)
        errors: list[str | None] = [None] * len(texts)
        n_tokens, truncated = [0] * len(texts), [False] * len(texts)
        for lo in range(0, len(texts), max(1, window)):
            items = self.prepare(texts[lo : lo + window], text, lo)
            for e in self._stream(items, st, ordered=False):
                n_tokens[e.index], truncated[e.index], errors[e.index] = e.n_tokens, e.truncated, e.error
                if e.vector is not None:
                    out[e.index] = finish(e.vector[None], norm, dims)[0]
        st.seconds = time.perf_counter() - t0
        return Embeddings(out, errors, n_tokens, truncated, st)

    def encode(self, texts: Sequence[str] | str, **kwargs: Any) -> np.ndarray:
        """`embed`'s vectors (N, D) float32, or an `EmbeddingError` naming the first text that cannot
        run. One `str` gives its one vector (D,), as sentence-transformers' `encode` does."""
        got = self.embed(texts, **kwargs)
        bad = next((i for i, e in enumerate(got.errors) if e), None)
        if bad is not None:
            raise EmbeddingError(f"{'text' if isinstance(texts, str) else f'texts[{bad}]'}: {got.errors[bad]}")
        return got.vectors[0] if isinstance(texts, str) else got.vectors
