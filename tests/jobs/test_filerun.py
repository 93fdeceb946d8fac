"""The one file run (`jobs/filerun.py`) under each of its four commands, `classify`, `decide`,
`embed` and `rerank`, on tiny random models: an interrupted output resumed from any cut, and
`--shard` parts merged, equal the uninterrupted run's bytes; an output mlx-slm did not write, an
input edited since, other settings and a manifest that recorded no input sha256 are refused,
naming the fix, and the output is left as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_slm.cli import main
from mlx_slm.files.output import manifest_path
from mlx_slm.text.workload import tickets

TEXTS = [t for t, _ in tickets(11)]
QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does it need an answer today?", "criteria": {"true": "Blocked"}},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "technical": None}},
}
COMMANDS = ["classify", "decide", "embed", "rerank"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def models(tiny_arch, tmp_path_factory):
    """A tiny causal LM whose tokenizer has Yes and No (classify, decide), a tiny sentence-transformers
    folder (embed) and a tiny one-label sequence classifier (rerank)."""
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    hf = make_tiny(tmp_path_factory.mktemp("hf-filerun"), "qwen2", words=("Yes", "No"))
    lm = convert(hf, tmp_path_factory.mktemp("mlx-filerun") / "m", dtype="float32", progress=None)
    return {"lm": lm, "st": tiny_arch.st_mlx(pooling="mean"), "cross": tiny_arch.seqcls_mlx("qwen2", 1)}


def _input(command: str, path: Path, texts: list[str]) -> Path:
    """An input of `command`'s form with error rows among its rows (an empty text, a broken line)."""
    if command == "rerank":
        lines = [
            json.dumps({"id": i, "query": t, "documents": texts[i + 1 : i + 4] + ([""] if i == 2 else [])})
            for i, t in enumerate(texts[:8])
        ]
    else:
        field = "state" if command == "decide" else "text"
        lines = [json.dumps({"id": i, field: t}) for i, t in enumerate(texts)]
        lines.insert(2, json.dumps({"id": "empty", field: None if command == "decide" else ""}))
    lines.insert(5, "{broken")
    path.write_text("".join(x + "\n" for x in lines))
    return path


def _args(command: str, models: dict, tmp_path: Path, window: int = 3) -> list:
    """The options of a run of `command` (its model, and the window a resume and a shard cut at)."""
    if command == "classify":
        return ["--model", models["lm"], "--labels", "billing,technical,account", "--window", window]
    if command == "decide":
        q = tmp_path / "q.json"
        q.write_text(json.dumps(QUESTIONS))
        return ["--model", models["lm"], "--questions", q, "--window", window]
    if command == "embed":
        return ["--model", models["st"], "--window", window, "--prompt-name", "query"]
    return ["--model", models["cross"], "--window", window - 1, "--top-n", 2]


def _interrupted(whole: Path, part: Path, cut: int) -> None:
    """What a run killed after writing `cut` bytes leaves: the prefix and an incomplete manifest."""
    part.write_bytes(whole.read_bytes()[:cut])
    doc = json.loads(manifest_path(str(whole)).read_text())
    doc["complete"], doc["rows"] = False, None
    manifest_path(str(part)).write_text(json.dumps(doc))


@pytest.mark.parametrize("command", COMMANDS)
def test_a_resumed_run_and_merged_shards_equal_the_uninterrupted_run(command, models, tmp_path):
    inp = _input(command, tmp_path / "in.jsonl", TEXTS)
    args = _args(command, models, tmp_path)
    whole = tmp_path / "whole.jsonl"
    r = run(command, inp, "-o", whole, *args, "-q")
    assert r.exit_code == 1, r.output  # its error rows
    data = whole.read_bytes()
    m = json.loads(manifest_path(str(whole)).read_text())
    assert m["complete"] and m["rows"] == len(data.splitlines()) and m["settings"]["input_sha256"]
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    for cut in sorted({0, 7, ends[0], ends[2] + 5, ends[4], ends[len(ends) // 2] - 1, ends[-2], len(data) - 1}):
        part = tmp_path / f"part-{cut}.jsonl"
        _interrupted(whole, part, cut)
        r = run(command, inp, "-o", part, *args, "--resume")
        assert r.exit_code == 1, (cut, r.output)
        assert part.read_bytes() == data, f"{command}: cut at byte {cut}"
        assert json.loads(manifest_path(str(part)).read_text())["output_sha256"] == m["output_sha256"]
    r = run(command, inp, "-o", whole, *args, "--resume")  # complete: kept as it is, nothing computed
    assert r.exit_code == 1 and whole.read_bytes() == data and "was complete already" in r.stderr
    parts = [tmp_path / f"s{i}.jsonl" for i in range(3)]
    for i, p in enumerate(parts):
        r = run(command, inp, "-o", p, *args, "--shard", f"{i}/3")
        assert r.exit_code in (0, 1) and f"shard {i}/3: " in r.stderr, r.output
    r = run("merge", *parts, "-o", tmp_path / "merged.jsonl")
    assert r.exit_code == 0 and "ids checked against the input" in r.stderr, r.output
    assert (tmp_path / "merged.jsonl").read_bytes() == data


@pytest.mark.parametrize("command", COMMANDS)
def test_what_cannot_be_resumed_is_refused_naming_the_fix(command, models, tmp_path):
    inp = _input(command, tmp_path / "in.jsonl", TEXTS[:6])
    args = _args(command, models, tmp_path)
    out = tmp_path / "out.jsonl"
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"id": 1}\n')
    r = run(command, inp, "-o", foreign, *args, "--resume")
    assert r.exit_code == 2 and f"not written by mlx-slm {command}" in r.stderr, r.output
    assert "start again without --resume, or choose another -o" in r.stderr
    assert foreign.read_text() == '{"id": 1}\n'
    run(command, inp, "-o", out, *args, "-q")
    whole = tmp_path / "whole.jsonl"
    shutil.copy(out, whole)
    shutil.copy(manifest_path(str(out)), manifest_path(str(whole)))
    cut = len(out.read_bytes()) // 2

    _interrupted(whole, out, cut)
    r = run(command, inp, "-o", out, *_args(command, models, tmp_path, window=4), "--resume")
    assert r.exit_code == 2 and "made with other settings (window: was" in r.stderr, r.output
    assert "run with the same options, or start again without --resume" in r.stderr
    assert len(out.read_bytes()) == cut  # refused: left as it was

    edited = inp.read_text().replace(TEXTS[4], TEXTS[4] + " again")
    inp.write_text(edited)
    r = run(command, inp, "-o", out, *args, "--resume")
    assert r.exit_code == 2 and f"the input {inp} was changed since" in r.stderr, r.output
    assert "start again without --resume" in r.stderr and len(out.read_bytes()) == cut

    doc = json.loads(manifest_path(str(out)).read_text())
    del doc["settings"]["input_sha256"]  # as a manifest of before recorded it
    manifest_path(str(out)).write_text(json.dumps(doc))
    r = run(command, inp, "-o", out, *args, "--resume")
    assert r.exit_code == 2 and "made by an older mlx-slm that did not record its input's sha256" in r.stderr
    assert "start again without --resume" in r.stderr and len(out.read_bytes()) == cut


def test_a_batch_prior_is_restored_by_each_job_its_own_way(models, tmp_path):
    """classify takes back its fitted prior (the manifest's `fitted_calibrator`), decide its batch
    priors (the settings' `priors`): a run resumed after the warm-up writes the whole run's bytes."""
    for command, extra in (("classify", ["--calibrate", "batch", "--warmup", 4]), ("decide", ["--calibrate", "batch", "--warmup", 4])):  # fmt: skip
        inp = _input(command, tmp_path / f"{command}.jsonl", TEXTS)
        whole, part = tmp_path / f"{command}-whole.jsonl", tmp_path / f"{command}-part.jsonl"
        args = [*_args(command, models, tmp_path, window=2), *extra]
        run(command, inp, "-o", whole, *args, "-q")
        m = json.loads(manifest_path(str(whole)).read_text())
        assert m["fitted_calibrator"] if command == "classify" else m["settings"]["priors"]
        data = whole.read_bytes()
        _interrupted(whole, part, [i for i, b in enumerate(data) if b == ord("\n")][7] + 3)
        r = run(command, inp, "-o", part, *args, "--resume")
        assert r.exit_code == 1 and part.read_bytes() == data, r.output


def test_one_query_resumes_whole_and_is_not_sharded(models, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    args = ["rerank", "--query", "card charged twice", docs, "--model", models["cross"]]
    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    assert run(*args, "-o", whole, "-q").exit_code == 0
    _interrupted(whole, part, 70)
    r = run(*args, "-o", part, "--resume")
    assert r.exit_code == 0 and part.read_bytes() == whole.read_bytes(), r.output
    r = run(*args, "-o", part, "--shard", "0/2")
    assert r.exit_code == 2 and "--shard needs a queries file" in r.stderr


@pytest.mark.parametrize("out", ["v.npy", "v.parquet"])
def test_embed_writes_npy_and_parquet_whole_so_it_neither_resumes_nor_shards_them(models, tmp_path, out):
    inp = _input("embed", tmp_path / "in.jsonl", TEXTS[:4])
    for extra in (["--resume"], ["--shard", "0/2"]):
        r = run("embed", inp, "-o", tmp_path / out, "--model", models["st"], *extra)
        assert r.exit_code == 2 and f"{extra[0]} needs a JSONL output" in r.stderr and "write .jsonl" in r.stderr
        assert not (tmp_path / out).exists()


@pytest.mark.parametrize("command", ["embed", "rerank"])
def test_their_parts_merge_into_jsonl_not_parquet(command, models, tmp_path):
    inp = _input(command, tmp_path / "in.jsonl", TEXTS[:6])
    parts = [tmp_path / f"s{i}.jsonl" for i in range(2)]
    for i, p in enumerate(parts):
        run(command, inp, "-o", p, *_args(command, models, tmp_path), "--shard", f"{i}/2", "-q")
    r = run("merge", *parts, "-o", tmp_path / "all.parquet")
    assert r.exit_code == 2 and f"the parts are of `mlx-slm {command}`" in r.stderr and "into .jsonl" in r.stderr
    assert not (tmp_path / "all.parquet").exists()
