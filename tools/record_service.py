"""Record the service's answers to 134 requests (every route, errors included) on a tiny random model.

A refactor of the service or the HTTP layer must leave this record byte-identical: run it before and
after, then `cmp` the two files. Volatile fields (ids, timings) are masked; the tiny model is built
once into WORKDIR (default /tmp/mlx-slm-record) from tests/conftest.make_tiny.

Usage: python tools/record_service.py OUT.json [WORKDIR]
"""

# ruff: noqa: E401, E402, E701, E702, E731, I001
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import httpx
import uvicorn

import mlx_slm  # noqa: F401
from _common import free_port, tiny_model, wait_healthy

root = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/mlx-slm-record")
root.mkdir(parents=True, exist_ok=True)
model = tiny_model(root)

from mlx_slm.server import ServeOptions, Service, classifier_loader, create_app


def start(loader):
    """The service over `loader` on a free port, in a thread; (service, server, thread, url) once healthy."""
    svc = Service(loader, ServeOptions(max_wait_ms=5))
    port = free_port()
    config = uvicorn.Config(create_app(svc), host="127.0.0.1", port=port, log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    return svc, server, th, url


svc, server, th, url = start(classifier_loader(str(model)))

VOL = {"id", "created", "total_ms", "queue_ms", "inference_ms"}
KEEP = ("content-type", "retry-after", "www-authenticate", "allow", "x-total-time", "x-queue-time", "x-inference-time")


def mask(o):
    if isinstance(o, dict):
        return {k: ("<v>" if k in VOL and not isinstance(v, (dict, list)) else mask(v)) for k, v in o.items()}
    if isinstance(o, list):
        return [mask(x) for x in o]
    return o


def metrics_mask(t):
    out = []
    for line in t.splitlines():
        if not line.startswith("#") and ("seconds" in line):
            line = line.rsplit(" ", 1)[0] + " <v>"
        out.append(line)
    return out


rec = []


def do(name, method, path, body=None, raw=None, headers=None):
    r = httpx.request(method, url + path, json=body, content=raw, headers=headers or {}, timeout=60)
    h = {k: ("<v>" if k.startswith("x-") else r.headers[k]) for k in KEEP if k in r.headers}
    if path == "/metrics":
        b = metrics_mask(r.text)
    else:
        try:
            b = mask(r.json())
        except ValueError:
            b = r.text
    rec.append({"name": name, "method": method, "path": path, "status": r.status_code, "headers": h, "body": b})


T = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "I need to change the email address on my profile.",
    "refund status please",
    "x",
    "Please reset my password",
]
LONG = "refund status please " * 400
do("health", "GET", "/health")
do("model", "GET", "/v1/model")
do("info", "GET", "/info")
do("models", "GET", "/v1/models")
do("openapi", "GET", "/openapi.json")
do("ours one", "POST", "/v1/classify", {"text": T[0]})
do("ours many ids", "POST", "/v1/classify", {"texts": T, "ids": [f"a{i}" for i in range(6)]})
do("ours int ids", "POST", "/v1/classify", {"texts": T[:2], "ids": [7, 9]})
do(
    "ours own task",
    "POST",
    "/v1/classify",
    {"text": "free money", "labels": ["spam", "ham"], "system": "Flag spam.", "template": "Mail: {text}\nVerdict:"},
)
do("ours own labels", "POST", "/v1/classify", {"texts": T[:3], "labels": ["billing", "other"]})
do("ours system null", "POST", "/v1/classify", {"text": T[1], "system": None})
do("ours truncate head", "POST", "/v1/classify", {"text": LONG, "truncate": "head"})
do("ours truncate tail", "POST", "/v1/classify", {"text": LONG, "truncate": "tail"})
do("ours truncate middle", "POST", "/v1/classify", {"text": LONG, "truncate": "middle"})
do("ours min_conf", "POST", "/v1/classify", {"texts": T[:3], "min_confidence": 0.99})
do("ours min_conf null", "POST", "/v1/classify", {"texts": T[:3], "min_confidence": None})
do("ours vllm body", "POST", "/v1/classify", {"model": "m", "input": T[:2]})
do("ours vllm body bad", "POST", "/v1/classify", {"input": 5})
do("ours tei body", "POST", "/v1/classify", {"inputs": T[:2]})
for i, b in enumerate(
    [
        {},
        {"text": "a", "texts": ["b"]},
        {"text": 3},
        {"text": "   "},
        {"texts": []},
        {"texts": ["ok", ""]},
        {"texts": ["ok", 5]},
        {"texts": ["a", "b"], "ids": [1]},
        {"texts": ["a", "b"], "ids": [1, 1]},
        {"text": "a", "ids": [1]},
        {"text": "a", "labels": ["only"]},
        {"text": "a", "labels": ["x", "x"]},
        {"text": "a", "template": "no placeholder"},
        {"text": "a", "labels": ["x", "y"], "template": "{labels} {text}"},
        {"text": "a", "labels": ["x", "y" * 3000], "template": "T: {text}"},
        {"text": "a", "truncate": "both"},
        {"text": "a", "colour": "red"},
        {"text": "a", "min_confidence": 2},
        {"texts": ["a"] * 300},
        [1, 2],
        {"text": LONG},
        {"texts": ["a", LONG]},
        {"text": "a", "system": 5},
        {"texts": ["a"], "ids": [True]},
    ]
):
    do(f"ours bad {i}", "POST", "/v1/classify", b)
do("ours not json", "POST", "/v1/classify", raw=b"{not json", headers={"content-type": "application/json"})
do("ours deep", "POST", "/v1/classify", raw=b"[" * 100000 + b"]" * 100000)
do("ours surrogate", "POST", "/v1/classify", raw=b'{"text": "\\ud800"}')
do("ours surrogate field", "POST", "/v1/classify", raw=b'{"text": "a", "\\ud800": 1}')
do("ours 413 body", "POST", "/v1/classify", raw=json.dumps({"text": "a" * (2 << 20)}).encode())
do("tei one", "POST", "/predict", {"inputs": T[0]})
do("tei many", "POST", "/predict", {"inputs": T[:3]})
do("tei root", "POST", "/", {"inputs": T[:2], "parameters": {"top_k": 2, "function_to_apply": "none"}})
do("tei raw", "POST", "/predict", {"inputs": T[:2], "raw_scores": True})
do("tei trunc", "POST", "/predict", {"inputs": LONG, "truncate": True})
do("tei trunc left", "POST", "/predict", {"inputs": LONG, "truncate": True, "truncation_direction": "Left"})
do("tei long", "POST", "/predict", {"inputs": LONG})
for i, b in enumerate(
    [
        {},
        {"inputs": 5},
        {"inputs": []},
        {"inputs": [["a", "b"]]},
        {"inputs": "a", "raw_scores": 1},
        {"inputs": "a", "truncation_direction": "Up"},
        {"inputs": "a", "truncate": "yes"},
        {"inputs": "a", "parameters": 3},
        {"inputs": "a", "parameters": {"foo": 1}},
        {"inputs": "a", "parameters": {"function_to_apply": "sigmoid"}},
        {"inputs": "a", "parameters": {"top_k": 0}},
        {"inputs": "a", "x": 1},
        {"inputs": ["a"] * 300},
    ]
):
    do(f"tei bad {i}", "POST", "/predict", b)
do("vllm one", "POST", "/classify", {"model": "x", "input": T[0]})
do("vllm many", "POST", "/classify", {"input": T[:4], "truncate_prompt_tokens": -1, "user": "u"})
do("vllm long", "POST", "/classify", {"input": LONG})
for i, b in enumerate(
    [
        {},
        {"input": 5},
        {"input": "a", "model": 3},
        {"input": "a", "truncate_prompt_tokens": 10},
        {"input": "a", "foo": 1},
    ]
):
    do(f"vllm bad {i}", "POST", "/classify", b)
# OpenAI's chat completions (a choice, a json_schema enum, the next token) and embeddings (OpenAI's, TEI's).
MSG = [{"role": "system", "content": "Route the ticket."}, {"role": "user", "content": T[0]}]
do(
    "chat choice",
    "POST",
    "/v1/chat/completions",
    {"messages": MSG, "guided_choice": ["billing", "technical"], "logprobs": True},
)
do("chat structured", "POST", "/chat/completions", {"messages": MSG, "structured_outputs": {"choice": ["a", "b", "c"]}})
SCHEMA = {"type": "object", "properties": {"team": {"enum": ["billing", "account"]}}, "required": ["team"]}
do(
    "chat schema",
    "POST",
    "/v1/chat/completions",
    {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}},
)
do("chat next", "POST", "/v1/chat/completions", {"messages": MSG, "max_tokens": 1, "logprobs": True, "top_logprobs": 3})
for i, b in enumerate(
    [
        {},
        {"messages": MSG},
        {"messages": MSG, "guided_choice": []},
        {"messages": MSG, "guided_choice": ["a", "a"]},
        {"messages": MSG, "max_tokens": 1, "top_logprobs": 21, "logprobs": True},
        {"messages": MSG, "max_tokens": 2},
        {"messages": MSG, "guided_choice": ["a", "b"], "n": 2},
        {"messages": [{"role": "robot", "content": "x"}], "max_tokens": 1},
        {"messages": MSG, "model": "other", "max_tokens": 1},
    ]
):
    do(f"chat bad {i}", "POST", "/v1/chat/completions", b)
do("embed one", "POST", "/v1/embeddings", {"input": T[0], "encoding_format": "float"})
do("embed many b64", "POST", "/v1/embeddings", {"input": T[:3]})
do("embed dims", "POST", "/v1/embeddings", {"input": T[:2], "dimensions": 8, "encoding_format": "float"})
do("embed ids", "POST", "/v1/embeddings", {"input": [[1, 2, 3]], "encoding_format": "float"})
do("tei embed", "POST", "/embed", {"inputs": T[:2]})
for i, b in enumerate([{}, {"input": []}, {"input": "a", "dimensions": 0}, {"input": [[10**9]]}, {"input": 5}]):
    do(f"embed bad {i}", "POST", "/v1/embeddings", b)
do("tei embed bad", "POST", "/embed", {"inputs": 5})
do("404", "GET", "/nope")
do("404 post", "POST", "/nope", {"text": "a"})
do("405", "GET", "/v1/classify")
do("405 tei", "GET", "/predict")
do("405 health", "POST", "/health", {})
svc.opts.api_key = "k"
do("401 ours", "POST", "/v1/classify", {"text": "a"})
do("401 wrong", "POST", "/v1/classify", {"text": "a"}, headers={"Authorization": "Bearer no"})
do("401 tei", "POST", "/predict", {"inputs": "a"})
do("401 vllm", "POST", "/classify", {"input": "a"})
do("401 model", "GET", "/v1/model")
do("401 info", "GET", "/info")
do("401 models", "GET", "/v1/models")
do("auth ok", "POST", "/v1/classify", {"text": "a"}, headers={"Authorization": "Bearer k"})
do("health open", "GET", "/health")
svc.opts.api_key = None
svc.opts.max_queue_items = 2
do("429", "POST", "/v1/classify", {"texts": T[:3]})
do("429 tei", "POST", "/predict", {"inputs": T[:3]})
do("429 vllm", "POST", "/classify", {"input": T[:3]})
svc.opts.max_queue_items = 1024
svc.opts.request_timeout_s = 1e-4
with svc.loaded.clf.engine.lock:
    do("504", "POST", "/v1/classify", {"texts": T[:3]})
    do("504 tei", "POST", "/predict", {"inputs": T[:3]})
    do("504 vllm", "POST", "/classify", {"input": T[:3]})
svc.opts.request_timeout_s = 60.0
time.sleep(0.3)
svc.begin_drain()
do("503 drain", "POST", "/v1/classify", {"text": "a"})
do("503 tei", "POST", "/predict", {"inputs": "a"})
do("503 vllm", "POST", "/classify", {"input": "a"})
do("health drain", "GET", "/health")
svc.draining = False
do("after", "POST", "/v1/classify", {"text": T[0]})
do("metrics", "GET", "/metrics")
server.should_exit = True
th.join(10)

# A served task of questions: our route answers every question; TEI's and vLLM's say 422.
from mlx_slm.text.questions import Question

QS = [
    {
        "name": "team",
        "question": "Which team should handle this ticket?",
        "labels": ["billing", "technical", "account"],
        "none": "none of these",
    },
    {"name": "urgent", "kind": "yesno", "question": "Does this ticket need an answer today?", "answers": ["y", "n"]},
    {
        "name": "mood",
        "kind": "scale",
        "question": "How calm is the customer, from 1 to 5?",
        "levels": ["1", "2", "3", "4", "5"],
    },
    {
        "name": "mentions",
        "kind": "multi",
        "question": "Does this ticket mention {label}?",
        "labels": ["a payment", "the app"],
        "answers": ["y", "n"],
    },
]
svc, server, th, url = start(classifier_loader(str(model), questions=[Question.from_dict(q) for q in QS]))
do("q model", "GET", "/v1/model")
do("q one", "POST", "/v1/classify", {"text": T[0]})
do("q many", "POST", "/v1/classify", {"texts": T, "ids": list(range(6))})
do("q min_conf", "POST", "/v1/classify", {"texts": T[:3], "min_confidence": 0.9})
do("q labels", "POST", "/v1/classify", {"text": "a", "labels": ["x", "y"]})
do("q tei", "POST", "/predict", {"inputs": T[0]})
do("q vllm", "POST", "/classify", {"input": T[0]})
do("q long", "POST", "/v1/classify", {"text": LONG})
server.should_exit = True
th.join(10)
Path(sys.argv[1]).write_text(json.dumps(rec, indent=1, sort_keys=True, ensure_ascii=False))
print(len(rec), "requests recorded")
