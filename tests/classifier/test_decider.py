"""The Decider (`classifier/decider.py`) against Transformers' own decision path (`transformers.decision`): the same
probabilities within 1e-4 in float32 for every question type, state type and description
shape, several requests (different states and questions) in one batch, an answer that does not
depend on the other questions, more options than letters, and the state cache."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.text.decisions.errors import DecisionError
from mlx_slm.text.decisions.openai import parse_openai
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import parse_systemone
from tests.decision_cases import TEMPERATURE

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?", "criteria": {"true": "Needs action today", "false": "Can wait"}},
    "one_sided": {"type": "noul", "instructions": "Is it spam?", "criteria": {"true": "Unsolicited ads"}},
    "bare": {"type": "noul"},
    "team": {"type": "choice", "instructions": "Which team handles this ticket?",
             "criteria": {"billing": "Payments and refunds", "technical": None, "account": {"k": "login"},
                          "sales": ["new", "plans"]}},
    "anger": {"type": "score", "instructions": {"ask": "How angry is the customer?"},
              "criteria": ["Calm", "Annoyed", {"level": "furious"}]},
}  # fmt: skip
STATES = [
    "I was charged twice for my order and want a refund now.",
    {"ticket": "The app crashes on login <|im_end|> every time", "priority": 2},
    ["cannot reset password", {"tries": 3}],
]


def transformers_probs(hf_dir, body: dict, temperature: dict | None = None, config=None) -> dict[str, list[float]]:
    """Transformers' decision path for a plain chat model: prepare_inputs, the forward, the label
    logits at the last position, the temperature, the softmax (as DecisionPipeline runs it)."""
    import torch
    from transformers import AutoTokenizer
    from transformers.decision import DecisionConfig as TC
    from transformers.decision import label_token_ids, prepare_inputs

    model = _hf_model(hf_dir)
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    config = config or TC(temperature=dict(temperature or {}))
    out = {}
    with torch.no_grad():
        for inputs, qs in prepare_inputs(config, body, tok):
            inputs = dict(inputs)
            marks = inputs.pop("marks")
            logits = model(**inputs, use_cache=False, logits_to_keep=marks - 1).logits[0]
            for i, q in enumerate(qs):
                s = logits[i, label_token_ids(tok, tuple(q.labels))].float()
                s = config.logits_processors[q.type](inputs["input_ids"], s[None])[0]
                out[q.name] = s.softmax(-1).tolist()
    return out


_MODELS: dict = {}


def _hf_model(hf_dir):
    from transformers import AutoModelForCausalLM

    if str(hf_dir) not in _MODELS:
        import torch

        _MODELS[str(hf_dir)] = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    return _MODELS[str(hf_dir)]


def test_every_answer_equals_transformers_decision_path(yesno_decider):
    hf_dir, decider = yesno_decider
    bodies = [{"model": "m", "state": s, "questions": QUESTIONS} for s in STATES]
    # several requests, different states, in one call (one batch)
    results = decider.decide([parse_systemone(b, decider.config) for b in bodies])
    for body, res in zip(bodies, results):
        ref = transformers_probs(hf_dir, body, TEMPERATURE)
        for q, p in zip(res.request.questions, res.probabilities):
            np.testing.assert_allclose(p, ref[q.key], atol=1e-4, err_msg=q.key)
        assert res.input_tokens > 0 and res.cached_tokens == 0


def test_different_questions_in_one_batch_and_independent_answers(yesno_decider):
    hf_dir, decider = yesno_decider
    subsets = [["team"], ["anger", "urgent"], ["bare", "team", "one_sided"]]
    bodies = [{"model": "m", "state": STATES[i % 3], "questions": {k: QUESTIONS[k] for k in ks}}
              for i, ks in enumerate(subsets)]  # fmt: skip
    # reordered and renamed: the same answer
    renamed = {
        "model": "m",
        "state": STATES[0],
        "questions": {"zz " + k: QUESTIONS[k] for k in reversed(list(QUESTIONS))},
    }
    results = decider.decide([parse_systemone(b, decider.config) for b in [*bodies, renamed]])
    alone = {}
    for body, res in zip(bodies, results):
        ref = transformers_probs(hf_dir, body, TEMPERATURE)
        for q, p in zip(res.request.questions, res.probabilities):
            np.testing.assert_allclose(p, ref[q.key], atol=1e-4)
            alone[(str(body["state"]), q.key)] = p
    for q, p in zip(results[-1].request.questions, results[-1].probabilities):
        key = (str(STATES[0]), q.key[3:])
        if key in alone:
            np.testing.assert_allclose(p, alone[key], atol=1e-6)


def test_more_options_than_letters_scored_by_their_names(yesno_decider):
    """Beyond 26 options Transformers refuses; ours score each option's own name whole: the same
    as the sum of its tokens' log-probabilities after Transformers' own prompt with those labels."""
    import torch
    from transformers import AutoTokenizer
    from transformers.decision import DecisionConfig as TC
    from transformers.decision import prepare_inputs

    hf_dir, decider = yesno_decider
    names = [f"team {w}" for w in "abcdefghijklmnopqrstuvwxyz"] + ["billing", "refund"]
    body = {"model": "m", "state": STATES[0], "questions": {"t": {"type": "choice", "criteria": dict.fromkeys(names)}}}
    (res,) = decider.decide([parse_systemone(body, decider.config)])
    (p,) = res.probabilities
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    ((inputs, _),) = prepare_inputs(TC(labels={"choice": names}), body, tok)  # their prompt, with the names as labels
    prompt = inputs["input_ids"][0].tolist()
    model = _hf_model(hf_dir)
    scores = []
    with torch.no_grad():
        for name in names:
            ids = prompt + tok(name, add_special_tokens=False)["input_ids"]
            lp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
            scores.append(sum(float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(ids[len(prompt) :])))
    want = torch.tensor(scores).div(TEMPERATURE["choice"]).softmax(-1).numpy()
    np.testing.assert_allclose(p, want, atol=1e-4)


def test_a_repeated_state_comes_from_the_cache(yesno_decider):
    """The same state again: its KV from the cache; the same questions again: their answers too
    (the same computation), all counted in cached_tokens; a new question runs after the cached state."""
    hf_dir, decider = yesno_decider
    decider.states.clear()
    state = STATES[0] + " (again)"
    req = parse_systemone({"model": "m", "state": state, "questions": QUESTIONS}, decider.config)
    (first,) = decider.decide([req])
    (second,) = decider.decide([req])
    assert first.cached_tokens == 0 and second.cached_tokens == second.input_tokens == first.input_tokens
    for a, b in zip(first.probabilities, second.probabilities):
        np.testing.assert_array_equal(a, b)
    new = {"other": {"type": "choice", "instructions": "Which product?", "criteria": {"app": None, "web": None}}}
    body = {"model": "m", "state": state, "questions": {"team": QUESTIONS["team"], **new}}
    (third,) = decider.decide([parse_systemone(body, decider.config)])
    assert 0 < third.cached_tokens < third.input_tokens
    ref = transformers_probs(hf_dir, body, TEMPERATURE)
    for q, p in zip(third.request.questions, third.probabilities):
        np.testing.assert_allclose(p, ref[q.key], atol=1e-4)
    off = type(decider)(decider.engine, decider.config, state_cache=0)
    off.decide([req])
    assert off.decide([req])[0].cached_tokens == 0


def test_prompt_cache_key_reuses_the_shared_start(yesno_decider):
    hf_dir, decider = yesno_decider
    decider.states.clear()
    q = [{"type": "predicate", "name": "refund", "instructions": "Asks for money back."}]
    base = "A long conversation about a billing problem that goes on. "
    r1 = parse_openai({"model": "m", "input": base, "questions": q, "prompt_cache_key": "conv-1"})
    r2 = parse_openai(
        {"model": "m", "input": base + "Now I want a refund.", "questions": q, "prompt_cache_key": "conv-1"}
    )
    decider.decide([r1])
    (res,) = decider.decide([r2])
    assert res.cached_tokens > 0
    ref = transformers_probs(
        hf_dir, {"state": r2.state, "questions": {"refund": {"type": "noul", "instructions": q[0]["instructions"]}}}
    )
    np.testing.assert_allclose(res.probabilities[0], ref["refund"], atol=1e-4)


def test_over_the_context(yesno_decider):
    _, decider = yesno_decider
    long_state = "word " * 2000
    with pytest.raises(DecisionError) as e:
        decider.decide([parse_systemone({"model": "m", "state": long_state, "questions": {"a": {"type": "noul"}}})])
    assert e.value.type == "tokens_exceeded"
    r = parse_openai({"model": "m", "input": long_state, "questions": [{"type": "predicate", "instructions": "x"}]})
    (res,) = decider.decide([r])
    assert res.probabilities == (None,)


OWN_TEMPLATE = (
    "{%- macro t(x) %}{{ x if x is string else x|tojson }}{% endmacro -%}"
    "<|im_start|>user\nTicket: {{ t(state) }}\nQuestion: {{ t(question.instructions or '') }}\n"
    "{% for o in question.options %}{{ question.labels[loop.index0] }}) {{ o }}\n{% endfor %}"
    "<|im_end|>\n<|im_start|>assistant\nAnswer:<|mark|> and what follows is not read<|split|>"
)


def test_a_model_folders_own_decision_template(yesno_decider, tmp_path):
    """decision.json (labels, temperature, noul_options) and decision_template.jinja read as
    Transformers reads them; the answer read at the template's mark."""
    import json

    from transformers.decision import DecisionConfig as TC

    from mlx_slm.classifier.decider import Decider

    hf_dir, decider = yesno_decider
    d = {"labels": {"noul": ["Yes", "No"], "choice": ["1", "2", "3", "4"]}, "temperature": {"noul": 0.8},
         "noul_options": ["false", "true"]}  # fmt: skip
    (tmp_path / "decision.json").write_text(json.dumps(d))
    (tmp_path / "decision_template.jinja").write_text(OWN_TEMPLATE)
    config = DecisionConfig.from_folder(tmp_path)
    own = Decider(decider.engine, config, state_cache=0)
    body = {"model": "m", "state": STATES[1], "questions": {k: QUESTIONS[k] for k in ("urgent", "team", "anger")}}
    (res,) = own.decide([parse_systemone(body, config)])
    ref = transformers_probs(hf_dir, body, config=TC.from_pretrained(str(tmp_path)))
    for q, p in zip(res.request.questions, res.probabilities):
        np.testing.assert_allclose(p, ref[q.key], atol=1e-4, err_msg=q.key)
    assert res.request.questions[0].options == ("false", "true")


def test_calibration_divides_by_the_question_temperature(yesno_decider):
    from mlx_slm.classifier.decider import Decider

    hf_dir, decider = yesno_decider
    body = {"model": "m", "state": STATES[0], "questions": {k: QUESTIONS[k] for k in ("team", "urgent")}}
    cal = Decider(decider.engine, decider.config, state_cache=0, calibration={"team": 2.0, "urgent": 2.0},
                  calibration_questions={"team": QUESTIONS["team"], "urgent": {**QUESTIONS["urgent"], "instructions": "?"}})  # fmt: skip
    (raw,) = decider.decide([parse_systemone(body, decider.config)])
    (got,) = cal.decide([parse_systemone(body, decider.config)])
    # "urgent" was fitted for another question under that key: raw
    np.testing.assert_allclose(got.probabilities[1], raw.probabilities[1], atol=1e-6)
    want = np.exp(np.log(raw.probabilities[0]) / 2.0)
    np.testing.assert_allclose(got.probabilities[0], want / want.sum(), atol=1e-6)


def test_a_question_over_the_context_is_refused_alone(yesno_decider):
    """OpenAI: the question whose prompt is over the context is refused (None), the others
    answered as alone; System One: the request is refused whole (tokens_exceeded)."""
    hf_dir, decider = yesno_decider
    long = "Consider every word here. " * 400
    qs = [{"type": "predicate", "name": "long", "instructions": long},
          {"type": "choice", "name": "team", "instructions": "Which team?", "choices": [{"value": "billing"}, {"value": True}]}]  # fmt: skip
    r = parse_openai({"model": "m", "input": STATES[0], "questions": qs})
    (res,) = decider.decide([r])
    assert res.probabilities[0] is None and res.probabilities[1] is not None
    body = {"state": STATES[0], "questions": {"team": {"type": "choice", "instructions": "Which team?",
                                                       "criteria": {"billing": None, "true": None}}}}  # fmt: skip
    ref = transformers_probs(hf_dir, body, TEMPERATURE)  # a boolean value reads as JSON: "true"
    np.testing.assert_allclose(res.probabilities[1], ref["team"], atol=1e-4)
    s1 = {"model": "m", "state": STATES[0], "questions": {"long": {"type": "noul", "instructions": long}}}
    with pytest.raises(DecisionError) as e:
        decider.decide([parse_systemone(s1)])
    assert e.value.type == "tokens_exceeded"


@pytest.mark.parametrize(
    "state", ["", "<|im_end|>", "\n\n\n", "end with spaces   ", "émoji 🎉 and 한국어", {}, [], {"<|im_start|>": "key"}]
)
def test_edge_states_equal_transformers(yesno_decider, state):
    hf_dir, decider = yesno_decider
    body = {"model": "m", "state": state, "questions": {k: QUESTIONS[k] for k in ("bare", "team")}}
    (res,) = decider.decide([parse_systemone(body, decider.config)])
    ref = transformers_probs(hf_dir, body, TEMPERATURE)
    for q, p in zip(res.request.questions, res.probabilities):
        np.testing.assert_allclose(p, ref[q.key], atol=1e-4, err_msg=q.key)


def test_a_model_without_tree_masks_is_refused_by_name():
    from types import SimpleNamespace

    from mlx_slm.classifier.decider import Decider
    from mlx_slm.ground.errors import ModelError

    engine = SimpleNamespace(model=SimpleNamespace(supports_tree=False, has_lm_head=True), path="some-mlx-lm-model")
    with pytest.raises(ModelError, match="some-mlx-lm-model"):
        Decider(engine)  # type: ignore[arg-type]


def test_bodies_as_dicts_and_an_empty_request(yesno_decider):
    from mlx_slm.text.decisions.questions import DecisionRequest

    _, decider = yesno_decider
    body = {"state": STATES[0], "questions": {"team": QUESTIONS["team"]}}
    (a,) = decider.decide([body])
    (b,) = decider.decide([parse_systemone({"model": "m", **body}, decider.config)])
    np.testing.assert_allclose(a.probabilities[0], b.probabilities[0], atol=1e-12)
    (c,) = decider.decide([{"input": STATES[0], "questions": [{"type": "predicate", "instructions": "Urgent?"}]}])
    assert c.request.refusal == "question" and len(c.probabilities) == 1
    with pytest.raises(DecisionError):
        decider.decide([DecisionRequest(STATES[0], ())])


def test_a_hugging_face_folders_decision_files_survive_its_conversion(yesno_decider, tmp_path):
    import json
    import shutil

    from mlx_slm.classifier.decider import Decider

    hf_dir, _ = yesno_decider
    src = tmp_path / "with-decision"
    shutil.copytree(hf_dir, src)
    (src / "decision.json").write_text(json.dumps({"temperature": {"choice": 2.5}, "noul_options": ["false", "true"]}))
    (src / "decision_template.jinja").write_text(OWN_TEMPLATE)
    d = Decider.load(str(src), dtype="float32", state_cache=0)
    assert d.config.temperature_of("choice") == 2.5 and d.config.noul_options == ("false", "true")
    assert d.config.chat_template == OWN_TEMPLATE


def test_a_long_state_runs_on_its_own_first_and_stays_exact(yesno_decider):
    """A state's rest longer than FUSED_TRUNK runs causally before its questions (not in their
    tree pass): the same answers, in a batch with a short state that runs fused."""
    from mlx_slm.classifier import decider as mod

    hf_dir, decider = yesno_decider
    decider.states.clear()
    long = "The printer keeps jamming on page two. " * 33
    bodies = [{"model": "m", "state": s, "questions": {k: QUESTIONS[k] for k in ("urgent", "team")}}
              for s in (long, STATES[0])]  # fmt: skip
    results = decider.decide([parse_systemone(b, decider.config) for b in bodies])
    assert len(decider.prepare([parse_systemone(bodies[0], decider.config)])[0].ids) > mod.FUSED_TRUNK
    for body, res in zip(bodies, results):
        ref = transformers_probs(hf_dir, body, TEMPERATURE)
        for q, p in zip(res.request.questions, res.probabilities):
            np.testing.assert_allclose(p, ref[q.key], atol=1e-4, err_msg=q.key)


def test_a_state_over_the_context_is_tokenized_once_not_once_a_question(yesno_decider, monkeypatch):
    """A state far over the context (but under the characters' bound) with many questions is
    refused after one tokenization of it (the probe question's prompt), not one per question:
    System One 422 tokens_exceeded, OpenAI every question refused."""
    hf_dir, decider = yesno_decider
    planner = decider.planner
    state = "Consider every word here. " * (planner.max_length // 2)  # ~2.5x the context in tokens
    seen = []
    real = planner.prompts
    monkeypatch.setattr(planner, "prompts", lambda st, qs, styles: seen.append(len(qs)) or real(st, qs, styles))
    qs = {f"q{i}": {"type": "noul", "instructions": f"Question {i}?"} for i in range(40)}
    with pytest.raises(DecisionError) as e:
        decider.prepare([parse_systemone({"model": "m", "state": state, "questions": qs})])
    assert e.value.type == "tokens_exceeded" and seen == [1]
    seen.clear()
    oa = [{"type": "predicate", "name": k, "instructions": q["instructions"]} for k, q in qs.items()]
    (item,) = decider.prepare([parse_openai({"model": "m", "input": state, "questions": oa})])
    assert item.chains == [None] * 40 and seen == [1]


def test_the_answer_cache_counts_in_the_byte_budget_and_survives_a_put(yesno_decider):
    """Cached answers are keyed by a short digest (not the whole prompt), their bytes count in the
    state cache's budget, and a state put again (the same tokens) keeps the answers it had."""
    from mlx_slm.classifier.decider import Decider
    from mlx_slm.kinds.decisions import StateKV

    _, decider = yesno_decider
    d = Decider(decider.engine, decider.config, state_cache=4)
    body = {"model": "m", "state": STATES[0], "questions": {k: QUESTIONS[k] for k in ("team", "urgent")}}
    d.decide([parse_systemone(body, d.config)])
    (state,) = d.states._by_tokens.values()
    assert len(state.scores) == 2 and all(isinstance(k, bytes) and len(k) <= 32 for k in state.scores)
    kv_bytes = sum(k.nbytes + v.nbytes for k, v in state.kv)
    assert state.scores_nbytes > 0 and d.states._bytes == kv_bytes + state.scores_nbytes
    again = StateKV(state.tokens, state.kv)
    d.states.put(again)
    assert again.scores == state.scores and d.states._bytes == again.nbytes
    (res,) = d.decide([parse_systemone(body, d.config)])
    assert res.cached_tokens == res.input_tokens  # answered from the kept answers


def test_beyond_the_letters_a_string_and_a_boolean_of_the_same_text_stay_distinct(yesno_decider):
    """OpenAI's typed values "true" and true beyond 26 options: the string is labelled as JSON
    (`"true"`), the boolean as `true`, so both are answered (not refused as a label given twice)."""
    _, decider = yesno_decider
    choices = [{"value": f"team {w}"} for w in "abcdefghijklmnopqrstuvwxy"] + [{"value": "true"}, {"value": True}]
    body = {
        "model": "m",
        "input": STATES[0],
        "questions": [{"type": "choice", "name": "t", "instructions": "Who?", "choices": choices}],
    }
    req = parse_openai(body, decider.config)
    assert req.questions[0].labels[-2:] == ('"true"', "true")
    (res,) = decider.decide([req])
    (p,) = res.probabilities
    assert p.shape == (27,) and np.isfinite(p).all() and p.sum() == pytest.approx(1.0)


@pytest.fixture(scope="module")
def nan_decider(tmp_path_factory):
    """A Decider on the tiny model whose lm_head holds NaN (weights that overflow or are broken)."""
    import mlx.core as mx

    from mlx_slm.classifier.decider import Decider
    from mlx_slm.weights.convert import convert
    from tests.conftest import make_tiny

    hf_dir = make_tiny(tmp_path_factory.mktemp("hf-nan"), "qwen2", words=("Yes", "No"))
    out = convert(hf_dir, tmp_path_factory.mktemp("mlx-nan") / "m", dtype="float32", progress=None)
    w = mx.load(str(out / "model.safetensors"))
    w["lm_head.weight"] = mx.full(w["lm_head.weight"].shape, float("nan"))
    mx.save_safetensors(str(out / "model.safetensors"), w, metadata={"format": "mlx"})
    (out / "conversion.json").unlink()  # its weights' hash changed: a plain MLX folder
    return Decider.load(str(out), dtype="float32")


def test_non_finite_answers_are_refused_naming_the_question(nan_decider):
    """NaN probabilities are never answered (nor divided by a prior, nor written as JSON's NaN):
    the request is refused naming the question and the fix; so is a contextual prior from them."""
    from mlx_slm.text.decisions.methods import Method

    qs = {"team": QUESTIONS["team"]}
    with pytest.raises(DecisionError, match=r"question 'team': the model gave a non-finite probability.*float32"):
        nan_decider.decide([{"model": "m", "state": "refund please", "questions": qs}])
    (q,) = parse_systemone({"model": "m", "state": "x", "questions": qs}).questions
    with pytest.raises(DecisionError, match="question 'team''s contextual prior: the model gave a non-finite"):
        nan_decider.contextual_prior(q, Method(prior="contextual"))
