"""The manual holds together: the README links every docs/ page and so does docs/index.md,
every relative link (and its #anchor) in README.md, ARCHITECTURE.md and docs/*.md reaches a
file (and a heading) that exists, and each command's --help ends with a `Docs:` line naming
an existing page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest

from mlx_slm.cli import main
from tests.conftest import TICKET_TEXTS as TEXTS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
MANUAL = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *PAGES]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (where `[x](y)` is code)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text(encoding="utf-8")))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces to `-`,
    a repeated heading numbered (-1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_the_docs_pages_exist():
    names = {p.name for p in PAGES}
    assert "index.md" in names and len(names) >= 10, names


@pytest.mark.parametrize("index", ["README.md", "docs/index.md"])
def test_every_docs_page_is_linked_from_the_readme_and_the_index(index):
    src = ROOT / index
    targets = {(src.parent / link.split("#", 1)[0]).resolve() for link in links(src) if "://" not in link}
    missing = [str(p.relative_to(ROOT)) for p in PAGES if p != src and p.resolve() not in targets]
    assert not missing, f"{index} does not link {missing}"


@pytest.mark.parametrize("page", MANUAL, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading_that_exist(page):
    bad = []
    for link in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...: not a file here
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            bad.append(f"{link}: no file {target}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            bad.append(f"{link}: no heading #{anchor} in {target.name}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_every_command_help_ends_with_an_existing_docs_page():
    """Each command's --help (and the group's) ends with one `Docs: docs/<page>.md` line;
    `bench` hands --help to the harness, whose epilog says the same."""
    # each command's context a child of the group's, as the CLI makes it: a context of its own would lack the
    # group's -h, and click keeps the help option a command was first asked with (later helps would differ)
    top = click.Context(main, info_name="mlx-slm", **main.context_settings)
    helps = {"mlx-slm": main.get_help(top)}
    for name, cmd in main.commands.items():
        helps[name] = cmd.get_help(click.Context(cmd, info_name=name, parent=top))
    helps["bench (harness)"] = (ROOT / "benchmarks" / "harness.py").read_text(encoding="utf-8")
    for name, text in helps.items():
        named = re.findall(r"^\s*Docs: (\S+)$", text, flags=re.M) or re.findall(r'epilog="Docs: (\S+)"', text)
        assert len(named) == 1, f"{name}: {len(named)} Docs lines"
        assert (ROOT / named[0]).is_file() and named[0].startswith("docs/"), f"{name}: {named[0]} is not a page"
        if name != "bench (harness)":  # the page closes the description, before the options
            assert re.search(r"^ +Docs: \S+(\n\n[A-Z][\w ,-]*ptions:$|\n*\Z)", text, flags=re.M), (
                f"{name}: Docs line not last"
            )


# ----------------------------------------------------------------------------- the manual's Python


def _python_blocks() -> list[tuple[str, str]]:
    """Every ```python block of the README and of the docs/ pages, with the page it is on."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [
        (str(page.relative_to(ROOT)), block)
        for page in pages
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    ]


def test_readme_python_blocks_run(tiny_qwen_mlx, tmp_path, monkeypatch, capsys):
    """Every ```python block of the README and docs/ (docs/classify.md's API block) runs as
    written, with the built-in model's name replaced by the tiny test model (the Ray Data block
    runs in tests/test_ray.py)."""
    from click.testing import CliRunner

    from mlx_slm.cli import main

    monkeypatch.chdir(tmp_path)
    inp = tmp_path / "sample.jsonl"
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    r = CliRunner().invoke(
        main, ["classify", str(inp), "--model", str(tiny_qwen_mlx), "-q", "-o", "o.jsonl", "--save-task", "task.json"]
    )
    assert r.exit_code == 0, r.output
    # The Ray Data block runs in tests/test_ray.py, the scikit-learn walk-through (its CSV, its
    # joblib file) in tests/sklearn/test_estimator.py, OpenAI's SDK against a server in tests/server/test_openai.py,
    # the decision clients (openai's decisions.create, typesafe-sdk) against a server in tests/server/test_decisions.py
    # and tests/server/test_systemone.py.
    skip = ("import ray", "import joblib", "openai.OpenAI(", "decisions.create(", "TypeSafeClient(")
    blocks = [(page, b) for page, b in _python_blocks() if not any(x in b for x in skip)]
    assert blocks, "the manual has no Python block"
    assert "docs/classify.md" in {page for page, _ in blocks}, "docs/classify.md holds the API block"
    for i, (page, block) in enumerate(blocks, 1):
        code = block.replace('"qwen2.5-coder-0.5b"', repr(str(tiny_qwen_mlx)))
        exec(compile(code, f"{page} python block {i}", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "billing" in out or "technical" in out or "account" in out
