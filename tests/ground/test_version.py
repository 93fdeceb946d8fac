"""The package's version (`ground/version.py`): the one number pyproject.toml states too, and the
one `mlx-slm --version` prints."""

from __future__ import annotations

import re
from pathlib import Path

from mlx_slm.ground.version import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_pyprojects():
    stated = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert stated and stated.group(1) == __version__


def test_the_package_and_the_cli_say_the_same_version():
    from click.testing import CliRunner

    import mlx_slm
    from mlx_slm.cli import main

    assert mlx_slm.__version__ == __version__
    r = CliRunner().invoke(main, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output
