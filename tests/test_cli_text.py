"""The CLI's text is printed as written (issue 41 item 4, issue 42 item 4: help and errors).

* Every command's ``--help`` (found by walking the click command tree, so a new command is covered
  without a change here) shows every parameter, positional arguments included, with its help text
  character for character (``[sweep]``, ``uniform:A:B`` were eaten as rich markup and emoji codes),
  its choices where it has a fixed set, and its default; ``simulate`` and ``partition`` show the
  config model's defaults.
* User errors whose text holds brackets and colon codes (``[/x]``, ``[bold]x``, ``:smile:``) are one
  ``error:`` line, exit code 2, every character kept, nothing in them styled even on a colour
  terminal, no traceback (``[/x]`` was a rich ``MarkupError`` traceback).
* ``fedsuite list`` prints plain text, not the docstrings' RST.

The SIGINT message of ``fedsuite simulate`` (a real run, interrupted, then continued with the command
it printed) is in tests/test_resume.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer.main
from typer.testing import CliRunner

from fedsuite.cli import app
from fedsuite.cli_support import CONFIG_KEYS, ConfigOptionsCommand, Names, config_defaults

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def _commands() -> dict[tuple[str, ...], click.Command]:
    """Every command of the ``fedsuite`` tree by its path (``()`` is the group itself)."""
    found: dict[tuple[str, ...], click.Command] = {}

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        found[path] = command
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


COMMANDS = _commands()


def squash(text: str) -> str:
    """``text`` without whitespace: help is re-wrapped (at spaces and after hyphens), never changed."""
    return "".join(text.split())


def _records(help_text: str) -> list[tuple[str, str]]:
    """The (names column, whole record) of each entry under the help's section headings."""
    records: list[list[str]] = []
    in_section = False
    for line in help_text.splitlines():
        if re.fullmatch(r"\S.*:", line):  # "Options:", "Positional arguments:", "Commands:"
            in_section = True
        elif in_section and re.match(r"  \S", line):
            records.append([line])
        elif in_section and line.startswith("   ") and records:
            records[-1].append(line)
    return [(re.split(r"\s{2,}", r[0].strip(), maxsplit=1)[0], "\n".join(r)) for r in records]


def _record_of(param: click.Parameter, records: list[tuple[str, str]]) -> str:
    for names, record in records:
        words = set(re.split(r"[\s,\[\]]+|\.\.\.", names))
        if isinstance(param, click.Argument) and (param.name or "").upper() in words:
            return record
        if isinstance(param, click.Option) and words & set(param.opts):
            return record
    raise AssertionError(f"{param.name} is not in the help:\n{records}")


def _help(path: tuple[str, ...]) -> str:
    result = runner.invoke(app, [*path, "--help"])
    text = result.stdout + (result.stderr or "")
    assert result.exit_code == 0, text
    assert "Traceback" not in text and "\x1b" not in text, text
    return text


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(("fedsuite", *p)))
def test_every_help_shows_every_parameter_as_written(path):
    command = COMMANDS[path]
    text = _help(path)
    assert squash(command.help or "") in squash(text)  # the docstring, as written
    records = _records(text)
    for name in getattr(command, "commands", {}):
        assert any(names == name for names, _ in records), f"command {name} is not listed:\n{text}"
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        record = _record_of(param, records)
        assert param.help, f"{' '.join(path)} {param.name}: no help text"
        assert squash(param.help) in squash(record), record
        if isinstance(param.type, Names):  # a fixed set: every name, in its order
            assert squash("choices: " + ", ".join(param.type.choices())) in squash(record), record
        default = param.default
        if isinstance(param, click.Option) and not param.is_flag and default not in (None, [], ()):
            assert squash(f"default: {default}") in squash(record), record
        if param.required:
            assert "required" in record, record


def test_arguments_choices_and_config_defaults_are_in_the_help():
    text = _help(("list",))
    assert "Positional arguments:" in text
    record = _record_of(COMMANDS[("list",)].params[0], _records(text))
    assert squash("[WHAT] the list to print (default: all) [choices: strategies, datasets, partitioners, models]") \
        == squash(record)

    from fedsuite import registry
    from fedsuite.plugins.neuron_lr import PRESETS

    simulate = COMMANDS[("simulate",)]
    assert isinstance(simulate, ConfigOptionsCommand) and isinstance(COMMANDS[("partition",)], ConfigOptionsCommand)
    text = _help(("simulate",))
    records = _records(text)
    by_option = {p.opts[0]: _record_of(p, records) for p in simulate.params if isinstance(p, click.Option)}
    for option, names in [("--strategy", registry.methods()), ("--dataset", registry.datasets()),
                          ("--partitioner", registry.partitioners()), ("--model", registry.models()),
                          ("--neuron-lr", PRESETS)]:
        for name in names:
            assert re.search(rf"[ ,]{re.escape(name)}[,\]]", " ".join(by_option[option].split())), (option, name)
    defaults = config_defaults()
    shown = 0
    for param in simulate.params:
        key = CONFIG_KEYS.get(param.name, param.name)
        if isinstance(param, click.Option) and key in defaults:
            record = by_option[param.opts[0]]
            if defaults[key] is None:  # no value of its own: the help says what happens
                assert "default" in record, record
            else:
                assert squash(f"default: {defaults[key]}") in squash(record), record
                shown += 1
    assert shown >= 15  # rounds, lr, strategy, dataset, num_clients, ...
    assert squash("--rounds INTEGER federated rounds [default: 20]") in squash(text)


# ------------------------------------------------------------------------------------------------
# errors: one line, every character, nothing styled
# ------------------------------------------------------------------------------------------------

SWEEP_TOML = "[sweep]\nbogus = 1\n"

#: (arguments, the exact text the error line must hold); "{dir}" is the test's folder
ERRORS = [
    (["list", ":smile:"], "unknown list ':smile:'; allowed: strategies, datasets, partitioners, models"),
    (["report", "[bold]x", "a[/x]"], "not fedsuite run directories (no config.json): [bold]x, a[/x]"),
    (["sweep", "--seeds", "[/x]"], "--seeds expects integers separated by commas, got '[/x]'"),
    (["sweep", "-c", "{dir}/x.toml", "--grid", "lr=0.1", "--out", "{dir}/sweeps"],
     "{dir}/x.toml: [sweep] takes grid = {key = [values]} and seeds = [ints]"),
    (["sweep", "--search", "random", "--space", "lr=uniform:A:B", "--out", "{dir}/sweeps"],
     "--space expects key=log:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH or choice:V1,V2,..., got 'lr=uniform:A:B'"),
    (["simulate", "--rounds", "[bold]x"], "Invalid value for '--rounds': '[bold]x' is not a valid integer."),
    (["partition", "--dataset", "[bold]x :smile:", "--out", "{dir}/p.png"],
     "config: unknown dataset '[bold]x :smile:'; allowed: "),
    (["simulate", "--set", "strategy=[/x]", "--output-dir", "{dir}/runs"], "config: unknown strategy '[/x]'; allowed: "),
]


def _fill(items: list[str], folder: Path) -> list[str]:
    return [item.replace("{dir}", str(folder)) for item in items]


@pytest.mark.parametrize("args, words", ERRORS, ids=[" ".join(a[:2]) for a, _ in ERRORS])
def test_errors_keep_brackets_and_colon_codes(args, words, tmp_path):
    (tmp_path / "x.toml").write_text(SWEEP_TOML)
    result = runner.invoke(app, _fill(args, tmp_path))
    text = result.stdout + (result.stderr or "")
    assert result.exit_code == 2, text
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in text and "MarkupError" not in text
    assert len(text.strip().splitlines()) == 1 and text.startswith("error: "), text
    assert _fill([words], tmp_path)[0] in text, text
    assert not any(tmp_path.glob("*/")), "a user error left a folder behind"


def test_on_a_colour_terminal_only_the_prefix_is_styled(tmp_path):
    """Real processes with colour forced on (rich styles what it reads as markup): the message after
    the red ``error:`` holds no escape sequence and every character; the exit code is 2."""
    env = {**os.environ, "FORCE_COLOR": "1", "PYTHONPATH": str(ROOT)}
    for args, words in [ERRORS[0], ERRORS[-1]]:  # the last: the reported MarkupError traceback
        proc = subprocess.run([sys.executable, "-m", "fedsuite.cli", *_fill(args, tmp_path)], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stdout + proc.stderr
        prefix, _, message = proc.stderr.partition("error:")
        assert "\x1b" in prefix, repr(proc.stderr)  # the prefix is red: colour is on
        message = message.removeprefix("\x1b[0m")
        assert "\x1b" not in message and message.startswith(" ") and message.count("\n") == 1, repr(proc.stderr)
        assert _fill([words], tmp_path)[0] in message, repr(proc.stderr)


def test_every_console_prints_text_as_written():
    """The CLI's consoles are ``cli_support.plain_console`` (no markup, no emoji codes) and its progress
    columns take no markup: a new ``Console()`` or ``TextColumn`` elsewhere would read user text as markup."""
    offenders = []
    for path in sorted((ROOT / "fedsuite").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            if re.search(r"\bConsole\(", line) and "return Console(stderr=stderr, markup=False, emoji=False" not in line:
                offenders.append(where)
            if re.search(r"\bTextColumn\(", line) and "markup=False" not in line:
                offenders.append(where)
            if re.search(r"""["']\[(bold|/|red|yellow|green|dim|italic)[^"']*\]""", line):  # a markup tag in a literal
                offenders.append(where)
    assert not offenders, "\n".join(offenders)


def test_list_prints_plain_text_not_rst():
    result = runner.invoke(app, ["list", "datasets"])
    assert result.exit_code == 0, result.stdout
    assert "``" not in result.stdout and ":class:" not in result.stdout
    assert "<root>/MNIST/raw" in squash(result.stdout)  # was ``<root>/MNIST/raw``
    markdown = runner.invoke(app, ["list", "datasets", "--markdown"]).stdout  # Markdown: a code span, as in README.md
    assert "``<root>/MNIST/raw``" in markdown
