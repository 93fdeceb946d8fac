"""The one base class for errors a user can fix (`ground/errors.py`): every kind of it is a
`UserError` the CLI answers with exit 2, and each also is the standard exception a caller of the
library would catch for it (a bad model is a `ValueError`, a missing extra an `ImportError`)."""

from __future__ import annotations

import pytest

from mlx_slm.ground.errors import MissingExtra, ModelError, OutputError, UsageError, UserError


@pytest.mark.parametrize(
    "cls, also",
    [(OutputError, ()), (ModelError, (ValueError,)), (MissingExtra, (ImportError,)), (UsageError, ())],
)
def test_every_kind_is_a_user_error_with_exit_2_and_its_standard_base(cls, also):
    e = cls("the fix")
    assert isinstance(e, UserError) and e.exit_code == 2 and str(e) == "the fix"
    for base in also:
        with pytest.raises(base):
            raise e
