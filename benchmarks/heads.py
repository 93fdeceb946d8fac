"""Learned heads against label scoring and calibration, by training-set size.

    python -m benchmarks.heads --banking77 ../shared/data/banking77 [--model qwen2.5-coder-0.5b]
        [--out benchmarks/results] [--sizes 10,25,50,100,300]

Data sets (each classified once by label scoring and once for hidden states; every
method is then applied to those same numbers with the library's own functions):

* `workload`: the 600-ticket benchmark workload (3 labels); the last `--workload-test`
  tickets of each label are the test set, training sets are drawn from the rest;
* `tickets`: benchmarks/data/support_tickets.jsonl (355 hand-labelled tickets, 6 labels),
  cross-validated: `--outer-folds` stratified folds, each tested on a head / prior trained
  on the other folds (training sizes drawn from those, and "all");
* `banking77`: BANKING77 (77 intents) from `--banking77` (train.csv, test.csv: text,
  category): training sets from train.csv, tested on `--banking77-test` messages per
  intent of test.csv.

Methods: `raw` (label scoring), `batch` (the test set's own prior), `fit` (per-label offsets
fitted on the training set's label scores), `head` (`heads.fit`: layer and C by
cross-validation on the training set; the same code as `mlx-slm train`). Figures: accuracy,
macro-F1, ECE, training seconds (the head's CV + fit, plus its training items' forward),
items/s (label scoring; the head's forward, stopped at its layer, measured side by side on
`--speed-n` test texts, also with 3 labels against 77). JSON, markdown and PNG in --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.accuracy import DATA, TICKET_LABELS, TICKET_SYSTEM, _jsonl
from mlx_slm.jobs.train import candidates, default_layers
from mlx_slm.text.calibration import fit_batch, fit_labelled
from mlx_slm.text.heads import candidate_name, head_input
from mlx_slm.text.heads import fit as fit_head
from mlx_slm.text.labels import log_softmax
from mlx_slm.text.metrics import confusion, ece, macro_f1
from mlx_slm.text.prompts import DEFAULT_LABELS, DEFAULT_SYSTEM, DEFAULT_TEMPLATE
from mlx_slm.text.workload import tickets

# The intents listed in the system message ({labels}, filled in once and prefix-cached): the
# last prompt position then reads the message against them (measured: a head on it does
# better than without the list, and label scoring sees the choices it scores).
BANKING_SYSTEM = "You classify messages to a bank's customer service by their intent. The intents: {labels}."
BANKING_TEMPLATE = "Message: {text}\nIntent:"
METHODS = ("raw", "batch", "fit", "head")


def figures(lp: np.ndarray, gold: np.ndarray) -> dict:
    pred = lp.argmax(1)
    k = lp.shape[1]
    return {
        "n": int(len(gold)),
        "accuracy": round(float((pred == gold).mean()), 4),
        "macro_f1": round(float(macro_f1(confusion(gold, pred, k))), 4),
        "ece": round(float(ece(np.exp(lp.max(1)), pred == gold)), 4),
    }


def label_scores(clf, texts: list[str]) -> tuple[np.ndarray, float]:
    run = clf.run(texts, window=max(1, len(texts)))
    preds = list(run)
    bad = [p for p in preds if not p.ok]
    if bad:
        raise SystemExit(f"item {bad[0].index}: {bad[0].error}")
    return log_softmax([[p.scores[k] for k in clf.labels] for p in preds]), run.stats.seconds


def per_label_draw(gold: np.ndarray, pool: np.ndarray, s: int, k: int, rng) -> np.ndarray | None:
    """`s` items of each label from `pool` (None if some label has fewer)."""
    out = []
    for c in range(k):
        have = pool[gold[pool] == c]
        if len(have) < s:
            return None
        out.append(rng.choice(have, s, replace=False))
    return np.sort(np.concatenate(out))


class DataSet:
    def __init__(self, name, labels, system, template, texts, gold, test=None, folds=None):
        self.name, self.labels, self.system, self.template = name, tuple(labels), system, template
        self.texts = list(texts)
        self.gold = np.array([self.labels.index(g) for g in gold])
        self.test = test  # indices of the test set, or None: cross-validated
        self.folds = folds


def run_methods(ds, lp, feats, layers, cands, train_idx, test_idx, per_item_s, folds) -> dict:
    k = len(ds.labels)
    g_tr, g_te = ds.gold[train_idx], ds.gold[test_idx]
    out = {
        "raw": figures(lp[test_idx], g_te),
        "batch": figures(fit_batch(lp[test_idx], ds.labels).apply(lp[test_idx]), g_te),
        "fit": figures(fit_labelled(lp[train_idx], g_tr, ds.labels).apply(lp[test_idx]), g_te),
    }
    t0 = time.perf_counter()
    head = fit_head({p: f[train_idx] for p, f in feats.items()}, layers, g_tr, ds.labels, cands, folds=folds)
    fit_s = time.perf_counter() - t0
    out["head"] = figures(head.log_probs(head_input(feats, layers, head)[test_idx]), g_te)
    out["head"].update(
        {
            "layers": list(head.layers),
            "poolings": list(head.poolings),
            "name": head.name,
            "kind": head.estimator,
            "C": head.C,
            "cv_accuracy": round(head.info["chosen"]["accuracy"], 4),
            "fit_seconds": round(fit_s, 2),
            "train_seconds": round(fit_s + per_item_s * len(train_idx), 2),
            "by_layer": {
                candidate_name(r["layers"], r["poolings"]): round(r["accuracy"], 4) for r in head.info["table"]
            },
        }
    )
    assert k == len(head.labels)
    return out, head


def mean_of(runs: list[dict]) -> dict:
    out = {}
    for m in runs[0]:
        out[m] = {
            key: round(float(np.mean([r[m][key] for r in runs])), 4)
            for key in ("accuracy", "macro_f1", "ece")
            if key in runs[0][m]
        }
        out[m]["n"] = int(sum(r[m]["n"] for r in runs))
        if m == "head":
            for key in ("fit_seconds", "train_seconds"):
                out[m][key] = round(float(np.mean([r[m][key] for r in runs])), 2)
            out[m]["layers"] = sorted({r[m]["name"] for r in runs})
            out[m]["kind"] = sorted({r[m]["kind"] for r in runs})
    return out


def speed(engine, ds, head, texts, label_clf) -> dict:
    """items/s side by side on the same texts: label scoring, the head (forward stopped at its
    layer), and the same head's forward at the last layer."""
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.text.heads import Head

    n = len(engine.model.layers)
    res = {"n": len(texts)}
    _, secs = label_scores(label_clf, texts)
    res["label_scoring"] = round(len(texts) / secs, 3)
    for name, h in (("head", head), ("head_last_layer", _at_layer(head, n) if head.layers != (n,) else None)):
        if h is None:
            continue
        clf = Classifier(engine, ds.labels, ds.system, ds.template, head=h)
        run = clf.run(texts, window=len(texts))
        list(run)
        res[name] = round(len(texts) / run.stats.seconds, 3)
        res[name + "_layers"] = h.name
    # The label count: a 3-label head on the same texts costs what the k-label one does.
    k3 = Head(
        ds.labels[:3],
        head.layers,
        head.mean,
        head.scale,
        head.coef[:3],
        head.intercept[:3],
        poolings=head.poolings,
        kind=head.estimator,
    )
    clf = Classifier(engine, k3.labels, ds.system, ds.template, head=k3)
    run = clf.run(texts, window=len(texts))
    list(run)
    res["head_3_labels"] = round(len(texts) / run.stats.seconds, 3)
    return res


def _at_layer(head, layer: int):
    """A head of the same shape reading `layer` (for timing only: its labels mean nothing)."""
    from mlx_slm.text.heads import Head

    d = head.dim
    return Head(
        head.labels, (layer,), head.mean[:d], head.scale[:d], head.coef[:, :d], head.intercept, poolings=("last",)
    )


def load_sets(args) -> list[DataSet]:
    sets = []
    work = tickets(args.workload_n)
    gold = np.array([DEFAULT_LABELS.index(g) for _, g in work])
    test = np.sort(np.concatenate([np.flatnonzero(gold == c)[-args.workload_test :] for c in range(3)]))
    sets.append(
        DataSet(
            "workload",
            DEFAULT_LABELS,
            DEFAULT_SYSTEM,
            DEFAULT_TEMPLATE,
            [t for t, _ in work],
            [g for _, g in work],
            test,
        )
    )
    sup = _jsonl(DATA / "support_tickets.jsonl")
    sets.append(
        DataSet(
            "tickets",
            TICKET_LABELS,
            TICKET_SYSTEM,
            DEFAULT_TEMPLATE,
            [r["text"] for r in sup],
            [r["label"] for r in sup],
            folds=args.outer_folds,
        )
    )
    if args.banking77:
        root = Path(args.banking77)
        intents = json.loads((root / "categories.json").read_text())[: args.banking77_intents or None]
        name = {lab: lab.replace("_", " ") for lab in intents}  # label scoring reads words: "card arrival"
        labels = [name[lab] for lab in intents]
        tr = list(csv.DictReader(open(root / "train.csv", encoding="utf-8")))
        te = list(csv.DictReader(open(root / "test.csv", encoding="utf-8")))
        rng = np.random.default_rng(0)
        need = min(max(args.sizes), args.banking77_max_size or max(args.sizes))
        pool, test = [], []
        for lab in intents:  # the pool: up to the largest size per intent; the test: --banking77-test each
            a = [r["text"] for r in tr if r["category"] == lab]
            pool += [(a[i], name[lab]) for i in rng.permutation(len(a))[:need]]
            b = [r["text"] for r in te if r["category"] == lab]
            test += [(b[i], name[lab]) for i in rng.permutation(len(b))[: args.banking77_test]]
        rows = pool + test
        idx = np.arange(len(pool), len(rows))
        sets.append(
            DataSet(
                "banking77",
                labels,
                BANKING_SYSTEM,
                BANKING_TEMPLATE,
                [t for t, _ in rows],
                [g for _, g in rows],
                idx,
            )
        )
    return sets


def main(argv: list[str] | None = None) -> int:
    from mlx_slm.classifier.classifier import Classifier
    from mlx_slm.engine.engine import Engine
    from mlx_slm.jobs.train import head_classifier

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="heads", help="results file names: TAG.json, TAG.md, TAG.png")
    ap.add_argument("--banking77", default=None, help="BANKING77 folder (train.csv, test.csv, categories.json)")
    ap.add_argument("--sets", default="workload,tickets,banking77")
    ap.add_argument("--sizes", default="10,25,50,100,300", help="training examples per label")
    ap.add_argument("--workload-n", type=int, default=600, help="workload tickets (a quick run: fewer)")
    ap.add_argument("--workload-test", type=int, default=100, help="workload test tickets per label")
    ap.add_argument("--banking77-intents", type=int, default=0, help="first N intents only (a quick run); 0: all 77")
    ap.add_argument("--banking77-test", type=int, default=40, help="BANKING77 test messages per intent (all: 40)")
    ap.add_argument(
        "--banking77-max-size",
        type=int,
        default=0,
        help="BANKING77 training pool per intent at most this (0: the largest --sizes); label scoring of 77 "
        "labels runs over the whole pool (for `fit`), about 1 s a message on a 2-core CPU",
    )
    ap.add_argument("--outer-folds", type=int, default=5, help="tickets: cross-validation folds")
    ap.add_argument("--folds", type=int, default=5, help="the head's own CV folds (layer and C)")
    ap.add_argument("--layers", default="auto", help="candidate layers: auto, all, or 6,12,24")
    ap.add_argument("--poolings", default="last,mean", help="candidate poolings: last, mean, or both")
    ap.add_argument("--speed-n", type=int, default=64, help="test texts timed side by side per data set")
    args = ap.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.sets.split(","))
    engine = Engine.load(args.model)
    n = len(engine.model.layers)
    layers = default_layers(n) if args.layers == "auto" else (
        list(range(1, n + 1)) if args.layers == "all" else [int(x) for x in args.layers.split(",")]
    )  # fmt: skip
    poolings = tuple(args.poolings.split(","))
    cands = candidates(layers, n, poolings=poolings)
    feat_layers = sorted({x for c in cands for x in c.layers})
    results: dict = {
        "model": args.model,
        "machine": f"{platform.machine()}, {platform.system()}",
        "command": " ".join(["python -m benchmarks.heads", *(sys.argv[1:] if argv is None else argv)]),
        "layers": [c.name for c in cands],
        "sets": {},
    }
    for ds in load_sets(args):
        if ds.name not in wanted:
            continue
        print(f"{ds.name}: {len(ds.texts)} texts, {len(ds.labels)} labels", flush=True)
        label_clf = Classifier(engine, ds.labels, ds.system, ds.template)
        lp, score_s = label_scores(label_clf, ds.texts)
        print(f"  label scoring: {len(ds.texts) / score_s:.2f} items/s", flush=True)
        feats, errors, st = head_classifier(engine, ds.labels, ds.system, ds.template).features(
            ds.texts, feat_layers, poolings=poolings
        )
        assert not any(errors), [e for e in errors if e][:1]
        per_item = st.seconds / len(ds.texts)
        print(f"  features (to layer {max(feat_layers)}): {1 / per_item:.2f} items/s", flush=True)
        k = len(ds.labels)
        rng = np.random.default_rng(0)
        rec = {
            "labels": k,
            "items": len(ds.texts),
            "label_scoring_items_per_s": round(len(ds.texts) / score_s, 3),
            "features_items_per_s": round(1 / per_item, 3),
            "by_size": {},
        }
        last_head, speed_texts = None, None
        if ds.test is not None:
            pool = np.setdiff1d(np.arange(len(ds.texts)), ds.test)
            for s in args.sizes:
                tr = per_label_draw(ds.gold, pool, s, k, rng)
                if tr is None or s < args.folds:
                    continue
                res, last_head = run_methods(ds, lp, feats, feat_layers, cands, tr, ds.test, per_item, args.folds)
                rec["by_size"][str(s)] = res
                print(f"  {s}/label: " + ", ".join(f"{m} {res[m]['accuracy']:.3f}" for m in METHODS), flush=True)
            speed_texts = [ds.texts[i] for i in ds.test[np.linspace(0, len(ds.test) - 1, args.speed_n).astype(int)]]
        else:
            from sklearn.model_selection import StratifiedKFold

            outer = list(StratifiedKFold(ds.folds, shuffle=True, random_state=0).split(np.zeros(len(ds.gold)), ds.gold))
            for s in [*args.sizes, "all"]:
                runs = []
                for tr_all, te in outer:
                    tr = tr_all if s == "all" else per_label_draw(ds.gold, tr_all, s, k, rng)
                    if tr is None or (s != "all" and s < args.folds):
                        runs = []
                        break
                    res, last_head = run_methods(ds, lp, feats, feat_layers, cands, tr, te, per_item, args.folds)
                    runs.append(res)
                if runs:
                    rec["by_size"][str(s)] = mean_of(runs)
                    m = rec["by_size"][str(s)]
                    print(f"  {s}/label (CV): " + ", ".join(f"{x} {m[x]['accuracy']:.3f}" for x in METHODS), flush=True)
            speed_texts = [ds.texts[i] for i in np.linspace(0, len(ds.texts) - 1, args.speed_n).astype(int)]
        if last_head is not None:
            rec["speed"] = speed(engine, ds, last_head, speed_texts, label_clf)
            print(f"  speed: {rec['speed']}", flush=True)
        results["sets"][ds.name] = rec
    tag = args.tag
    (out / f"{tag}.json").write_text(json.dumps(results, indent=2) + "\n")
    md = markdown(results)
    (out / f"{tag}.md").write_text(md)
    try:
        plot(results, out / f"{tag}.png")
    except ImportError:
        print("matplotlib missing: no PNG (pip install 'mlx-slm[bench]')")
    print(md)
    return 0


def markdown(r: dict) -> str:
    lines = [
        f"# Learned heads vs label scoring ({r['model']})",
        "",
        f"`{r['command']}` on {r['machine']}. Candidate layers: {', '.join(r['layers'])}.",
        "",
    ]
    for name, s in r["sets"].items():
        lines += [
            f"## {name} ({s['labels']} labels, {s['items']} texts)",
            "",
            "| per label | raw acc | batch acc | fit acc | head acc | head macro-F1 | head ECE | head layer | head train s |",
            "|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        for size, m in s["by_size"].items():
            h = m["head"]
            layer = h["layers"] if isinstance(h["layers"], list) and isinstance(h["layers"][0], str) else None
            layer = ", ".join(layer) if layer else h.get("name", candidate_name(h["layers"]))
            layer += f" ({', '.join(h['kind']) if isinstance(h.get('kind'), list) else h.get('kind', 'logistic')})"
            lines.append(
                f"| {size} | {m['raw']['accuracy']:.3f} | {m['batch']['accuracy']:.3f} | {m['fit']['accuracy']:.3f} "
                f"| {h['accuracy']:.3f} | {h['macro_f1']:.3f} | {h['ece']:.3f} | {layer} | {h['train_seconds']} |"
            )
        sp = s.get("speed", {})
        lines += [
            "",
            f"items/s: label scoring {s['label_scoring_items_per_s']} (all texts), hidden states to the deepest "
            f"candidate {s['features_items_per_s']}; side by side on {sp.get('n')} test texts: label scoring "
            f"{sp.get('label_scoring')}, head (layer {sp.get('head_layers')}) {sp.get('head')}, "
            f"head at the last layer {sp.get('head_last_layer', sp.get('head'))}, the same head with 3 labels "
            f"{sp.get('head_3_labels')}.",
            "",
        ]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sets = list(r["sets"].items())
    fig = Figure(figsize=(5 * max(1, len(sets)), 4))
    FigureCanvasAgg(fig)
    for i, (name, s) in enumerate(sets, 1):
        ax = fig.add_subplot(1, len(sets), i)
        sizes = [x for x in s["by_size"] if x != "all"]
        for m in METHODS:
            ax.plot([int(x) for x in sizes], [s["by_size"][x][m]["accuracy"] for x in sizes], marker="o", label=m)
        if "all" in s["by_size"]:
            for m in METHODS:
                ax.axhline(s["by_size"]["all"][m]["accuracy"], ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(f"{name} ({s['labels']} labels)")
        ax.set_xlabel("training examples per label")
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
