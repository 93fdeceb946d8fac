"""`parity`: the MLX path against Transformers (labels and logits), or a head's features."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from ..classifier.plan import Plan
from ..classifier.task import Task
from ..files.readers import read_rows
from ..ground.errors import UserError
from ..jobs.decide import state_problem
from ..jobs.plan import CommandLabels, DecisionOptions, read_labels, resolve_decisions
from ..parity.chat import format_chat_report, run_chat_parity
from ..parity.decisions import format_decision_report, run_decision_parity
from ..parity.embeddings import format_embed_report, run_embed_parity
from ..parity.finetune import format_finetune_report, run_finetune_parity
from ..parity.labels import (
    Ours,
    default_reference,
    format_head_report,
    format_question_report,
    format_report,
    is_quantized_dir,
    run_head_parity,
    run_parity,
    run_question_parity,
)
from ..parity.reference import require_torch
from ..parity.seqcls import format_rerank_report, format_seqcls_report, run_rerank_parity, run_seqcls_parity
from ..text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE, PromptFormat, check_template
from ..text.questions import DEFAULT_SYSTEM as Q_SYSTEM
from ..text.questions import DEFAULT_TEMPLATE as Q_TEMPLATE
from ..text.questions import read_questions
from ..text.seqcls import SeqClsHead
from ..text.workload import sample, tickets
from ..weights.registry import BUILTINS, DEFAULT_MODEL, ModelRef
from ..weights.sources import materialise
from .base import ESCAPES_HELP, Command, escapes, notice, number, warn_blas
from .options import keep_quantized_option


@click.command(cls=Command)
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Model for the MLX path (name or dir).")
@click.option(
    "--reference",
    "-r",
    default=None,
    help="Original checkpoint for Transformers (default: the model's source). A quantized directory "
    "needs none: (a) runs on its dequantized values, (b) on the source its record names, if any.",
)
@click.option(
    "--n", default=40, show_default=True, type=number("n"), help="Items (a length-stratified workload sample)."
)
@click.option(
    "--input",
    "input_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Texts to use instead (any classify input).",
)
@click.option("--labels", "-l", "labels_csv", default=",".join(DEFAULT_LABELS), show_default=True)
@click.option(
    "--labels-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Labels from a file, as classify reads it (overrides --labels): many labels are checked in one trie pass.",
)
@click.option(
    "--system",
    default=DEFAULT_SYSTEM,
    callback=escapes,
    help="System message; {labels} and {label_descriptions} as classify. " + ESCAPES_HELP,
)
@click.option("--template", default=DEFAULT_TEMPLATE, callback=escapes, help=ESCAPES_HELP)
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), help="Compute dtype of the MLX path.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report.")
@click.option("--strict", is_flag=True, help="Also fail on conversion drift (label disagreement in (b)).")
@click.option(
    "--task",
    "task_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A task with a learned head (mlx-slm train): check its features and labels against Transformers' "
    "hidden_states at the head's layer (model and prompt from the task). A fine-tuned task (train --finetune): "
    "its labels and probabilities against Transformers with the adapters merged (float32 unless --dtype). With "
    "--decisions: a task fitted or trained on decisions (its trained questions checked too).",
)
@click.option(
    "--questions",
    "questions_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Several questions (as classify --questions): every answer of the one pass against Transformers "
    "scoring each question's full prompt afresh.",
)
@click.option(
    "--reranker",
    type=click.Choice(["auto", "seqcls", "qwen3", "question"]),
    help="Check a reranker's scores: every (query, document) of --input (text, text_pair) against "
    "Transformers scoring the pair alone (auto: a one-label sequence classifier, or qwen3 for a model "
    "named *Reranker*).",
)
@click.option("--instruction", help="The qwen3 reranker's instruction (default: the model card's).")
@click.option(
    "--chat",
    is_flag=True,
    help="Check the chat-completion route (/v1/chat/completions): each text as a conversation (--system, "
    "--template), its prompt ids against Transformers' apply_chat_template, its next token's top 20 "
    "log-probabilities against Transformers, and its guided_choice of --labels against classify's.",
)
@click.option(
    "--threshold",
    type=number("threshold"),
    help="A multi-label sequence classifier: its labels at or above this probability are its answer (0.5).",
)
@keep_quantized_option()
@click.option(
    "--embeddings",
    is_flag=True,
    help="Check embeddings (the default for a sentence-transformers folder) against sentence-transformers' "
    "encode, each text alone (a causal LM: Transformers' last hidden state at the last token).",
)
@click.option("--prompt-name", help="--embeddings: the folder's named prompt before each text.")
@click.option(
    "--decisions",
    "decisions_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Typed decisions (as `decide` asks them): every question of Q.json about each state (--input's state "
    "or text, else workload tickets, some as JSON objects and arrays) against Transformers' own decision "
    "path (transformers.decision, float32, one prompt per question); the largest difference reported.",
)
def parity(
    model: str,
    reference: str | None,
    n: int,
    input_path: str | None,
    labels_csv: str,
    labels_file: str | None,
    system: str,
    template: str,
    dtype: str | None,
    as_json: bool,
    strict: bool,
    keep_quantized: bool | None,
    task_file: str | None = None,
    questions_file: str | None = None,
    reranker: str | None = None,
    instruction: str | None = None,
    threshold: float | None = None,
    chat: bool = False,
    embeddings: bool = False,
    prompt_name: str | None = None,
    decisions_file: str | None = None,
) -> None:
    """Check that the MLX path gives Transformers' labels and logits.

    Exit status 1 on any label disagreement or a logit difference past tolerance in
    (a) forward exactness; (b) conversion drift fails only with --strict. For an
    MLX-quantized directory, (a) runs Transformers on its dequantized values and (c)
    checks our labels against mlx-lm's own forward on the directory (a failure too).

    A sequence-classification checkpoint (*ForSequenceClassification) is checked against
    AutoModelForSequenceClassification and the text-classification pipeline (answers equal,
    probabilities within 1e-4 in float32, our encodings the pipeline's), pairs included
    (text_pair in a JSONL/Parquet --input); no --reference is needed. --reranker checks a
    reranker's scores of (query, document) = (text, text_pair) against each pair scored alone.

    Docs: docs/parity.md
    """

    warn_blas()
    require_torch()  # the reference runs in a child process: a missing extra is exit 2 here, not a bug there
    ctx = click.get_current_context()
    run = _Parity.of(ctx)
    if decisions_file:
        run.decisions(decisions_file, task_file)
        return
    if task_file:
        run.task(task_file)
        return
    if chat:  # the chat route: Transformers on the weights we run (no --reference)
        return run.chat(ctx.params)
    if embeddings or prompt_name is not None or _sentence_transformers(model):
        return run.embed(prompt_name)
    if reranker is not None:
        run.rerank(reranker, instruction, questions_file)
        return
    if run.seqcls(questions_file, strict):
        return
    if threshold is not None or instruction is not None:
        raise click.UsageError("--threshold and --instruction go with a sequence classifier or --reranker")
    run = replace(run, reference=_reference_for(model, reference))
    if questions_file:
        run.questions(questions_file)
        return
    run.labels(labels_csv, labels_file, strict)


def _reference_for(model: str, reference: str | None) -> str:
    """--reference, or the one a built-in name or a quantized directory implies."""
    if reference is not None:
        return reference
    if model in BUILTINS:
        return model
    if is_quantized_dir(model):
        return default_reference(model)
    raise click.UsageError("--reference is needed unless --model is a built-in name or a quantized directory")


def _sentence_transformers(model: str) -> bool:
    """Whether `model` is a sentence-transformers folder (its modules.json; converted, it keeps it)."""

    return model not in BUILTINS and (materialise(model) / "modules.json").is_file()


def _say(m: str) -> None:
    notice(f"mlx-slm: {m}")


def _report(r: dict[str, Any], as_json: bool, text: Any, ok: bool) -> None:
    """The report printed (JSON, or `text(r)`); exit 1 unless `ok`."""
    click.echo(json.dumps(r, indent=2) if as_json else text(r))
    if not ok:
        sys.exit(1)


@dataclass(frozen=True)
class _Parity:
    """One `parity` run's options, read once (`of`): the plan (the model as the MLX path loads
    it, `ModelRef`: --model, --dtype, --keep-quantized/--dequantize; the prompt: --system,
    --template), the --reference, the items (--n, --input), which of the prompt and label
    options were typed, the report's form and a multi-label answer threshold; each check is a
    method."""

    plan: Plan
    reference: str | None
    n: int
    input_path: str | None
    typed: frozenset[str]
    as_json: bool
    threshold: float | None

    @classmethod
    def of(cls, ctx: click.Context) -> _Parity:
        p = ctx.params
        typed = frozenset(
            k
            for k in ("system", "template", "labels_csv", "labels_file", "model")
            if ctx.get_parameter_source(k).name != "DEFAULT"
        )
        model = ModelRef(p["model"], p["dtype"], p["keep_quantized"])
        plan = Plan(model=model, system=p["system"], template=p["template"])
        return cls(plan, p["reference"], p["n"], p["input_path"], typed, p["as_json"], p["threshold"])

    @property
    def model(self) -> ModelRef:
        assert self.plan.model is not None  # `of` names it
        return self.plan.model

    @property
    def prompt(self) -> tuple[str, str]:
        """(system, template) as given, used where typed (`typed`) by a chat prompt."""
        return self.plan.system or "", self.plan.template

    @property
    def ours(self) -> Ours:
        """How our side loads the model (the plan's `ModelRef`) and says its steps."""
        return Ours(self.model, progress=_say)

    @property
    def run_kwargs(self) -> dict[str, Any]:
        chat = {"system", "template"} & self.typed
        return {"ours": self.ours, "prompt": self.chat_prompt if chat else None}

    @property
    def chat_prompt(self) -> tuple[str | None, str]:
        """(system, template) as typed ({text}, {pair}, a question reranker's {query} checked);
        the system message only where typed."""
        system = (self.prompt[0] or None) if "system" in self.typed else None
        return system, check_template(self.prompt[1], placeholders=("text", "pair", "query"))

    def texts(self, model: str, system: str, template: str) -> list[Any]:
        """--input's first texts, or a length-stratified workload sample in this prompt."""
        return (
            _input_texts(self.input_path, self.n)
            if self.input_path
            else _workload_sample(model, self.n, system, template)
        )

    def labels(self, labels_csv: str, labels_file: str | None, strict: bool) -> None:
        """Zero-shot labels (`parity/labels.py`): exit 1 on a disagreement or past tolerance."""
        got = read_labels(labels_csv, labels_file)
        labels = got.labels
        assert labels is not None  # --labels has a default
        # As typed: every {word} checked, {{ }} literal braces (before any work).
        system, template = self._filled(got), check_template(self.prompt[1])
        texts = self.texts(self.model.name, system, template)
        m = self.model
        r = run_parity(m.name, self.reference, texts, labels, system or None, template, self.ours)
        ok = r["forward_ok"] and r.get("mlxlm_ok", True) and not (strict and not r["drift_ok"])
        _report(r, self.as_json, format_report, ok)

    def _filled(self, got: CommandLabels) -> str:
        """The system message with the labels filled in as typed (`Plan.with_labels`)."""
        return self.plan.with_labels(got.labels or [], got.descriptions, typed=True).system or ""

    def chat(self, o: dict[str, Any]) -> None:
        """`parity --chat` (`parity/chat.py`), with the command's options by name."""

        if o["reranker"] or o["questions_file"] or o["reference"] or o["threshold"] is not None or o["task_file"]:
            raise click.UsageError(
                "--chat checks the chat route on --model: drop --reranker, --questions, --reference, --threshold and --task"
            )
        got = read_labels(o["labels_csv"], o["labels_file"])
        assert got.labels is not None  # --labels has a default
        system, template = self._filled(got), check_template(self.prompt[1])
        texts = self.texts(self.model.name, system, template)
        m = self.model
        r = run_chat_parity(m.name, texts, got.labels, system or None, template, self.ours)
        _report(r, self.as_json, format_chat_report, r["ok"])

    def decisions(self, path: str, task_file: str | None = None) -> None:
        """`parity --decisions` (`parity/decisions.py`): exit 1 past tolerance or on a disagreement.
        With `--task` (fitted or trained on decisions), its trained questions are checked too."""
        m = self.model
        given = frozenset({"model"} & self.typed)
        # float32 weights unless a task pins others (its fits were made on the weights it names)
        dtype = m.dtype or (None if task_file else "float32")
        opts = DecisionOptions(m.name, dtype, m.keep_quantized, task_file, path, given=given)
        plan = resolve_decisions(opts)  # a bad questions file: exit 2 before any model loads
        if self.input_path:
            rows = read_rows(self.input_path, states=("state", "text"))
            states: list[Any] = [r.text for r in rows if r.error is None and not state_problem(r)][: self.n]
            if not states:
                raise UserError(f"--input {self.input_path} has no state to ask (no valid rows): give it some")
        else:  # tickets, every third as a JSON object and every fifth as an array: the state's three types
            states = [
                {"ticket": t, "n": i} if i % 3 == 2 else [t, i] if i % 5 == 4 else t
                for i, t in enumerate(_stratified(self.n))
            ]
        r = run_decision_parity(plan, states, reference=self.reference, progress=_say)
        _report(r, self.as_json, format_decision_report, r["ok"])

    def embed(self, prompt_name: str | None) -> None:
        """Embeddings (`parity/embeddings.py`) against sentence-transformers' encode."""
        texts = _input_texts(self.input_path, self.n) if self.input_path else _stratified(self.n)
        if any(not isinstance(t, str) for t in texts):
            raise click.UsageError("--embeddings embeds texts: --input's rows have a text_pair; give texts alone")
        m = self.model
        r = run_embed_parity(
            m.name, texts, prompt_name=prompt_name, reference=self.reference, dtype=m.dtype, progress=_say
        )
        _report(r, self.as_json, format_embed_report, r["forward_ok"])

    def questions(self, path: str) -> None:
        """Several questions (`parity/labels.py`): every answer of the one pass against each
        question's full prompt scored afresh."""
        questions = read_questions(path)
        system = Q_SYSTEM if self.prompt[0] == DEFAULT_SYSTEM else self.prompt[0]
        template = Q_TEMPLATE if self.prompt[1] == DEFAULT_TEMPLATE else self.prompt[1]
        texts = _input_texts(self.input_path, self.n) if self.input_path else _stratified(self.n)
        m = self.model
        r = run_question_parity(m.name, self.reference, texts, questions, system or None, template, self.ours)
        _report(r, self.as_json, format_question_report, r["forward_ok"])

    def task(self, task_file: str) -> None:
        """A task's learned head (its features and labels), or its fine-tuned adapters merged
        (`parity/finetune.py`); the model and prompt are the task's."""
        t = Task.load(task_file)
        if t.finetune is None and t.head is None:
            if t.decisions_fitted:  # train --decisions / eval --fit: its questions are checked with them
                raise click.UsageError(
                    f"--task {task_file} is a task of decision questions: check it with its questions "
                    f"(mlx-slm parity --decisions Q.json --task {task_file})"
                )
            raise click.UsageError(
                f"--task {task_file} has no learned head: parity --task checks heads (mlx-slm train)"
            )
        texts = self.texts(t.model, t.system or "", t.template)
        if t.finetune is not None:
            r = run_finetune_parity(t, texts, self.ours)
            _report(r, self.as_json, format_finetune_report, r["forward_ok"])
            return
        r = run_head_parity(t, texts, self.ours)
        _report(r, self.as_json, format_head_report, r["forward_ok"])

    def seqcls(self, questions_file: str | None, strict: bool) -> bool:
        """Parity of the model if it is a sequence classifier (False: it is not; nothing ran)."""

        model = self.model.name
        if model in BUILTINS:
            return False
        head = SeqClsHead.from_config(json.loads((materialise(model) / "config.json").read_text()))
        if head is None:
            return False
        if questions_file or {"labels_csv", "labels_file"} & self.typed:
            raise click.UsageError(f"--labels/--labels-file/--questions: {head.no_lm_head()}")
        items = self.items(pairs=True) if self.input_path else _seqcls_sample(self.n, self._takes_pairs(head))
        r = run_seqcls_parity(model, self.reference, items, threshold=self.threshold, **self.run_kwargs)
        _report(r, self.as_json, format_seqcls_report, r["forward_ok"] and not (strict and not r["drift_ok"]))
        return True

    def _takes_pairs(self, head: Any) -> bool:
        """Whether the prompt a sequence classifier runs takes a second text: the text as the
        tokenizer encodes a pair, or a chat prompt (typed, or the one an export records) whose
        template holds {pair}."""
        chat = self.run_kwargs["prompt"]
        if chat is None and head.prompt is None:
            return True
        typed = chat[1] if chat is not None and "template" in self.typed else None
        return "{pair}" in (typed or (head.prompt or {}).get("template") or DEFAULT_TEMPLATE)

    def rerank(self, reranker: str, instruction: str | None, questions_file: str | None) -> None:

        if questions_file or {"labels_csv", "labels_file"} & self.typed or self.threshold is not None:
            raise click.UsageError("--reranker scores (query, document) pairs: drop --labels, --questions, --threshold")
        if self.input_path:
            pairs = [x for x in self.items(pairs=True) if isinstance(x, tuple)]
            if not pairs:
                raise UserError(
                    f"--input {self.input_path} has no (query, document) pair: give each row a text (the query) "
                    "and a text_pair (the document)"
                )
        else:
            pairs = _rerank_sample(self.n)
        kw = self.run_kwargs
        if reranker != "question" and kw["prompt"] is not None:
            raise click.UsageError("--system/--template go with --reranker question (a yes/no prompt of your own)")
        r = run_rerank_parity(self.model.name, *zip(*pairs), reranker=reranker, instruction=instruction, **kw)
        _report(r, self.as_json, format_rerank_report, r["forward_ok"])

    def items(self, pairs: bool) -> list[Any]:
        """The first `n` readable items of --input: a text, or (text, text_pair) where a JSONL or
        Parquet row has one (see `_input_texts` for the rows skipped)."""

        assert self.input_path is not None
        fmt = Path(self.input_path).suffix.lower()
        pair = "text_pair" if pairs and fmt in (".jsonl", ".json", ".parquet", ".ndjson") else None
        return _input_texts(self.input_path, self.n, rows=read_rows(self.input_path, pair=pair))


def _seqcls_sample(n: int, pairs: bool = True) -> list[Any]:
    """`n` workload tickets, length-stratified; every fourth one paired with the ticket after it
    (where the prompt takes pairs)."""
    every = _stratified(n + 1)
    return [(t, every[i + 1]) if pairs and i % 4 == 3 else t for i, t in enumerate(every[:n])]


RERANK_QUERIES = ("card charged twice", "app crashes on login", "reset my password", "refund status")


def _rerank_sample(n: int) -> list[tuple[str, str]]:
    """`n` (query, document) pairs: workload tickets as documents, four queries in turn."""
    return [(RERANK_QUERIES[i % len(RERANK_QUERIES)], t) for i, t in enumerate(_stratified(n))]


def _stratified(n: int) -> list[str]:
    """`n` workload tickets (at most 600), length-stratified."""

    every = [t for t, _ in tickets(600)]
    order = sorted(range(600), key=lambda i: len(every[i]))
    return [every[order[int(k * 600 / n)]] for k in range(min(n, 600))]


def _input_texts(input_path: str, n: int, rows: Any = None) -> list[Any]:
    """The first `n` readable texts of --input (`rows`: as `files.readers.read_rows` reads them, its pairs
    as (text, pair)); the rows that cannot be read are skipped, and a notice on stderr says how
    many and on which lines (the report covers only the rest)."""

    texts: list[Any] = []
    skipped: list[int] = []
    for r in read_rows(input_path) if rows is None else rows:
        if len(texts) >= n:
            break
        if r.error is None:
            texts.append(r.text if r.pair is None else (r.text, r.pair))
        else:
            skipped.append(r.line)
    if not texts:
        raise UserError(f"--input {input_path} has no text to classify (no valid rows): give it some items")
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        notice(
            f"mlx-slm: note: --input {input_path}: {len(skipped)} row(s) that cannot be read were skipped "
            f"(line {shown}); parity ran on {len(texts)} text(s)"
        )
    return texts


def _workload_sample(model: str, n: int, system: str, template: str) -> list[str]:
    from transformers import AutoTokenizer  # lazy: transformers is slow to import, and only a workload sample needs it

    tok = AutoTokenizer.from_pretrained(str(materialise(model)))
    return sample(tok, n, PromptFormat(system or None, template))[1]
