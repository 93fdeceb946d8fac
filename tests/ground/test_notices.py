"""The one printer of notes (`ground/notices.py`): every note the package prints goes through
`notice`, one line on stderr, flushed."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_notes_have_one_printer():
    """Every note the package prints goes through `notices.notice` (one line on stderr, flushed):
    no other module prints to stderr itself."""
    import ast

    found = []
    for path in sorted((ROOT / "mlx_slm").rglob("*.py")):
        if path.name == "notices.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                if any(k.arg == "file" and "stderr" in ast.unparse(k.value) for k in node.keywords):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], f"print to stderr outside notices.py: {found}; use mlx_slm.ground.notices.notice"


def test_a_notice_is_one_line_on_stderr_and_nothing_on_stdout(capsys):
    from mlx_slm.ground.notices import notice

    notice("converting the model (once)")
    out, err = capsys.readouterr()
    assert out == "" and err == "converting the model (once)\n"
