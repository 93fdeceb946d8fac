"""The estimator's methods of fitting, one object each with one interface (`Method`): "head" (a
learned head on the hidden states), "labels" (the label names scored zero-shot), "model" (a
sequence classifier's own head) and "finetune" (LoRA adapters and a score head). Each refuses the
parameters it cannot use (`check`) and fits a `Task` (`fit`); the estimator asks the table
(`METHODS`) and never branches on the method itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from ..classifier.classifier import Classifier
from ..classifier.plan import Plan
from ..classifier.task import Task
from ..ground.notices import notice
from ..jobs.finetune import finetune_texts, progress_bar
from ..jobs.train import train_head
from ..kinds.base import KindSettings
from ..kinds.finetune import FineTunedSettings, in_memory
from ..kinds.head import HeadSettings
from ..text.calibration import CalibrationSpec
from ..text.heads import head_input
from ..text.prompts import PromptFormat, check_examples
from ..weights.convert import versions
from ..weights.finetune import FinetuneSettings
from .data import classes_of, label_key, targets
from .engines import FEATURES, shared_engine

# The estimator's own prompt defaults (not the CLI's ticket-specific ones): they name the
# labels ({labels} is filled with them), whatever the task.
DEFAULT_SYSTEM = "Classify the text. Answer with exactly one of: {labels}."
DEFAULT_TEMPLATE = "Text: {text}\nLabel:"
# The estimator's fine-tuning parameters, as `finetune.FinetuneSettings` names them.
TUNING = {
    "epochs": "epochs",
    "learning_rate": "learning_rate",
    "head_learning_rate": "head_learning_rate",
    "adapt_layers": "layers",
    "rank": "rank",
    "val_fraction": "val_fraction",
    "max_minutes": "max_minutes",
    "random_state": "seed",
}


class Method:
    """A way to fit: `kind`, the task's scoring kind it fits; `check`, its parameter refusals;
    `fit`, the task and the classes."""

    name: ClassVar[str]
    kind: ClassVar[str]
    reads_hidden_states: ClassVar[bool] = False  # `layers` and `pooling` choose a learned head's
    layers_note: ClassVar[str] = ""

    def check(self, est: Any) -> None:
        """Refuse the parameters this method cannot use, naming them (a `ValueError`)."""

    def check_parts(self, est: Any) -> None:
        """Refuse `layers` and `pooling` unless this method reads hidden states (a learned head)."""
        for name in ("layers", "pooling"):  # the learned head's hidden states: no other method reads them
            value = getattr(est, name)
            if not self.reads_hidden_states and not (isinstance(value, str) and value == "auto"):
                raise ValueError(
                    f"{name}={value!r} chooses a learned head's hidden states (method='head'); method="
                    f"{self.name!r} reads none{self.layers_note}: leave {name}='auto'"
                )

    def fit(self, est: Any, texts: list[str], y: Any) -> tuple[Task, np.ndarray]:
        raise NotImplementedError

    def adopt(self, task: Task, kind: Any, params: dict[str, Any]) -> tuple[Task, dict[str, Any]]:
        """A saved task taken back (`SLMClassifier.from_task`; `kind`: its scoring kind): the task as
        the estimator holds it, and the estimator's parameters (its prompt, then `params`)."""
        return task, {"system": task.system or "", "template": task.template, **params}

    def log_proba(self, est: Any, clf: Any, texts: list[str]) -> np.ndarray | None:
        """The log-probabilities (N, k) this method computes itself, or None: the classifier's."""
        return None

    def features(self, est: Any, clf_of: Callable[[], Any], texts: list[str]) -> np.ndarray:
        """The features a fitted task's predictions read (`transform`; `clf_of` gives the classifier,
        loaded only when used): a learned head's only."""
        raise ValueError("transform gives a learned head's features: fit with method='head'")


class PromptMethod(Method):
    """A method on a prompt of the estimator's (system, template, examples), over labels from `y`."""

    zero_shot: ClassVar[bool] = False

    def fit(self, est: Any, texts: list[str], y: Any) -> tuple[Task, np.ndarray]:
        classes, names, gold = classes_of(y, len(texts), est.labels, self.zero_shot, est.calibration)
        system = Plan(system=DEFAULT_SYSTEM if est.system is None else (est.system or None)).with_labels(names).system
        template = DEFAULT_TEMPLATE if est.template is None else est.template
        examples = check_examples(est.examples, names)  # as the CLI's --examples: pairs, known labels
        PromptFormat(system, template, examples)  # a template without {text} is refused now, not at predict
        engine = shared_engine(est.model, est.dtype)
        prompt = (names, system, template, examples)
        section, spec = self.train(est, engine, texts, gold, prompt, CalibrationSpec.of(est.calibration))
        task = Task(
            model=str(est.model),
            labels=tuple(names),
            system=system,
            template=template,
            examples=examples,
            calibration=spec,
            weights_sha256=engine.weights_sha256,
            versions=versions(),
            section=section,
        )
        return task, classes

    def train(
        self, est: Any, engine: Any, texts: list[str], gold: list[str] | None, prompt: tuple, spec: CalibrationSpec
    ) -> tuple[KindSettings | None, CalibrationSpec]:
        """(the task's section, its calibration) from the texts and their gold labels."""
        raise NotImplementedError


class HeadMethod(PromptMethod):
    name, kind = "head", "head"
    reads_hidden_states = True

    def check(self, est: Any) -> None:
        if est.calibration != "none":
            raise ValueError(
                "calibration applies to method='labels'; a head's probabilities are fitted on the labelled data "
                "already: leave calibration='none'"
            )

    def train(self, est, engine, texts, gold, prompt, spec):  # type: ignore[no-untyped-def]
        assert gold is not None
        names, system, template, examples = prompt
        log = (lambda m: notice(f"mlx-slm: {m}")) if est.verbose > 1 else None
        layers = est.layers if isinstance(est.layers, str) else [int(x) for x in est.layers]
        head = train_head(
            engine,
            texts,
            gold,
            classes=names,
            system=system,
            template=template,
            examples=examples,
            layers=layers,
            folds=est.folds,
            seed=est.random_state,
            poolings=("last", "mean") if est.pooling == "auto" else (est.pooling,),
            progress=est.verbose > 0,
            log=log,
            extract=FEATURES.features,
            **est.batching(),
        )
        return HeadSettings(head), spec

    def log_proba(self, est: Any, clf: Any, texts: list[str]) -> np.ndarray | None:
        """The head's maths on its features (cached), as the head kind does it."""
        return clf.head.log_probs(self.features(est, lambda: clf, texts))

    def features(self, est: Any, clf_of: Callable[[], Any], texts: list[str]) -> np.ndarray:
        """(N, parts, D): the head's parts of each text's hidden states, from the feature cache."""
        clf = clf_of()
        head = clf.head
        layers, poolings = sorted(set(head.layers)), tuple(sorted(set(head.poolings)))
        feats, errors, _ = FEATURES.features(clf, texts, layers, poolings, progress=est.verbose > 0)
        for i, e in enumerate(errors):
            if e is not None:
                raise ValueError(f"X row {i}: {e}")
        return head_input(feats, layers, head)


class LabelsMethod(PromptMethod):
    name, kind = "labels", "labels"
    zero_shot = True

    def train(self, est, engine, texts, gold, prompt, spec):  # type: ignore[no-untyped-def]
        names, system, template, examples = prompt
        if spec.needs_data:
            assert gold is not None
            clf = Classifier(engine, names, system, template, examples=examples, **est.batching())
            spec = clf.fit_calibration(texts, gold, spec, progress=est.verbose > 0)
        return None, spec


class FinetuneMethod(PromptMethod):
    name, kind = "finetune", "finetune"
    layers_note = " (adapt_layers= sets how many top blocks it adapts)"

    def check(self, est: Any) -> None:
        if est.calibration != "none":
            raise ValueError(
                "calibration applies to method='labels'; a fine-tuned model's probabilities are fitted on the "
                "labelled data already: leave calibration='none'"
            )
        if est.examples:
            raise ValueError("method='finetune' learns from X and y themselves: leave examples unset")

    def train(self, est, engine, texts, gold, prompt, spec):  # type: ignore[no-untyped-def]
        assert gold is not None
        names, system, template, _ = prompt
        settings = FinetuneSettings(**{v: getattr(est, k) for k, v in TUNING.items()})
        counts = {n: gold.count(n) for n in names}
        short = [f"{n!r} has {c}" for n, c in counts.items() if c < (2 if est.val_fraction > 0 else 1)]
        if short:
            raise ValueError(
                f"y: too few examples for fine-tuning: {'; '.join(short[:8])}. val_fraction={est.val_fraction:g} "
                "holds out at least one example of each label and trains on the rest, so each needs 2: add "
                "examples, or set val_fraction=0 (no early stopping)"
                if est.val_fraction > 0
                else f"y: too few examples for fine-tuning: {'; '.join(short[:8])}: a fine-tuned classifier learns "
                "each label from its examples; add examples of those labels, or leave them out of labels"
            )
        update, close = progress_bar(est.verbose == 0)
        try:
            tuned = finetune_texts(
                engine,
                texts,
                gold,
                names,
                system,
                template,
                settings,
                where=lambda i: f"X row {i}",
                progress=update,
                **est.batching(),
            )
        finally:
            close()
        return FineTunedSettings(in_memory(tuned)), spec

    def adopt(self, task: Task, kind: Any, params: dict[str, Any]) -> tuple[Task, dict[str, Any]]:
        """The adapters read once, held in memory (and in pickles), with the settings they were trained with."""
        task = replace(task, section=FineTunedSettings(in_memory(kind.tuned, kind.fused)))
        done = kind.tuned.settings
        return super().adopt(task, kind, {**{k: done[v] for k, v in TUNING.items() if v in done}, **params})


class ModelMethod(Method):
    """A sequence-classification checkpoint's own head, used as it is (its labels the classes;
    `y` checked against them and fitting the calibration)."""

    name, kind = "model", "seqcls"

    def check(self, est: Any) -> None:
        if est.system is not None or est.template is not None or est.examples:
            raise ValueError(
                "method='model' scores the text as the model's tokenizer encodes it (its own head, as "
                "Transformers feeds it): leave system, template and examples unset"
            )

    def fit(self, est: Any, texts: list[str], y: Any) -> tuple[Task, np.ndarray]:
        engine = shared_engine(est.model, est.dtype)
        score_head = getattr(engine.model, "seqcls", None)  # the checkpoint's own, if it is a sequence classifier
        if score_head is None:
            raise ValueError(
                f"method='model' uses a sequence-classification checkpoint's own head, but {est.model} is a causal "
                "LM (no score head): use method='labels' (zero-shot) or 'head' (a learned head)"
            )
        spec = CalibrationSpec.of(est.calibration)
        clf = Classifier(engine, **est.batching())
        if clf.spec.record_shape().form != "label":
            what = (
                "a multi-label head (a sigmoid per label: several labels a text)"
                if score_head.multi_label
                else ("a one-output head (a score, not a class)")
            )
            raise ValueError(
                f"method='model': {est.model} is {what}, and a scikit-learn classifier gives one class a text: use "
                "mlx_slm.Classifier for its predictions"
            )
        own = list(score_head.labels)
        names = own if est.labels is None else [str(label_key(c)) for c in est.labels]
        if sorted(names) != sorted(own):
            raise ValueError(
                f"labels={names[:8]}: the model's own labels are {own[:8]} (its head's rows): give them (in any "
                "order), or leave labels unset"
            )
        gold = None
        if y is not None or spec.needs_data:
            got = targets(y, len(texts))
            for i, v in enumerate(got.tolist()):
                if not isinstance(v, str) or v not in own:
                    raise ValueError(
                        f"y row {i}: label {v!r} is not one of the model's own labels {own[:8]}: a sequence "
                        "classifier's labels are its id2label (fix y, or drop the row)"
                    )
            gold = [str(v) for v in got.tolist()]
        if spec.needs_data:
            assert gold is not None
            spec = clf.fit_calibration(texts, gold, spec, progress=est.verbose > 0)
        task = Task(
            model=str(est.model),
            system=None,
            template="{text}",
            calibration=spec,
            weights_sha256=engine.weights_sha256,
            versions=versions(),
            **clf.spec.task_kwargs(clf.mode),
        )
        return task, np.asarray(names)

    def adopt(self, task: Task, kind: Any, params: dict[str, Any]) -> tuple[Task, dict[str, Any]]:
        return task, {"system": None, "template": None, **params}  # its prompt is the text itself


METHODS: dict[str, Method] = {m.name: m for m in (HeadMethod(), LabelsMethod(), ModelMethod(), FinetuneMethod())}
# a task's scoring kind -> the method that fits it
METHOD_OF_KIND = {m.kind: name for name, m in METHODS.items()}
