"""The README and the pages under docs/: every relative link resolves (file and heading), every
`hydraplan` command shown in a code block parses with the real command line, the README's
documentation list reaches every page and its repository map names paths that exist.

The examples that run (the set-up commands, the catalog files, the client and runtime code) are
run by the tests of what they exercise: tests/test_cli.py, tests/test_cli_commands.py,
tests/test_client.py and tests/test_runtime_model.py."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
from markdown_links import FENCED, LINK, broken_links, without_code_blocks

from hydraplan.api.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]


def shown_commands(path: Path) -> list[str]:
    """Every `hydraplan ...` command of `path`'s code blocks (fenced or indented), continuation
    lines joined, a pipe's or `&&`'s other side dropped."""
    text = path.read_text(encoding="utf-8")
    blocks = FENCED.findall(text)
    blocks += [line[4:] for line in without_code_blocks(text).splitlines() if line.startswith("    hydraplan ")]
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"\s(?:\|\||&&|\|)\s", line):
                if not re.search(r"(?:^|\s)hydraplan(?:\s|$)", part):  # JSON, Python, other tools
                    continue
                words = shlex.split(part, comments=True)
                while words and re.match(r"[A-Z_]+=", words[0]):  # HYDRAPLAN_REDIS_URL=... hydraplan serve
                    words = words[1:]
                if words and words[0] == "hydraplan":
                    commands.append(shlex.join(words))
    return commands


def parse_error(command: str) -> str | None:
    """What the command line says about `command` (flags only, nothing runs), or None if it parses."""
    words = [word for word in shlex.split(command) if word != "..."]  # "..." marks elided flags
    if ">" in words:  # a redirection of the output
        words = words[: words.index(">")]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(words[1:])
    except SystemExit as exc:
        return f"exit {exc.code}: {stderr.getvalue().strip()}"
    return None


def test_the_readme_and_every_docs_page_exist() -> None:
    names = {page.name for page in PAGES}
    assert {"cli.md", "planner.md", "cost-model.md", "service.md", "runtime.md", "whatif.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_resolves(page: Path) -> None:
    assert LINK.search(page.read_text(encoding="utf-8")), f"{page.name} links nowhere"
    assert broken_links(page, folders=True) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A section (`--flag`)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n[ok](other.md#a-section---flag) [ok](#here) [ok](other.md) [web](https://x.org/y)\n"
        "[no file](missing.md) [no heading](other.md#nowhere) [no local heading](#there)\n"
        "```\n[in a code block](not-checked.md)\n```\n"
    )
    assert broken_links(page, folders=True) == [
        f"missing.md (no file {tmp_path / 'missing.md'})",
        "other.md#nowhere (no heading #nowhere in other.md)",
        "#there (no heading #there in page.md)",
    ]


def test_the_commands_are_found_in_every_kind_of_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```\nhydraplan plan --compare        # a comment\ncat b.txt | hydraplan plan --lengths -\n"
        "hydraplan whatif --model tiny \\\n    --num-gpus 8,16\nX_Y=1 hydraplan serve\n```\n\n"
        "    hydraplan schemes --model tiny\n\n```bash\npip install . && hydraplan plan\npython -m pytest\n```\n"
    )
    assert shown_commands(page) == [
        "hydraplan plan --compare",
        "hydraplan plan --lengths -",
        "hydraplan whatif --model tiny --num-gpus 8,16",
        "hydraplan serve",
        "hydraplan plan",
        "hydraplan schemes --model tiny",
    ]


def test_every_command_shown_parses() -> None:
    """A renamed command or flag breaks the page that shows it (README or docs/)."""
    shown = {page.name: shown_commands(page) for page in PAGES}
    assert sum(map(len, shown.values())) >= 50
    for name in ("README.md", "cli.md", "runtime.md", "whatif.md", "cost-model.md", "service.md"):
        assert shown[name], f"no hydraplan command found in {name}"
    errors = {f"{name}: {command}": parse_error(command) for name, commands in shown.items() for command in commands}
    assert {where: error for where, error in errors.items() if error} == {}


def test_a_command_that_does_not_exist_is_refused() -> None:
    assert parse_error("hydraplan plan --compare > out.txt") is None
    assert "unrecognized arguments: --no-such-flag" in parse_error("hydraplan plan --no-such-flag")
    assert "invalid choice" in parse_error("hydraplan planify")


def test_the_readme_lists_every_docs_page() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    listed = {target for target in LINK.findall(section) if target.startswith("docs/")}
    assert listed == {f"docs/{page.name}" for page in DOCS.glob("*.md")}


def test_the_readme_is_a_front_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    sections = re.findall(r"^## (.+)$", without_code_blocks(text), re.M)
    assert sections[0] == "Set up"  # tests/test_cli.py checks its two commands
    assert {"A five-minute tour", "Headline results", "Repository map", "Documentation"} <= set(sections)


def test_the_repository_map_names_paths_that_exist() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Repository map\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    paths = [path for row in rows for path in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    assert {"planner/", "cost_models/", "runtime/", "benchmarks/", "docs/", "api/cli/"} <= set(paths)
    assert [path for path in paths if not (ROOT / path).exists()] == []
    planner_row = next(row for row in rows if row.startswith("| `planner/`"))
    for module in ("kernels.py", "portfolio.py", "budget.py"):
        assert (ROOT / "planner" / module).is_file() and f"`{module}`" in planner_row
