"""The data walk of `mlx-slm serve`: which calls climb back up a floor, which return to a room left open.

The real command runs in this process on a tiny random model (built once into WORKDIR, default
/tmp/mlx-slm-walk): it loads, serves, answers one POST /v1/classify and one TEI /predict from a
client thread, and drains on SIGTERM. Every Python call made in mlx_slm on every thread is traced
(`sys.setprofile`, `threading.setprofile`), with its caller: the nearest mlx_slm frame below it.

- A *climb*: a call from a function on one floor into a function on a higher floor (floors:
  tools/layers.py). Imports never run up (tests/tools/test_layers.py), so a climb is a callback or an
  object handed down; each is a place where a reader of a low floor must look up to follow the data.
- A *return to a room*: a call into a module that is already open lower on the same call stack,
  with another module between (A -> B -> A): the walk left the room and came back.
- A *stream pulled*: a lower floor resuming a generator that a higher floor handed it (the service's
  predictions flowing into `Calibration`). That is the data arriving, not the walk climbing: listed
  on its own, not counted as a climb.

Each distinct (caller, callee) pair is counted once, however often it ran.

Usage: python tools/walk.py [--json OUT.json] [WORKDIR]
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import sys
import threading
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

from _common import free_port, tiny_model, wait_healthy  # noqa: E402
from layers import floors, order  # noqa: E402

# Each floor's height (floors on one line share it), from the 'May import' lines.
FLOOR_OF = {name: i for i, tier in enumerate(order(floors()[0])[0]) for name in tier}


def _room(frame) -> str | None:  # type: ignore[no-untyped-def]
    name = frame.f_globals.get("__name__", "")
    return name[8:] if name.startswith("mlx_slm.") else ("" if name == "mlx_slm" else None)


def _floor(room: str) -> int:
    return FLOOR_OF.get(room.split(".")[0], -1)


class Tracer:
    """Collects climbs and returns to rooms from profile 'call' events."""

    def __init__(self) -> None:
        self.climbs: Counter[tuple[str, str]] = Counter()
        self.returns: Counter[tuple[str, str]] = Counter()
        self.pulls: Counter[tuple[str, str]] = Counter()
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, frame, event, arg):  # type: ignore[no-untyped-def]
        if event != "call":
            return
        room = _room(frame)
        if room is None:
            return
        caller, stack = None, []
        f = frame.f_back
        while f is not None:  # the mlx_slm rooms open below this call, nearest first
            r = _room(f)
            if r is not None:
                if caller is None:
                    caller = (r, f.f_code.co_qualname)
                stack.append(r)
            f = f.f_back
        if caller is None or caller[0] == room:
            return
        here = f"{room}.{frame.f_code.co_qualname}"
        there = f"{caller[0]}.{caller[1]}"
        with self.lock:
            self.calls += 1
            if _floor(caller[0]) >= 0 and _floor(room) > _floor(caller[0]):
                stream = frame.f_code.co_flags & (inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR)
                (self.pulls if stream else self.climbs)[(there, here)] += 1
            if room in stack[1:] and any(r != room for r in stack[: stack.index(room)]):
                self.returns[(there, here)] += 1


def _client(port: int, done: list[int]) -> None:
    import httpx

    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    done.append(httpx.post(url + "/v1/classify", json={"texts": ["my card was charged twice", "hi"]}).status_code)
    done.append(httpx.post(url + "/predict", json={"inputs": "the app crashes"}).status_code)
    os.kill(os.getpid(), signal.SIGTERM)  # the drain, as a process manager stops it


def walk(workdir: Path) -> dict:
    from click.testing import CliRunner

    from mlx_slm.cli import main

    model = tiny_model(workdir)
    port = free_port()
    done: list[int] = []
    tracer = Tracer()
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    client = threading.Thread(target=_client, args=(port, done), daemon=True)
    client.start()
    try:
        result = CliRunner().invoke(main, ["serve", "--model", str(model), "--port", str(port)], catch_exceptions=False)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    client.join(30)
    if done != [200, 200]:
        raise SystemExit(f"the walk's requests answered {done} (exit {result.exit_code}): {result.output[-800:]}")
    return {
        "calls_between_rooms": tracer.calls,
        "climbs": [{"from": a, "to": b, "times": n} for (a, b), n in sorted(tracer.climbs.items())],
        "returns_to_rooms": [{"from": a, "to": b, "times": n} for (a, b), n in sorted(tracer.returns.items())],
        "streams_pulled": [{"from": a, "to": b, "times": n} for (a, b), n in sorted(tracer.pulls.items())],
    }


def main() -> int:
    args = sys.argv[1:]
    out = None
    if args[:1] == ["--json"]:
        out, args = Path(args[1]), args[2:]
    workdir = Path(args[0] if args else "/tmp/mlx-slm-walk")
    workdir.mkdir(parents=True, exist_ok=True)
    rep = walk(workdir)
    print(f"climbs back up a floor: {len(rep['climbs'])}")
    for c in rep["climbs"]:
        a, b = c["from"], c["to"]
        fa, fb = _floor(a.split(".")[0]), _floor(b.split(".")[0])
        print(f"  {a} (floor {fa}) -> {b} (floor {fb})  x{c['times']}")
    print(f"returns to a room left open: {len(rep['returns_to_rooms'])}")
    for c in rep["returns_to_rooms"]:
        print(f"  {c['from']} -> {c['to']}  x{c['times']}")
    print(f"streams pulled from a higher floor: {len(rep['streams_pulled'])}")
    for c in rep["streams_pulled"]:
        print(f"  {c['from']} -> {c['to']}  x{c['times']}")
    if out is not None:
        out.write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
