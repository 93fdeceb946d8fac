"""What every benchmark's result file starts with: the model, the machine, the exact command, the
date, the matmul peak at the start and end of the run (a busy or throttled machine shows there),
and the peak RSS; and the line of the Markdown table that says so."""

from __future__ import annotations

import platform
import resource
import sys
import time
from typing import Any


def run_record(module: str, model: str, argv: list[str] | None, peak0: float, peak1: float) -> dict[str, Any]:
    """The header fields of a result (`module`: e.g. "benchmarks.questions"; `argv` as given, else sys.argv)."""
    return {
        "model": model,
        "machine": f"{platform.machine()} {platform.system()}, {platform.processor() or ''}".strip(", "),
        "command": f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "matmul_peak_gflops": {"start": round(peak0, 1), "end": round(peak1, 1)},
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_line(out: dict[str, Any]) -> str:
    """The command, the machine, the matmul peaks and the peak RSS in one Markdown line."""
    peak = out["matmul_peak_gflops"]
    return (
        f"`{out['command']}` on {out['machine']}; matmul peak {peak['start']} / {peak['end']} GFLOP/s "
        f"(start / end); peak RSS {out['max_rss_mb']} MB."
    )


def in_child(module: str, job: dict[str, Any]) -> dict[str, Any]:
    """`python -m MODULE --worker JOB OUT` in a child process without our OpenBLAS preload
    (`reference.run_in_child`: PyTorch shares no BLAS threads with MLX there), from the
    repository root; the job and the answer are JSON."""
    import json
    import tempfile
    from pathlib import Path

    from mlx_slm.parity.reference import run_in_child

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        done = run_in_child(["-m", module, "--worker", str(job_path), str(out_path)], cwd=root, stdout=sys.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"the {module} worker failed (exit status {done.returncode})")
        return json.loads(out_path.read_text())
