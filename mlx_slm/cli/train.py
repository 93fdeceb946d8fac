"""`train`: a learned head on labelled data, saved in a task."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import click

from ..classifier.pipeline import DEFAULT_BATCH_SIZE
from ..classifier.plan import Plan
from ..files.output import OutputLock, check_run_files, files_read
from ..files.readers import ReadSpec
from ..jobs.choose import run_choose
from ..jobs.decide import STATE_FIELDS
from ..jobs.finetune import history_table, progress_bar, run_finetune
from ..jobs.out_of_scope import NoneRule
from ..jobs.plan import CommandLabels, DecisionOptions, check_format_fields, flag_names, read_labels, resolve_decisions
from ..jobs.train import HeadOptions, TrainRun, run_train, run_train_fields
from ..jobs.train_decisions import DecisionTrainRun, own_files, run_train_decisions
from ..text.decisions.gold import gold_pairs
from ..text.questions import DEFAULT_SYSTEM as Q_SYSTEM
from ..text.questions import DEFAULT_TEMPLATE as Q_TEMPLATE
from ..weights.finetune import FinetuneSettings
from .base import TUNING, Command, given, notice, number, warn_blas
from .options import some_task_options, task_settings

# Which of the two wins depends on the data (docs/finetune.md): said after either, never chosen silently.
COMPARE = (
    "mlx-slm: a learned head or fine-tuning: which classifies better depends on the data (the head won on "
    "the 355 tickets, fine-tuning on BANKING77); `--finetune auto` measures both on held-out texts of "
    "yours and keeps the better"
)
NONE = ("none_label", "none_threshold", "none_target", "none_data")  # "none of these" (`_check_none`)
_TRAIN_TASK_OPTIONS = {
    "model",
    "labels_csv",
    "labels_file",
    "system",
    "template",
    "examples_file",
    "fmt",
    "text_field",
    "id_field",
    "text_column",
    "id_column",
    "pair_field",
    "pair_column",
    "batch_size",
    "max_batch_tokens",
    "window",
    "no_prefix_cache",
    "truncate",
    "dtype",
    "keep_quantized",
    "quiet",
}


def _not_stdin(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value == "-":
        raise click.BadParameter(
            "train reads DATA more than once (its texts' features, then each fold's fit, or a fine-tune's epochs): "
            "give a file, not stdin (-), e.g. save it first: ... > data.jsonl"
        )
    return value


@click.command(cls=Command)
@click.argument("data", type=click.Path(exists=True, dir_okay=False, allow_dash=True), callback=_not_stdin)
@click.option(
    "--save-task", required=True, type=click.Path(dir_okay=False), help="Write the task, with its head, here."
)
@click.option(
    "--layers",
    "layers_spec",
    default="auto",
    show_default=True,
    help="Candidate layers: auto (every eighth of the depth from a quarter on, plus the last two together), "
    "all, or numbers like 6,12,24.",
)
@click.option("--layer", type=number("layer"), help="Use this layer (an earlier one is faster), not the CV's choice.")
@click.option(
    "--folds", default=5, show_default=True, type=number("folds"), help="Cross-validation folds (examples per label)."
)
@click.option(
    "--pooling",
    type=click.Choice(["auto", "last", "mean"]),
    default="auto",
    show_default=True,
    help="Hidden state per layer: the last prompt position, the mean over the text's part of the prompt, or "
    "auto (both are candidates; the CV chooses).",
)
@click.option("--seed", default=0, show_default=True, type=number("seed"), help="Seed of the folds' shuffle.")
@click.option(
    "--gold-field",
    "--gold-column",
    "--label-field",
    "gold_fields",
    multiple=True,
    default=("label",),
    show_default=True,
    help="Field (JSONL) or column (CSV) of the gold label. Several (--label-field team --label-field urgent): "
    "one head per field from one pass over the texts, saved as a task of questions named by the fields.",
)
@click.option(
    "--finetune",
    type=click.Choice(["lora", "auto"]),
    help="Fine-tune instead of fitting a head: LoRA adapters on the top blocks and a score head (or the "
    "labels' own tokens, --objective labels), trained with cross-entropy on DATA in the task's prompt. "
    "auto: hold out a fifth of each label's texts, train both a head and a fine-tune on the rest, keep "
    "whichever classifies the held-out texts better (trained again on all of DATA), and print both.",
)
@click.option(
    "--objective",
    type=click.Choice(["score", "labels"]),
    default="score",
    show_default=True,
    help="--finetune: a score head at the last position (as *ForSequenceClassification), or the labels' tokens.",
)
@click.option("--epochs", default=8, show_default=True, type=number("epochs"), help="--finetune: epochs at most.")
@click.option(
    "--lr",
    "learning_rate",
    default=2e-5,
    show_default=True,
    type=number("learning_rate"),
    help="--finetune: the adapters' peak learning rate (warm-up, then --schedule down to 0).",
)
@click.option(
    "--head-lr",
    "head_learning_rate",
    default=1e-4,
    show_default=True,
    type=number("head_learning_rate"),
    help="--finetune: the score head's peak learning rate.",
)
@click.option(
    "--schedule",
    type=click.Choice(["cosine", "linear", "constant"]),
    default="cosine",
    show_default=True,
    help="--finetune: how the learning rate falls after the warm-up.",
)
@click.option(
    "--adapt-layers",
    type=number("adapt_layers"),
    help="--finetune: LoRA adapters on this many top blocks (the ones below run once per text) "
    "[default: 16, or every block of a smaller model].",
)
@click.option("--rank", default=8, show_default=True, type=number("rank"), help="--finetune: the LoRA rank.")
@click.option(
    "--lora-scale",
    default=20.0,
    show_default=True,
    type=number("lora_scale"),
    help="--finetune: the LoRA scale (the delta is scale * x A B, mlx-lm's convention).",
)
@click.option("--dropout", default=0.0, show_default=True, type=number("dropout"), help="--finetune: LoRA dropout.")
@click.option(
    "--train-batch-size",
    default=16,
    show_default=True,
    type=number("train_batch_size"),
    help="--finetune: texts per step.",
)
@click.option(
    "--val-fraction",
    default=0.0,
    show_default=True,
    type=number("val_fraction"),
    help="--finetune: each label's share held out for validation (0: every example trains).",
)
@click.option(
    "--keep",
    type=click.Choice(["auto", "average", "best", "last"]),
    default="auto",
    show_default=True,
    help="--finetune: the weights kept: the mean of the later half's epochs (average), the epoch with "
    "the lowest validation loss (best: needs --val-fraction), the last; auto: best with "
    "--val-fraction, else average (the recipe measured in docs/finetune.md).",
)
@click.option(
    "--patience",
    default=2,
    show_default=True,
    type=number("patience"),
    help="--finetune --keep best: stop after this many epochs without a better validation loss.",
)
@click.option(
    "--max-minutes",
    type=number("max_minutes"),
    help="--finetune: stop after this many minutes (the best epoch so far is kept).",
)
@click.option(
    "--head-init",
    type=click.Choice(["zeros", "probe", "centroid", "words"]),
    default="zeros",
    show_default=True,
    help="--finetune: the score head starts at zero, fitted on the base model's "
    "features (probe), at their class means (centroid), or as the LM head's rows of each label's "
    "first token (words).",
)
@click.option(
    "--label-smoothing",
    default=0.0,
    show_default=True,
    type=number("label_smoothing"),
    help="--finetune: this share of each example's target spread over the other labels.",
)
@click.option(
    "--contrastive",
    default=0.0,
    show_default=True,
    type=number("contrastive"),
    help="--finetune: weight of a supervised contrastive loss on the features beside the cross-entropy.",
)
@click.option("--fused", is_flag=True, help="--finetune: run the adapters merged into the weights (see docs).")
@click.option(
    "--none-label",
    help="Rows with this label are out-of-scope examples: the task learns them as a class "
    "and answers them 'none of these' (label null, abstained true). With --none-threshold auto it also "
    "marks --none-data's out-of-scope texts; if DATA has none, the threshold alone answers 'none'. "
    "With --decisions: the option of the trained choice question that means none, learned from DATA's "
    "states labelled with it, as any option (label some).",
)
@click.option(
    "--none-threshold",
    help="Also answer 'none of these' when no label reaches this probability: a number "
    "from 0 to 1, or auto (chosen on --none-data to --none-target).",
)
@click.option(
    "--none-target",
    default=0.02,
    show_default=True,
    type=number("none_target"),
    help="--none-threshold auto: the share of in-scope accuracy the threshold may cost on --none-data.",
)
@click.option(
    "--none-data",
    type=click.Path(exists=True, dir_okay=False),
    help="--none-threshold auto: held-out labelled texts (read as DATA; out-of-scope ones labelled "
    "--none-label) to choose the threshold on.",
)
@click.option(
    "--decisions",
    "decisions_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Train typed decision questions (Q.json, as `decide` asks them): a head per question given "
    "--gold-field KEY=FIELD, on the hidden states where its answer is read (--head-prompt question, "
    "--finetune lora|auto: a classifier per question, the question its prompt; --none-label OPTION "
    "[--none-threshold P|auto]: 'none of these'); decide --task and serve --task answer those questions "
    "with it, on both routes.",
)
@click.option(
    "--head-prompt",
    type=click.Choice(["decision", "question"]),
    help="--decisions: what a question's head reads. decision (the default): the decision prompt's "
    "hidden states where its answer is read, in the same pass as the other questions (each state costs "
    "the question's tokens); question: a classifier of the question's own, the question its cached "
    "prompt and the state its text, as --finetune trains, its head chosen as train chooses (--pooling "
    "last or mean): each state costs its own tokens again, far cheaper with many options (BANKING77's "
    "77 intents: docs/decisions.md).",
)
@some_task_options(_TRAIN_TASK_OPTIONS)
@click.pass_context
def train(
    ctx: click.Context,
    data: str,
    save_task: str,
    layers_spec: str,
    layer: int | None,
    folds: int,
    pooling: str,
    seed: int,
    gold_fields: tuple[str, ...],
    decisions_file: str | None,
    head_prompt: str | None,
    **o: Any,
) -> None:
    """Train a learned head on labelled DATA (text and --gold-field) and save it in a task.

    
    One forward pass per text, to the deepest candidate layer; a logistic regression on
    the hidden state (at the last prompt position, or the mean over the text's tokens),
    its layer, pooling and strength chosen by stratified k-fold cross-validation. Prints
    the per-layer table (CV accuracy and macro-F1 against the seconds per item a forward
    stopped there costs) and the choice. Labels: --labels
    or --labels-file, else the data's own. Then classify, eval, serve with --task:
      mlx-slm train labelled.csv --gold-column category --save-task task.json
      mlx-slm classify tickets.jsonl --task task.json -o out.jsonl

    \b
    Typed decisions (docs/decisions.md): a question of Q.json trained on its labelled states
    (--decisions), then answered by decide and serve (the decision routes) with --task:
      mlx-slm train gold.jsonl --decisions q.json --gold-field team --save-task t.json
      mlx-slm serve --task t.json

    Docs: docs/heads.md
    """

    warn_blas()
    poolings = ("last", "mean") if pooling == "auto" else (pooling,)
    if decisions_file is not None:
        head = HeadOptions(layers_spec, layer, folds, seed, o["window"], poolings)
        _train_decisions(ctx, (data, decisions_file, save_task), gold_fields, (head, head_prompt), o)
        return
    if head_prompt is not None:
        raise click.UsageError(
            "--head-prompt says what a decision question's head reads: it goes with --decisions Q.json (a labels "
            "task's head reads its own prompt, --system and --template)"
        )
    none = {k: o.pop(k) for k in NONE}  # "none of these": checked here, applied by the job to the saved task
    reads = files_read(o, ("DATA", data), *(("--none-data", none["none_data"]),) * bool(none["none_data"]))
    check_run_files(reads, [("--save-task", save_task)])
    # One writer of a task at a time: a second run saving to it stops now, naming this one (held to the end).
    ctx.with_resource(OutputLock(save_task, create=False, option="--save-task"))
    o["gold_field"], o["save_task"] = gold_fields[0], save_task
    rule = _none_rule(ctx, data, none, gold_fields, o)
    tune = {k: o.pop(k) for k in TUNING}  # the fine-tuning options (checked in _finetune)
    head = HeadOptions(layers_spec, layer, folds, seed, o["window"], poolings)
    if tune["finetune"] is not None or set(TUNING) & given(ctx, tune) - {"finetune"}:
        _finetune(ctx, data, gold_fields, tune, _Given(head, rule, o))
        return
    if len(gold_fields) > 1:
        _train_fields(ctx, data, gold_fields, _Given(head, rule, o))
        return
    # Neither --labels nor --labels-file: the data's own labels (not classify's default ones).
    run = _train_run(ctx, data, _Given(head, rule, o), _labels(ctx, o, say=True))
    task, table = run_train(run, _say(o))
    click.echo(table)
    if not o["quiet"]:
        notice(f"mlx-slm: task saved to {save_task}; classify with: mlx-slm classify INPUT --task {save_task}")
        notice(COMPARE)


# What `train --decisions` takes beside its own: the model, how DATA is read, --quiet.
_DECISION_OPTIONS = {
    "model",
    "dtype",
    "keep_quantized",
    "fmt",
    "text_field",
    "id_field",
    "text_column",
    "id_column",
    "quiet",
}
_DECISION_OWN = {
    "data",
    "layers_spec",
    "layer",
    "folds",
    "seed",
    "pooling",
    "gold_fields",
    "decisions_file",
    "head_prompt",
    "save_task",
}


def _train_decisions(
    ctx: click.Context,
    files: tuple[str, str, str],
    gold_fields: tuple[str, ...],
    heads: tuple[HeadOptions, str | None],
    o: dict[str, Any],
) -> None:
    """`train --decisions Q.json` (`jobs.train_decisions`): a head per labelled question (on the
    decision prompt, or on the question's own prompt: --head-prompt question), or a fine-tune, "none
    of these" (--none-label OPTION: one of the trained question's options) where asked."""
    data, questions, save_task = files
    head, head_prompt = heads
    none = {k: o[k] for k in NONE}
    held = (("--none-data", none["none_data"]),) * bool(none["none_data"])
    reads = files_read(o, ("DATA", data), ("--decisions", questions), *held)
    check_run_files(reads, [("--save-task", save_task)])
    ctx.with_resource(OutputLock(save_task, create=False, option="--save-task"))
    typed = {k for k in ctx.params if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}
    other = sorted(typed - _DECISION_OPTIONS - _DECISION_OWN - set(TUNING) - set(NONE))
    if other:
        raise click.UsageError(
            f"--decisions trains a head per decision question: {flag_names({other[0]})} is for a labels "
            "task (a decision question's prompt and options are its own); drop it"
        )
    if ctx.get_parameter_source("gold_fields") != click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--decisions: give --gold-field KEY=FIELD for each question to train")
    settings = DecisionOptions(o["model"], o.get("dtype"), o.get("keep_quantized"), questions_file=questions)
    plan = resolve_decisions(settings)
    states = (o["text_field"],) if "text_field" in typed else STATE_FIELDS
    column = o["text_column"] if "text_column" in typed else "state"  # else "text" where the header lacks it
    read = ReadSpec(o.get("fmt"), states[0], o["id_field"], column, o["id_column"], states=states)
    tune = {k: o[k] for k in TUNING}
    tuning = None
    if tune["finetune"] is not None:
        if head_prompt is not None:
            raise click.UsageError(
                f"--finetune {tune['finetune']} trains a classifier on the question's own prompt (its head too, "
                "with auto): drop --head-prompt"
            )
        if tune["finetune"] == "lora":  # as for a labels task: a head's options choose nothing here
            _refuse_head_options(ctx)
        _check_recipe(ctx, tune)
        tuning = (tune["finetune"], _finetune_settings(tune, head.seed), tune["fused"])
    elif typed & set(TUNING):
        name = sorted(typed & set(TUNING))[0]
        flag = next(p.opts[0] for p in ctx.command.params if p.name == name)  # --lr, not --learning-rate
        if head_prompt == "question":
            raise click.UsageError(
                f"{flag} is a fine-tuning option; --head-prompt question fits a head: drop {flag}, or fine-tune "
                "instead (--finetune lora, without --head-prompt)"
            )
        raise click.UsageError(f"{flag} is a fine-tuning option: add --finetune lora")
    elif head_prompt == "question":
        tuning = ("head", None, False)
    elif "pooling" in typed:
        raise click.UsageError(
            "--pooling: a head on the decision prompt reads the hidden state where the answer is read (the "
            "last position); add --head-prompt question for a head that pools as train's (last or mean)"
        )
    threshold = _check_none(ctx, none, gold_fields)
    if threshold is not None and none["none_label"] is None:
        raise click.UsageError(
            "--none-threshold with --decisions answers the question's own 'none of these' option when no other "
            "reaches it: name that option with --none-label OPTION (add one to the question if it has none)"
        )
    if tuning is not None:  # each question's own classifier is an output too: never a file the run reads
        keys = gold_pairs(plan.questions, gold_fields)
        own = own_files(save_task, list(keys))
        check_run_files(
            reads, [("--save-task", save_task), *((f"question {k!r}'s classifier", str(f)) for k, f in own.items())]
        )
    rule = NoneRule(none["none_label"], threshold, none["none_target"], none["none_data"], read)
    run = DecisionTrainRun(
        data,
        plan,
        gold_fields,
        save_task,
        head,
        read,
        tuning,
        rule,
        column_given="text_column" in typed,
    )
    _task, table = run_train_decisions(run, _say(o))
    click.echo(table)
    if not o["quiet"]:
        notice(f"mlx-slm: task saved to {save_task}; answer with: mlx-slm decide INPUT --task {save_task}")


@dataclass(frozen=True)
class _Given:
    """What every way of training was given beside its own options: how a head is chosen, "none
    of these", and the task options (the command's parameters by name)."""

    head: HeadOptions
    none: NoneRule
    o: dict[str, Any]


def _say(o: dict[str, Any]) -> Any:
    """Where a run's notes go: stderr, or nowhere with --quiet."""
    return (lambda _m: None) if o["quiet"] else notice


def _labels(ctx: click.Context, o: dict[str, Any], say: bool = False) -> CommandLabels:
    """--labels or --labels-file as typed (neither: None, the data's own labels), with the note
    (`say`) when their descriptions would not reach the model."""
    labels_csv = o["labels_csv"] if "labels_csv" in given(ctx, o) else None
    return read_labels(labels_csv, o["labels_file"], o["system"], None if o["quiet"] or not say else notice)


def _train_run(
    ctx: click.Context,
    data: str,
    g: _Given,
    labels: CommandLabels | None = None,
    untyped: tuple[str, str] | None = None,
) -> TrainRun:
    """The run the options describe, resolved once: the plan (the model, the prompt as typed,
    the batching, how DATA is read, where the task goes), the labels, how a head is chosen and
    "none of these". `untyped`: the (system, template) a run takes where none was typed, if
    not the command's defaults (several heads take the questions')."""
    o, settings = g.o, task_settings(ctx, g.o)
    check_format_fields(settings, (data, g.none.data))  # a field option DATA's format has not
    system, template = o["system"] or None, o["template"]
    if untyped is not None:
        system = (system if "system" in settings.given else None) or untyped[0]
        template = template if "template" in settings.given else untyped[1]
    # As train has always read DATA: an --id-column named need not exist (ids are not saved).
    read = replace(settings.read_spec(), id_required=False).for_input(data)
    plan = Plan(
        model=settings.model_ref(),
        system=system,
        template=template,
        batch_size=settings.batch_size or DEFAULT_BATCH_SIZE,
        max_batch_tokens=settings.max_batch_tokens or "auto",
        use_prefix_cache=not settings.no_prefix_cache,
        truncate=settings.truncate,
        window=settings.window,
        read=read,
        save_task=settings.save_task,
        quiet=settings.quiet,
        given=settings.given,
    )
    named = None if labels is None or labels.labels is None else tuple(labels.labels)
    descriptions = None if labels is None else labels.descriptions
    reads = tuple(files_read(o, ("DATA", data)))
    return TrainRun(data, plan, named, descriptions, o["examples_file"], g.head, g.none, reads)


def _train_fields(ctx: click.Context, data: str, fields: tuple[str, ...], g: _Given) -> None:
    """Several gold fields: one head per field, one pass over the texts, a task of questions."""

    clash = {"labels_csv", "labels_file", "examples_file"} & given(ctx, g.o)
    if clash:
        names = {"labels_csv": "--labels", "labels_file": "--labels-file", "examples_file": "--examples"}
        raise click.UsageError(
            f"{names[sorted(clash)[0]]} goes with one --label-field: with several, each head takes its field's own labels"
        )
    _, table = run_train_fields(_train_run(ctx, data, g, untyped=(Q_SYSTEM, Q_TEMPLATE)), list(fields), _say(g.o))
    click.echo(table)
    if not g.o["quiet"]:
        save_task = g.o["save_task"]
        notice(
            f"mlx-slm: task of {len(fields)} questions saved to {save_task}; classify with: mlx-slm classify "
            f"INPUT --task {save_task} (add zero-shot questions with --questions)"
        )


HEAD_FLAGS = {"layers_spec": "--layers", "layer": "--layer", "folds": "--folds", "pooling": "--pooling"}


def _refuse_head_options(ctx: click.Context) -> None:
    """A learned head's options typed with --finetune lora: refused by name (they choose hidden states)."""
    head_opts = sorted(k for k in HEAD_FLAGS if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE)
    if head_opts:
        first = head_opts[0]
        if first == "folds":
            raise click.UsageError(
                "--folds cross-validates a learned head; --finetune holds out --val-fraction of each label for "
                "validation instead: drop --folds"
            )
        raise click.UsageError(
            f"{HEAD_FLAGS[first]} chooses a learned head's hidden states; --finetune trains adapters and a head "
            "of their own (--adapt-layers sets how many top blocks): drop it"
        )


def _finetune(ctx: click.Context, data: str, gold_fields: tuple[str, ...], tune: dict[str, Any], g: _Given) -> Any:
    """`train --finetune lora` (or auto): check the options, fine-tune, print the epochs, say where the task went."""

    if tune["finetune"] is None:
        named = sorted(set(TUNING) & given(ctx, tune))
        flag = next(p.opts[0] for p in ctx.command.params if p.name == named[0])  # --lr, not --learning-rate
        raise click.UsageError(f"{flag} is a fine-tuning option: add --finetune lora")
    if tune["finetune"] == "lora":
        _refuse_head_options(ctx)
    if len(gold_fields) > 1:
        raise click.UsageError("--finetune trains one classifier: give one --gold-field")
    if g.o["examples_file"]:
        raise click.UsageError(
            "--examples goes with zero-shot labels and heads; a fine-tuned classifier learns "
            "from DATA itself: drop --examples"
        )
    settings = _finetune_settings(tune, g.head.seed)
    _check_recipe(ctx, tune)
    run = _train_run(ctx, data, g, _labels(ctx, g.o, say=True))
    quiet = g.o["quiet"]
    if tune["finetune"] == "auto":
        return _choose(run, settings, tune["fused"], quiet)
    update, close = progress_bar(quiet)
    try:
        task, tuned = run_finetune(run, settings, fused=tune["fused"], progress=update, say=_say(g.o))
    finally:
        close()
    click.echo(history_table(tuned))
    if not quiet:
        save_task = run.plan.save_task
        notice(
            f"mlx-slm: task saved to {save_task} (adapters: {task.finetune['adapters']}); classify with: "
            f"mlx-slm classify INPUT --task {save_task}"
        )
        notice(COMPARE)
    return task


def _choose(run: TrainRun, settings: FinetuneSettings, fused: bool, quiet: bool) -> Any:
    """`train --finetune auto`: a head and a fine-tune measured on held-out texts, the winner kept."""
    update, close = progress_bar(quiet)
    try:
        say = (lambda _m: None) if quiet else notice
        task, choice, table = run_choose(run, settings, fused=fused, progress=update, say=say)
    finally:
        close()
    click.echo(choice.table())
    click.echo(table)
    if not quiet:
        save_task = run.plan.save_task
        notice(
            f"mlx-slm: kept the {choice.winner}; task saved to {save_task}; "
            f"classify with: mlx-slm classify INPUT --task {save_task}"
        )
    return task


def _finetune_settings(tune: dict[str, Any], seed: int) -> FinetuneSettings:
    """The fine-tuning options as the settings `run_finetune` and `run_choose` take."""
    return FinetuneSettings(
        objective=tune["objective"],
        layers=tune["adapt_layers"],
        rank=tune["rank"],
        scale=tune["lora_scale"],
        dropout=tune["dropout"],
        epochs=tune["epochs"],
        learning_rate=tune["learning_rate"],
        head_learning_rate=tune["head_learning_rate"],
        schedule=tune["schedule"],
        batch_size=tune["train_batch_size"],
        seed=seed,
        val_fraction=tune["val_fraction"],
        patience=tune["patience"],
        max_minutes=tune["max_minutes"],
        head_init=tune["head_init"],
        keep=tune["keep"],
        label_smoothing=tune["label_smoothing"],
        contrastive=tune["contrastive"],
    )


def _check_recipe(ctx: click.Context, tune: dict[str, Any]) -> None:
    """Options that contradict the recipe they would run with: exit 2 naming the option and the fix."""
    typed = given(ctx, tune)
    held = tune["val_fraction"] > 0
    if tune["keep"] == "best" and not held:
        raise click.UsageError(
            "--keep best keeps the epoch with the lowest validation loss: add --val-fraction "
            "(e.g. 0.1), or drop --keep best (the default averages the later epochs)"
        )
    best = tune["keep"] == "best" or (tune["keep"] == "auto" and held)
    if "patience" in typed and not best:
        raise click.UsageError(
            "--patience stops on the validation loss, which only --keep best watches: add "
            "--val-fraction 0.1 (and --keep best), or drop --patience"
        )


def _none_rule(
    ctx: click.Context, data: str, none: dict[str, Any], gold_fields: tuple[str, ...], o: dict[str, Any]
) -> NoneRule:
    """ "None of these" as asked, checked before any work (`_check_none`); with --none-threshold
    auto, --none-data read and checked now, as the threshold's choice will read it after training."""
    threshold = _check_none(ctx, none, gold_fields)
    keys = ("fmt", "text_field", "id_field", "text_column", "id_column")
    read = ReadSpec(**{k: o[k] for k in keys}, gold=gold_fields[0])
    rule = NoneRule(none["none_label"], threshold, none["none_target"], none["none_data"], read)
    if threshold == "auto":  # the held-out data read and checked now, not after the training
        named = _labels(ctx, o).labels if _labels_given(ctx, o) else None
        rule.check(data, named)
    return rule


def _labels_given(ctx: click.Context, o: dict[str, Any]) -> bool:
    return bool((o["labels_csv"] if "labels_csv" in given(ctx, o) else None) or o["labels_file"])


def _check_none(ctx: click.Context, none: dict[str, Any], gold_fields: tuple[str, ...]) -> float | str | None:
    """The "none of these" options, checked before any work: --none-threshold a probability or
    auto (which needs --none-data), --none-target and --none-data only with auto; one classifier."""
    typed = given(ctx, none)
    t = none["none_threshold"]
    if typed and len(gold_fields) > 1:
        raise click.UsageError("--none-label and --none-threshold go with one --gold-field (one classifier)")
    if t is None:
        extra = sorted(typed & {"none_target", "none_data"})
        if extra:
            flag = "--" + extra[0].replace("_", "-")
            raise click.UsageError(f"{flag} chooses --none-threshold auto's threshold: add --none-threshold auto")
        return None
    if t == "auto":
        if not none["none_data"]:
            raise click.UsageError(
                "--none-threshold auto chooses the threshold on held-out labelled texts: give --none-data FILE "
                "(or a number, e.g. --none-threshold 0.5)"
            )
        return "auto"
    try:
        value = float(t)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:  # NaN and the infinities fail too
        raise click.BadParameter(f"{t!r}: give a probability from 0 to 1, or auto", param_hint="'--none-threshold'")
    if "none_data" in typed or "none_target" in typed:
        raise click.UsageError("--none-data and --none-target choose --none-threshold auto's threshold: drop them")
    return value
