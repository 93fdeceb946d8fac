"""What a front end and the service exchange (`service/api.py`): `ServeOptions` checked as it is made, a
blank or padded served name refused as --api-key is."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")


pytest.importorskip("uvicorn")


from mlx_slm.ground.errors import UsageError  # noqa: E402
from mlx_slm.server import ServeOptions  # noqa: E402


@pytest.mark.parametrize("name, says", [("", "blank"), ("   ", "blank"), (" a ", "'a'"), ("a\x00", "control")])
def test_a_blank_or_padded_name_is_refused_as_api_key_is(name, says):
    with pytest.raises(UsageError) as e:
        ServeOptions(served_model_names=("ok", name))
    assert "--served-model-name" in str(e.value) and says in str(e.value)
