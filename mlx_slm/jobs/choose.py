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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.classifier import Classifier
from ..classifier.plan import Plan
from ..classifier.task import Task
from ..engine.engine import Engine
from ..kinds.finetune import FineTunedSettings, in_memory
from ..kinds.head import HeadSettings
from ..text.heads import format_table, min_per_label
from ..text.metrics import accuracy, confusion, macro_f1
from ..weights.finetune import FinetuneSettings, validation_split
from .finetune import finetune_texts, history_table, save_finetuned
from .labelled import TrainError, TrainingData
from .train import Trace, TrainRun, classify_options, labelled_plan, learn_head, trained_task

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
class Verdict:
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
class _Shared:
    """What both methods train with: the run, the loaded model, the data, the plan with the data's
    labels (filled into its system message), the fine-tuning settings and how its progress is shown."""

    run: TrainRun
    engine: Any
    data: TrainingData
    plan: Plan
    settings: FinetuneSettings
    fused: bool
    progress: Callable[[Any], None] | None

    def where(self, rows: np.ndarray) -> Callable[[int], str]:
        return lambda i: f"{self.data.path}: line {self.data.lines[rows[i]]}"

    def task(self, section: Any) -> Task:
        return trained_task(self.plan, self.engine, section)


class HeadWay:
    """The learned head (`train`), as a method `--finetune auto` weighs."""

    name = "head"

    def fit(self, s: _Shared, rows: np.ndarray, minutes: float | None) -> Any:
        d = s.data
        folds = min(s.run.head.folds, int(np.bincount(d.gold[rows], minlength=len(d.labels)).min()))
        head = replace(s.run.head, folds=folds, seed=s.settings.seed)
        trace = Trace(source=d.path, lines=[d.lines[i] for i in rows])
        texts, gold = [d.texts[i] for i in rows], [d.labels[i] for i in d.gold[rows]]
        prompt = (s.plan.system, s.plan.template, ())
        return learn_head(s.engine, texts, gold, d.labels, head, trace, prompt, classify_options(s.plan))

    def section(self, s: _Shared, head: Any) -> Any:
        return HeadSettings(head)

    def record(self, s: _Shared, head: Any, choice: Verdict) -> Any:
        """The head with its data and what `--finetune auto` measured in its info (saved with it)."""
        head.info.update({"data": Path(s.data.path).name, "data_sha256": s.data.sha256, "compared": choice.record()})
        return head

    def save(self, s: _Shared, task: Task, head: Any) -> Task:
        task.save(s.plan.save_task)
        return task

    def table(self, head: Any) -> str:
        return format_table(head)


class FinetuneWay:
    """LoRA fine-tuning (`train --finetune lora`), as a method `--finetune auto` weighs."""

    name = "finetune"

    def fit(self, s: _Shared, rows: np.ndarray, minutes: float | None) -> Any:
        d = s.data
        texts, gold = [d.texts[i] for i in rows], [d.labels[i] for i in d.gold[rows]]
        tuning = replace(s.settings, max_minutes=minutes)
        return finetune_texts(s.engine, s.plan, texts, gold, tuning, where=s.where(rows), progress=s.progress)

    def section(self, s: _Shared, tuned: Any) -> Any:
        return FineTunedSettings(in_memory(tuned, s.fused))

    def record(self, s: _Shared, tuned: Any, choice: Verdict) -> Any:
        """The adapters with what `--finetune auto` measured in their settings (saved with them)."""
        return replace(tuned, settings={**tuned.settings, "compared": choice.record()})

    def save(self, s: _Shared, task: Task, tuned: Any) -> Task:
        reads = [("DATA", s.data.path), *s.run.reads]
        return save_finetuned(task, tuned, s.plan.save_task, s.fused, reads=reads)

    def table(self, tuned: Any) -> str:
        return history_table(tuned)


WAYS = (HeadWay(), FinetuneWay())  # in the order a tie is settled: the head first


def run_choose(
    run: TrainRun,
    settings: FinetuneSettings,
    *,
    fused: bool = False,
    progress: Callable[[Any], None] | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> tuple[Task, Verdict, str]:
    """The `train --finetune auto` command: returns (the saved `Task`, the `Verdict`, the
    winner's own table: the head's layers, or the fine-tune's epochs). "None of these"
    (`run.none`) is applied to the winner's task before anything is written."""

    need = (
        3,
        "--finetune auto holds out some of each label's texts to compare the head and fine-tuning, "
        "and the head cross-validates on the rest (2 folds at least), so each label needs 3: add examples "
        f"of those labels to {run.data}, or choose one method (drop --finetune, or --finetune lora)",
    )
    data = run.read(need=need, what="--finetune auto")
    tr, te = held_out_split(data.gold, data.labels, settings.seed)
    if np.bincount(data.gold[tr], minlength=len(data.labels)).min() < min_per_label(2):
        raise TrainError(f"{run.data}: {need[1]}")
    plan = labelled_plan(run.prompt(data), data.labels)
    say(f"mlx-slm: loading {plan.model}")
    s = _Shared(run, Engine.load(plan.model), data, plan, settings, fused, progress)
    deadline = None if settings.max_minutes is None else time.perf_counter() + settings.max_minutes * 60
    trials = []
    for way in WAYS:
        say(f"mlx-slm: --finetune auto: the {way.name} on {len(tr)} texts, {len(te)} held out")
        t0 = time.perf_counter()
        # The trial fine-tune may take half the time left; the final run what is left after it.
        learned = way.fit(s, tr, None if deadline is None else max((deadline - t0) / 120, 0.01))
        seconds = time.perf_counter() - t0
        task = s.task(way.section(s, learned))
        held = [data.texts[i] for i in te]
        acc, f1 = score(task, s.engine, held, data.gold[te], s.where(te), **classify_options(plan))
        trials.append(Trial(way.name, acc, f1, seconds))
    choice = Verdict(tuple(trials), winner(trials), len(te), len(tr))
    way = next(w for w in WAYS if w.name == choice.winner)
    say(f"mlx-slm: --finetune auto kept the {way.name}; training it on all {len(data.texts)} texts")
    left = None if deadline is None else max((deadline - time.perf_counter()) / 60, 0.01)
    learned = way.record(s, way.fit(s, np.arange(len(data.texts)), left), choice)
    # "None of these": its threshold chosen on held-out data, before anything is written.
    task = run.none.apply(s.task(way.section(s, learned)), s.engine, say, **classify_options(plan))
    return way.save(s, task, learned), choice, way.table(learned)
