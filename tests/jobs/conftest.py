"""The decision commands' shared fixtures (`tests/decision_cli.py`): `tiny` and `q`."""

from tests.decision_cli import q, tiny  # noqa: F401
