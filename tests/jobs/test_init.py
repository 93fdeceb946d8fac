"""The jobs (`mlx_slm/jobs/`): the work behind each command, without click; the CLI parses options and calls
one of them."""

from __future__ import annotations


def test_no_job_knows_click():
    """The jobs raise `UserError`s the CLI prints; none imports click or takes a front end's callback."""
    import ast
    from pathlib import Path

    import mlx_slm.jobs

    for path in Path(mlx_slm.jobs.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in names if m.split(".")[0] == "click"}, path.name
