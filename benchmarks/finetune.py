"""Fine-tuned classifiers (LoRA) against today's learned head, on BANKING77 at 10 messages per intent
and on the 355 labelled support tickets (5-fold, 10 per label).

    python -m benchmarks.finetune --banking77 ../shared/data/banking77 [--methods head,score,labels]
        [--per-intent 10] [--test-per-intent 10 | --all-test] [--layers 16 --rank 8 --lr 2e-5 ...]
        [--max-minutes 30] [--tag finetune]
    python -m benchmarks.finetune --dataset tickets [--per-intent 10] [--folds 5] [--fold-limit N]

Data (`--dataset banking77`): `--per-intent` messages of each of the 77 intents from train.csv
and `--test-per-intent` of each from test.csv (stratified; `--all-test`: the whole 3,080),
drawn with `--data-seed`. The prompt is benchmarks/heads.py's (the intents listed in the system
message, which the prefix cache computes once; `--system short`: without the list).
`--dataset tickets`: benchmarks/data/support_tickets.jsonl (355 tickets, 6 labels) in
`--folds` stratified folds (as benchmarks/heads.py splits them); each fold is tested on a
method trained on `--per-intent` tickets of each label drawn from the other folds
(`--fold-limit`: the first N folds only); the prompt is benchmarks/accuracy.py's ticket
system message. Figures are the folds' means. Methods, each trained on the same texts and
tested on the same texts:

* `head`: today's learned head (`mlx_slm.jobs.train.train_head`, layers and C by cross-validation),
  tested through the Classifier;
* `score`: `mlx_slm.weights.finetune` objective (a), LoRA + a score head at the last position;
* `labels`: objective (b), LoRA + the labels' own tokens under the LM head (sequence scoring).

Fine-tuned methods are tested by `FineTuned.predict` on the merged model (the inference path:
the model's own ops, the prompt head's KV once); `--speed-n` test prompts are also run unfused
(`apply`) and fused (`merge`) side by side, items/s. Figures: accuracy, macro-F1, seconds to
train (the frozen blocks' one pass + the epochs; the head: its features + CV + fit), seconds per
epoch, peak MLX memory per epoch, the per-epoch history. JSON, Markdown and PNG go to --out as
TAG.*; every run also appends its rows to finetune-trials.json (and regenerates
finetune-trials.md), so the settings tried stay listed with their results.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.heads import BANKING_SYSTEM, BANKING_TEMPLATE
from benchmarks.record import run_line, run_record

SHORT_SYSTEM = "You classify messages to a bank's customer service by their intent."
CLINC_SHORT = "You classify requests to a virtual assistant by their intent."
CLINC_FULL = "You classify requests to a virtual assistant by their intent. The intents: {labels}."
CLINC_TEMPLATE = "Request: {text}\nIntent:"
SYSTEMS = {"full": BANKING_SYSTEM, "short": SHORT_SYSTEM}  # full: benchmarks/heads.py's, the 77 intents listed
TUNABLE = (
    "layers", "rank", "scale", "dropout", "epochs", "learning_rate", "head_learning_rate", "schedule", "warmup",
    "weight_decay", "batch_size", "val_fraction", "patience", "max_minutes", "seed", "prefix_grad", "head_init",
    "label_smoothing", "contrastive", "contrastive_temperature", "keep",
)  # fmt: skip


def load_banking(root: Path, per_intent: int, test_per_intent: int | None, seed: int):
    """(labels, train texts, train gold, test texts, test gold); test_per_intent None: all of test.csv."""
    intents = json.loads((root / "categories.json").read_text())
    labels = [lab.replace("_", " ") for lab in intents]  # label scoring reads words: "card arrival"
    tr = list(csv.DictReader(open(root / "train.csv", encoding="utf-8")))
    te = list(csv.DictReader(open(root / "test.csv", encoding="utf-8")))
    rng = np.random.default_rng(seed)
    train, test = [], []
    for k, lab in enumerate(intents):
        a = [r["text"] for r in tr if r["category"] == lab]
        train += [(a[i], k) for i in rng.permutation(len(a))[:per_intent]]
        b = [r["text"] for r in te if r["category"] == lab]
        test += [(b[i], k) for i in (rng.permutation(len(b))[:test_per_intent] if test_per_intent else range(len(b)))]
    return (
        labels,
        [t for t, _ in train],
        np.array([g for _, g in train]),
        [t for t, _ in test],
        np.array([g for _, g in test]),
    )


def load_clinc(root: Path, per_intent: int, seed: int, val_per_intent: int = 5, oos_train: int = 0):
    """(labels, train texts, train gold, test texts, test gold, extra): `per_intent` queries of each of
    the 150 intents from `train` (seed), the whole in-scope `test`; extra: the out-of-scope `oos_test`
    and, to choose a threshold on, `val_per_intent` of each intent from `val` and `oos_val`. `oos_train`:
    that many of `oos_train`'s out-of-scope queries join the training texts as one more class, "oos"
    (the product's `--none-label`), the last label."""
    d = json.loads((root / "data_full.json").read_text())
    domains = json.loads((root / "domains.json").read_text())
    intents = sorted({i for v in domains.values() for i in v})
    labels = [lab.replace("_", " ") for lab in intents]
    index = {lab: k for k, lab in enumerate(intents)}
    rng = np.random.default_rng(seed)

    def draw(rows, n):
        out = []
        for lab in intents:
            a = [t for t, g in rows if g == lab]
            out += [(a[i], index[lab]) for i in rng.permutation(len(a))[:n]]
        return out

    train = draw(d["train"], per_intent)
    if oos_train:
        train += [(d["oos_train"][i][0], len(intents)) for i in rng.permutation(len(d["oos_train"]))[:oos_train]]
        labels = [*labels, OOS]
    test = [(t, index[g]) for t, g in d["test"]]
    val = draw(d["val"], val_per_intent)
    extra = {
        "oos_test": [t for t, _ in d["oos_test"]],
        "val": ([t for t, _ in val], np.array([g for _, g in val])),
        "oos_val": [t for t, _ in d["oos_val"]],
    }
    return (labels, [t for t, _ in train], np.array([g for _, g in train]), [t for t, _ in test],
            np.array([g for _, g in test]), extra)  # fmt: skip


def load_tickets(folds: int, per_label: int, seed: int):
    """(labels, splits): each split (train texts, train gold, test texts, test gold), one a fold."""
    from sklearn.model_selection import StratifiedKFold

    from benchmarks.accuracy import DATA, TICKET_LABELS, _jsonl

    rows = _jsonl(DATA / "support_tickets.jsonl")
    texts = [r["text"] for r in rows]
    gold = np.array([TICKET_LABELS.index(r["label"]) for r in rows])
    rng = np.random.default_rng(seed)
    splits = []
    for tr_all, te in StratifiedKFold(folds, shuffle=True, random_state=0).split(np.zeros(len(gold)), gold):
        tr = np.sort(np.concatenate([rng.choice(tr_all[gold[tr_all] == c], per_label, replace=False)
                                     for c in range(len(TICKET_LABELS))]))  # fmt: skip
        splits.append(([texts[i] for i in tr], gold[tr], [texts[i] for i in te], gold[te]))
    return list(TICKET_LABELS), splits


def mean_of(runs: list[dict]) -> dict:
    """One method's figures over several splits: the means (peak memory: the largest), each split kept."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[0])
    for k in ("accuracy", "macro_f1", "train_seconds", "seconds_per_epoch", "test_items_per_s"):
        vals = [r[k] for r in runs if r.get(k) is not None]
        out[k] = round(float(np.mean(vals)), 4 if k in ("accuracy", "macro_f1") else 2) if vals else None
    out["n"] = sum(r["n"] for r in runs)
    out["peak_memory_mb"] = max(r["peak_memory_mb"] for r in runs)
    for k in ("best_epoch", "epochs_run", "stopped"):
        if k in runs[0]:
            out[k] = "/".join(str(r[k]) for r in runs)
    out["history"] = runs[0].get("history")
    out["splits"] = [{k: v for k, v in r.items() if k != "history"} for r in runs]
    return out


def data_key(a, splits) -> dict:
    """What must match for a row to be reused from another run: the data and its draw."""
    return {"name": a.dataset, "per_intent": a.per_intent, "data_seed": a.data_seed, "splits": len(splits),
            **({"oos_train": a.oos_train} if a.oos_train else {}),
            "test_per_intent": None if a.all_test or a.dataset == "tickets" else a.test_per_intent}  # fmt: skip


def reuse(path: Path, method: str, key: dict) -> dict:
    """`method`'s row of the earlier run at `path`, refused unless it ran on the same data."""
    if not path.is_file():
        raise SystemExit(f"--reuse: no earlier run {path} (its JSON, in --out)")
    r = json.loads(path.read_text())
    d = {"name": "banking77", "splits": 1, **r["data"]}
    if any(d.get(k) != v for k, v in key.items()) or method not in r["methods"]:
        raise SystemExit(f"{path}: no {method!r} row on the same data ({key})")
    return {**r["methods"][method], "from": path.stem, "from_command": r["command"]}


def figures(lp: np.ndarray, gold: np.ndarray) -> dict:
    from mlx_slm.text.metrics import confusion, macro_f1

    pred = lp.argmax(1)
    return {
        "n": int(len(gold)),
        "accuracy": round(float((pred == gold).mean()), 4),
        "macro_f1": round(float(macro_f1(confusion(gold, pred, lp.shape[1]))), 4),
    }


OOS = "oos"  # CLINC150's out-of-scope texts, as a none label (no intent is named so)


def oos_figures(lps: dict, val_gold: np.ndarray, gold: np.ndarray, labels: list[str], target: float) -> dict:
    """CLINC150's "none of these", by the product's own rule (`mlx_slm.text.out_of_scope`, as `train
    --none-threshold auto` chooses): the threshold chosen on `val` + `oos_val` to cost at most `target`
    of in-scope accuracy there, then in-scope accuracy and out-of-scope recall and precision on `test` +
    `oos_test`, with the threshold and without."""
    from mlx_slm.text.out_of_scope import answers, choose_threshold
    from mlx_slm.text.out_of_scope import figures as oos

    learned = OOS in labels  # trained as a class (--oos-train): its own probability, else 0
    names = list(labels) if learned else [*labels, OOS]

    def probs(a: str, b: str) -> np.ndarray:
        p = np.exp(np.concatenate([lps[a], lps[b]]))
        return p if learned else np.concatenate([p, np.zeros((len(p), 1))], axis=1)

    val_gold_names = [labels[g] for g in val_gold] + [OOS] * len(lps["oos_val"])
    threshold, chosen = choose_threshold(probs("val", "oos_val"), val_gold_names, names, OOS, target)
    test_p, test_g = probs("test", "oos_test"), [labels[g] for g in gold] + [OOS] * len(lps["oos_test"])
    return {"threshold": threshold, "target": target, "chosen_on": {k: chosen[k] for k in ("in_scope", "out_of_scope")},
            **oos(answers(test_p, names, OOS, threshold), test_g, OOS),
            "without": oos(answers(test_p, names, OOS, None), test_g, OOS)}  # fmt: skip


def run_head(engine, labels, system, template, train, test, extra=None, lps=None) -> dict:
    import mlx.core as mx

    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.jobs.train import train_head
    from mlx_slm.text.labels import log_softmax

    (xtr, ytr), (xte, yte) = train, test
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    head = train_head(engine, xtr, [labels[g] for g in ytr], classes=labels, system=system, template=template)
    secs = time.perf_counter() - t0
    peak = mx.get_peak_memory() / 1e6
    clf = Classifier(engine, labels, system, template, head=head)
    t1 = time.perf_counter()
    preds = list(clf.run(xte, window=len(xte)))
    test_s = time.perf_counter() - t1
    lp = log_softmax([[p.scores[k] for k in clf.labels] for p in preds])
    if lps is not None:
        lps["test"] = lp
        for name, texts in (extra or {}).items():
            texts = texts[0] if isinstance(texts, tuple) else texts
            lps[name] = log_softmax([[p.scores[k] for k in clf.labels] for p in clf.run(texts, window=len(texts))])
    return {
        **figures(lp, yte),
        "train_seconds": round(secs, 1),
        "peak_memory_mb": round(peak, 1),
        "test_items_per_s": round(len(xte) / test_s, 2),
        "layers": head.name,
        "kind": head.estimator,
    }


def run_finetune(engine, labels, fmt, train, test, settings, speed_n: int, extra=None, lps=None) -> tuple[dict, object]:
    import mlx.core as mx

    from mlx_slm.text.labels import build_labelset
    from mlx_slm.text.prompts import render, tokenize
    from mlx_slm.weights.finetune import Provenance, finetune

    tok = engine.tokenizer
    (xtr, ytr), (xte, yte) = train, test
    ptr = tokenize(tok, [render(tok, fmt, t) for t in xtr])
    pte = tokenize(tok, [render(tok, fmt, t) for t in xte])
    want = settings.objective == "labels" or settings.head_init == "words"
    lt = build_labelset(tok, labels, render(tok, fmt, "x")).token_ids if want else None

    shown = {"epoch": 0}

    def progress(p) -> None:
        if p.phase == "encode" and p.done == p.total:
            print(f"  frozen blocks: {p.total} texts in {p.elapsed:.0f} s", flush=True)
        if p.phase == "train" and p.epoch != shown["epoch"]:
            shown["epoch"] = p.epoch
            print(f"  {p.elapsed:.0f} s: epoch {p.epoch} starts; last val loss {p.val_loss}, val acc {p.val_accuracy}, "
                  f"about {p.eta or 0:.0f} s left", flush=True)  # fmt: skip

    ft = finetune(engine.model, ptr, list(ytr), labels, settings, label_tokens=lt, progress=progress,
                  provenance=Provenance(engine.weights_sha256, {"system": fmt.system, "template": fmt.template}))  # fmt: skip
    for e in ft.history:
        print(f"  epoch {e.epoch}: train loss {e.train_loss:.3f}, val loss {e.val_loss}, val acc {e.val_accuracy}, "
              f"{e.seconds:.0f} s, peak {e.peak_memory_mb:.0f} MB{'' if e.complete else ' (cut short)'}", flush=True)  # fmt: skip
    merged = ft.merge(engine.model)
    t0 = time.perf_counter()
    lp = ft.predict(merged, pte)
    test_s = time.perf_counter() - t0
    if lps is not None:
        lps["test"] = lp
        for name, texts in (extra or {}).items():
            texts = texts[0] if isinstance(texts, tuple) else texts
            lps[name] = ft.predict(merged, tokenize(tok, [render(tok, fmt, t) for t in texts]))
    complete = [e for e in ft.history if e.complete]
    out = {
        **figures(lp, yte),
        "train_seconds": round(ft.encode_seconds + ft.train_seconds, 1),
        "encode_seconds": ft.encode_seconds,
        "seconds_per_epoch": round(float(np.mean([e.seconds for e in complete])), 1) if complete else None,
        "epochs_run": len(ft.history),
        "best_epoch": ft.best_epoch,
        "stopped": ft.stopped,
        "peak_memory_mb": max(e.peak_memory_mb for e in ft.history),
        "test_items_per_s": round(len(pte) / test_s, 2),
        "history": [e.__dict__ for e in ft.history],
        "settings": {k: ft.settings[k] for k in ("objective", *TUNABLE)},
    }
    if speed_n:
        out["speed"] = speed(ft, engine.model, merged, pte[:: max(1, len(pte) // speed_n)][:speed_n])
    mx.clear_cache()
    return out, ft


def speed(ft, base, merged, prompts) -> dict:
    """items/s of the same prompts unfused (LoRA layers) and fused (merged weights), alternated 3 times (best of each)."""
    applied = ft.apply(base)
    got: dict[str, list[float]] = {"unfused": [], "fused": []}
    diffs = []
    for _ in range(3):
        for name, m in (("unfused", applied), ("fused", merged)):
            t0 = time.perf_counter()
            lp = ft.predict(m, prompts)
            got[name].append(len(prompts) / (time.perf_counter() - t0))
            diffs.append(lp)
    return {
        "n": len(prompts),
        **{k: round(max(v), 2) for k, v in got.items()},
        "max_prob_diff": float(np.abs(np.exp(diffs[0]) - np.exp(diffs[1])).max()),
    }


def settings_from(a, objective: str):
    from mlx_slm.weights.finetune import FinetuneSettings

    return FinetuneSettings(
        objective=objective, layers=a.layers, rank=a.rank, scale=a.scale, dropout=a.dropout, epochs=a.epochs,
        learning_rate=a.lr, head_learning_rate=a.head_lr, schedule=a.schedule, warmup=a.warmup,
        weight_decay=a.weight_decay, batch_size=a.batch_size, val_fraction=a.val_fraction, patience=a.patience,
        max_minutes=a.max_minutes, seed=a.seed, prefix_grad=a.prefix_grad, head_init=a.head_init,
        label_smoothing=a.label_smoothing, contrastive=a.contrastive, contrastive_temperature=a.contrastive_temperature,
        keep=a.keep,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--dataset", choices=("banking77", "clinc150", "tickets"), default="banking77")
    ap.add_argument("--banking77", default="../shared/data/banking77")
    ap.add_argument("--clinc150", default="../shared/data/clinc150")
    ap.add_argument(
        "--none-target",
        type=float,
        default=0.02,
        help="clinc150: the in-scope accuracy the none threshold may cost on val (as train --none-target)",
    )
    ap.add_argument(
        "--oos-train",
        type=int,
        default=0,
        help="clinc150: this many out-of-scope training queries, learned as a class 'oos'",
    )
    ap.add_argument("--lps", type=Path, default=None, help="save each method's test log-probabilities (npz) here")
    ap.add_argument("--folds", type=int, default=5, help="tickets: stratified folds")
    ap.add_argument("--fold-limit", type=int, default=0, help="tickets: run the first N folds only (0: all)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--tag", default="finetune")
    ap.add_argument("--note", default="", help="a word on this trial, kept in the trials table")
    ap.add_argument("--methods", default="head,score,labels")
    ap.add_argument("--per-intent", type=int, default=10)
    ap.add_argument("--test-per-intent", type=int, default=10)
    ap.add_argument("--all-test", action="store_true", help="test on the whole test.csv (3,080 messages)")
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument(
        "--system", choices=("full", "short"), default="full", help="the fine-tuned methods' system message"
    )
    ap.add_argument(
        "--head-system", choices=("full", "short"), default="full", help="the learned head's system message"
    )
    ap.add_argument(
        "--reuse",
        action="append",
        default=[],
        metavar="TAG:METHOD",
        help="take METHOD's row from the earlier run TAG (its JSON in --out), on the same data, instead of running it",
    )
    ap.add_argument("--speed-n", type=int, default=64)
    ap.add_argument("--prefix-grad", action="store_true", help="the gradient through the prompt head's KV too")
    ap.add_argument("--head-init", choices=("zeros", "probe", "centroid", "words"), default="zeros")
    ap.add_argument(
        "--keep",
        default="auto",
        choices=["auto", "average", "best", "last"],
        help="the weights kept (FinetuneSettings.keep; auto: best with --val-fraction, else average)",
    )
    for name, typ, default in (
        ("layers", int, 16), ("rank", int, 8), ("scale", float, 20.0), ("dropout", float, 0.0), ("epochs", int, 8),
        ("lr", float, 2e-5), ("head-lr", float, 1e-4), ("schedule", str, "cosine"), ("warmup", float, 0.1),
        ("weight-decay", float, 0.0), ("batch-size", int, 16), ("val-fraction", float, 0.0), ("patience", int, 2),
        ("max-minutes", float, 30.0), ("seed", int, 0), ("label-smoothing", float, 0.0), ("contrastive", float, 0.0),
        ("contrastive-temperature", float, 0.1),
    ):  # fmt: skip
        ap.add_argument(f"--{name}", type=typ, default=default)
    a = ap.parse_args(argv)
    from mlx_slm.engine.engine import Engine
    from mlx_slm.ground.blas import matmul_peak
    from mlx_slm.text.prompts import PromptFormat, fill_labels

    engine = Engine.load(a.model)
    if a.dataset == "tickets":
        from benchmarks.accuracy import TICKET_SYSTEM
        from mlx_slm.text.prompts import DEFAULT_TEMPLATE

        labels, splits = load_tickets(a.folds, a.per_intent, a.data_seed)
        splits = splits[: a.fold_limit or None]
        systems, template = {"full": TICKET_SYSTEM, "short": TICKET_SYSTEM}, DEFAULT_TEMPLATE
        test_desc = f"{len(splits)} of {a.folds} folds, each fold the test set"
    elif a.dataset == "clinc150":
        labels, xtr, ytr, xte, yte, extra = load_clinc(Path(a.clinc150), a.per_intent, a.data_seed,
                                                       oos_train=a.oos_train)  # fmt: skip
        splits, template = [(xtr, ytr, xte, yte)], CLINC_TEMPLATE
        systems = {"full": CLINC_FULL, "short": CLINC_SHORT}
        test_desc = "all of test (4,500 in scope), oos_test beside"
    else:
        labels, xtr, ytr, xte, yte = load_banking(Path(a.banking77), a.per_intent,
                                                  None if a.all_test else a.test_per_intent, a.data_seed)  # fmt: skip
        splits, systems, template = [(xtr, ytr, xte, yte)], SYSTEMS, BANKING_TEMPLATE
        test_desc = "all of test.csv" if a.all_test else f"{a.test_per_intent} per intent of test.csv"
    fmt = PromptFormat(fill_labels(systems[a.system], labels), template)
    extras = extra if a.dataset == "clinc150" else None
    peak0 = matmul_peak()["mlx"]
    methods: dict[str, dict] = {}
    if any(":" not in x for x in a.reuse):
        raise SystemExit(f"--reuse {a.reuse}: give TAG:METHOD, e.g. --reuse trial-04:score")
    reused = dict(x.split(":", 1)[::-1] for x in a.reuse)  # method -> tag
    for m in a.methods.split(","):
        if m in reused:
            methods[m] = reuse(a.out / f"{reused[m]}.json", m, data_key(a, splits))
            print(f"{m}: from {reused[m]}: accuracy {methods[m]['accuracy']}", flush=True)
            continue
        runs = []
        for i, (xtr, ytr, xte, yte) in enumerate(splits):
            print(f"{m}: split {i + 1} of {len(splits)}: {len(xtr)} training texts, {len(xte)} test texts", flush=True)
            lps: dict = {}
            if m == "head":
                r = run_head(engine, labels, systems[a.head_system], template, (xtr, ytr), (xte, yte), extras, lps)
                r["system"] = a.head_system
            else:
                r, _ = run_finetune(engine, labels, fmt, (xtr, ytr), (xte, yte), settings_from(a, m), a.speed_n,
                                    extras, lps)  # fmt: skip
                r["system"] = a.system
            if a.lps is not None:
                a.lps.mkdir(parents=True, exist_ok=True)
                np.savez_compressed(a.lps / f"{a.tag}-{m}-{i}.npz", gold=yte, **lps,
                                    **({"val_gold": extras["val"][1]} if extras else {}))  # fmt: skip
            print(f"  {m}: accuracy {r['accuracy']}, macro-F1 {r['macro_f1']}, {r['train_seconds']} s to train",
                  flush=True)  # fmt: skip
            if extras:
                r["oos"] = oos_figures(lps, extras["val"][1], yte, labels, a.none_target)
                print(f"  {m}: none of these: {r['oos']}", flush=True)
            runs.append(r)
        methods[m] = mean_of(runs)
    out = {
        **run_record("benchmarks.finetune", a.model, argv, peak0, matmul_peak()["mlx"]),
        "data": {"name": a.dataset, "train": sum(len(x[0]) for x in splits), "test": sum(len(x[2]) for x in splits),
                 "per_intent": a.per_intent, "system": a.system, "test_desc": test_desc,
                 "test_per_intent": None if a.all_test or a.dataset == "tickets" else a.test_per_intent,
                 "data_seed": a.data_seed, "splits": len(splits), "oos_train": a.oos_train},
        "note": a.note,
        "methods": methods,
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.tag}.json").write_text(json.dumps(out, indent=2) + "\n")
    (a.out / f"{a.tag}.md").write_text(markdown(out))
    plot(out, a.out / f"{a.tag}.png")
    add_trials(a.out, a.tag, out)
    print(markdown(out))
    return 0


def _how(r: dict) -> str:
    """A method's settings in words (what differs from the defaults of `FinetuneSettings` named)."""
    s = r.get("settings")
    if not s:
        return f"layers {r.get('layers')} ({r.get('kind')})"
    words = [f"top {s['layers']} blocks", f"rank {s['rank']}", f"scale {s['scale']:g}", f"lr {s['learning_rate']:g}"]
    if s.get("objective") == "score":
        words.append(f"head lr {s['head_learning_rate']:g}")
    words.append(f"batch {s['batch_size']}")
    for key, word in (("dropout", "dropout"), ("weight_decay", "weight decay")):
        if s.get(key):
            words.append(f"{word} {s[key]:g}")
    if s.get("prefix_grad"):
        words.append("gradient through the prompt head")
    if s.get("head_init", "zeros") != "zeros":
        words.append(f"head init {s['head_init']}")
    if s.get("label_smoothing"):
        words.append(f"label smoothing {s['label_smoothing']:g}")
    if s.get("contrastive"):
        words.append(f"contrastive {s['contrastive']:g} (t {s.get('contrastive_temperature', 0.1):g})")
    if s.get("keep") == "average" or s.get("average"):  # (trials before `keep` said average)
        words.append("later epochs averaged")
    if s.get("val_fraction") == 0:
        words.append("no validation split")
    words.append(f"best epoch {r['best_epoch']} of {r['epochs_run']} ({r['stopped']})")
    return ", ".join(words)


def _row(name: str, r: dict) -> str:
    per_epoch = r.get("seconds_per_epoch")
    return (
        f"| {name} | {r.get('system', '')} | {r['accuracy']:.3f} | {r['macro_f1']:.3f} | {r['train_seconds']:.0f} | "
        f"{'' if per_epoch is None else f'{per_epoch:.0f}'} | {r['peak_memory_mb']:.0f} | {r['test_items_per_s']} | "
        f"{_how(r)} |"
    )


HEADER = [
    "| method | system message | accuracy | macro-F1 | s to train | s / epoch | peak MLX MB | test items/s | settings |",
    "|---|---|---:|---:|---:|---:|---:|---:|---|",
]
NAMES = {"head": "learned head (today)", "score": "LoRA + score head (a)", "labels": "LoRA + label tokens (b)"}


def markdown(r: dict) -> str:
    d = r["data"]
    if d.get("name") == "clinc150":
        title = f"CLINC150, {d['per_intent']} per intent"
        about = (f"{d['train']} training queries, {d['test']} in-scope test queries (all of test) and oos_test; "
                 "system message per method in the table. ")  # fmt: skip
    elif d.get("name") == "tickets":
        title = f"the 355 labelled tickets, {d['per_intent']} per label, {d['test_desc']}"
        about = (f"{d['train']} training tickets and {d['test']} test tickets over the folds (the figures: the "
                 "folds' means); the ticket system message of benchmarks/accuracy.py. ")  # fmt: skip
    else:
        test = "all of test.csv" if d["test_per_intent"] is None else f"{d['test_per_intent']} per intent of test.csv"
        title = f"BANKING77, {d['per_intent']} per intent"
        about = (
            f"{d['train']} training messages, {d['test']} test messages ({test}); system message (full: the "
            "intents listed, as benchmarks/heads.py; short: without them) per method in the table. "
        )
    lines = [
        f"# Fine-tuned (LoRA) vs the learned head: {title} ({r['model']})",
        "",
        about + run_line(r),
        "",
        *HEADER,
        *[_row(NAMES.get(m, m), x) for m, x in r["methods"].items()],
        "",
    ]
    for m, x in r["methods"].items():
        if "from" in x:
            lines += [
                f"{NAMES.get(m, m)}: the row of the run `{x['from']}` on the same data: `{x['from_command']}`.",
                "",
            ]
    oos_rows = [(m, x["oos"]) for m, x in r["methods"].items() if x.get("oos")]
    if oos_rows:
        t = oos_rows[0][1]
        lines += [
            f"None of these: the threshold chosen on val ({t['chosen_on']['in_scope']} in scope) + oos_val "
            f"({t['chosen_on']['out_of_scope']}) to cost at most {t['target']:g} of in-scope accuracy there "
            f"(`mlx_slm.text.out_of_scope.choose_threshold`, as `train --none-threshold auto`), scored on test + "
            f"oos_test ({t['in_scope']} + {t['out_of_scope']}):",
            "",
            "| method | threshold | in-scope accuracy | without threshold | OOS recall | OOS precision |",
            "|---|---|---|---|---|---|",
            *[f"| {NAMES.get(m, m)} | {o['threshold'] if o['threshold'] is None else round(o['threshold'], 4)} | "
              f"{o['in_scope_accuracy']:.4f} | {o['without']['in_scope_accuracy']:.4f} | {o['oos_recall']:.4f} | "
              f"{o['oos_precision'] if o['oos_precision'] is None else round(o['oos_precision'], 4)} |"
              for m, o in oos_rows],
            "",
        ]  # fmt: skip
    for m, x in r["methods"].items():
        if "speed" in x:
            sp = x["speed"]
            lines.append(
                f"{NAMES.get(m, m)}: inference on {sp['n']} test prompts, unfused (LoRA layers) {sp['unfused']} "
                f"items/s, fused (merged) {sp['fused']} items/s; max |p unfused - p fused| {sp['max_prob_diff']:.1e}."
            )
    return "\n".join(lines) + "\n"


def add_trials(out: Path, tag: str, r: dict) -> None:
    """Append this run's rows to finetune-trials.json and rewrite finetune-trials.md from it."""
    path = out / "finetune-trials.json"
    trials = json.loads(path.read_text()) if path.exists() else []
    for m, x in r["methods"].items():
        if "from" in x:  # already listed under its own run
            continue
        trials.append({"tag": tag, "date": r["date"], "note": r.get("note", ""), "method": m, "data": r["data"],
                       **{k: v for k, v in x.items() if k not in ("history",)}})  # fmt: skip
    path.write_text(json.dumps(trials, indent=2) + "\n")
    lines = [
        "# Fine-tuning trials (every run of benchmarks/finetune.py, in order; BANKING77 unless the test column says tickets)",
        "",
        "Seconds are indicative: trial-01 to trial-05 ran while the 2-core machine was shared with other work; the later runs on the machine alone.",
        "",
        "| run | note | test | " + HEADER[0][2:],
        "|---|---|---|" + HEADER[1][1:],
    ]
    for t in trials:
        d = t["data"]
        test = f"{d['test']} ({'all' if d['test_per_intent'] is None else str(d['test_per_intent']) + '/intent'})"
        if d.get("name") == "tickets":
            test = f"tickets: {d['test']} ({d['test_desc']})"
        t.setdefault("system", d["system"])
        lines.append(f"| {t['tag']} | {t['note']} | {test} " + _row(NAMES.get(t["method"], t["method"]), t))
    (out / "finetune-trials.md").write_text("\n".join(lines) + "\n")


def plot(r: dict, path: Path) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib missing: no PNG (pip install 'mlx-slm[bench]')", file=sys.stderr)
        return
    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    for m, x in r["methods"].items():
        ax.scatter([x["train_seconds"] / 60], [x["accuracy"]], s=60, label=NAMES.get(m, m))
    ax.axhline(0.87, ls=":", color="grey", label="goal 0.87")
    ax.set_xlabel("minutes to train (2 shared cores)")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=8)
    ax2 = fig.add_subplot(1, 2, 2)
    for m, x in r["methods"].items():
        h = x.get("history")
        if h:
            ax2.plot([e["epoch"] for e in h], [e["val_accuracy"] for e in h], marker="o", label=NAMES.get(m, m))
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("validation accuracy")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
