"""The scikit-learn estimator against `mlx-slm train` + `classify --task`, same data and prompt.

    python -m benchmarks.sklearn_vs_cli [--model qwen2.5-coder-0.5b] [--n-train 300]
        [--out benchmarks/results/sklearn-vs-cli.json]

Data: benchmarks/data/support_tickets.jsonl (355 hand-labelled tickets, 6 labels): the first
`--n-train` are the training set, the rest the test set. The CLI runs as a user runs it (two
child processes: `train`, then `classify --task`); the estimator fits in this process
(`SLMClassifier(...).fit(X, y)`, then `predict_proba`). Reported: both accuracies on the test
set, whether the two heads are the same (sha256 of their weights), the largest difference
between their probabilities, and each side's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import mlx_slm  # noqa: F401  (BLAS before mlx)
from benchmarks.accuracy import DATA, TICKET_SYSTEM
from mlx_slm.weights.registry import DEFAULT_MODEL

TEMPLATE = "Ticket: {text}\nCategory:"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--n-train", type=int, default=300)
    ap.add_argument("--out", default="benchmarks/results/sklearn-vs-cli.json")
    a = ap.parse_args()
    rows = [json.loads(x) for x in (DATA / "support_tickets.jsonl").read_text(encoding="utf-8").splitlines()]
    train, test = rows[: a.n_train], rows[a.n_train :]
    X, y = [r["text"] for r in train], [r["label"] for r in train]
    Xt, yt = [r["text"] for r in test], [r["label"] for r in test]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "train.jsonl").write_text("".join(json.dumps({"text": t, "label": g}) + "\n" for t, g in zip(X, y)))
        (d / "test.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(Xt)))
        cli = [sys.executable, "-m", "mlx_slm.cli"]
        prompt = ["--model", a.model, "--system", TICKET_SYSTEM, "--template", TEMPLATE]
        t0 = time.perf_counter()
        subprocess.run([*cli, "train", str(d / "train.jsonl"), *prompt, "--save-task", str(d / "task.json"), "--quiet"],
                       check=True, env=env)  # fmt: skip
        t1 = time.perf_counter()
        subprocess.run([*cli, "classify", str(d / "test.jsonl"), "--task", str(d / "task.json"), "-o", str(d / "out.jsonl"), "--quiet"],
                       check=True, env=env)  # fmt: skip
        t2 = time.perf_counter()
        out = [json.loads(x) for x in (d / "out.jsonl").read_text().splitlines()]
        cli_head = json.loads((d / "task.json").read_text())["head"]

        from mlx_slm.sklearn import SLMClassifier

        t3 = time.perf_counter()
        est = SLMClassifier(a.model, system=TICKET_SYSTEM, template=TEMPLATE).fit(X, y)
        t4 = time.perf_counter()
        proba = est.predict_proba(Xt)
        t5 = time.perf_counter()
    cli_p = np.array([[r["probs"][c] for c in est.classes_] for r in out])
    est_pred = est.classes_[proba.argmax(axis=1)]
    result = {
        "model": a.model,
        "data": "benchmarks/data/support_tickets.jsonl",
        "n_train": len(X),
        "n_test": len(Xt),
        "labels": list(est.classes_),
        "cli_accuracy": float(np.mean([r["label"] == g for r, g in zip(out, yt)])),
        "estimator_accuracy": float(np.mean(est_pred == np.array(yt))),
        "same_head": est.task_.head.sha256 == cli_head["sha256"],
        "head": est.task_.head.name,
        "head_kind": est.task_.head.estimator,
        "cv_accuracy": est.task_.head.info["chosen"]["accuracy"],
        "max_abs_prob_diff": float(np.abs(cli_p - proba).max()),
        "same_labels": [r["label"] for r in out] == est_pred.tolist(),
        "seconds": {
            "cli_train": round(t1 - t0, 1),
            "cli_classify": round(t2 - t1, 1),
            "estimator_fit": round(t4 - t3, 1),
            "estimator_predict": round(t5 - t4, 1),
        },
    }
    print(json.dumps(result, indent=2))
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
