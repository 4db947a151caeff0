"""The README's and docs' commands work as typed: every ``fedsuite ...`` line of their shell examples
is parsed by the CLI's own parser (an unknown command or option, a value of the wrong type or a
missing argument fails here, naming the file and the line), and every relative link points at a
file of the repository. The examples are not run (many take minutes); the parser is what would
refuse them first."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shell_commands(page: Path) -> list[tuple[int, str]]:
    """(line number, command) of each ``fedsuite`` command in the page's ```bash blocks, with
    backslash continuations joined and trailing comments dropped."""
    out, in_block, pending, start = [], False, "", 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_block = line.strip() in ("```bash", "```sh", "```console") if not in_block else False
            continue
        if not in_block:
            continue
        if not pending:
            start = number
        pending += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        command, pending = pending, ""
        command = re.sub(r"\s+#.*$", "", command).strip().removesuffix("&").strip()  # a comment; in the background
        if command.startswith("fedsuite "):
            out.append((start, command))
    return out


COMMANDS = [(page, number, command) for page in PAGES for number, command in shell_commands(page)]


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) >= 20 and {p.name for p, _, _ in COMMANDS} >= {"README.md", "sweeps.md", "reproducing.md"}


@pytest.mark.parametrize("page, number, command", COMMANDS,
                         ids=[f"{p.relative_to(ROOT)}:{n}" for p, n, _ in COMMANDS])
def test_every_documented_command_parses(page, number, command, capsys):
    from fedsuite.cli import app

    group = typer.main.get_command(app)
    # a shell variable stands for a number the reader fills in (a count the data decides)
    args = [re.sub(r"^\$[A-Z_]+$", "1", a) for a in shlex.split(command)[1:]]
    try:
        with group.make_context("fedsuite", list(args), resilient_parsing=False) as ctx:
            name, sub, rest = group.resolve_command(ctx, ctx.protected_args + ctx.args)
            with sub.make_context(name, rest, parent=ctx):
                pass
    except (click.exceptions.Exit, SystemExit, click.ClickException) as exc:
        if getattr(exc, "exit_code", getattr(exc, "code", 1)) == 0:  # --help, --version
            return
        pytest.fail(f"{page.relative_to(ROOT)}:{number}: `{command}` does not parse: "
                    f"{capsys.readouterr().err.strip() or exc}")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_at_a_file(page):
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        if not (page.parent / target).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"
