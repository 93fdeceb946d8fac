"""Shared fixtures: the decision commands' (`tests/decision_cli.py`: `tiny`, `q`) and embed's
(`tests/embed_cli.py`: `folder`, `inp`)."""

from tests.decision_cli import q, tiny  # noqa: F401
from tests.embed_cli import folder, inp  # noqa: F401
