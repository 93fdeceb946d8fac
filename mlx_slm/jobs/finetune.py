"""`mlx-slm train --finetune lora`: a fine-tuned classifier from labelled data, saved as a task.

Read the data first (its problems fail before the model loads), render and tokenize every
text with the task's prompt exactly as `classify` will (the fine-tuned kind's own items), fine-
tune (`weights.finetune.finetune`: LoRA adapters on the top blocks and a score head, or the labels' own
tokens), then write the adapters beside the task (`files.output.adapters_file`: `TASK.<sha256>.adapters.
safetensors`, a new name for new adapters, its sha256 in the task) and then the task. Ctrl-C or
`--max-minutes` keep the best finished epoch as a complete task; with no finished epoch nothing is
written. Either file is written whole or not at all (a temporary file renamed into place); a task
saved over an older one leaves the older task and the adapters it names as they were until the
new task is in place (a kill between the two writes leaves the old pair whole), and a new
adapters file is removed if the task cannot be written (never one an older task names).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..classifier.classifier import Classifier
from ..classifier.plan import Plan
from ..engine.engine import Engine
from ..files.output import adapters_file, check_run_files
from ..ground.safefs import atomic_write
from ..kinds.finetune import FineTunedSettings, in_memory
from ..kinds.labels import labelset_for
from ..weights.adapters import FinetuneError
from ..weights.convert import sha256_file
from ..weights.finetune import FinetuneSettings, Provenance, finetune
from .labelled import TrainError
from .train import TrainRun, classify_options, labelled_plan, trained_task


def run_finetune(
    run: TrainRun,
    settings: FinetuneSettings,
    *,
    fused: bool = False,
    progress: Callable[[Any], None] | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> tuple[Any, Any]:
    """The `train --finetune lora` command: returns (the saved `Task`, the `FineTuned`). `fused`:
    the task runs the adapters merged; `progress` takes the training's `Progress`, `say` each
    step's message. "None of these" (`run.none`) is applied to the task, its adapters in memory,
    before anything is written; the adapters may be none of the files the run reads (`run.reads`)."""

    need = (
        1,
        "A fine-tuned classifier learns each label from its examples: add examples of those labels to "
        f"{run.data}, or leave them out of --labels (or --labels-file)",
    )
    if settings.val_fraction > 0:  # one example of each label held out, one trained on
        need = (
            2,
            f"--val-fraction {settings.val_fraction:g} holds out at least one example of each label for "
            "validation and trains on the rest, so each needs 2: add examples of those labels, leave them out "
            "of --labels and the data, or set --val-fraction 0 (no early stopping)",
        )
    data = run.read(need=need, what="a fine-tuned classifier")
    plan = labelled_plan(run.prompt(data), data.labels)
    say(f"mlx-slm: loading {plan.model}")
    engine = Engine.load(plan.model)
    t0 = time.perf_counter()
    where = lambda i: f"{run.data}: line {data.lines[i]}"  # noqa: E731
    tuned = finetune_texts(engine, plan, data.texts, data.gold, settings, where=where, progress=progress)
    say(
        f"mlx-slm: fine-tuned in {time.perf_counter() - t0:.0f} s ({tuned.stopped} after {len(tuned.history)} "
        f"epochs; {kept(tuned)})"
    )
    task = trained_task(plan, engine, FineTunedSettings(in_memory(tuned, fused)))
    task = run.none.apply(task, engine, say, **classify_options(plan))
    return save_finetuned(task, tuned, plan.save_task, fused, reads=[("DATA", run.data), *run.reads]), tuned


def save_finetuned(task: Any, tuned: Any, save_task: str | Path, fused: bool = False, reads: Sequence[Any] = ()) -> Any:
    """Write `tuned`'s adapters beside `save_task` (`output.adapters_file`: a name of their own,
    from their sha256), then `task` there naming them: a whole new pair, or the old one as it
    was. The adapters file is checked with the outputs (none of `reads`, not the task), and an
    existing file of that name is used only if it holds these very bytes. Returns the saved `Task`."""
    data = reproducible(tuned).to_bytes()
    sha = hashlib.sha256(data).hexdigest()
    path = adapters_file(save_task, sha)
    check_run_files(reads, [("--save-task", str(save_task)), ("the adapters file", str(path))])
    created = not _holds(path, sha)
    if created:
        if path.exists() or path.is_symlink():
            raise FinetuneError(
                f"{path} exists and is not these adapters: mlx-slm names a task's adapters after the task and "
                "their sha256 and does not replace another file; remove it, or choose another --save-task"
            )

        atomic_write(path, data, "the adapters file")
    section = {
        "adapters": path.name,
        "sha256": sha,
        "fused": fused,
        "objective": tuned.objective,
        "layers": list(tuned.lora.layers),
        "rank": tuned.lora.rank,
    }
    task = replace(
        task, section=FineTunedSettings(section), home=str(path.resolve().parent)
    )  # named relative to the task's folder
    try:
        task.save(save_task)
    except BaseException:
        if created:  # ours alone: an older task names another file (or, if these bytes, one it wrote)
            path.unlink(missing_ok=True)
        raise
    return task


def _holds(path: Path, sha256: str) -> bool:
    """Whether `path` is a regular file (not a link) whose content has this sha256."""

    try:
        return path.is_file() and not path.is_symlink() and sha256_file(path) == sha256
    except OSError:
        return False


def reproducible(tuned: Any) -> Any:
    """`tuned` without its wall-clock figures (each epoch's seconds and peak memory, the frozen
    pass's and training's seconds): what the adapters file holds, so that the same seed and data
    give the same file, byte for byte (the figures are printed, `history_table`, not saved)."""

    history = [replace(e, seconds=None, peak_memory_mb=None) for e in tuned.history]
    return replace(tuned, history=history, encode_seconds=0.0, train_seconds=0.0)  # 0.0: the file's "absent"


def finetune_texts(
    engine: Any,
    plan: Plan,
    texts: Sequence[Any],
    gold: Sequence[Any],
    settings: FinetuneSettings,
    *,
    where: Callable[[int], str] = lambda i: f"text {i}",
    progress: Callable[[Any], None] | None = None,
) -> Any:
    """`weights.finetune.finetune` on `texts` (each one's gold label, or its index in the plan's labels)
    rendered and tokenized as `classify` renders them with the plan's prompt, labels and
    batching (the labels kind's items: chat template, truncation); a text that cannot run is a
    `TrainError` naming it (`where(i)`: its file and line). `train --finetune` and the
    estimator's method="finetune" fine-tune here."""

    labels = plan.labels
    clf = Classifier(engine, plan=labelled_plan(plan, labels, features_only=settings.objective == "score"))
    items = clf.prepare(list(texts))
    for i, it in enumerate(items):
        if it.error:
            raise TrainError(f"{where(i)}: {it.error}")
    # Each label's tokens after this prompt: what objective "labels" scores, and where --head-init words
    # starts the score head (the LM head's rows of the labels' words), whichever the objective.
    label_tokens = None
    if settings.objective != "score":
        label_tokens = [list(t) for t in clf.labelset.token_ids]
    elif settings.head_init == "words":
        words = labelset_for(engine, clf.format, labels, as_text=plan.controls_as_text)
        label_tokens = [list(t) for t in words.token_ids]
    return finetune(
        engine.model,
        [it.ids for it in items],
        list(gold),
        list(labels),
        settings,
        label_tokens=label_tokens,
        provenance=Provenance(engine.weights_sha256, {"system": plan.system, "template": plan.template}),
        progress=progress,
    )


def history_table(tuned: Any) -> str:
    """The epochs as a table: training loss, validation loss and accuracy, seconds, peak memory."""
    lines = ["epoch  steps  train loss  val loss  val acc  seconds  peak MB"]
    for e in tuned.history:
        best = " *" if e.epoch == tuned.best_epoch and "mean" not in kept(tuned) else ""
        vl = "-" if e.val_loss is None else f"{e.val_loss:.4f}"
        va = "-" if e.val_accuracy is None else f"{e.val_accuracy:.3f}"
        lines.append(
            f"{e.epoch:>5}  {e.steps:>5}  {e.train_loss:>10.4f}  {vl:>8}  {va:>7}  {e.seconds:>7.1f}  "
            f"{e.peak_memory_mb:>7.0f}{best}"
        )
    mark = "" if "mean" in kept(tuned) else " (*)"
    lines.append(f"stopped: {tuned.stopped}; {kept(tuned)}{mark}; the frozen pass {tuned.encode_seconds:.1f} s")
    return "\n".join(lines)


def kept(tuned: Any) -> str:
    """Which weights a run kept, in words: the mean of the later epochs (the default recipe), or one epoch."""
    mean = tuned.settings.get("averaged_epochs") or []
    if len(mean) > 1:
        return f"kept the mean of epochs {mean[0]}-{mean[-1]}"
    return f"kept epoch {tuned.best_epoch}"


def progress_bar(quiet: bool) -> tuple[Callable[[Any], None], Callable[[], None]]:
    """A tqdm bar on stderr for the frozen pass, then one for the steps (the epoch, its running
    loss, the last finished epoch's validation accuracy and which epoch that was, time left);
    and the function that closes it."""
    if quiet:
        return (lambda _p: None), (lambda: None)
    from tqdm.auto import tqdm  # lazy: a bar only (tqdm comes with transformers, not a dependency of ours)

    bars: dict[str, Any] = {}

    def update(p: Any) -> None:
        bar = bars.get(p.phase)
        if bar is None:
            for other in bars.values():
                other.close()
            desc = "mlx-slm: frozen blocks" if p.phase == "encode" else "mlx-slm: fine-tuning"
            bar = bars[p.phase] = tqdm(total=p.total, desc=desc, unit=" texts" if p.phase == "encode" else " steps")
        bar.n = p.done
        if p.phase == "train":
            post = {"epoch": f"{p.epoch}/{p.epochs}"}
            if p.loss is not None:
                post["loss"] = f"{p.loss:.3f}"
            if p.val_accuracy is not None:  # the last finished epoch's, named: not the epoch under way
                post["val_acc"] = f"{p.val_accuracy:.3f} (epoch {p.val_epoch})"
            if p.eta is not None:
                post["left"] = f"{p.eta / 60:.1f} min"
            bar.set_postfix(post, refresh=False)
        bar.refresh()

    def close() -> None:
        for bar in bars.values():
            bar.close()

    return update, close
