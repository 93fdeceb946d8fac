"""A real client checks a served task (issue 55, item 6): jev-style's `eval` (PyPI jev-style 0.5.0, run
unmodified as its own CLI, as a user runs it) against `mlx-slm serve --task T` reports, question by
question, the accuracy, Brier score and log-loss that `mlx-slm eval --decisions --task T` reports on the
same states and gold; T fitted by `mlx-slm eval --decisions --fit --save-task` on other states.

Slow: the tiny random model (its figures mean nothing; the claim is that the two agree), but a real
server in a child process and jev-style's CLI in another. jev-style sends no `model` unless told, hence
`--model ours=jev-latest` (docs/decisions.md shows the same command)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
jev_evaluate = pytest.importorskip("jev_style.evaluate")

from mlx_slm.cli import main  # noqa: E402
from mlx_slm.text.workload import tickets  # noqa: E402
from tests.server.test_app import serve_child  # noqa: E402

QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this support ticket?",
        "criteria": {
            "billing": "Payments, charges, invoices, refunds",
            "technical": "Bugs, crashes, errors, the app or site not working",
            "account": "Logins, passwords, profile and account settings",
        },
    },
    "urgent": {"type": "noul", "instructions": "Is the customer blocked right now?"},
}


def _rows(n: int) -> list[dict]:
    """`n` workload tickets with their team and a drawn true/false per ticket as the gold answers."""
    rng = random.Random(7)
    return [{"id": i, "state": t, "team": team, "urgent": rng.random() < 0.5} for i, (t, team) in enumerate(tickets(n))]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _jev_data(path: Path, rows: list[dict]) -> Path:
    """jev-style's input: one /v1/systemone body a line, a `label` inside each scored question."""
    lines = []
    for r in rows:
        qs = {k: {**q, "label": r[k]} for k, q in QUESTIONS.items()}
        lines.append({"state": r["state"], "questions": qs})
    return _write(path, lines)


def _cli(args: list[str]) -> str:
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.slow
def test_jev_style_eval_of_a_served_task_equals_mlx_slm_eval(tiny_arch, tmp_path):
    model = str(tiny_arch.mlx("qwen2"))
    rows = _rows(48)
    fit, held = _write(tmp_path / "fit.jsonl", rows[:24]), _write(tmp_path / "held.jsonl", rows[24:])
    q = tmp_path / "q.json"
    q.write_text(json.dumps(QUESTIONS))
    task, ours_json, theirs_json = tmp_path / "t.json", tmp_path / "ours.json", tmp_path / "jev.json"
    golds = ["--gold-field", "team", "--gold-field", "urgent"]

    # The tiny random model answers near-constantly, so a fit on honest gold cannot beat its raw answers
    # (and a fit that does not is not kept). Gold skewed to the option its raw answers pick least gives a
    # bias per option something to learn: the kept fit is then what the rest of the test serves.
    raw_json = tmp_path / "raw.json"
    _cli(["eval", str(fit), "--decisions", str(q), *golds, "--model", model, "--json", str(raw_json)])
    raw = json.loads(raw_json.read_text())["questions"]
    skewed = []
    for i, r in enumerate(rows[:24]):
        r = dict(r)
        for key in QUESTIONS:
            labels, picked = raw[key]["labels"], [sum(col) for col in zip(*raw[key]["confusion"])]
            rare = labels[picked.index(min(picked))]
            others = [x for x in labels if x != rare]
            value = others[i % len(others)] if i < 2 * len(others) else rare
            r[key] = {"true": True, "false": False}.get(value, value)
        skewed.append(r)
    _write(fit, skewed)

    # label -> fit (cross-validated: the way, a bias per option, a temperature) -> the held-out figures
    out = _cli(["eval", str(fit), "--decisions", str(q), *golds, "--model", model, "--fit", "--save-task", str(task)])
    assert "fit: chose" in out
    _cli(["eval", str(held), "--decisions", str(q), *golds, "--task", str(task), "--json", str(ours_json)])
    ours = json.loads(ours_json.read_text())["questions"]
    assert all(ours[k]["applied"].get("fitted_as") == k for k in QUESTIONS), ours  # the task's methods, applied

    # -> serve --task -> an unmodified client
    proc, url = serve_child("--task", str(task))
    try:
        asked = {"model": "jev-latest", "state": rows[30]["state"], "questions": {"route": QUESTIONS["team"]}}
        one = httpx.post(url + "/v1/systemone", json=asked, timeout=120).json()["answers"]["route"]
        cmd = [sys.executable, "-m", "jev_style", "eval", str(_jev_data(tmp_path / "held.jev.jsonl", rows[24:])),
               "--server", f"ours={url}", "--model", "ours=jev-latest", "--json", str(theirs_json)]  # fmt: skip
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    finally:
        proc.terminate()
        proc.wait(30)
    # the fitted question under another id is still the task's question (its digest), and says so
    assert one["x_method"]["fitted_as"] == "team" and "x_raw_probabilities" in one
    assert run.returncode == 0, run.stderr[-2000:]

    theirs = json.loads(theirs_json.read_text())
    engine = theirs["engines"]["ours"]
    assert engine["failed_rows"] == 0 and theirs["common_questions"] == 2 * len(rows[24:])
    for key in QUESTIONS:
        items = [r for r in theirs["results"]["ours"] if r["qid"] == key]
        got = jev_evaluate.metrics(items)
        assert got["n"] == ours[key]["n"] == 24
        assert got["accuracy"] == pytest.approx(ours[key]["accuracy"], abs=1e-12), key
        # Brier: jev-style sums over every option; a noul's two-outcome form (ours) counts one of the two
        twice = 2 if ours[key]["brier_form"] == "binary" else 1
        assert got["brier"] == pytest.approx(twice * ours[key]["brier"], abs=1e-4), key
        assert got["log_loss"] == pytest.approx(ours[key]["log_loss"], abs=1e-4), key
    # the choice's ECE: both the top probability's, 15 equal-width bins
    team = jev_evaluate.metrics([r for r in theirs["results"]["ours"] if r["qid"] == "team"])
    assert team["ece"] == pytest.approx(ours["team"]["ece"], abs=1e-4)
    # and the headline jev-style prints: every question's answers together
    mean = sum(ours[k]["accuracy"] for k in QUESTIONS) / len(QUESTIONS)
    assert engine["summary"]["accuracy"] == pytest.approx(mean, abs=1e-12)
