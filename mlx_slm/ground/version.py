"""The package's version (the one number pyproject.toml states too)."""

__version__ = "0.1.0"
