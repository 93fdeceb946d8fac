"""How RIGHT typed decisions are, per method, with `classify`'s figures on the same rows beside them.

    python -m benchmarks.decision_accuracy [--model qwen2.5-coder-0.5b] [--sets tickets,posts,banking77,clinc150]
        [--n-test tickets=150] [--n-train posts=100] [--out benchmarks/results] [--tag decision-accuracy]
        [--posts /tmp/tweeteval] [--banking77 DIR] [--clinc150 DIR] [--ways letters,names,letters2,names2,prompt,prompt2 (all)]
        [--cache DIR] [--probe N]

Each data set has a TRAIN split (what learns from labels) and a TEST split (what every method
is scored on), drawn seeded and stratified by label, and ONE `choice` question (System One's form)
whose options are the labels:

* `tickets`: the seed workload's 600 tickets (`mlx_slm.text.workload.tickets`), "Which team should
  handle this support ticket?" (billing / technical / account, with descriptions); train 20 per
  team, test the rest (`--n-test tickets=N`: N of the rest, length-stratified per team);
* `posts`: TweetEval sentiment (`--posts`: val_text.txt, val_labels.txt, test_text.txt,
  test_labels.txt, mapping.txt; github.com/cardiffnlp/tweeteval, datasets/sentiment), "What is
  the sentiment of this post?"; train 100 per label from val, test 100 per label from test;
* `banking77` (`--banking77`: train.csv, test.csv, categories.json): the 77 intents as options
  (beyond 26 options they are scored by their own names); train 10 per intent, test
  `--n-test banking77=N` (N / 77 per intent) from test.csv;
* `clinc150` (`--clinc150`: data_full.json): the 150 intents and "none of these" (out of scope).

Every way of asking (`--ways`: letters = Transformers' DECISION_PROMPT; names = the options' own
names; prompt = the names style's question as the system message, the state as the user's; x2 =
both option orders averaged) runs ONCE over the TRAIN and the TEST rows (a `Decider`
each, state cache off, each split timed); every method below reads those raw answers:

* per way: `raw`; `batch` (divided by the mean raw answer over the TEST states, the first
  `DEFAULT_WARMUP` in input order: what `decide --calibrate batch` does); `contextual` (divided by
  the answer to content-free states, `Decider.contextual_prior`);
* `fitted`: `fit_question` on every way's TRAIN answers (a bias per option and a temperature, the
  way chosen by cross-validated accuracy), its method applied to the chosen way's TEST answers;
* `fit-prior`: the batch prior of the TRAIN states (no gold: `eval --fit-prior`) on TEST;
* `trained head`: `train_question` on TRAIN (the decision prompt's hidden states where the answer
  is read), answered on TEST by a `Decider` holding the head (`Methods.of([Method(head=...)])`: its
  own pass, timed);
* `trained head (question prompt)`: `train --decisions --head-prompt question` on TRAIN
  (`run_train_decisions`: classify's head on the question's own prompt, the state its text, in a
  decision task), answered on TEST by `decide --task`'s `Decider`; cheap enough for every set;
* `fine-tuned (LoRA)`: `train --decisions --finetune lora` on TRAIN (`run_train_decisions`: the
  question's own classifier, fine-tuned by classify's machinery at its defaults, saved beside a
  decision task), answered on TEST by `decide --task`'s `Decider` (its own pass, timed);
  `--no-tune SETS` skips it (said not run); `--tuned-only SETS` runs it, the question-prompt head
  and classify's rows only (every other method needs the decision prompt over each state, which lists every option:
  BANKING77's 77 options are ~750 tokens a state, about an hour a pass here); `--untrained-only
  SETS` the other way round: each way over TEST only (raw, batch, contextual) and classify's label
  scoring, what learns from TRAIN said not run (the many-option sets' untrained figures, on fewer rows);
* beside them, `classify` on the same TEST rows: label scoring raw, with a batch prior
  (`fit_batch` over TEST), a learned head (`train_head` on TRAIN), and fine-tuned (`train --finetune
  lora` with the set's classify prompt on TRAIN, `classify --task` on TEST; `--no-tune` skips it too).

Each goal of issue 55 is read twice: against its figure, and against classify's best of the same
tier on the same rows (the issue's promise: decisions at least as right as classify), with the
gap's 95 % interval from a paired bootstrap of the TEST rows (each row's answer is kept in the JSON).

Figures: accuracy, macro-F1, ECE of the top probability, automation at 5 % error (the largest
share of TEST rows, most confident first, whose answers are at least 95 % right:
`metrics.threshold_for_accuracy`), tokens and seconds per TEST row of the passes a method needs at
answer time, and what learning it cost (train s). `--cache DIR` keeps each pass's raw answers
(keyed by the model's weights, the question, the way and the rows), and each fine-tune's TEST
answers (keyed by the weights, the prompt, the settings, TRAIN and TEST), so a run can be resumed; a
pass read back keeps its measured seconds and says "cached". `--probe N` only times N TEST
prompts of each set per way (sizing a run). Results: `--out`/TAG.{json,md,png}; `--merge` keeps
the sets TAG.json already has that this run does not run (each set keeps its own command line).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.heads import BANKING_SYSTEM, BANKING_TEMPLATE
from benchmarks.record import run_line, run_record
from mlx_slm.classifier.classifier import Classifier
from mlx_slm.classifier.decider import Decider
from mlx_slm.classifier.plan import Plan
from mlx_slm.engine.engine import Engine
from mlx_slm.files.readers import ReadSpec
from mlx_slm.jobs.finetune import run_finetune
from mlx_slm.jobs.plan import DecisionOptions, resolve_decisions
from mlx_slm.jobs.train import HeadOptions, Trace, TrainRun, train_head
from mlx_slm.jobs.train_decisions import DecisionTrainRun, run_train_decisions, train_question
from mlx_slm.text.calibration import DEFAULT_WARMUP, fit_batch
from mlx_slm.text.decisions.fitting import batch_prior, figures, fit_question, prior_of
from mlx_slm.text.decisions.methods import Method, Methods, tuned_prompt
from mlx_slm.text.decisions.questions import DecisionQuestion, DecisionRequest
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import systemone_questions
from mlx_slm.text.heads import Head
from mlx_slm.text.metrics import confusion, macro_f1, threshold_for_accuracy
from mlx_slm.text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from mlx_slm.text.workload import stratified_sample, tickets
from mlx_slm.weights.finetune import FinetuneSettings
from mlx_slm.weights.registry import ModelRef

WAYS = {
    "letters": ("letters", 1),
    "names": ("names", 1),
    "letters2": ("letters", 2),
    "names2": ("names", 2),
    "prompt": ("prompt", 1),
    "prompt2": ("prompt", 2),
}
WAY_NAMES = {v: k for k, v in WAYS.items()}
SETS = ("tickets", "posts", "banking77", "clinc150")
N_TRAIN = {"tickets": 20, "posts": 100, "banking77": 10, "clinc150": 10}  # per label
N_TEST = {"tickets": 0, "posts": 300, "banking77": 231, "clinc150": 151}  # in all (0: every row left)
TARGET = 0.95  # automation at 5 % error
NONE_OF_THESE = "none of these"
TEAMS = {"billing": "payments, invoices, refunds, charges", "technical": "bugs, crashes, errors",
         "account": "login, profile, email, password"}  # fmt: skip
POSTS_SYSTEM = "You classify the sentiment of social media posts. Answer with exactly one of: {labels}."
POSTS_TEMPLATE = "Post: {text}\nSentiment:"
CLINC_SYSTEM = "You classify requests to a virtual assistant by their intent. The intents: {labels}."
CLINC_TEMPLATE = "Request: {text}\nIntent:"
# The goals of issue 55: (set, which rows, what, figure, at least); which rows: "prior" (a prior that needs no
# labels: batch, contextual, fit-prior), "untrained" (any way, raw or with such a prior), "trained" (a head
# or a fine-tune: what `train --decisions` trains).
GOALS = (
    ("tickets", "prior", "with a prior (batch, contextual or fit-prior: no labels)", "accuracy", 0.90),
    ("tickets", "trained", "trained (a head or LoRA)", "accuracy", 0.93),
    ("posts", "untrained", "untrained (a style and a prior)", "macro_f1", 0.60),
    ("posts", "trained", "trained (a head or LoRA)", "macro_f1", 0.72),
    ("banking77", "trained", "trained (a head or LoRA; the goal: at 10 per intent)", "accuracy", 0.86),
)
TRAINED = ("trained head", "trained head (question prompt)", "fine-tuned (LoRA)")
# Each goal's classify counterpart on the same rows, the same tier: what no labels give (label scoring, raw
# or with the batch prior) or what labels train (a learned head, a fine-tune). The issue's promise: decisions
# at least as right as classify on the same model and rows.
CLASSIFY_TIER = {
    "prior": ("classify: labels + batch prior",),
    "untrained": ("classify: labels raw", "classify: labels + batch prior"),
    "trained": ("classify: learned head", "classify: fine-tuned (LoRA)"),
}
RESAMPLES = 2000  # the paired bootstrap of a goal's gap to classify


@dataclass
class DataSet:
    """One set: its question (System One's form), its labels (= the options, in order), the
    classify prompt, TRAIN and TEST as (text, label index), and how they were drawn."""

    name: str
    question: dict[str, Any]
    labels: tuple[str, ...]
    system: str
    template: str
    train: list[tuple[str, int]]
    test: list[tuple[str, int]]
    drawn: str
    source: str = ""


# ---------------------------------------------------------------------------- data
def _draw(rows: list[tuple[str, int]], k: int, per: int, rng: np.random.Generator) -> list[int]:
    """`per` row indices of each of `k` labels, at random (all of a label's rows where it has fewer)."""
    out = []
    for c in range(k):
        have = [i for i, (_, g) in enumerate(rows) if g == c]
        out += [have[i] for i in rng.permutation(len(have))[:per]]
    return out


def _shuffled(rows: list[tuple[str, int]], seed: int) -> list[tuple[str, int]]:
    """TEST in a seeded random order (a batch prior's first states are then a random sample)."""
    return [rows[i] for i in np.random.default_rng(seed + 1).permutation(len(rows))]


def load_tickets(n_train: int, n_test: int, seed: int) -> DataSet:
    rows = [(t, DEFAULT_LABELS.index(g)) for t, g in tickets(600)]
    rng = np.random.default_rng(seed)
    tr = _draw(rows, 3, n_train, rng)
    rest = [i for i in range(len(rows)) if i not in set(tr)]
    if n_test:  # per team, spread over the length-sorted order (the workload's length distribution)
        te = []
        for c in range(3):
            mine = [i for i in rest if rows[i][1] == c]
            te += [mine[j] for j in stratified_sample([len(rows[i][0].split()) for i in mine], n_test // 3)]
        how = f"train {n_train} per team at random; test {n_test // 3} per team of the rest, length-stratified"
    else:
        te, how = rest, f"train {n_train} per team at random; test every other ticket"
    q = {"team": {"type": "choice", "instructions": "Which team should handle this support ticket?", "criteria": TEAMS}}
    source = "the seed workload (mlx_slm.text.workload.tickets(600))"
    train, test = [rows[i] for i in tr], _shuffled([rows[i] for i in te], seed)
    return DataSet("tickets", q, DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE, train, test, how, source)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def load_posts(root: Path, n_train: int, n_test: int, seed: int) -> DataSet:
    names = [line.split("\t")[1].strip() for line in _lines(root / "mapping.txt") if line.strip()]
    split = {
        s: [(t.strip(), int(g)) for t, g in zip(_lines(root / f"{s}_text.txt"), _lines(root / f"{s}_labels.txt"))]
        for s in ("val", "test")
    }
    rng = np.random.default_rng(seed)
    k = len(names)
    train = [split["val"][i] for i in _draw(split["val"], k, n_train, rng)]
    test = [split["test"][i] for i in _draw(split["test"], k, n_test // k, rng)]
    q = {"sentiment": {"type": "choice", "instructions": "What is the sentiment of this post?", "criteria": dict.fromkeys(names)}}  # fmt: skip
    how = f"train {n_train} per label at random from val; test {n_test // k} per label at random from test"
    source = f"TweetEval sentiment (github.com/cardiffnlp/tweeteval, datasets/sentiment), read from {root}"
    return DataSet("posts", q, tuple(names), POSTS_SYSTEM, POSTS_TEMPLATE, train, _shuffled(test, seed), how, source)


def load_banking77(root: Path, n_train: int, n_test: int, seed: int) -> DataSet:
    intents = json.loads((root / "categories.json").read_text())
    labels = tuple(x.replace("_", " ") for x in intents)  # the options read as words: "card arrival"
    index = {x: i for i, x in enumerate(intents)}

    def read(name: str) -> list[tuple[str, int]]:
        with open(root / name, encoding="utf-8") as f:
            return [(r["text"], index[r["category"]]) for r in csv.DictReader(f)]

    tr_all, te_all = read("train.csv"), read("test.csv")
    rng = np.random.default_rng(seed)
    k = len(labels)
    train = [tr_all[i] for i in _draw(tr_all, k, n_train, rng)]
    test = [te_all[i] for i in _draw(te_all, k, max(1, n_test // k), rng)]
    q = {
        "intent": {"type": "choice", "instructions": "What does the customer want?", "criteria": dict.fromkeys(labels)}
    }
    how = f"train {n_train} per intent at random from train.csv; test {max(1, n_test // k)} per intent from test.csv"
    source = f"BANKING77 (PolyAI, CC-BY-4.0), read from {root}"
    return DataSet("banking77", q, labels, BANKING_SYSTEM, BANKING_TEMPLATE, train, _shuffled(test, seed), how, source)


def load_clinc150(root: Path, n_train: int, n_test: int, seed: int) -> DataSet:
    data = json.loads((root / "data_full.json").read_text())
    intents = sorted({g for _, g in data["train"]})
    labels = (*(x.replace("_", " ") for x in intents), NONE_OF_THESE)
    index = {**{x: i for i, x in enumerate(intents)}, "oos": len(intents)}
    rows = {s: [(t, index[g]) for t, g in data[s] + data[f"oos_{s}"]] for s in ("train", "test")}
    rng = np.random.default_rng(seed)
    k = len(labels)
    train = [rows["train"][i] for i in _draw(rows["train"], k, n_train, rng)]
    test = [rows["test"][i] for i in _draw(rows["test"], k, max(1, n_test // k), rng)]
    criteria = {**dict.fromkeys(labels[:-1]), NONE_OF_THESE: "the request fits none of the other intents"}
    q = {"intent": {"type": "choice", "instructions": "What does the user want?", "criteria": criteria}}
    how = (
        f"train {n_train} per intent (and out of scope) from train; test {max(1, n_test // k)} per intent "
        "(and out of scope) from test"
    )
    source = f"CLINC150 (Larson et al. 2019, CC-BY-3.0), read from {root}"
    return DataSet("clinc150", q, labels, CLINC_SYSTEM, CLINC_TEMPLATE, train, _shuffled(test, seed), how, source)


def load_set(name: str, a: argparse.Namespace) -> DataSet:
    sizes = (a.n_train[name], a.n_test[name], a.seed)
    if name == "tickets":
        return load_tickets(*sizes)
    load = {"posts": load_posts, "banking77": load_banking77, "clinc150": load_clinc150}[name]
    return load(Path(getattr(a, name)), *sizes)


# ---------------------------------------------------------------------------- the passes
def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False, default=str).encode("utf-8")).hexdigest()[:20]


class Passes:
    """Each way's raw answers over a split: run once (timed), kept in memory and (`cache`) on disk."""

    def __init__(self, engine: Engine, config: DecisionConfig, cache: Path | None, chunk: int):
        self.engine, self.config, self.cache, self.chunk = engine, config, cache, chunk
        self.runs: dict[tuple[str, str, str], dict[str, Any]] = {}

    def decider(self, way: tuple[str, int]) -> Decider:
        methods = Methods(default=Method(style=way[0], permute=way[1]))
        return Decider(self.engine, self.config, methods=methods, state_cache=0)

    def get(self, ds: DataSet, q: DecisionQuestion, way: tuple[str, int], split: str) -> dict[str, Any]:
        """{probs (n, k), tokens (n,), seconds, rows, cached} of `way` over `split`'s rows."""
        mem = (ds.name, WAY_NAMES[way], split)
        if mem in self.runs:
            return self.runs[mem]
        texts = [t for t, _ in getattr(ds, split)]
        key = _digest(str(self.engine.weights_sha256), q.digest, way, texts)
        path = self.cache / f"{ds.name}-{WAY_NAMES[way]}-{split}-{key}.json" if self.cache else None
        if path is not None and path.is_file():
            got = json.loads(path.read_text())
            got.update(probs=np.asarray(got["probs"]), tokens=np.asarray(got["tokens"]), cached=True)
            say(f"  {mem}: read back ({got['seconds']:.1f} s when run)")
        else:
            got = self._run(ds.name, q, way, split, texts)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                body = {**got, "probs": got["probs"].tolist(), "tokens": got["tokens"].tolist()}
                path.write_text(json.dumps(body))
        self.runs[mem] = got
        return got

    def note(
        self, name: str, what: str, split: str, rows: int, seconds: float, tokens: Any = None, cached: bool = False
    ) -> None:
        """A pass that is not a way's (a head's features or answers, classify's): its time in the table."""
        tokens = None if tokens is None else np.asarray(tokens)
        self.runs[(name, what, split)] = {"rows": rows, "seconds": seconds, "tokens": tokens, "cached": cached}

    def kept(self, name: str, what: str, parts: Any, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """A fine-tune's TEST answers ({probs (n, k), tokens (n,), seconds, train_s, info}): trained and
        run once, kept in the cache as a way's pass is (keyed by the weights, `what` and `parts`: the
        settings, TRAIN and TEST), read back by a later run (`cached`: True) with its measured seconds."""
        key = _digest(str(self.engine.weights_sha256), what, parts)
        path = self.cache / f"{name}-{what.replace(' ', '_')}-{key}.json" if self.cache else None
        if path is not None and path.is_file():
            got = json.loads(path.read_text())
            got.update(probs=np.asarray(got["probs"]), tokens=np.asarray(got["tokens"]), cached=True)
            say(f"  {name} {what}: read back (trained in {got['train_s']:.0f} s when run)")
            return got
        got = {**compute(), "cached": False}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**got, "probs": got["probs"].tolist(), "tokens": got["tokens"].tolist()}))
        return got

    def _run(self, name: str, q: DecisionQuestion, way: tuple[str, int], split: str, texts: list[str]) -> dict:
        d = self.decider(way)
        probs, tokens, secs = [], [], 0.0
        for k in range(0, len(texts), self.chunk):
            reqs = [DecisionRequest(t, (q,)) for t in texts[k : k + self.chunk]]
            t0 = time.perf_counter()
            res = d.decide(reqs)
            secs += time.perf_counter() - t0
            probs += [np.asarray(r.raw[0], dtype=np.float64) for r in res]
            tokens += [int(r.input_tokens) for r in res]
            say(f"  {name} {WAY_NAMES[way]} {split}: {len(probs)}/{len(texts)} in {secs:.0f} s")
        return {
            "probs": np.stack(probs),
            "tokens": np.asarray(tokens),
            "seconds": secs,
            "rows": len(texts),
            "cached": False,
        }


# ---------------------------------------------------------------------------- figures
def scored(probs: np.ndarray, gold: np.ndarray) -> dict[str, Any]:
    """Accuracy, macro-F1, ECE, Brier, log-loss, and automation at 5 % error, of answers against gold."""
    p = np.asarray(probs, dtype=np.float64)
    p = p / p.sum(axis=1, keepdims=True)
    out = figures(p, gold)
    conf, ok = p.max(axis=1), p.argmax(axis=1) == gold
    thr = threshold_for_accuracy(conf, ok, TARGET)
    out["automation_5"] = 0.0 if thr is None else float(np.mean(conf >= thr))
    out["predicted"] = np.bincount(p.argmax(axis=1), minlength=p.shape[1]).tolist()
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def row(method: str, family: str, probs: Any, gold: np.ndarray, **extra: Any) -> dict[str, Any]:
    """A method's figures on TEST, and its answer to each TEST row (the option's index, in TEST's
    order: what the goals' paired comparison with classify resamples)."""
    answers = np.asarray(probs, dtype=np.float64).argmax(axis=1).tolist()
    return {"method": method, "family": family, "available": True, **scored(probs, gold), **extra, "answers": answers}


def cost(passes: list[dict[str, Any]], n: int) -> dict[str, float]:
    """Tokens and seconds per TEST row of the passes a method runs at answer time."""
    return {
        "tokens_per_row": round(float(sum(p["tokens"].sum() for p in passes)) / n, 1),
        "seconds_per_row": round(sum(p["seconds"] for p in passes) / n, 4),
    }


def way_rows(ds: DataSet, q: DecisionQuestion, passes: Passes, ways: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """raw, batch and contextual for each way, on the TEST rows."""
    gold = np.array([g for _, g in ds.test])
    labels = q.answer_names()
    out = []
    for way in ways:
        te = passes.get(ds, q, way, "test")
        c = cost([te], len(gold))
        w = WAY_NAMES[way]
        out.append(row(f"{w}: raw", "decide", te["probs"], gold, way=w, **c))
        cal = batch_prior(te["probs"], labels, DEFAULT_WARMUP)
        out.append(row(f"{w}: batch prior", "decide", _apply(cal, te["probs"]), gold, way=w, **c))
        d = passes.decider(way)
        t0 = time.perf_counter()
        ctx = d.contextual_prior(q, Method(style=way[0], permute=way[1], prior="contextual"))
        setup = round(time.perf_counter() - t0, 2)
        out.append(row(f"{w}: contextual prior", "decide", _apply(ctx, te["probs"]), gold, way=w, setup_s=setup, **c))
    return out


def _apply(cal: Any, probs: np.ndarray) -> np.ndarray:
    """Each answer as a method with `cal` gives it (`Method.answer`: what the decider applies)."""
    m = Method(calibrator=cal)
    return np.stack([m.answer(p) for p in probs])


def learned_rows(
    ds: DataSet, q: DecisionQuestion, passes: Passes, ways: list[tuple[str, int]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`fitted` and `fit-prior` from the TRAIN passes, applied to TEST; and the fit's report."""
    gold_tr = np.array([g for _, g in ds.train])
    gold = np.array([g for _, g in ds.test])
    labels = q.answer_names()
    train = {w: passes.get(ds, q, w, "train") for w in ways}
    t0 = time.perf_counter()
    fitted = fit_question({w: p["probs"] for w, p in train.items()}, gold_tr, labels, q.key)
    fit_s = time.perf_counter() - t0
    chosen = (fitted.style, fitted.permute)
    learn = round(sum(p["seconds"] for p in train.values()) + fit_s, 1)
    cv = fitted.calibrator.info.get("cv_accuracy_calibrated")
    if fitted.beats_raw:
        m = Method(fitted.style, fitted.permute, "none", fitted.calibrator, None, q.key, q.digest)
        answered = chosen
        te = passes.get(ds, q, chosen, "test")
        final = np.stack([m.answer(p) for p in te["probs"]])
    else:  # `eval --fit --save-task` keeps such a question raw: `decide --task` asks it in the letters, one order
        answered = ("letters", 1) if ("letters", 1) in ways else ways[0]
        te = passes.get(ds, q, answered, "test")
        final = np.asarray(te["probs"], dtype=np.float64)
    kept = {"kept": fitted.beats_raw, "chosen_way": WAY_NAMES[chosen], "cv_accuracy_of_choice": fitted.choice_cv}
    out = [
        row(
            "fitted",
            "decide",
            final,
            gold,
            way=WAY_NAMES[answered],
            train_s=learn,
            cv_accuracy=cv,
            **kept,
            **cost([te], len(gold)),
        )
    ]
    for w in [x for x in ways if x[1] == 1]:
        cal = prior_of(train[w]["probs"], labels, q.key, DEFAULT_WARMUP)
        te = passes.get(ds, q, w, "test")
        learn = round(train[w]["seconds"], 1)
        final = _apply(cal, te["probs"])
        out.append(
            row(
                f"fit-prior ({WAY_NAMES[w]})",
                "decide",
                final,
                gold,
                way=WAY_NAMES[w],
                train_s=learn,
                **cost([te], len(gold)),
            )
        )
    return out, fitted.report()


def head_row(ds: DataSet, q: DecisionQuestion, passes: Passes, folds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A head trained on the decision prompt's hidden states (`train_question` on TRAIN), answered on
    TEST by a `Decider` holding it, as `decide --task` / `serve --task` answer a trained question."""
    gold = np.array([g for _, g in ds.test])
    t0 = time.perf_counter()
    train = ([t for t, _ in ds.train], [ds.labels[g] for _, g in ds.train])
    opts, trace = HeadOptions(folds=folds), Trace(log=lambda m: say(f"  head: {m}"))
    head = train_question(passes.decider(("letters", 1)), q, *train, opts, trace)
    train_s = time.perf_counter() - t0
    passes.note(ds.name, "head features", "train", len(ds.train), head.info["feature_seconds"])
    saved = Methods.of([Method(head=head, key=q.key, digest=q.digest)])
    d = Decider(passes.engine, passes.config, methods=saved, state_cache=0)
    probs, tokens, secs = answered(d, q, ds, passes.chunk, "head")
    passes.note(ds.name, "head", "test", len(ds.test), secs, tokens)
    p = {"tokens": np.asarray(tokens), "seconds": secs}
    cv = head.info.get("chosen", {}).get("accuracy")
    info = {"name": head.name, "estimator": head.estimator, "cv_accuracy": cv, "train_s": round(train_s, 1)}
    r = row("trained head", "decide", np.stack(probs), gold, train_s=round(train_s, 1), **cost([p], len(gold)))
    return {**r, "cv_accuracy": cv}, info


def answered(d: Decider, q: DecisionQuestion, ds: DataSet, chunk: int, trained: str) -> tuple[list, list, float]:
    """TEST answered by `d`, whose method for `q` is `trained` (checked on every answer), `chunk`
    requests a call: (probabilities per row, input tokens per row, seconds in all)."""
    probs, tokens, secs = [], [], 0.0
    for k in range(0, len(ds.test), chunk):
        t1 = time.perf_counter()
        res = d.decide([DecisionRequest(t, (q,)) for t, _ in ds.test[k : k + chunk]])
        secs += time.perf_counter() - t1
        assert all(r.applied[0].get("trained") == trained for r in res), res[0].applied
        probs += [np.asarray(r.probabilities[0]) for r in res]
        tokens += [r.input_tokens for r in res]
        say(f"  {ds.name} {trained} test: {len(probs)}/{len(ds.test)} in {secs:.0f} s")
    return probs, tokens, secs


def classify_rows(
    ds: DataSet, engine: Engine, passes: Passes, a: argparse.Namespace, untrained: bool = False
) -> list[dict[str, Any]]:
    """`classify` on the same TEST rows: label scoring raw and with a batch prior, a learned head, and
    (unless `--no-tune`) a fine-tune: each tier of the decision methods has its classify counterpart
    (`untrained`: the label scoring only, what learns from TRAIN said not run)."""
    folds = a.folds
    gold = np.array([g for _, g in ds.test])
    texts = [t for t, _ in ds.test]
    probs, st = _classify(Classifier(engine, ds.labels, ds.system, ds.template), texts)
    passes.note(ds.name, "classify labels", "test", len(texts), st.seconds, [st.prompt_tokens / len(texts)])
    with np.errstate(divide="ignore"):
        lp = np.maximum(np.log(probs), -1e4)
    batch = np.exp(fit_batch(lp, ds.labels).apply(lp))
    c = {
        "tokens_per_row": round(st.prompt_tokens / len(texts), 1),
        "seconds_per_row": round(st.seconds / len(texts), 4),
    }
    out = [
        row("classify: labels raw", "classify", probs, gold, **c),
        row("classify: labels + batch prior", "classify", batch, gold, **c),
    ]
    if untrained:
        why = "not run: --untrained-only (nothing learns from TRAIN)"
        learned = ("classify: learned head", "classify: fine-tuned (LoRA)")
        return out + [{"method": m, "family": "classify", "available": False, "note": why} for m in learned]
    t0 = time.perf_counter()
    train = ([t for t, _ in ds.train], [ds.labels[g] for _, g in ds.train])
    head = train_head(engine, *train, classes=ds.labels, system=ds.system, template=ds.template, folds=folds)
    train_s = round(time.perf_counter() - t0, 1)
    passes.note(ds.name, "classify head features", "train", len(ds.train), head.info["feature_seconds"])
    hp, hst = _classify(Classifier(engine, ds.labels, ds.system, ds.template, head=head), texts)
    passes.note(ds.name, "classify head", "test", len(texts), hst.seconds, [hst.prompt_tokens / len(texts)])
    c = {
        "tokens_per_row": round(hst.prompt_tokens / len(texts), 1),
        "seconds_per_row": round(hst.seconds / len(texts), 4),
    }
    out.append(row("classify: learned head", "classify", hp, gold, train_s=train_s, head=head.name, **c))
    if ds.name in a.no_tune:
        why = "not run: --no-tune (fine-tuning costs minutes to hours here; see finetune's results)"
        out.append({"method": "classify: fine-tuned (LoRA)", "family": "classify", "available": False, "note": why})
    else:
        out.append(classify_tuned_row(ds, engine, passes, a.model))
    return out


def _classify(clf: Classifier, texts: list[str]) -> tuple[np.ndarray, Any]:
    run = clf.run(texts, window=max(1, len(texts)))
    preds = list(run)
    bad = [p for p in preds if not p.ok]
    if bad:
        raise SystemExit(f"classify: item {bad[0].index}: {bad[0].error}")
    return np.array([[p.probs[k] for k in clf.labels] for p in preds], dtype=np.float64), run.stats


# The question's own classifier (`train --decisions`'s tuned question): mode -> (its row, its `tuning`, the
# pass's name, what `x_method.trained` says).
OWN = {
    "lora": ("fine-tuned (LoRA)", ("lora", FinetuneSettings(), False), "lora", "fine-tuned"),
    "head": ("trained head (question prompt)", ("head", None, False), "question head", "learned head"),
}


def tuned_row(
    ds: DataSet, q: DecisionQuestion, passes: Passes, model: str, mode: str = "lora", folds: int = 5
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`train --decisions --finetune lora` (mode "lora") or `--head-prompt question` (mode "head")
    on TRAIN (the question's own classifier, the question its prompt: fine-tuned at classify's
    defaults, or classify's head), answered on TEST by the `Decider` `decide --task` runs."""
    method, tuning, kind, trained = OWN[mode]
    settings = FinetuneSettings()
    head = HeadOptions(folds=folds)

    def compute() -> dict[str, Any]:
        names = q.answer_names()
        with tempfile.TemporaryDirectory() as tmp:
            qf, data, task = Path(tmp) / "q.json", Path(tmp) / "train.jsonl", Path(tmp) / "task.json"
            qf.write_text(json.dumps(ds.question))
            data.write_text("".join(json.dumps({"state": t, "gold": names[g]}) + "\n" for t, g in ds.train))
            plan = resolve_decisions(DecisionOptions(model=model, questions_file=str(qf), given=frozenset({"model"})))
            run = DecisionTrainRun(str(data), plan, (f"{q.key}=gold",), str(task), head, None, tuning)
            t0 = time.perf_counter()
            run_train_decisions(run, say=lambda m: say(f"  {kind}: {m}"))
            train_s = time.perf_counter() - t0
            served = resolve_decisions(DecisionOptions(task_file=str(task))).loaded(passes.engine)
            d = served.decider(passes.engine, state_cache=0)
            (sq,) = served.questions
            probs, tokens, secs = answered(d, sq, ds, passes.chunk, trained)
            report = dict(served.methods.for_question(sq)[0].report or {})
            own = json.loads((Path(tmp) / report["classifier"]).read_text())
            if own.get("head"):  # the head's parts and its cross-validated accuracy, as train prints them
                learned = Head.from_dict(own["head"])
                report.update(head=learned.name, cv_accuracy=learned.info.get("chosen", {}).get("accuracy"))
        return {
            "probs": np.stack(probs),
            "tokens": np.asarray(tokens),
            "seconds": secs,
            "train_s": train_s,
            "info": report,
        }

    # the prompt as the code builds it; a LoRA's key as before the head mode (its cached fine-tunes stay valid)
    parts: tuple = (q.digest, tuned_prompt(q), asdict(settings), ds.train, ds.test)
    if mode != "lora":
        parts = (mode, q.digest, tuned_prompt(q), asdict(head), ds.train, ds.test)
    got = passes.kept(ds.name, kind, parts, compute)
    gold = np.array([g for _, g in ds.test])
    passes.note(ds.name, kind, "test", len(ds.test), got["seconds"], got["tokens"], got["cached"])
    train_s = round(got["train_s"], 1)
    extra = {k: got["info"][k] for k in ("cv_accuracy", "head") if k in got["info"]}
    r = row(method, "decide", got["probs"], gold, train_s=train_s, **cost([got], len(gold)))
    return {**r, **extra}, {"train_s": train_s, **got["info"]}


def classify_tuned_row(ds: DataSet, engine: Engine, passes: Passes, model: str) -> dict[str, Any]:
    """`train --finetune lora` with the set's classify prompt on TRAIN (classify's fine-tune at its
    defaults), `classify --task` on TEST: the trained decision's counterpart on the same rows."""
    settings = FinetuneSettings()

    def compute() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            data, task = Path(tmp) / "train.jsonl", Path(tmp) / "task.json"
            data.write_text("".join(json.dumps({"text": t, "label": ds.labels[g]}) + "\n" for t, g in ds.train))
            plan = Plan(
                model=ModelRef(model),
                system=ds.system,
                template=ds.template,
                read=ReadSpec(),
                save_task=str(task),
                quiet=True,
            )
            t0 = time.perf_counter()
            run_finetune(
                TrainRun(str(data), plan, labels=ds.labels), settings, say=lambda m: say(f"  classify lora: {m}")
            )
            train_s = time.perf_counter() - t0
            probs, st = _classify(Classifier.from_task(task, engine=engine), [t for t, _ in ds.test])
        tokens = np.full(len(ds.test), st.prompt_tokens / len(ds.test))
        return {"probs": probs, "tokens": tokens, "seconds": st.seconds, "train_s": train_s, "info": {}}

    parts = (ds.system, ds.template, ds.labels, asdict(settings), ds.train, ds.test)
    got = passes.kept(ds.name, "classify lora", parts, compute)
    passes.note(ds.name, "classify lora", "test", len(ds.test), got["seconds"], got["tokens"], got["cached"])
    gold = np.array([g for _, g in ds.test])
    c = cost([got], len(gold))
    return row("classify: fine-tuned (LoRA)", "classify", got["probs"], gold, train_s=round(got["train_s"], 1), **c)


NO_FIT = ("fitted", *(f"fit-prior ({w})" for w, (_, n) in WAYS.items() if n == 1))  # a prior per one-order way


def run_set(ds: DataSet, engine: Engine, config: DecisionConfig, passes: Passes, a: argparse.Namespace) -> dict:
    (q,) = systemone_questions(ds.question, config)
    ways = [WAYS[w] for w in a.ways]
    say(f"{ds.name}: {len(ds.train)} train, {len(ds.test)} test, {len(ds.labels)} options")
    if ds.name in a.tuned_only:  # no pass of the decision prompt: every method that needs one said not run
        why = (
            "not run: --tuned-only (the decision prompt lists every option: a pass over each split costs too much here)"
        )
        rows = [
            {"method": f"{WAY_NAMES[w]}: {m}", "family": "decide", "available": False, "note": why}
            for w in ways
            for m in ("raw", "batch prior", "contextual prior")
        ]
        rows += [{"method": m, "family": "decide", "available": False, "note": why} for m in (*NO_FIT, "trained head")]
        fit_report: dict[str, Any] = {"note": why}
        head_info: dict[str, Any] = {"note": why}
        qrow, qhead_info = tuned_row(ds, q, passes, a.model, "head", a.folds)
        trow, tuned_info = tuned_row(ds, q, passes, a.model)
        rows += [qrow, trow, *classify_rows(ds, engine, passes, a)]
        return set_result(ds, q, passes, rows, fit_report, {**head_info, "question_prompt": qhead_info}, tuned_info)
    rows = way_rows(ds, q, passes, ways)
    if ds.name in a.untrained_only:  # TEST passes only: what needs TRAIN said not run
        why = "not run: --untrained-only (TEST passes only, nothing learns from TRAIN: see the passes' s / row)"
        learned = (*NO_FIT, "trained head", "trained head (question prompt)", "fine-tuned (LoRA)")
        rows += [{"method": m, "family": "decide", "available": False, "note": why} for m in learned]
        rows += classify_rows(ds, engine, passes, a, untrained=True)
        return set_result(ds, q, passes, rows, {"note": why}, {"note": why}, {"note": why})
    if ds.name in a.no_fit:  # no TRAIN passes: said, not run
        why = "not run: --no-fit (each way's pass over TRAIN costs too much here; see the passes' s / row)"
        fit_report = {"note": why}
        rows += [{"method": m, "family": "decide", "available": False, "note": why} for m in NO_FIT]
    else:
        fitted_rows, fit_report = learned_rows(ds, q, passes, ways)
        rows += fitted_rows
    hrow, head_info = head_row(ds, q, passes, a.folds)
    qrow, head_info["question_prompt"] = tuned_row(ds, q, passes, a.model, "head", a.folds)
    rows += [hrow, qrow]
    if ds.name in a.no_tune:
        why = "not run: --no-tune (fine-tuning costs minutes to hours here; see finetune's results)"
        rows.append({"method": "fine-tuned (LoRA)", "family": "decide", "available": False, "note": why})
        tuned_info: dict[str, Any] = {"note": why}
    else:
        trow, tuned_info = tuned_row(ds, q, passes, a.model)
        rows.append(trow)
    rows += classify_rows(ds, engine, passes, a)
    return set_result(ds, q, passes, rows, fit_report, head_info, tuned_info)


def set_result(
    ds: DataSet, q: DecisionQuestion, passes: Passes, rows: list[dict[str, Any]], fit: dict, head: dict, tuned: dict
) -> dict[str, Any]:
    """A set's part of the results: its rows, draw, question and passes."""
    pass_table = {
        f"{w}/{s}": {
            "rows": r["rows"],
            "seconds": round(r["seconds"], 1),
            "seconds_per_row": round(r["seconds"] / r["rows"], 3),
            "tokens_per_row": None if r["tokens"] is None else round(float(r["tokens"].mean()), 1),
            "cached": r["cached"],
        }
        for (name, w, s), r in passes.runs.items()
        if name == ds.name
    }
    for r in rows:
        say(f"  {r['method']:<32} " + (f"acc {r['accuracy']:.3f} F1 {r['macro_f1']:.3f}" if r["available"] else "n/a"))
    return {
        "labels": list(ds.labels),
        "question": ds.question,
        "question_digest": q.digest,
        "train": len(ds.train),
        "test": len(ds.test),
        "test_support": np.bincount([g for _, g in ds.test], minlength=len(ds.labels)).tolist(),
        "gold": [g for _, g in ds.test],  # TEST's labels in order: each row's `answers` read against them
        "drawn": ds.drawn,
        "source": ds.source,
        "passes": pass_table,
        "fit": fit,
        "head": head,
        "tuned": tuned,
        "methods": rows,
    }


def probe(ds: DataSet, passes: Passes, ways: list[tuple[str, int]], n: int) -> dict[str, Any]:
    """Seconds and tokens per prompt of `n` TEST rows per way (sizing a run; nothing scored)."""
    (q,) = systemone_questions(ds.question, passes.config)
    out = {}
    for way in ways:
        d = passes.decider(way)
        t0 = time.perf_counter()
        res = d.decide([DecisionRequest(t, (q,)) for t, _ in ds.test[:n]])
        secs = time.perf_counter() - t0
        out[WAY_NAMES[way]] = {
            "rows": len(res),
            "seconds_per_row": round(secs / len(res), 2),
            "tokens_per_row": round(float(np.mean([r.input_tokens for r in res])), 1),
        }
        print(f"  probe {ds.name} {WAY_NAMES[way]}: {out[WAY_NAMES[way]]}", file=sys.stderr, flush=True)
    return out


# ---------------------------------------------------------------------------- goals, markdown, plot
def figure_of(answers: np.ndarray, gold: np.ndarray, k: int, fig: str) -> float:
    """Accuracy or macro-F1 of answers (option indices) against gold, as `scored` reads them."""
    if fig == "accuracy":
        return float(np.mean(answers == gold))
    return float(macro_f1(confusion(gold, answers, k)))


def paired_gap(a: list[int], b: list[int], gold: list[int], k: int, fig: str, seed: int = 0) -> list[float]:
    """The 95 % interval of `fig`(a) - `fig`(b) on the same rows: a paired bootstrap (`RESAMPLES`
    draws of the rows with replacement, both methods scored on each draw)."""
    x, y, g = np.asarray(a), np.asarray(b), np.asarray(gold)
    rng = np.random.default_rng(seed)
    gaps = []
    for _ in range(RESAMPLES):
        i = rng.integers(0, len(g), len(g))
        gaps.append(figure_of(x[i], g[i], k, fig) - figure_of(y[i], g[i], k, fig))
    lo, hi = np.percentile(gaps, [2.5, 97.5])
    return [round(float(lo), 4), round(float(hi), 4)]


def goal_rows(s: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The decision rows a goal reads: "trained" a head or LoRA; "prior" a prior that needs no labels;
    "untrained" any way, raw or with such a prior (never the fit, a head or LoRA)."""
    rows = [r for r in s["methods"] if r["available"] and r["family"] == "decide"]
    if kind == "trained":
        return [r for r in rows if r["method"] in TRAINED]
    if kind == "prior":
        return [r for r in rows if "prior" in r["method"]]
    return [r for r in rows if r["method"] != "fitted" and r["method"] not in TRAINED]


def against_classify(s: dict[str, Any], kind: str, fig: str, best: dict[str, Any]) -> dict[str, Any]:
    """A goal's best decision row against classify's best of the same tier on the same rows: the
    gap, its paired 95 % interval (when both rows kept their answers), and the verdict."""
    mine = [r for r in s["methods"] if r["available"] and r["method"] in CLASSIFY_TIER[kind]]
    if not mine:
        return {"classify": None}
    other = max(mine, key=lambda r: r[fig])
    gap = round(best[fig] - other[fig], 4)
    ran = {r["method"] for r in mine}
    missing = [m.removeprefix("classify: ") for m in CLASSIFY_TIER[kind] if m not in ran]
    out = {"classify": other[fig], "classify_by": other["method"], "gap": gap, "interval": None}
    out["classify_not_run"] = missing  # a tier's classify method this set's run left out (an older run, --no-tune)
    if best.get("answers") and other.get("answers") and s.get("gold"):
        out["interval"] = paired_gap(best["answers"], other["answers"], s["gold"], len(s["labels"]), fig)
    if gap >= 0:
        out["verdict"] = "at least classify"
    elif out["interval"] is not None and out["interval"][1] >= 0:
        out["verdict"] = "below classify, within noise"
    else:
        out["verdict"] = "below classify" if out["interval"] is not None else "below classify (no interval)"
    return out


def goals(sets: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal of issue 55 of the sets in `sets`: the best decision row of its tier against the
    figure asked, and against classify's best of the same tier on the same rows (the issue's promise)."""
    out = []
    for name, kind, what, fig, want in GOALS:
        s = sets.get(name)
        if s is None:  # a set this file does not hold: its goals are another file's
            continue
        rows = goal_rows(s, kind)
        if not rows:  # not run, or every method the goal reads left out (--tuned-only, --no-tune)
            out.append({"set": name, "goal": what, "figure": fig, "at_least": want, "status": "not run"})
            continue
        best = max(rows, key=lambda r: r[fig])
        status = "met" if best[fig] >= want else "not met"
        g = {"set": name, "goal": what, "figure": fig, "at_least": want, "best": best[fig], "by": best["method"]}
        out.append({**g, "status": status, **against_classify(s, kind, fig, best)})
    return out


def _merged(out: dict[str, Any]) -> bool:
    """Whether some set came from another run than the file's own (`--merge`)."""
    return any(s.get("run") and s["run"] != run_line(out) for s in out["sets"].values())


def _versus(g: dict[str, Any]) -> str:
    """A goal's classify columns: classify's figure and method, the gap and its interval, the verdict."""
    if g.get("classify") is None:
        return "not run | | "
    iv = g.get("interval")
    gap = f"{g['gap']:+.3f}" + (f" ({iv[0]:+.3f} to {iv[1]:+.3f})" if iv else "")
    missing = g.get("classify_not_run") or []
    verdict = g["verdict"] + (f" ({', '.join(missing)}: not run on these rows)" if missing else "")
    return f"{g['classify']:.3f} ({g['classify_by'].removeprefix('classify: ')}) | {gap} | {verdict}"


def _cell(x: Any, fmt: str = ".3f") -> str:
    return "" if x is None else format(x, fmt) if isinstance(x, float) else str(x)


def markdown(out: dict[str, Any]) -> str:
    sets = out["sets"]
    lines = [
        f"# How right typed decisions are, per method, with classify beside them ({out['model']}, {out['date']})",
        "",
        ("Sets from several runs, each named above its own table; the last: " if _merged(out) else "") + run_line(out),
        "",
        "Accuracy / macro-F1 on each set's TEST rows (every method scored on the same rows):",
        "",
        "| method | " + " | ".join(f"{n} (n={s['test']})" for n, s in sets.items()) + " |",
        "|---|" + "---|" * len(sets),
    ]
    methods = list(dict.fromkeys(r["method"] for s in sets.values() for r in s["methods"]))
    for m in methods:
        cells = []
        for s in sets.values():
            r = next((x for x in s["methods"] if x["method"] == m), None)
            cells.append(
                "not in its run"
                if r is None
                else "n/a"
                if not r["available"]
                else f"{r['accuracy']:.3f} / {r['macro_f1']:.3f}"
            )
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Goals (issue 55)",
        "",
        "| set | goal | figure | at least | best | by | | classify, same tier | gap (95 % interval) | |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in out["goals"]:
        lines.append(
            f"| {g['set']} | {g['goal']} | {g['figure']} | {g['at_least']:.2f} | {_cell(g.get('best'))} | {g.get('by', '')} "
            f"| **{g['status']}** | {_versus(g)} |"
        )
    lines += [
        "",
        "Classify, same tier: classify's best on the same TEST rows without labels (label scoring, raw or with the "
        "batch prior) or trained (a learned head, a fine-tune); the gap is the decision's figure minus classify's, its "
        f"interval a paired bootstrap over the TEST rows ({RESAMPLES} draws); both bests are chosen on TEST.",
    ]
    for name, s in sets.items():
        lines += [
            "",
            f"## {name}: {len(s['labels'])} options, {s['train']} train / {s['test']} test rows",
            "",
            f"{s['source']}; {s['drawn']}. Question: `{json.dumps(s['question'], ensure_ascii=False)[:300]}`",
            "",
            *([f"Run: {s['run']}", ""] if _merged(out) and s.get("run") else []),
            "| method | accuracy | macro-F1 | ECE | automation at 5 % error | tokens / row | s / row | train s | note |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in s["methods"]:
            if not r["available"]:
                lines.append(f"| {r['method']} | n/a | n/a | n/a | n/a | | | | {r['note']} |")
                continue
            note = []
            if r["method"] == "fitted":
                note.append(f"chose {r.get('chosen_way', r['way'])}")
                if r.get("cv_accuracy_of_choice") is not None:  # (older results: absent)
                    note.append(f"the choice's CV accuracy {r['cv_accuracy_of_choice']:.3f}")
                if r.get("kept") is False:
                    note.append(
                        f"not kept (no better than raw, cross-validated): answered {r['way']} raw, as the task would"
                    )
            if r.get("cv_accuracy") is not None:
                note.append(f"CV accuracy on train {r['cv_accuracy']:.3f}")
            if r.get("setup_s") is not None:
                note.append(f"prior found in {r['setup_s']} s")
            if r.get("head"):
                note.append(f"head {r['head']}")
            lines.append(
                f"| {r['method']} | {r['accuracy']:.3f} | {r['macro_f1']:.3f} | {r['ece']:.3f} | {r['automation_5']:.3f} "
                f"| {r['tokens_per_row']} | {r['seconds_per_row']:.3f} | {_cell(r.get('train_s'), '.1f')} | {'; '.join(note)} |"
            )
        fit = s["fit"]
        lines += [
            "",
            (
                f"Fitted: chose {fit['chosen']['style']}, {fit['chosen']['permute']} order(s) by cross-validated "
                f"accuracy ({_cell(fit.get('cv_accuracy'))}); ways tried: "
                + ", ".join(f"{w['style']} x{w['permute']} CV {_cell(w['cv_accuracy'])}" for w in fit["ways"])
                + (f" ({fit['note']})" if fit.get("note") else "")
                if "chosen" in fit
                else f"Fitted and fit-prior: {fit['note']}"
            )
            + (
                f". Trained head: {s['head']['name']} ({s['head']['estimator']}), CV accuracy on train "
                f"{_cell(s['head']['cv_accuracy'])}, {s['head']['train_s']} s to train."
                if "name" in s["head"]
                else "."
            ),
            "",
            "Each pass (one way over one split, state cache off; run once, read by every method):",
            "",
            "| way / split | rows | seconds | s / row | tokens / row | |",
            "|---|---|---|---|---|---|",
        ]
        for k, p in s["passes"].items():
            lines.append(
                f"| {k} | {p['rows']} | {p['seconds']} | {p['seconds_per_row']} | {_cell(p['tokens_per_row'], '.1f')} | {'cached' if p['cached'] else ''} |"
            )
    for name, p in out.get("probes", {}).items():
        lines += [
            "",
            f"Probe only ({name}, not scored): "
            + "; ".join(
                f"{w}: {v['seconds_per_row']} s and {v['tokens_per_row']} tokens per prompt ({v['rows']} prompts)"
                for w, v in p.items()
            ),
        ]
    lines += ["", "## Notes", "", *DEFINITIONS, *(f"- {n}" for n in out.get("notes") or [])]
    return "\n".join(lines) + "\n"


DEFINITIONS = (
    "- Ways of asking: `letters` is Transformers' DECISION_PROMPT (exact; beyond 26 options the labels are the "
    "options' names); `names` lists the options by name and scores each name whole; `prompt` asks each question as a "
    "classifier of its own (the names style's question as the system message, the state as the user's, the names "
    "scored as `classify` scores labels); `x2` (`letters2`, `names2`, `prompt2`) asks in the forward and the "
    "reversed option order and averages the two answers.",
    "- `batch prior`: each TEST answer divided by the mean raw answer of the first 512 TEST states in input order "
    "(TEST is shuffled, seeded), what `decide --calibrate batch` does; `contextual prior`: divided by the mean answer "
    "to five content-free states (`Decider.contextual_prior`); `fit-prior`: the batch prior of the TRAIN states (no "
    "gold), as `eval --fit-prior` saves it; `fitted`: `eval --fit`'s bias per option and temperature, fitted on the "
    "TRAIN answers of every way, the way chosen by cross-validated accuracy on TRAIN; `trained head`: `train "
    "--decisions`'s head on TRAIN (the decision prompt's hidden states where the answer is read), answered by a "
    "`Decider` holding it (its own pass over TEST); `trained head (question prompt)`: `train --decisions "
    "--head-prompt question` (classify's head, last or mean pooling, on the question's own prompt, the state its "
    "text), answered by `decide --task`'s Decider; train s is the whole training run.",
    "- `classify`: label scoring with the set's classify prompt on the same TEST rows; `+ batch prior`: divided by "
    "the mean over TEST (`fit_batch`); `learned head`: `train_head` on TRAIN (the classify prompt's hidden states); "
    "`fine-tuned (LoRA)`: `train --finetune lora` on TRAIN at its defaults with the same prompt, `classify --task`.",
    "- Automation at 5 % error: the largest share of TEST rows, taken most confident first, whose answers are at "
    "least 95 % right (0 when even the most confident are not). ECE: the top probability's, 10 equal bins.",
    "- tokens / row: a decision's input tokens (its state once and each asked variant's own tokens); classify's prompt "
    "tokens (an unbatched, uncached run's). s / row: the seconds of the passes a method runs at answer time, per TEST "
    "row (a prior's or a fit's own cost is in its note or train s); train s: what learning it cost (TRAIN passes and "
    "the fit). Seconds are wall time on a shared 2-core machine (the matmul peaks above say how busy it was).",
    "- `fine-tuned (LoRA)`: `train --decisions --finetune lora` on TRAIN (classify's fine-tune at its defaults, the "
    "question as the system message, the options' names as labels), answered by `decide --task`'s Decider; train s "
    "is the whole training run.",
)


def plot(out: dict[str, Any], path: Path) -> None:
    """Accuracy per method per set: one horizontal bar chart per set, decide and classify in two colours."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib, only for the PNG
    from matplotlib.figure import Figure

    sets = list(out["sets"].items())
    n = max(len(s["methods"]) for _, s in sets)
    fig = Figure(figsize=(5.5 * len(sets), 0.32 * n + 1.6))
    FigureCanvasAgg(fig)
    for i, (name, s) in enumerate(sets, 1):
        ax = fig.add_subplot(1, len(sets), i)
        rows = s["methods"][::-1]
        acc = [r["accuracy"] if r["available"] else 0.0 for r in rows]
        colours = [
            "#bbbbbb" if not r["available"] else "#4c72b0" if r["family"] == "decide" else "#dd8452" for r in rows
        ]
        ax.barh(range(len(rows)), acc, color=colours)
        for y, r in enumerate(rows):
            text = f"{r['accuracy']:.3f}" if r["available"] else "not available"
            ax.text((r["accuracy"] if r["available"] else 0) + 0.01, y, text, va="center", fontsize=7)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(
            [r["method"] + (f" ({r['way']})" if r["method"] == "fitted" and r["available"] else "") for r in rows],
            fontsize=7,
        )
        ax.set_xlim(0, 1.12)
        ax.set_xlabel("accuracy on TEST")
        ax.set_title(f"{name} ({len(s['labels'])} options, n={s['test']})", fontsize=9)
    fig.suptitle(f"{Path(out['model']).name}: decide (blue), classify (orange)", fontsize=10)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)


def _per_set(text: str, default: dict[str, int], what: str) -> dict[str, int]:
    """`--n-test` / `--n-train`: N for every set, or SET=N,... over the defaults."""
    out = dict(default)
    for part in [x for x in text.split(",") if x]:
        name, _, n = part.rpartition("=")
        if name and name not in SETS:
            raise SystemExit(f"{what}: {name!r} is none of the sets ({', '.join(SETS)})")
        for k in [name] if name else SETS:
            out[k] = int(n)
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--sets", default="tickets,posts,banking77,clinc150")
    ap.add_argument(
        "--n-test",
        default="",
        help="TEST rows in all, N or SET=N,... (default: "
        + ", ".join(f"{k}={v or 'rest'}" for k, v in N_TEST.items())
        + ")",
    )
    ap.add_argument(
        "--n-train",
        default="",
        help="TRAIN rows per label, N or SET=N,... (default: "
        + ", ".join(f"{k}={v}" for k, v in N_TRAIN.items())
        + ")",
    )
    ap.add_argument("--ways", default=",".join(WAYS), help="ways of asking run over TRAIN and TEST")
    ap.add_argument("--posts", default="/tmp/tweeteval", help="TweetEval sentiment folder (not committed)")
    ap.add_argument("--banking77", default="../shared/data/banking77")
    ap.add_argument("--clinc150", default="../shared/data/clinc150")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--tag", default="decision-accuracy")
    ap.add_argument(
        "--no-fit", default="", help="sets without fitted and fit-prior (no pass over TRAIN but the head's)"
    )
    ap.add_argument("--no-tune", default="", help="sets without the fine-tuned (LoRA) row (its training is long)")
    ap.add_argument(
        "--tuned-only",
        default="",
        help="sets with only the fine-tuned (LoRA) row and classify's (no pass of the decision prompt)",
    )
    ap.add_argument(
        "--untrained-only",
        default="",
        help="sets with only the untrained methods and classify's label scoring (TEST passes only, no TRAIN)",
    )
    ap.add_argument("--merge", action="store_true", help="keep TAG.json's other sets (a run of some sets adds them)")
    ap.add_argument("--cache", type=Path, default=None, help="keep each pass's raw answers here (resume a run)")
    ap.add_argument("--chunk", type=int, default=32, help="requests per decide call (progress is told per call)")
    ap.add_argument("--folds", type=int, default=5, help="the heads' cross-validation folds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", action="append", default=[], help="a line for the markdown's notes (repeatable)")
    ap.add_argument(
        "--render",
        action="store_true",
        help="only write TAG.md and TAG.png again from TAG.json (its goals read again; its notes, or --note's)",
    )
    ap.add_argument("--probe", type=int, default=0, help="only time N TEST prompts per set and way (nothing scored)")
    a = ap.parse_args(argv)
    a.n_test, a.n_train = _per_set(a.n_test, N_TEST, "--n-test"), _per_set(a.n_train, N_TRAIN, "--n-train")
    a.sets, a.ways = [s for s in a.sets.split(",") if s], [w for w in a.ways.split(",") if w]
    a.no_fit = [s for s in a.no_fit.split(",") if s]
    a.no_tune = [s for s in a.no_tune.split(",") if s]
    a.tuned_only = [s for s in a.tuned_only.split(",") if s]
    a.untrained_only = [s for s in a.untrained_only.split(",") if s]
    both = set(a.tuned_only) & set(a.untrained_only)
    if both:
        raise SystemExit(f"--tuned-only and --untrained-only both name {', '.join(sorted(both))}: choose one")
    bad = [s for s in a.sets + a.no_fit + a.no_tune + a.tuned_only + a.untrained_only if s not in SETS] + [
        w for w in a.ways if w not in WAYS
    ]
    # the trained head (letters) reads the letters' passes: needed where a set is neither untrained- nor tuned-only
    trains = [s for s in a.sets if s not in a.untrained_only + a.tuned_only]
    if bad or ("letters" not in a.ways and trains):
        raise SystemExit(
            f"--sets is some of {', '.join(SETS)}; --ways some of {', '.join(WAYS)}, with letters unless every set is"
            f" --untrained-only or --tuned-only; got {bad}"
        )
    return a


def main(argv: list[str] | None = None) -> int:
    from mlx_slm.ground.blas import matmul_peak

    a = parse(argv)
    if a.render:  # the markdown and the plot again from TAG.json (no model), with --note's lines if given
        out = json.loads((a.out / f"{a.tag}.json").read_text())
        goals_now = goals(out["sets"]) if out["sets"] else []  # the rule of today's code, on the stored rows
        write({**out, "goals": goals_now, "notes": a.note or out.get("notes", [])}, a.out, a.tag)
        return 0
    peak0 = matmul_peak()["mlx"]
    engine = Engine.load(a.model)
    config = DecisionConfig.of_model(a.model, engine.path)
    passes = Passes(engine, config, a.cache, a.chunk)
    sets, probes = {}, {}
    for name in a.sets:
        ds = load_set(name, a)
        if a.probe:
            probes[name] = probe(ds, passes, [WAYS[w] for w in a.ways], a.probe)
        else:
            sets[name] = run_set(ds, engine, config, passes, a)
    peak1 = matmul_peak()["mlx"]
    out = {**run_record("benchmarks.decision_accuracy", a.model, argv, peak0, peak1), "ways": a.ways}
    for s in sets.values():  # each set says the run it came from (a merged file holds several)
        s["run"] = run_line(out)
    if a.merge and (a.out / f"{a.tag}.json").is_file():
        old = json.loads((a.out / f"{a.tag}.json").read_text())
        kept = {k: {**v, "run": v.get("run") or run_line(old)} for k, v in old["sets"].items() if k not in sets}
        sets = {**kept, **sets}
        sets = {k: sets[k] for k in SETS if k in sets}  # the sets in their usual order
        probes = {**old.get("probes", {}), **probes}
        a.note = a.note or old.get("notes", [])
    out.update(sets=sets, probes=probes, goals=goals(sets) if sets else [], notes=a.note)
    write(out, a.out, a.tag)
    return 0


def write(out: dict[str, Any], folder: Path, tag: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{tag}.json").write_text(json.dumps(out, indent=2) + "\n")
    md = markdown(out)
    (folder / f"{tag}.md").write_text(md)
    print(md)
    if out["sets"]:
        try:
            plot(out, folder / f"{tag}.png")
        except ImportError:
            print("matplotlib missing: no PNG (pip install 'mlx-slm[bench]')", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
