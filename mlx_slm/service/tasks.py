"""The task cache: one classifier per task (labels, prompt, truncation), all on the one engine.

A request with its own `labels`/`system`/`template`/`truncate` gets a classifier from a small
LRU; items of the same task share micro-batches and a prefix KV. Each task has two
classifiers: a *front* one on a copy of the tokenizer (its own lock), which request handlers
use to check and tokenize while the worker runs a forward pass, and a *back* one on the
engine, which only the worker uses. A new task's parts are checked one by one first, so a
failure names the request field at fault (`Invalid`). The served task is pinned in both.

A task's key is a frozen value (`service.keys`) that builds its own task, its kind chosen by
the kinds table from the request's arguments (`kinds.arguments`, `kinds.request_spec`), as the
CLI and the Python API choose. The rerank routes run the model's reranker (`rerank_key`): the
served task when it is one (`serve --reranker`), else a task of its own, `RerankTask(truncate)`,
whose kind is the one the model says it is (`--reranker auto`: a one-label sequence classifier,
a causal LM named *Reranker*); a model that is none answers `NotSupported`. Its items are (query,
document) pairs, so documents of concurrent rerank requests share micro-batches and each
query's tokens run once (the item's head, `pipeline.head_of`).

The embedding routes run the model's embedder (`embed_key`): `EmbedTask(truncate)`, an
`classifier.Embedder` with the model folder's pooling (a causal LM's last token when it has
none), in the same two caches and through the same queue; its items carry their prompt's head,
so texts of different prompts share micro-batches. A model that does not embed (a sequence
classifier) answers `NotSupported`; a served model that only embeds (`classifies` false)
answers the classifying routes so."""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import Any, Generic, TypeVar

from ..classifier.classifier import Classifier
from ..classifier.decision_plan import DecisionPlan
from ..classifier.embedder import Embedder, EmbeddingError, pooling_of
from ..engine.engine import Engine
from ..engine.state_cache import STATE_CACHE
from ..ground.errors import UserError
from ..kinds import ModelFacts, arguments, request_spec
from ..kinds import TaskError as KindRefused
from ..models import embeds_only
from ..text.calibration import CalibrationSpec
from ..text.labels import LabelError
from ..text.labels import validate as validate_labels
from ..text.prompts import PromptError, PromptFormat
from ..weights.registry import ModelRef
from .api import Loaded, TaskSpec
from .decide import DecisionTask
from .errors import Invalid, NotSupported, TooLarge
from .keys import DECIDE_KEY, ChatTask, ClassifyTask, EmbedTask, RerankTask, TaskKey, TaskParts

# The most tokens a request's own labels (or a chat request's choices) may hold in all, every
# label counted whole: each is scored as a continuation of every prompt (a trie of that many
# nodes beside each row), so the work grows with them. 1,500 choices of ~20 tokens (30,000)
# held a CPU worker 25-40 s; CLINC150's 150 intents are ~500.
MAX_LABEL_TOKENS = 8192
EMBEDS_ONLY = (
    "this model embeds only (a bare backbone without an LM head: a sentence-transformers embedding model); it "
    "cannot classify: POST its texts to /v1/embeddings (OpenAI's API) or /embed (TEI's) for their vectors"
)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A least-recently-used map of at most `capacity` entries; the pinned key (the served
    task) is never evicted. Not thread-safe: its owner holds the lock that guards it."""

    def __init__(self, capacity: int, pinned: K | None = None):
        self.capacity, self.pinned = max(1, capacity), pinned
        self._d: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value for `key`, made by `make()` (and kept) on a miss; a hit becomes the newest."""
        if key in self._d:
            self._d.move_to_end(key)
            return self._d[key]
        value = self._d[key] = make()
        while len(self._d) > self.capacity:
            k = next(iter(self._d))
            if k == self.pinned:
                self._d.move_to_end(k)
                k = next(iter(self._d))
            self._d.pop(k)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)


class TaskCache:
    """The served task and the requests' own: keys, classifiers (front and back), checks and
    calibration. `load` fills it once the model is loaded; nothing here runs a forward pass."""

    def __init__(self, capacity: int):
        self.loaded: Loaded | None = None
        self.default_key: TaskKey = TaskKey()
        self.front_engine: Any = None
        self._front: LRU[TaskKey, Any] = LRU(capacity)  # classifiers on the front tokenizer
        self._front_lock = threading.Lock()
        self._back: LRU[TaskKey, Any] = LRU(capacity)  # classifiers on the engine (the worker runs them)
        self._back_lock = threading.Lock()  # built by request threads before admission, read by the worker
        self._reranker: Any = None  # the model's reranker kind (or why it has none), made on first use
        self._pooling: Any = None  # the model's embedding pooling (or why it has none), read on first use
        self._deciders: dict[bool, Any] = {}  # the decision tasks (front, back), made on first use
        self._decider_lock = threading.Lock()
        self.state_cache = STATE_CACHE  # the back Decider's recent states kept (`ServeOptions.state_cache`)

    def load(self, loaded: Loaded) -> None:
        """Take the loader's classifier as the served task, pinned in both caches."""

        clf = loaded.clf
        self.loaded = loaded
        self.default_key = self.key(None, None, None, None)
        self._front.pinned = self._back.pinned = self.default_key
        self._back.get(self.default_key, lambda: clf)
        # The front: the same model object, a copy of the tokenizer with its own lock, so
        # request handlers tokenize while the worker runs a forward pass.
        self.front_engine = Engine(clf.engine.model, copy.deepcopy(clf.engine.tokenizer), clf.engine.path)
        self._front.get(self.default_key, lambda: self._build(self.front_engine, self.default_key))

    @property
    def base(self) -> Any:
        """The served task's classifier (the loader's)."""
        return self.loaded.clf  # type: ignore[union-attr]

    def key(self, labels: Sequence[str] | None, system: Any, template: str | None, truncate: Any) -> ClassifyTask:
        """A task's identity: the served task's parts where the request gives none."""
        c = self.base
        t = c.truncate if truncate is None else (truncate or None)
        return ClassifyTask(
            tuple(labels) if labels is not None else c.labels,
            c.format.system if system is None else (system or None),
            c.format.template if template is None else template,
            t,
        )

    def rerank_key(self, truncate: Any) -> TaskKey:
        """The reranker's task: the served task (`key`) when it is the reranker, else its own
        `RerankTask`; `NotSupported` when the model is no reranker."""
        spec = self.reranker()
        if spec is self.base.spec:
            return self.key(None, None, None, truncate)
        return RerankTask(self.base.truncate if truncate is None else (truncate or None))

    def chat_key(self, choices: tuple[str, ...]) -> ChatTask:
        """A chat completion's task: its choices (() for the next token), the kinds of
        `kinds/chat.py`; `NotSupported` on a model without an LM head."""
        seqcls = getattr(self.base.engine.model, "seqcls", None)
        if not getattr(self.base.engine.model, "has_lm_head", True):
            what = f"a {seqcls.architecture}: its own score head" if seqcls is not None else "no LM head"
            raise NotSupported(
                f"this model has {what}, and a chat completion scores the LM head's tokens: POST the texts to "
                "/v1/classify (or /classify) for its answers, or serve a causal LM"
            )
        return ChatTask(tuple(choices))

    def reranker(self) -> Any:
        """The kind the rerank routes run, asked of the kinds table as `--reranker auto` (the
        served kind when it is a reranker), made once; `NotSupported` says how to serve a
        reranker when the model is none."""
        if self._reranker is None:
            base = self.base
            name = self.loaded.model or str(base.engine.path or "")  # type: ignore[union-attr]
            model = ModelFacts(getattr(base.engine.model, "seqcls", None), name)
            try:
                self._reranker = request_spec(base.spec, arguments(model, reranker="auto"))
            except LabelError as e:  # the command line's advice, as the service takes it
                why = str(e).replace("pass --reranker", "start mlx-slm serve with --reranker")
                why = why.replace(
                    "(mlx-slm classify with text_pair)", '(POST "texts": [[query, document], ...] to /v1/classify)'
                )
                self._reranker = NotSupported(why)
        if isinstance(self._reranker, NotSupported):
            raise self._reranker
        return self._reranker

    @property
    def classifies(self) -> bool:
        """False when the served model embeds only (no LM head, no score head, no learned head)."""
        return not (embeds_only(self.base.engine.model) and self.base.head is None)

    def embed_key(self, truncate: bool) -> EmbedTask:
        """The embedder's task; `NotSupported` when the model does not embed."""
        self.pooling()
        return EmbedTask(bool(truncate))

    def pooling(self) -> Any:
        """The model's embedding pooling (`embedder.pooling_of`), read once; `NotSupported` says
        why a model does not embed (a sequence classifier)."""

        if self._pooling is None:
            try:
                self._pooling = pooling_of(self.base.engine)
            except EmbeddingError as e:
                self._pooling = NotSupported(str(e))
        if isinstance(self._pooling, NotSupported):
            raise self._pooling
        return self._pooling

    def embedder(self, engine: Any, truncate: bool) -> Embedder:
        """The model's embedder on `engine` (`EmbedTask`), batched as the served task."""
        b = self.base
        return Embedder(
            engine,
            self.pooling(),
            truncate=truncate,
            batch_size=b.batching.batch_size,
            max_batch_tokens=b.batching.max_batch_tokens,
            sort=b.batching.sort,
            use_prefix_cache=b.kind.run.use_prefix_cache,
        )

    def classifier(self, engine: Any, parts: TaskParts) -> Classifier:
        """A classifier task on `engine`: the served task's plan (`Classifier.plan`: its batching,
        context and prefix caching, which a request changes none of) with the task's kind, prompt
        and truncation (`parts`), its labels filled into that prompt (the plan's `with_labels`, in
        the classifier), and no calibration of its own (a request's is `calibrate`'s, per request)."""
        plan = replace(
            self.base.plan,
            system=parts.system,
            template=parts.template,
            kind=parts.spec,
            labels_filled=False,
            truncate=parts.truncate,
            calibration=CalibrationSpec(),
            min_confidence=None,
        )
        return Classifier(engine, plan=plan)

    def _build(self, engine: Any, key: TaskKey) -> Any:
        """The task of `key` on `engine` (the key says what it is made of: `service.keys`); a kind
        the served task cannot be asked for (truncation) is the request's `truncate` at fault."""
        try:
            return key.build(self, engine)
        except KindRefused as e:
            raise Invalid(str(e), "truncate") from None

    def front(self, key: TaskKey) -> Any:
        """The task's classifier on the front tokenizer (validation and token counts); a task
        that cannot be built raises the classifier's `LabelError` / `PromptError`."""
        with self._front_lock, self.front_engine.lock:  # construction tokenizes too
            return self._front.get(key, lambda: self._build(self.front_engine, key))

    def decision_config(self) -> Any:
        """The served model's decision settings (its folder's decision.json, else Transformers' defaults)."""
        return self.decider(True).decider.config

    def decider(self, front: bool) -> DecisionTask:
        """The decision task (`service.decide`): on the front tokenizer (`front`: preparing requests
        off the worker) or on the engine (the worker's; it holds the state cache). Both read the
        model folder's decision.json and the served task's per-question calibration. Kept outside
        the task LRU, so the state cache is never evicted with a classifier task."""
        with self._decider_lock:
            if front not in self._deciders:
                engine = self.front_engine if front else self.base.engine
                ld = self.loaded
                try:
                    plan = ld.decision_plan if ld is not None and ld.decision_plan is not None else None
                    served = ld.model if ld is not None and ld.model else str(self.base.engine.path)
                    plan = (plan or DecisionPlan(ModelRef(served))).loaded(self.base.engine)
                    state_cache = 0 if front else self.state_cache
                    self._deciders[front] = DecisionTask(plan.decider(engine, state_cache=state_cache))
                except UserError as e:  # no LM head, an mlx-lm architecture, a bad decision.json: said once, kept
                    self._deciders[front] = NotSupported(f"this server's model cannot answer decisions: {e}")
            got = self._deciders[front]
            if isinstance(got, NotSupported):
                raise got
            return got

    def back(self, key: TaskKey) -> Any:
        """The task's classifier on the engine, which only the worker runs. A request builds
        its task's before admission (`Service.classify`), off the worker: building tokenizes its
        labels or choices (1,500 choices: seconds on a real tokenizer), which the worker then
        never waits for. Two requests of one new task may both build it (one is kept); the engine's lock guards the tokenizer."""
        if key == DECIDE_KEY:
            return self.decider(False)
        engine = self.base.engine

        def make() -> Any:
            with engine.lock:
                return self._build(engine, key)

        with self._back_lock:
            if key in self._back:
                return self._back.get(key, make)
        built = make()  # outside the cache's lock: the worker's lookups never wait for a build
        with self._back_lock:
            return self._back.get(key, lambda: built)

    def for_request(self, spec: TaskSpec) -> tuple[TaskKey, Any]:
        """(key, front classifier) of a request's task, or `Invalid` naming the request field at
        fault, taken from the check that failed (`check`; then a `LabelError` from building
        is the labels', a `PromptError` the prompt's: over the context)."""

        if not self.classifies:
            raise NotSupported(EMBEDS_ONLY)
        if spec.rerank:
            key = self.rerank_key(spec.truncate)
        elif spec.chat is not None:
            key = self.chat_key(spec.chat)
        else:
            key = self.key(spec.labels, spec.system, spec.template, spec.truncate)
            if key not in self._front:  # a new task: its parts checked one by one first
                self.check(key)
        try:
            front = self.front(key)
        except LabelError as e:  # tokenizes to nothing, two alike, one too long for the context
            raise Invalid(str(e), "labels") from None
        except ValueError as e:  # PromptError: the fixed prompt is over the context: the part the request set
            fld = "template" if spec.template is not None else "system" if spec.system is not None else "labels"
            raise Invalid(str(e), fld) from None
        if key != self.default_key:
            _check_label_tokens(front, "choices" if spec.chat is not None else "labels")
        if spec.min_confidence is not None and not front.spec.abstains:
            raise Invalid(front.spec.no_calibration.replace("--min-confidence", "min_confidence"), "min_confidence")
        return key, front

    def check(self, key: ClassifyTask) -> None:
        """The checks a classifier runs on its task's parts, one part at a time, so that a
        failure names its field: the labels alone, the labels against their descriptions,
        then the template."""
        if key.labels == self.base.labels and not key.labels:  # a kind without labels of its own: asked as served
            return  # (a truncation it cannot take is refused as its kind is chosen: `kinds.request_spec`)
        descriptions = self.loaded.label_descriptions  # type: ignore[union-attr]
        for fld, check in (
            ("labels", lambda: validate_labels(key.labels)),
            # The labels filled into the system message as the task will fill them (`Plan.with_labels`).
            ("labels", lambda: replace(self.base.plan, system=key.system).with_labels(key.labels, descriptions)),
            ("template", lambda: PromptFormat(key.system, key.template)),
        ):
            try:
                check()
            except (LabelError, PromptError) as e:
                raise Invalid(str(e), fld) from None

    def calibration_for(self, key: TaskKey) -> tuple[Any, float | None]:
        """(CalibrationSpec, min_confidence) for a task: a fitted prior applies only to the
        default task (other labels or prompt: it means nothing there); 'batch' applies per request."""

        ld = self.loaded
        spec = CalibrationSpec.of(ld.calibration, warmup=ld.warmup)  # type: ignore[union-attr]
        if key != self.default_key and spec.fitted:
            spec = CalibrationSpec(warmup=spec.warmup)
        return spec, ld.min_confidence  # type: ignore[union-attr]

    def calibrate(self, key: TaskKey, spec: TaskSpec, front: Any, raw: list[Any]) -> tuple[list[Any], Any]:
        """A request's predictions through its task's calibration (one `Calibration` per request)."""

        cal, conf = self.calibration_for(key)
        if spec.min_confidence is not None:
            conf = spec.min_confidence
        if not front.spec.calibrates:  # a head's, relevance, multi-label or one-output scores: never label-calibrated
            cal = CalibrationSpec(warmup=cal.warmup)
            conf = conf if front.spec.abstains else None
        calib = front.calibration_run(cal, conf)
        return list(calib(r[0] for r in raw)), calib


def _check_label_tokens(front: Any, what: str) -> None:
    """A request's own labels or choices within `MAX_LABEL_TOKENS` (`TooLarge`, 413, naming it)."""
    ls = getattr(front.kind, "labelset", None)
    if ls is None:
        return
    n = sum(len(t) for t in ls.token_ids)
    if n > MAX_LABEL_TOKENS:
        raise TooLarge(
            f"the {len(ls.token_ids)} {what} are {n} tokens in all, over this server's limit of {MAX_LABEL_TOKENS} "
            f"per request (each is scored after the prompt, so the work grows with them): send fewer or shorter {what}",
            "labels",
        )
