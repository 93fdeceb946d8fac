"""Proving the fast path gives Transformers' answers (`parity/labels.py`): the comparison's own
arithmetic (labels that agree, the largest differences over the label rows, the vocabulary and the
probabilities), and where a converted folder's reference comes from. (Runs against Transformers
are in tests/cli/test_parity.py and tests/suites/test_real_smollm2.py.)"""

from __future__ import annotations

import json

import numpy as np

from mlx_slm.parity.labels import compare, default_reference, is_quantized_dir


def test_compare_counts_agreement_and_the_largest_differences():
    a = [np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.0, 0.5, 0.0, 9.0])]
    b = [np.array([1.5, 2.0, 3.0, 1.0]), np.array([0.0, 0.25, 0.0, 9.0])]
    c = compare(["x", "y"], ["x", "z"], a, b, [[0.9, 0.1], [0.2, 0.8]], [[0.7, 0.3], [0.2, 0.8]], [0, 1])
    assert (c.agree, c.total, c.disagreements) == (1, 2, [1])
    assert c.max_dlogit_labels == 0.5 and c.max_dlogit_vocab == 3.0  # row 3 is no label's: the vocabulary's
    assert abs(c.max_dprob - 0.2) < 1e-12
    assert c.as_dict()["max_abs_dlogit_vocab"] == 3.0 and c.as_dict()["disagreements"] == [1]


def test_a_converted_folder_names_its_source_only_while_it_exists(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    conv = tmp_path / "conv"
    conv.mkdir()
    assert default_reference(str(conv)) is None and not is_quantized_dir(str(conv))  # no record, no config
    (conv / "conversion.json").write_text(json.dumps({"source_path": str(src)}))
    (conv / "config.json").write_text(json.dumps({"quantization": {"group_size": 32, "bits": 4}}))
    assert default_reference(str(conv)) == str(src) and is_quantized_dir(str(conv))
    src.rmdir()
    assert default_reference(str(conv)) is None
    (conv / "config.json").write_text("{")
    assert not is_quantized_dir(str(conv))
