"""The one base class for errors a user can fix.

Anything raised as a `UserError` is the user's to mend (a bad flag, file, label set or
checkpoint): the CLI prints its message on one line and exits 2. Every other exception
is a bug in mlx-slm, and the CLI lets its traceback show.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input, options or environment; the message names the problem and the fix."""

    exit_code = 2


class OutputError(UserError):
    """The output cannot be written as asked (it is an input, locked, or not ours to resume)."""


class ModelError(UserError, ValueError):
    """A model that cannot be found, fetched or loaded as given."""


class MissingExtra(UserError, ImportError):
    """An optional dependency (an extra) is not installed; the message names the pip command."""


class UsageError(UserError):
    """Options that do not go together: the CLI shows the command's usage line with the message."""
