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
* One spelling per idea across the commands (issue 41 item 1): ``-h`` is ``--help`` on ``fedsuite``
  and every command; ``simulate``, ``sweep`` and ``reproduce`` take ``--output-dir``, ``--data-root``
  (one help text, and it reaches every run's config) and ``--engine``; ``--out`` names a file only
  (partition's figure); ``--seeds 0 1 2``, ``--seeds 0,1,2`` and ``--seeds 0,1 2`` are the same seeds
  on ``sweep`` and ``reproduce``, with the same one-line error; ``report`` and ``sweep`` read a run
  with one ``--last`` default (all its evaluations when it has fewer).

The SIGINT message of ``fedsuite simulate`` (a real run, interrupted, then continued with the command
it printed) is in tests/test_resume.py.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
import typer.main
from typer.testing import CliRunner

from fedsuite.cli.main import app
from fedsuite.cli.support import CONFIG_KEYS, ConfigOptionsCommand, Names, config_defaults

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


def test_help_lists_the_commands_in_one_order():
    """``fedsuite --help`` lists ``simulate`` (``fedsuite.cli.main``), then the commands of each group
    in the order ``main`` adds the groups to the app: ``show``, ``deploy``, ``queues``."""
    names = [names for names, _ in _records(_help(())) if not names.startswith("-")]
    assert names == ["simulate", "list", "partition", "report", "certs", "connection", "submit", "gateway", "sweep",
                     "reproduce"]


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

    from fedsuite.method import registry
    from fedsuite.method.plugins.neuron_lr import PRESETS

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
    (["report", "[bold]x", "a[/x]"], "no fedsuite runs at or under [bold]x, a[/x] (a run's folder holds config.json)"),
    (["sweep", "--seeds", "[/x]"], "--seeds takes non-negative integers (--seeds 0 1 2 or --seeds 0,1,2), got '[/x]'"),
    (["reproduce", "x", "--seeds", "0", "[/x]"],
     "--seeds takes non-negative integers (--seeds 0 1 2 or --seeds 0,1,2), got '[/x]'"),
    (["sweep", "-c", "{dir}/x.toml", "--grid", "lr=0.1", "--output-dir", "{dir}/sweeps"],
     "{dir}/x.toml: [sweep] takes grid = {key = [values]} and seeds = [ints]"),
    (["sweep", "--search", "random", "--space", "lr=uniform:A:B", "--output-dir", "{dir}/sweeps"],
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
        proc = subprocess.run([sys.executable, "-m", "fedsuite.cli.main", *_fill(args, tmp_path)], capture_output=True,
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


def test_list_strategies_shows_each_methods_parameters():
    """A method's hyperparameters could be found only in an error message (``fedprox.mue: unknown
    key; allowed keys here: mu``): ``fedsuite list strategies NAME`` prints each with its type, range,
    default and meaning, read from the method's typed section, and the paper's value where the field
    declares one that differs; a plug-in the method switches on is listed with the values it gives."""
    result = runner.invoke(app, ["list", "strategies", "fedprox"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("fedprox: ") and "[fedprox] --set fedprox.KEY=VALUE" in lines[1]
    assert lines[2:] == ["    mu: float, ≥ 0; default 0.01", "        proximal coefficient μ (0 = FedAvg)"]
    fedsam = runner.invoke(app, ["list", "strategies", "fedsam"]).stdout
    assert "    rho: float, ≥ 0; default 0.5\n" in fedsam
    assert "        the paper's value: 0.1 (the FedInit paper, Table 7)\n" in fedsam
    fedinit = runner.invoke(app, ["list", "strategies", "fedinit"]).stdout
    assert "[relaxed_init] the plug-in fedinit switches on (beta = 0.1)" in fedinit
    assert "    beta: float or unset; default 0.1\n" in fedinit
    assert "no parameters of its own" in runner.invoke(app, ["list", "strategies", "fedavg"]).stdout
    every = runner.invoke(app, ["list", "strategies"]).stdout  # every method, each with its parameters
    assert "    mu: float, ≥ 0; default 0.01" in every and "    granularity: one of \"tensor\", \"module\"" in every
    for args, words in ((["list", "strategies", "fedprx"], "unknown strategy 'fedprx'; allowed: "),
                        (["list", "datasets", "fedprox"], "a name is listed with strategies")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and words in result.output, result.output


# ------------------------------------------------------------------------------------------------
# one spelling per idea: -h, --output-dir, --data-root, --engine, --out, --seeds, --last
# ------------------------------------------------------------------------------------------------

#: the commands that write runs: their options of one idea are spelled alike
RUN_COMMANDS = [("simulate",), ("sweep",), ("reproduce",)]


def _option(path: tuple[str, ...], name: str) -> click.Option | None:
    return next((p for p in COMMANDS[path].params if isinstance(p, click.Option) and name in p.opts), None)


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(("fedsuite", *p, "-h")))
def test_dash_h_is_help_on_every_command(path):
    result = runner.invoke(app, [*path, "-h"])
    text = result.stdout + (result.stderr or "")
    assert result.exit_code == 0, text
    assert text == _help(path)
    assert any(names == "-h, --help" for names, _ in _records(text)), text
    # set once, on the app (click hands it to every command's context), not per command
    assert "help_option_names" not in (COMMANDS[path].context_settings if path else {})


def test_the_run_commands_spell_output_dir_data_root_and_engine_alike():
    for name in ("--output-dir", "--data-root", "--engine"):
        helps = set()
        for path in RUN_COMMANDS:
            option = _option(path, name)
            assert option is not None, f"fedsuite {path[0]} has no {name}"
            assert squash(option.help) in squash(_record_of(option, _records(_help(path))))
            helps.add(option.help)
        if name != "--output-dir":  # the parent folder of different things: each help says which
            assert len(helps) == 1, helps
    assert _option(("report",), "--output-dir") is not None  # the folder the report's files go in
    for path, command in COMMANDS.items():  # --out: a single file, partition's figure, and nothing else
        out = _option(path, "--out") if path else None
        if path == ("partition",):
            assert out is not None and "file" in out.help, out
        else:
            assert out is None, f"fedsuite {' '.join(path)} has --out"
    # the old spelling is refused in one line naming the new one, also as --out=...
    for args in (["sweep", "--out", "x"], ["reproduce", "list", "--out=x"], ["report", "x", "--out", "y"],
                 ["simulate", "--out", "x"]):
        result = runner.invoke(app, args)
        text = result.stdout + (result.stderr or "")
        assert result.exit_code == 2 and text.strip() == f"error: --out is now --output-dir ({args[0]} --output-dir FOLDER)", text
    assert "is now" not in runner.invoke(app, ["partition", "--out", "x.xyz"]).output  # partition's --out is a file


def test_data_root_reaches_every_run_config(tmp_path, monkeypatch):
    """simulate: into the config as its other options (a --set still wins); sweep: a base setting
    of every run, before the base --set; reproduce: passed to every run."""
    import fedsuite.queues.reproduce
    import fedsuite.launch.runner
    import fedsuite.queues.sweep
    from fedsuite.config import build_config

    calls: dict[str, tuple] = {}

    def record(name):
        def fake(*args, **kwargs):
            calls[name] = args
            return 0
        return fake

    monkeypatch.setattr(fedsuite.launch.runner, "run_simulation", record("simulate"))
    monkeypatch.setattr(fedsuite.queues.sweep, "run_sweep", record("sweep"))
    monkeypatch.setattr(fedsuite.queues.reproduce, "run_reproduce", record("reproduce"))
    data = str(tmp_path / "my data")
    assert runner.invoke(app, ["simulate", "--data-root", data]).exit_code == 0
    config, set_, values = calls["simulate"]
    assert values["data_root"] == data and build_config(config, set_, values).data_root == data
    assert runner.invoke(app, ["sweep", "--data-root", data, "--set", "rounds=3"]).exit_code == 0
    base_set = calls["sweep"][1]
    assert build_config(None, base_set).data_root == data and base_set[1:] == ["rounds=3"]
    assert runner.invoke(app, ["sweep", "--data-root", data, "--set", "data_root=/elsewhere"]).exit_code == 0
    assert build_config(None, calls["sweep"][1]).data_root == "/elsewhere"  # --set wins, as on simulate
    assert runner.invoke(app, ["reproduce", "list", "--data-root", data]).exit_code == 0
    assert calls["reproduce"][7] == data


#: the commands that take --seeds, with the arguments before it, and where their function gets the seeds
SEEDS_COMMANDS = {"sweep": (["sweep", "--grid", "lr=0.1"], "fedsuite.queues.sweep", "run_sweep"),
                  "reproduce": (["reproduce", "tiny"], "fedsuite.queues.reproduce", "run_reproduce")}


def _seeds_given(command: str, seeds: list[str], monkeypatch) -> tuple[list[int] | None, str, int]:
    """(the seeds the command's function got, or None if it was not called; the text; the exit code)."""
    import importlib

    args, module, function = SEEDS_COMMANDS[command]
    got: list = []
    monkeypatch.setattr(importlib.import_module(module), function, lambda *a, **k: got.append(a[3]) or 0)
    result = runner.invoke(app, [*args, *seeds])
    return (got[0] if got else None), result.stdout + (result.stderr or ""), result.exit_code


@pytest.mark.parametrize("command", list(SEEDS_COMMANDS))
@pytest.mark.parametrize("seeds", [["--seeds", "0", "1", "2"], ["--seeds", "0,1,2"], ["--seeds", "0,1", "2"],
                                   ["--seeds=0,1,2"], ["--seeds", "0", "--seeds", "1,2"]],
                         ids=lambda s: " ".join(s))
def test_seeds_take_either_form_on_sweep_and_reproduce(command, seeds, monkeypatch):
    got, text, code = _seeds_given(command, seeds, monkeypatch)
    assert code == 0 and got == [0, 1, 2], text
    assert _seeds_given(command, [], monkeypatch)[0] is None  # not given: the command's default


@pytest.mark.parametrize("seeds, bad", [(["a"], "a"), (["-1"], "-1"), (["0,-1"], "-1"), (["1.5"], "1.5"),
                                        (["0", "x"], "x"), (["0,1", "2,b"], "b"), ([","], ","), (["+1"], "+1")],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_bad_seed_is_the_same_one_line_error_on_sweep_and_reproduce(seeds, bad, monkeypatch):
    for command in SEEDS_COMMANDS:
        got, text, code = _seeds_given(command, ["--seeds", *seeds], monkeypatch)
        assert code == 2 and got is None, text
        assert text == f"error: --seeds takes non-negative integers (--seeds 0 1 2 or --seeds 0,1,2), got {bad!r}\n"
    for command in SEEDS_COMMANDS:  # no value at all: the same usage error too
        got, text, code = _seeds_given(command, ["--seeds"], monkeypatch)
        assert code == 2 and got is None and text == "error: --seeds expects one or more values\n", text


def test_report_and_sweep_read_a_run_with_one_last_default():
    from fedsuite.records.results import report

    report_last, sweep_last = _option(("report",), "--last"), _option(("sweep",), "--last")
    assert report_last.default == sweep_last.default == 10 == inspect.signature(report).parameters["last"].default
    assert report_last.help == sweep_last.help and "all of them if it has fewer" in report_last.help


def test_report_reads_all_evaluations_of_a_run_with_fewer_than_last(tmp_path):
    """Three evaluations, --last's default 10: the reading is their mean, as a sweep reads the run;
    round 0 (the initial model) is not one of them."""
    from fedsuite.config import build_config
    from fedsuite.records.results import evaluations, run_value
    from fedsuite.records.rows import read_metrics

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(build_config().active_dump()))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_accuracy": a}) + "\n"
                                               for r, a in ((0, 0.1), (1, 0.3), (2, 0.4), (3, 0.5))))
    result = runner.invoke(app, ["report", str(run), "--output-dir", str(tmp_path / "report")])
    assert result.exit_code == 0, result.stdout + (result.stderr or "")
    assert "| 40.00 |" in (tmp_path / "report" / "report.md").read_text()  # one seed: no spread
    rows = json.loads((tmp_path / "report" / "report.json").read_text())
    assert rows[0]["final_mean"] == pytest.approx(0.4)
    assert run_value(evaluations(read_metrics(run)), "accuracy", 10)[0] == pytest.approx(40.0)  # the sweep's reading


def _write_run(folder: Path, seed: int, accuracies: list[float], **values) -> Path:
    """A finished run's record (config.json, metrics.jsonl with round 0 and one row per round)."""
    from fedsuite.config import build_config

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(build_config(values={"seed": seed, **values}).active_dump()))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_accuracy": a}) + "\n"
                                                  for r, a in enumerate([0.1, *accuracies])))
    return folder


def test_report_searches_folders_and_names_its_reading_and_spread(tmp_path):
    """``fedsuite report runs/*`` failed once a sweep existed (``runs/sweeps`` is not a run): a folder
    that is not a run is searched for runs at any depth, as ``fedsuite.load_runs`` searches. The
    final accuracy names its reading (the mean of the last --last evaluations, where simulate printed
    the last one) and its spread (the sample std over seeds, ddof = 1); one seed shows no "± 0.00"."""
    runs = tmp_path / "runs"
    _write_run(runs / "a-s0", 0, [0.5, 0.9])
    _write_run(runs / "sweeps" / "mine" / "lr-0.02" / "s0", 0, [0.2, 0.6], lr=0.02)
    _write_run(runs / "sweeps" / "mine" / "lr-0.02" / "s1", 1, [0.4, 0.8], lr=0.02)
    result = runner.invoke(app, ["report", *map(str, sorted(runs.iterdir())), "--last", "1",
                                 "--output-dir", str(tmp_path / "report")])
    text = squash(result.stdout)
    assert result.exit_code == 0, result.output
    assert squash("each run's mean of its last 1 evaluations") in text and squash("sample std (ddof = 1)") in text
    rows = {r["group"].split()[-1]: r for r in json.loads((tmp_path / "report" / "report.json").read_text())}
    assert rows["lr=0.02"]["seeds"] == 2 and rows["lr=0.02"]["final_std"] == pytest.approx(0.02 ** 0.5)  # 60 and 80: the sample std
    assert rows["lr=0.05"]["seeds"] == 1 and rows["lr=0.05"]["final_std"] is None
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| final acc (%): mean of last 1 evaluations ± sample std |" in md and "sample std (ddof = 1)" in md
    assert "| 90.00 |" in md and "90.00 ±" not in md  # one seed: no spread (it showed "± 0.00")
    # a sweep folder alone: its three seeds (60, 80, 50) and their sample standard deviation
    _write_run(runs / "sweeps" / "mine" / "lr-0.02" / "s2", 2, [0.2, 0.5], lr=0.02)
    result = runner.invoke(app, ["report", str(runs / "sweeps"), "--last", "1", "--output-dir", str(tmp_path / "r2")])
    assert result.exit_code == 0, result.output
    (row,) = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert row["final_std"] == pytest.approx(float(np.std([0.6, 0.8, 0.5], ddof=1)))
    # a folder without a run is named, in one line
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["report", str(tmp_path / "empty"), "--output-dir", str(tmp_path / "r3")])
    assert result.exit_code == 2 and f"no fedsuite runs at or under {tmp_path / 'empty'}" in result.output
