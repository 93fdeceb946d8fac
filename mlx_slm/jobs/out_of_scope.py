"""`train --none-threshold auto`: a task's `min_confidence` chosen on held-out labelled texts.

The task (a learned head or a fine-tuned classifier, with or without a none label) classifies the
held-out texts (`--none-data`: labelled as the training data is, the out-of-scope ones labelled
with the none label), and `text.out_of_scope.choose_threshold` picks the largest threshold that
keeps their in-scope accuracy within `--none-target` of the accuracy without one. The task
records how: the target, the file and its sha256, the held-out figures with and without the
threshold (in-scope accuracy, the share answered, out-of-scope recall and precision).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..classifier.classifier import Classifier
from ..classifier.task import Task
from ..files.readers import ReadSpec
from ..ground.errors import UsageError
from ..text.out_of_scope import DEFAULT_TARGET, choose_threshold
from .labelled import TrainError, read_training_data


def none_section(label: str | None, chosen: dict[str, Any] | None = None) -> dict[str, Any]:
    """A task's "none of these" section: its none label and how its `min_confidence` was chosen."""
    return {"label": label, "min_confidence": chosen}


@dataclass(frozen=True)
class NoneRule:
    """ "None of these" as `train` was asked it (--none-label, --none-threshold, --none-target,
    --none-data), checked by the front end and applied by the job itself to the trained task,
    before anything is written. `threshold`: a probability, "auto" (chosen on `data` to
    `target`), or None; `read`: how `data` is read (as DATA is, its gold field named)."""

    label: str | None = None
    threshold: float | str | None = None
    target: float = DEFAULT_TARGET
    data: str | None = None
    read: ReadSpec = ReadSpec()

    @property
    def asked(self) -> bool:
        return self.label is not None or self.threshold is not None

    def check(self, data_path: str, labels: Sequence[str] | None) -> None:
        """With "auto": `data` read and checked now, before any training (`check_none_data`)."""
        if self.threshold == "auto" and self.data is not None:
            check_none_data(self.data, data_path, self.label, labels=labels, read=self.read)

    def apply(self, task: Task, engine: Any, say: Any = lambda _m: None, **clf_kwargs: Any) -> Task:
        """`task` as it is to be saved: its none label (one of its labels) and its min_confidence as
        given or chosen on `data` (`clf_kwargs`: how the held-out texts are batched); unchanged when
        nothing was asked."""
        if not self.asked:
            return task
        learned = self.label if self.label in task.labels else None  # else it marks `data`'s out-of-scope texts
        if self.label is not None and learned is None and self.threshold != "auto":
            raise UsageError(
                f"--none-label {self.label!r}: no row of DATA is labelled {self.label!r} (the labels: "
                f"{list(task.labels)[:8]}): label the out-of-scope examples with it, or add --none-threshold auto "
                "--none-data FILE to mark out-of-scope texts there only, or drop --none-label"
            )
        auto = self.threshold == "auto"
        task = replace(task, none=none_section(learned), min_confidence=None if auto else self.threshold)
        if not auto:
            return task
        assert self.data is not None  # the front end asks --none-data with auto
        return choose_none_threshold(
            task, engine, self.data, target=self.target, read=self.read, say=say, marked=self.label, **clf_kwargs
        )


def check_none_data(
    path: str,
    data_path: str,
    none_label: str | None,
    labels: Sequence[str] | None = None,
    read: ReadSpec | None = None,
) -> None:
    """`--none-data` read and checked before any training, as `choose_none_threshold` will read it
    after: every row a text and a gold label among the task's labels (`labels`, else DATA's own) and
    `none_label`. A bad row is a `TrainError` naming its line now, not after the whole fine-tune."""
    own = list(labels) if labels else list(read_training_data(data_path, None, spec=read, need=(0, "")).labels)
    names = own + ([none_label] if none_label is not None and none_label not in own else [])
    read_training_data(path, names, spec=read, need=(0, ""), what="the held-out data")


def choose_none_threshold(
    task: Task,
    engine: Any,
    data_path: str,
    *,
    target: float = DEFAULT_TARGET,
    read: ReadSpec | None = None,
    say: Any = lambda _m: None,
    marked: str | None = None,
    **clf_kwargs: Any,
) -> Task:
    """`task` with its `min_confidence` chosen on the held-out labelled texts at `data_path` (read
    as training data is read: `read`), recorded in its none section (`none_section`). `marked`: the
    label of the held-out out-of-scope texts when the task did not learn one (it answers "none of
    these" by the threshold alone)."""
    none_label = task.none["label"] if task.none else None
    marked = marked if none_label is None else None
    names = list(task.labels) + ([marked] if marked is not None else [])
    data = read_training_data(data_path, names, spec=read, need=(0, ""), what="the held-out data")
    if not len(data.gold):
        raise TrainError(f"{data_path}: no labelled texts to choose the threshold on")
    if marked is not None and names.index(marked) not in set(data.gold.tolist()):
        raise TrainError(
            f"--none-label {marked!r}: no row of DATA or of {data_path} is labelled {marked!r}: label the out-of-scope "
            "examples with it (in either file), or drop --none-label"
        )
    clf = Classifier.from_task(task, engine=engine, **clf_kwargs)
    probs = np.zeros((len(data.texts), len(task.labels)))
    for p in clf.classify_iter(data.texts):
        if not p.ok:
            raise TrainError(f"{data_path}: line {data.lines[p.index]}: {p.error}")
        probs[p.index] = [p.probs[lab] for lab in task.labels]
    gold = [names[i] for i in data.gold]
    # Without a learned none label the held-out out-of-scope texts (if `marked`) have probability 0 for it;
    # with none at all every held-out text is in scope: the threshold trades answered texts for accuracy.
    marker = none_label or marked or "\0none"
    labels = list(task.labels) + ([] if none_label is not None else [marker])
    if none_label is None:
        probs = np.concatenate([probs, np.zeros((len(probs), 1))], axis=1)
    try:
        threshold, figures = choose_threshold(probs, gold, labels, marker, target)
    except ValueError as e:
        raise TrainError(f"{data_path}: {e}") from None
    said = {k: v for k, v in figures.items() if k not in ("out_of_scope", "oos_recall", "oos_precision")}
    if none_label is not None or marked is not None:
        said = figures
    chosen = {
        "chosen_on": data_path,
        **({"out_of_scope_label": marked} if marked is not None else {}),
        "sha256": data.sha256,
        "n": len(gold),
        **said,
    }
    say(
        f"mlx-slm: none of these: min_confidence {threshold if threshold is not None else 'none'} chosen on "
        f"{len(gold)} held-out texts (target: at most {target:g} of in-scope accuracy): in-scope accuracy "
        f"{figures['without_threshold']['in_scope_accuracy']} -> {figures['in_scope_accuracy']}"
        + (f", out-of-scope recall {figures['oos_recall']}" if figures.get("oos_recall") is not None else "")
    )
    return replace(task, min_confidence=threshold, none=none_section(none_label, chosen))
