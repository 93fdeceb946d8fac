"""The task cache's keys: one frozen value per kind of task the service runs.

A key is a task's identity in the caches and the queue (items of one key share micro-batches),
compared and hashed by its class and fields. It also says what its task is made of: `build`
gives the task's classifier (or embedder) on an engine, asking the kinds table (`kinds.arguments`,
`kinds.request_spec`) for its kind, as the CLI and the Python API do. No caller reads a key's
fields by position or dispatches on a tag: each key builds its own task.

    ClassifyTask  the served task, or a request's own labels, prompt or truncation on it
    RerankTask    the model's reranker beside the served task (the rerank routes)
    ChatTask      a chat completion: its choices as labels, or (none) its next token
    EmbedTask     the model's embedder (the embedding routes)
    DecideTask    typed decisions (`service.decide`: a `Decider`, outside the task LRU)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..kinds import arguments, request_spec
from ..kinds.chat import CHAT_TEMPLATE


@dataclass(frozen=True)
class TaskParts:
    """What a classifier task is made of beside the served task's batching and run settings:
    its kind (a `KindSpec`, chosen through the kinds table), its prompt and its truncation."""

    spec: Any
    system: str | None
    template: str
    truncate: str | None


@dataclass(frozen=True)
class TaskKey:
    """A task's identity (see the module docstring). `build` makes its task on `engine`; `cache`
    is the `TaskCache` (the served task, the model's reranker and embedding pooling)."""

    def parts(self, cache: Any) -> TaskParts:
        raise NotImplementedError

    def build(self, cache: Any, engine: Any) -> Any:
        return cache.classifier(engine, self.parts(cache))


@dataclass(frozen=True)
class ClassifyTask(TaskKey):
    """The served task, or a request's own: its labels, system message, template and truncation
    (each the served task's where the request gives none: `TaskCache.key`)."""

    labels: tuple[str, ...]
    system: str | None
    template: str
    truncate: str | None

    def parts(self, cache: Any) -> TaskParts:
        base = cache.base
        if not cache.classifies:  # an embedding model's served task: features only (never asked to classify)
            return TaskParts(base.spec, self.system, self.template, self.truncate)
        # The served kind answers for its own labels (and prompt); other labels: zero-shot labels.
        args = arguments(labels=self.labels, label_descriptions=cache.loaded.label_descriptions, truncate=self.truncate)
        same_prompt = (self.system, self.template) == (base.format.system, base.format.template)
        return TaskParts(request_spec(base.spec, args, same_prompt), self.system, self.template, self.truncate)


@dataclass(frozen=True)
class RerankTask(TaskKey):
    """The model's reranker beside the served task (`TaskCache.rerank_key`), with its truncation."""

    truncate: str | None

    def parts(self, cache: Any) -> TaskParts:
        base = cache.base
        return TaskParts(cache.reranker(), base.format.system, base.format.template, self.truncate)


@dataclass(frozen=True)
class ChatTask(TaskKey):
    """A chat completion (`TaskCache.chat_key`): the conversation is the whole prompt, scored for
    its choices (as labels), or for its next token when there are none."""

    choices: tuple[str, ...]

    def parts(self, cache: Any) -> TaskParts:
        spec = request_spec(cache.base.spec, arguments(labels=self.choices, conversation=True))
        return TaskParts(spec, None, CHAT_TEMPLATE, None)


@dataclass(frozen=True)
class EmbedTask(TaskKey):
    """The model's embedder (`TaskCache.embed_key`): its pooling, with or without truncation."""

    truncate: bool

    def build(self, cache: Any, engine: Any) -> Any:
        return cache.embedder(engine, self.truncate)


@dataclass(frozen=True)
class DecideTask(TaskKey):
    """Typed decisions: one `Decider` per side, kept outside the task LRU (`TaskCache.decider`,
    which `TaskCache.back` gives for this key)."""


DECIDE_KEY = DecideTask()
