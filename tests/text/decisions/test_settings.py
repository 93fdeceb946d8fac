"""A model's decision settings (`text/decisions/settings.py`): `DecisionConfig` read from a model
folder's decision.json as Transformers reads it."""

from __future__ import annotations

import json

from mlx_slm.text.decisions.prompt import render_user_message
from mlx_slm.text.decisions.settings import DecisionConfig
from mlx_slm.text.decisions.systemone import parse_systemone
from tests.decision_cases import QUESTIONS, transformers_questions


def test_config_labels_and_noul_order_as_transformers(tmp_path):
    from transformers.decision import DECISION_PROMPT
    from transformers.decision import DecisionConfig as TC
    from transformers.utils.chat_template_utils import _compile_jinja_template

    d = {"labels": {"noul": ["Y", "N"], "choice": ["1", "2", "3", "4", "5"]}, "noul_options": ["false", "true"],
         "temperature": {"choice": 2}, "unknown": 1}  # fmt: skip
    (tmp_path / "decision.json").write_text(json.dumps(d))
    config = DecisionConfig.from_folder(tmp_path)
    assert config.temperature_of("choice") == 2.0 and config.temperature_of("noul") == 1.0
    body = {"model": "m", "state": "s", "questions": QUESTIONS}
    theirs = transformers_questions(body, TC.from_pretrained(str(tmp_path)))
    template = _compile_jinja_template(DECISION_PROMPT)
    for q, t in zip(parse_systemone(body, config).questions, theirs):
        assert list(q.options) == t.options and list(q.labels) == t.labels
        assert render_user_message("s", q) == template.render(state="s", question=t)
