"""Several questions per text in one pass, against one run per question.

    python -m benchmarks.questions [--model qwen2.5-coder-0.5b] [--n 24] [--counts 1,2,4,8,16]
        [--repeat 1] [--out benchmarks/results] [--name questions]

The texts: `--n` workload tickets, stratified by length (every n-th of the 600 sorted by
length). The questions: sixteen triage questions about a support ticket (choice, yes/no,
scale), each 15-20 tokens with its answer line. For each question alone, one run the way
one question runs today (`Classifier(engine, labels, system, template)` on that question's
own full prompt: the label path); then for each count c, one run asking the first c
questions together, in the same process. Reported per count: seconds, items/s, the tokens
the run processed, its token floor (every text's own tokens once after the shared head, plus
every branch's question and option tokens, no padding), the seconds that floor needs at the
measured matmul peak (tokens x FLOPs per token), and answers equal to the single runs (labels,
and the largest probability difference). `--repeat R`: R rounds, each every single run then
every count's run (interleaved, so a busy machine slows both sides alike); the seconds are
the medians of the rounds, and "x single runs" the ratio of the medians (the one pass's
median over the median of each round's sum of single runs).

Results: `--out`/`--name`.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.record import run_line, run_record
from mlx_slm.classifier.classifier import Classifier
from mlx_slm.engine.engine import Engine
from mlx_slm.ground.blas import matmul_peak
from mlx_slm.models import flops_per_token
from mlx_slm.text.questions import Question
from mlx_slm.text.workload import tickets

YN = ("yes", "no")
QUESTIONS = [
    Question("team", "Which team should handle this ticket?", "choice", ("billing", "technical", "account")),
    Question("urgent", "Does this ticket need an answer today?", "yesno", YN),
    Question("angry", "Is the customer angry or upset?", "yesno", YN),
    Question("refund", "Does the customer ask for money back?", "yesno", YN),
    Question("mood", "How calm is the customer, from 1 to 5?", "scale", ("1", "2", "3", "4", "5")),
    Question("product", "Which product is it about?", "choice", ("app", "website", "card")),
    Question("repeat", "Has the customer written about this before?", "yesno", YN),
    Question("bug", "Does the ticket report a software bug?", "yesno", YN),
    Question("security", "Could the account be at risk?", "yesno", YN),
    Question("churn", "Might the customer leave us?", "yesno", YN),
    Question("effort", "How much work to solve it, from 1 to 3?", "scale", ("1", "2", "3")),
    Question("language", "Is the ticket written in English?", "yesno", YN),
    Question("payment", "Is a payment mentioned in the ticket?", "yesno", YN),
    Question("login", "Is logging in part of the problem?", "yesno", YN),
    Question("polite", "Is the customer polite?", "yesno", YN),
    Question("priority", "What priority should it get?", "choice", ("low", "normal", "high")),
]


def texts_of(n: int) -> list[str]:
    all_t = [t for t, _ in tickets(600)]
    order = sorted(range(600), key=lambda i: len(all_t[i].split()))
    return [all_t[order[int(k * 600 / n)]] for k in range(n)]


def timed(clf: Classifier, texts: list[str]) -> tuple[list, dict, float, float]:
    """A run's predictions, figures, wall seconds and process CPU seconds (every thread's: a
    busy machine stretches the wall clock of a run that waits on its threads far more)."""
    run = clf.run(texts, window=len(texts))
    t0, c0 = time.perf_counter(), time.process_time()
    preds = list(run)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    bad = [p for p in preds if not p.ok]
    if bad:
        raise SystemExit(f"item {bad[0].index}: {bad[0].error}")
    return preds, run.stats.as_dict(), secs, cpu


def floor_tokens(clf: Classifier, texts: list[str]) -> int:
    """Every text's own tokens once (after the shared head) plus every branch's tokens."""
    plan = clf.kind.plan
    assert plan is not None
    head = len(clf.prefix_tokens)
    total = 0
    for common, chains in plan.split(texts):
        total += len(common) - (head if common[:head] == list(clf.prefix_tokens) else 0)
        total += sum(len(c) + b.nodes for c, b in zip(chains, plan.blocks))
    return total


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--counts", default="1,2,4,8,16")
    ap.add_argument("--repeat", type=int, default=1, help="rounds (interleaved); medians reported")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--name", default="questions", help="the result files' name")
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.counts.split(",")]
    engine = Engine.load(a.model)
    texts = texts_of(a.n)
    per_token = flops_per_token(json.loads((engine.path / "config.json").read_text()))
    peak0 = matmul_peak()["mlx"]
    # Today's way: one run per question, through the label path, on that question's own full prompt.
    singles_clf = []
    for q in QUESTIONS[: max(counts)]:
        (block,) = Classifier(engine, questions=[q]).kind.plan.blocks
        singles_clf.append((q, Classifier(engine, list(block.options.labels), block.fmt.system, block.fmt.template)))
    together = {c: Classifier(engine, questions=QUESTIONS[:c]) for c in counts}
    alone_answers: list[list] = []
    alone_secs: list[list[float]] = [[] for _ in singles_clf]
    alone_cpu: list[list[float]] = [[] for _ in singles_clf]
    runs: dict[int, list[tuple[list, dict, float]]] = {c: [] for c in counts}
    for r in range(a.repeat):
        for i, (q, clf) in enumerate(singles_clf):
            preds, _, secs, cpu = timed(clf, texts)
            if r == 0:
                alone_answers.append([q.answer([np.array([p.scores[k] for k in clf.labels])]) for p in preds])
            alone_secs[i].append(secs)
            alone_cpu[i].append(cpu)
            print(f"round {r + 1} alone {q.name:>9}: {secs:6.1f} s", file=sys.stderr)
        for c in counts:
            runs[c].append(timed(together[c], texts))
            print(f"round {r + 1} {c:>2} questions: {runs[c][-1][2]:6.1f} s", file=sys.stderr)
    alone = [(ans, statistics.median(s)) for ans, s in zip(alone_answers, alone_secs)]
    rows = []
    for c in counts:
        clf = together[c]
        preds, st, _, _ = runs[c][0]
        secs = statistics.median(x[2] for x in runs[c])
        singles = statistics.median(sum(s[r] for s in alone_secs[:c]) for r in range(a.repeat))
        cpu = statistics.median(x[3] for x in runs[c])
        singles_cpu = statistics.median(sum(s[r] for s in alone_cpu[:c]) for r in range(a.repeat))
        equal, worst = 0, 0.0
        for qi, q in enumerate(QUESTIONS[:c]):
            for p, one in zip(preds, alone[qi][0]):
                x, y = p.answers[q.name], one
                equal += x["label"] == y["label"]
                worst = max(worst, max(abs(x["probs"][k] - y["probs"][k]) for k in x["probs"]))
        floor = floor_tokens(clf, texts)
        row = {
            "questions": c,
            "seconds": round(secs, 2),
            "items_per_s": round(len(texts) / secs, 3),
            "single_runs_seconds": round(singles, 2),
            "x_single_runs": round(secs / singles, 3),
            "cpu_seconds": round(cpu, 2),
            "single_runs_cpu_seconds": round(singles_cpu, 2),
            "x_single_runs_cpu": round(cpu / singles_cpu, 3),
            "x_one_question": round(secs / alone[0][1], 3),
            "processed_tokens": st["processed_tokens"],
            "floor_tokens": floor,
            "x_token_floor": round(st["processed_tokens"] / floor, 3),
            "branch_tokens_per_row": round(st["label_tokens"] / len(texts), 1),
            "answers_equal": f"{equal}/{c * len(texts)}",
            "max_prob_diff": worst,
            "stats": st,
            "seconds_rounds": [round(x[2], 2) for x in runs[c]],
            "single_runs_seconds_rounds": [round(sum(s[r] for s in alone_secs[:c]), 2) for r in range(a.repeat)],
        }
        rows.append(row)
        print(
            f"{c:>2} questions: {secs:6.1f} s  {row['x_single_runs']:.2f}x the single runs  "
            f"{row['x_one_question']:.2f}x one  tokens {row['x_token_floor']:.2f}x floor  "
            f"equal {row['answers_equal']}  max diff {worst:.1e}",
            file=sys.stderr,
        )
    peak1 = matmul_peak()["mlx"]
    peak = max(peak0, peak1)
    for r in rows:
        r["floor_seconds"] = round(r["floor_tokens"] * per_token / (peak * 1e9), 2)
        r["x_floor_seconds"] = round(r["seconds"] / r["floor_seconds"], 2)
    out = {
        **run_record("benchmarks.questions", a.model, argv, peak0, peak1),
        "texts": len(texts),
        "repeat": a.repeat,
        "alone_seconds": {q.name: round(s, 2) for q, (_, s) in zip(QUESTIONS, alone)},
        "rows": rows,
    }
    write(out, a.out, a.name)


def write(out: dict, folder: Path, name: str = "questions") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        f"# Several questions per text ({out['model']}, {out['date']}, {out['texts']} workload tickets"
        + (f", medians of {out['repeat']} interleaved rounds)" if out.get("repeat", 1) > 1 else ")"),
        "",
        run_line(out),
        "",
        "| questions | seconds | items/s | single runs (s) | x single runs | x one question | branch tokens/row "
        "| tokens x floor | seconds x floor | answers equal | max prob diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['questions']} | {r['seconds']} | {r['items_per_s']} | {r['single_runs_seconds']} | "
            f"{r['x_single_runs']} | {r['x_one_question']} | {r['branch_tokens_per_row']} | {r['x_token_floor']} | "
            f"{r['x_floor_seconds']} | {r['answers_equal']} | {r['max_prob_diff']:.1e} |"
        )
    if out.get("repeat", 1) > 1:
        lines += ["", "Process CPU seconds (every thread; medians), one pass against that many single runs:", ""]
        lines += [
            f"- {r['questions']} questions: {r['cpu_seconds']} against {r['single_runs_cpu_seconds']}: "
            f"{r['x_single_runs_cpu']}x"
            for r in out["rows"]
            if "cpu_seconds" in r
        ]
        lines += ["", "Each round's seconds (one pass; that many single runs):", ""]
        lines += [
            f"- {r['questions']} questions: {r['seconds_rounds']}; {r['single_runs_seconds_rounds']}"
            for r in out["rows"]
        ]
    (folder / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    qs = [r["questions"] for r in out["rows"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(qs, [r["seconds"] for r in out["rows"]], "o-", label="one pass, all questions")
    ax.plot(qs, [r["single_runs_seconds"] for r in out["rows"]], "s--", label="one run per question")
    ax.plot(qs, [r["floor_seconds"] for r in out["rows"]], ":", label="token floor at the matmul peak")
    ax.set_xlabel("questions per text")
    ax.set_ylabel(f"seconds for {out['texts']} tickets")
    ax.set_xscale("log", base=2)
    ax.set_title(f"Several questions per text ({out['model']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / f"{name}.png", dpi=120)


if __name__ == "__main__":
    main()
