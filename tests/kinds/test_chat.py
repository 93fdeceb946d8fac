"""Chat completions (`kinds/chat.py`): a conversation's choices scored as labels, or its next token;
the table chooses between them by whether choices were given, neither calibrates, abstains or cuts
a conversation short, and the next token's alternatives are the vocabulary's largest, best first."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_slm.kinds import ChatChoiceSpec, NextTokenSpec, spec_of
from mlx_slm.kinds.chat import CHAT_TEMPLATE, NO_CALIBRATION, top_ids
from mlx_slm.text.calibration import CalibrationSpec
from mlx_slm.text.labels import LabelError


def test_the_table_chooses_choices_or_the_next_token():
    choice = spec_of(labels=("yes", "no"), conversation=True)
    assert type(choice) is ChatChoiceSpec and choice.labels == ("yes", "no")
    nxt = spec_of(conversation=True)
    assert type(nxt) is NextTokenSpec and nxt.labels == ()
    for spec in (choice, nxt):
        fmt = spec.prompt("a system message", "Ticket: {text}")  # the conversation is the whole prompt
        assert fmt.system is None and fmt.template == CHAT_TEMPLATE
        with pytest.raises(LabelError, match="calibration and min_confidence do not apply") as e:
            spec.check_calibration(CalibrationSpec.of("batch"))
        assert str(e.value) == NO_CALIBRATION
        with pytest.raises(LabelError):
            spec.check_calibration(CalibrationSpec(), min_confidence=0.5)


def test_top_ids_are_the_largest_best_first_ties_by_the_lower_index():
    row = np.array([0.1, 0.5, 0.3, 0.5, -1.0, 0.3])
    assert top_ids(row, 3).tolist() == [1, 3, 2]
    assert top_ids(row, 4).tolist() == [1, 3, 2, 5]
    assert top_ids(row, 10).tolist() == [1, 3, 2, 5, 0, 4]  # k over the vocabulary: all of it
    rng = np.random.default_rng(0)
    big = rng.normal(size=1000)
    assert top_ids(big, 20).tolist() == np.argsort(-big, kind="stable")[:20].tolist()
