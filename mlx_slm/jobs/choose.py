"""`mlx-slm train --finetune auto`: the learned head or fine-tuning, whichever wins on the user's own texts.

Which of the two is better depends on the data: on BANKING77 at 10 per intent fine-tuning won
(0.859 against the head's 0.781), on the 355 tickets at 10 per label the head did (0.887 against
0.845). So the tool measures instead of guessing:

    labelled file -> a stratified held-out share (HOLDOUT of each label, at least one)
      -> a head fitted on the rest (its layer, pooling and strength by cross-validation, as `train`)
      -> a fine-tune of the rest (the default recipe, or the options given)
      -> both classify the held-out texts, as `classify` would -> accuracy, macro-F1, seconds
      -> the winner (accuracy, then macro-F1; a tie goes to the head: cheaper to train and to run)
         trained again on every text and saved; the table says what was measured and kept.

`--max-minutes` bounds the whole run: the trial fine-tune gets half of it, the final one what is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.classifier import Classifier
from ..classifier.task import Task
from ..engine.engine import Engine
from ..kinds.finetune import FineTunedSettings, in_memory
from ..kinds.head import HeadSettings
from ..text.heads import DEFAULT_FOLDS, POOLINGS, format_table, min_per_label
from ..text.metrics import accuracy, confusion, macro_f1
from ..text.prompts import DEFAULT_SYSTEM, DEFAULT_TEMPLATE, check_template, fill_system
from ..weights.finetune import validation_split
from .finetune import finetune_texts, history_table, save_finetuned
from .labelled import TrainError, read_training_data
from .train import train_head, trained_task

HOLDOUT = 0.2  # each label's share held out to compare the two (at least one text a label)
METHODS = ("head", "finetune")


@dataclass(frozen=True)
class Trial:
    """One method's figures on the held-out texts, and the seconds its training took."""

    method: str
    accuracy: float
    macro_f1: float
    seconds: float


@dataclass(frozen=True)
class Choice:
    """What `--finetune auto` measured (`trials`, on `held_out` texts after training on `trained_on`)
    and kept (`winner`, trained again on every text)."""

    trials: tuple[Trial, ...]
    winner: str
    held_out: int
    trained_on: int

    def record(self) -> dict[str, Any]:
        """The figures as the saved head or adapters keep them."""
        return {
            "kept": self.winner,
            "held_out": self.held_out,
            "trained_on": self.trained_on,
            **{
                t.method: {
                    "accuracy": round(t.accuracy, 4),
                    "macro_f1": round(t.macro_f1, 4),
                    "train_seconds": round(t.seconds, 1),
                }
                for t in self.trials
            },
        }

    def table(self) -> str:
        lines = [
            f"held out {self.held_out} texts (trained on the other {self.trained_on}):",
            "method    accuracy  macro-F1  train s",
        ]
        for t in self.trials:
            mark = "  <- kept" if t.method == self.winner else ""
            lines.append(f"{t.method:<8}  {t.accuracy:>8.3f}  {t.macro_f1:>8.3f}  {t.seconds:>7.0f}{mark}")
        return "\n".join(lines)


def winner(trials: Sequence[Trial]) -> str:
    """The better method: higher accuracy, then macro-F1; a tie goes to the first (the head)."""
    best = trials[0]
    for t in trials[1:]:
        if (round(t.accuracy, 9), round(t.macro_f1, 9)) > (round(best.accuracy, 9), round(best.macro_f1, 9)):
            best = t
    return best.method


def held_out_split(gold: np.ndarray, labels: Sequence[str], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) indices: HOLDOUT of each label's texts held out (at least one), drawn with `seed`."""
    return validation_split(gold, labels, HOLDOUT, seed)


def score(
    task: Task, engine: Any, texts: Sequence[Any], gold: np.ndarray, where: Callable[[int], str], **clf_kwargs: Any
) -> tuple[float, float]:
    """Accuracy and macro-F1 of `task` on `texts`, classified as `classify --task` would; a text
    that cannot run is a `TrainError` naming it (`where(i)`), as it is in training."""
    preds = Classifier.from_task(task, engine=engine, **clf_kwargs).classify(list(texts))
    index = {name: i for i, name in enumerate(task.labels)}
    for i, p in enumerate(preds):
        if p.error:
            raise TrainError(f"{where(i)}: {p.error}")
    pred = np.array([index[p.label] for p in preds])
    return accuracy(gold, pred), macro_f1(confusion(gold, pred, len(task.labels)))


@dataclass(frozen=True)
class _Setup:
    """What both methods train with: the loaded model, the data, the prompt and the options."""

    engine: Any
    model: str
    data: Any  # TrainingData
    system: str | None
    template: str
    settings: Any  # FinetuneSettings
    head: dict[str, Any]  # train_head's options: layers, layer, folds, poolings, window
    fused: bool
    progress: Callable[[Any], None] | None
    clf_kwargs: dict[str, Any]

    def where(self, rows: np.ndarray) -> Callable[[int], str]:
        return lambda i: f"{self.data.path}: line {self.data.lines[rows[i]]}"

    def task(self, section: Any) -> Task:
        d = self.data
        return trained_task(self.model, self.engine, d.labels, self.system, self.template, section)


class HeadWay:
    """The learned head (`train`), as a method `--finetune auto` weighs."""

    name = "head"

    def fit(self, s: _Setup, rows: np.ndarray, minutes: float | None) -> Any:
        d = s.data
        folds = min(s.head["folds"], int(np.bincount(d.gold[rows], minlength=len(d.labels)).min()))
        return train_head(
            s.engine,
            [d.texts[i] for i in rows],
            [d.labels[i] for i in d.gold[rows]],
            classes=d.labels,
            system=s.system,
            template=s.template,
            **{**s.head, "folds": folds},
            seed=s.settings.seed,
            source=d.path,
            lines=[d.lines[i] for i in rows],
            **s.clf_kwargs,
        )

    def section(self, s: _Setup, head: Any) -> Any:
        return HeadSettings(head)

    def record(self, s: _Setup, head: Any, choice: Choice) -> Any:
        """The head with its data and what `--finetune auto` measured in its info (saved with it)."""
        head.info.update({"data": Path(s.data.path).name, "data_sha256": s.data.sha256, "compared": choice.record()})
        return head

    def save(self, s: _Setup, task: Task, head: Any, save_task: str, reads: Sequence[Any]) -> Task:
        task.save(save_task)
        return task

    def table(self, head: Any) -> str:
        return format_table(head)


class FinetuneWay:
    """LoRA fine-tuning (`train --finetune lora`), as a method `--finetune auto` weighs."""

    name = "finetune"

    def fit(self, s: _Setup, rows: np.ndarray, minutes: float | None) -> Any:
        d = s.data
        return finetune_texts(
            s.engine,
            [d.texts[i] for i in rows],
            [d.labels[i] for i in d.gold[rows]],
            d.labels,
            s.system,
            s.template,
            replace(s.settings, max_minutes=minutes),
            where=s.where(rows),
            progress=s.progress,
            **s.clf_kwargs,
        )

    def section(self, s: _Setup, tuned: Any) -> Any:
        return FineTunedSettings(in_memory(tuned, s.fused))

    def record(self, s: _Setup, tuned: Any, choice: Choice) -> Any:
        """The adapters with what `--finetune auto` measured in their settings (saved with them)."""
        return replace(tuned, settings={**tuned.settings, "compared": choice.record()})

    def save(self, s: _Setup, task: Task, tuned: Any, save_task: str, reads: Sequence[Any]) -> Task:
        return save_finetuned(task, tuned, save_task, s.fused, reads=[("DATA", s.data.path), *reads])

    def table(self, tuned: Any) -> str:
        return history_table(tuned)


WAYS = (HeadWay(), FinetuneWay())  # in the order a tie is settled: the head first


def run_choose(
    data_path: str,
    save_task: str,
    *,
    model: str,
    settings: Any,
    labels: Sequence[str] | None = None,
    descriptions: Mapping[str, str] | None = None,
    system: str | None = DEFAULT_SYSTEM,
    template: str = DEFAULT_TEMPLATE,
    read: Mapping[str, Any] | None = None,
    layers: str | None = "auto",
    layer: int | None = None,
    folds: int = DEFAULT_FOLDS,
    poolings: Sequence[str] = POOLINGS,
    window: int = 1024,
    dtype: str | None = None,
    dequantize: bool | None = None,
    fused: bool = False,
    progress: Callable[[Any], None] | None = None,
    say: Callable[[str], None] = lambda _m: None,
    reads: Sequence[Any] = (),
    finish: Callable[[Any, Any], Any] | None = None,
    **clf_kwargs: Any,
) -> tuple[Task, Choice, str]:
    """The `train --finetune auto` command: returns (the saved `Task`, the `Choice`, the
    winner's own table: the head's layers, or the fine-tune's epochs). `finish(task, engine)`: the task as it is to be
    saved, before anything is written (e.g. "none of these")."""

    need = (
        3,
        "--finetune auto holds out some of each label's texts to compare the head and fine-tuning, "
        "and the head cross-validates on the rest (2 folds at least), so each label needs 3: add examples "
        f"of those labels to {data_path}, or choose one method (drop --finetune, or --finetune lora)",
    )
    data = read_training_data(data_path, labels, need=need, what="--finetune auto", **(read or {}))
    tr, te = held_out_split(data.gold, data.labels, settings.seed)
    if np.bincount(data.gold[tr], minlength=len(data.labels)).min() < min_per_label(2):
        raise TrainError(f"{data_path}: {need[1]}")
    say(f"mlx-slm: loading {model}")
    s = _Setup(
        Engine.load(model, dtype, dequantize),
        model,
        data,
        fill_system(system or None, data.labels, descriptions),
        check_template(template),
        settings,
        {"layers": layers, "layer": layer, "folds": folds, "poolings": poolings, "window": window},
        fused,
        progress,
        clf_kwargs,
    )
    deadline = None if settings.max_minutes is None else time.perf_counter() + settings.max_minutes * 60
    trials = []
    for way in WAYS:
        say(f"mlx-slm: --finetune auto: the {way.name} on {len(tr)} texts, {len(te)} held out")
        t0 = time.perf_counter()
        # The trial fine-tune may take half the time left; the final run what is left after it.
        learned = way.fit(s, tr, None if deadline is None else max((deadline - t0) / 120, 0.01))
        seconds = time.perf_counter() - t0
        acc, f1 = score(
            s.task(way.section(s, learned)),
            s.engine,
            [data.texts[i] for i in te],
            data.gold[te],
            s.where(te),
            **clf_kwargs,
        )
        trials.append(Trial(way.name, acc, f1, seconds))
    choice = Choice(tuple(trials), winner(trials), len(te), len(tr))
    way = next(w for w in WAYS if w.name == choice.winner)
    say(f"mlx-slm: --finetune auto kept the {way.name}; training it on all {len(data.texts)} texts")
    left = None if deadline is None else max((deadline - time.perf_counter()) / 60, 0.01)
    learned = way.record(s, way.fit(s, np.arange(len(data.texts)), left), choice)
    task = s.task(way.section(s, learned))
    if finish is not None:  # e.g. "none of these": its threshold chosen on held-out data, before anything is written
        task = finish(task, s.engine)
    return way.save(s, task, learned, save_task, reads), choice, way.table(learned)
