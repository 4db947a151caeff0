"""What the ``fedsuite`` commands share beyond their options: the one-line user error (:func:`fail`),
the consoles that print text as given (:func:`plain_console`), usage errors said the same way
(:class:`OneLineUsageGroup`, :class:`OneLineUsageCommand`), help that shows every parameter's help,
choices and default (:class:`PlainHelp`, :class:`Names`, :class:`ConfigOptionsCommand`), options
that take several values after one flag (:class:`ManyValuesCommand`: ``--seeds 0 1 2``), the one
reading of ``--seeds`` (:func:`parse_seeds`, ``sweep``'s and ``reproduce``'s) and a run's progress
bar (:class:`RunProgress`), and the commands' checks of the paths they take (:func:`check_readable`,
:func:`check_writable_folder`, :func:`check_writable_file`: ``fedsuite.records.paths``' one check, as
one line). Light imports only: ``fedsuite.cli.main`` imports this at start-up.

No text is ever read as rich markup or emoji codes: help is click's plain text (the app has
``rich_markup_mode=None``), and every console is a :func:`plain_console`, so a message holding
``[sweep]``, ``[/x]``, ``[bold]x`` or ``uniform:A:B`` prints as written. Styling is explicit, with
:class:`rich.text.Text` (``Text.assemble(("error:", "bold red"), " ", message)``), never markup.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any, Callable, Iterable, NoReturn, Optional, Sequence, Union

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text
from typer.core import TyperCommand, TyperGroup
from typer.utils import get_params_from_function


def plain_console(stderr: bool = False) -> Console:
    """A console that prints strings as they are: no markup (``[bold]``, ``[/x]``), no emoji codes
    (``:smile:``, ``uniform:A:B``), no highlighting of numbers and paths. Every console of the CLI
    is one of these (tests/test_cli_text.py checks the sources); style with :class:`rich.text.Text`."""
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False)


err_console = plain_console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """A user error: one ``error:`` line on stderr, then exit ``code`` (2: bad input; 1: a run failed).
    The only error prefix of the CLI: click's usage errors come here too."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    raise typer.Exit(code)


def check_writable_folder(folder: Any, field: str) -> None:
    """Something can be written under ``folder`` (``fedsuite.records.paths.folder_problem``: a loop, a file
    on the way, no room, ...); else one line naming ``field``, exit 2."""
    from fedsuite.records.paths import folder_problem

    problem = folder_problem(folder)
    if problem is not None:
        fail(f"{field}: {problem}")


def check_writable_file(path: Any, field: str) -> None:
    """A file can be written at ``path`` (``fedsuite.records.paths.file_target_problem``); else one line, exit 2."""
    from fedsuite.records.paths import file_target_problem

    problem = file_target_problem(path)
    if problem is not None:
        fail(f"{field}: {problem}")


def check_readable(path: Any, kind: str, field: str) -> None:
    """``path``, a ``kind`` (``file`` or ``folder``) the command reads, can be read
    (``fedsuite.records.paths.input_problem``); else one line naming ``field``, exit 2."""
    from fedsuite.records.paths import input_problem

    problem = input_problem(path, kind)
    if problem is not None:
        fail(f"{field}: {problem}")


#: the two spellings of ``--seeds`` (and both at once: ``--seeds 0,1 2``), as its error names them
SEEDS_FORMS = "--seeds 0 1 2 or --seeds 0,1,2"


def parse_seeds(values: Optional[Sequence[str]]) -> Optional[list[int]]:
    """``--seeds`` of ``fedsuite sweep`` and ``fedsuite reproduce``: the values given after the flag
    (:class:`ManyValuesCommand` hands each as one value), each a seed or seeds separated by commas,
    so ``--seeds 0 1 2``, ``--seeds 0,1,2`` and ``--seeds 0,1 2`` are the seeds 0, 1, 2. None (or
    nothing) when the option was not given: the command's default. A value that is not a
    non-negative integer, or no seed at all (``--seeds ,``), is one line, exit 2 (:func:`fail`)."""
    if not values:
        return None
    seeds: list[int] = []
    for value in values:
        for piece in value.split(","):
            piece = piece.strip()
            if not piece:  # "0,1," or "0, 1": an empty piece between commas is no seed
                continue
            if not re.fullmatch(r"[0-9]+", piece):
                fail(f"--seeds takes non-negative integers ({SEEDS_FORMS}), got {piece!r}")
            seeds.append(int(piece))
    if not seeds:
        fail(f"--seeds takes non-negative integers ({SEEDS_FORMS}), got {' '.join(values)!r}")
    return seeds


class RunProgress:
    """The bar of one run: round k/R, the latest test accuracy and the failed replies so far,
    updated from the rows of ``metrics.jsonl`` (``launch.simulate``'s ``on_progress``)."""

    def __init__(self, rounds: int, console: Console, starting: str = "starting Flower") -> None:
        self.rounds = rounds
        self.starting = starting  # what the bar says until round 1 has ended
        self.bar = Progress(TextColumn("{task.description}", markup=False, style="progress.description"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=False)
        self.task = self.bar.add_task(starting, total=rounds, start=False, visible=False)

    def begin(self) -> None:
        self.bar.start()
        self.bar.start_task(self.task)
        self.bar.update(self.task, visible=True)

    def show(self, rows: list[dict[str, Any]]) -> None:
        done = [r for r in rows if r["round"] > 0]
        accs = [r["test_accuracy"] for r in rows if r.get("test_accuracy") is not None]
        desc = f"round {done[-1]['round']}/{self.rounds}" if done else self.starting
        if accs:
            desc += f"  acc {100 * accs[-1]:.2f}%"
        failed = sum(r.get("failed", 0) or 0 for r in done)
        if failed:
            desc += f"  {failed} failed replies"
        self.bar.update(self.task, completed=done[-1]["round"] if done else 0, description=desc)

    def stop(self) -> None:
        self.bar.stop()


# ------------------------------------------------------------------------------------------------
# help: every parameter with its help, default, choices
# ------------------------------------------------------------------------------------------------


class Names(click.ParamType):
    """A name from a fixed set (the strategies, the datasets, ``fedsuite list``'s lists, the
    ``--neuron-lr`` presets, ...): ``--help`` shows the set as the parameter's choices.

    ``names`` is the set, or a function giving it, called only when the help is shown (the
    registry imports torch; a command's start-up does not). The value is passed on as given: the
    code that owns the names (the config, the registry, the tables) refuses a wrong one in its own
    one-line error, which names the allowed ones."""

    name = "name"

    def __init__(self, names: Union[Iterable[str], Callable[[], Iterable[str]]]) -> None:
        self.names = names

    def choices(self) -> list[str]:
        return [str(n) for n in (self.names() if callable(self.names) else self.names)]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:
        return None if isinstance(param, click.Argument) else "NAME"  # an argument's metavar is its name


def restore_argument_help(command: click.Command) -> None:
    """Give a command's positional arguments their ``typer.Argument(help=...)`` back: typer 0.20
    sets it before click (8.2+, whose Argument takes a help of its own) resets it to None."""
    if command.callback is None:
        return
    declared = get_params_from_function(inspect.unwrap(command.callback))
    for param in command.params:
        meta = declared.get(param.name or "")
        if isinstance(param, click.Argument) and not param.help and meta is not None:
            param.help = getattr(meta.default, "help", None)


class PlainHelp:
    """click's plain help text for a command or group (no rich panels: nothing in it is read as
    markup), in which every parameter, positional arguments included, shows its help and then, in
    brackets, its default (:meth:`shown_default`), its choices (a :class:`Names` or
    ``click.Choice`` type), its range and whether it is required."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's order (typer's own is rich panels; click before 8.5 has no arguments section)
        self.format_usage(ctx, formatter)  # type: ignore[attr-defined]
        self.format_help_text(ctx, formatter)  # type: ignore[attr-defined]
        self.format_arguments(ctx, formatter)
        self.format_options(ctx, formatter)
        self.format_epilog(ctx, formatter)  # type: ignore[attr-defined]

    def format_arguments(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.write_section("Positional arguments", [p for p in self.get_params(ctx)  # type: ignore[attr-defined]
                                                    if isinstance(p, click.Argument)], ctx, formatter)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.write_section("Options", [p for p in self.get_params(ctx)  # type: ignore[attr-defined]
                                       if not isinstance(p, click.Argument)], ctx, formatter)
        if isinstance(self, click.Group):
            self.format_commands(ctx, formatter)

    def write_section(self, title: str, params: list[click.Parameter], ctx: click.Context,
                      formatter: click.HelpFormatter) -> None:
        records = [r for r in (self.help_record(p, ctx) for p in params) if r is not None]
        if records:
            with formatter.section(title):
                formatter.write_dl(records)

    def help_record(self, param: click.Parameter, ctx: click.Context) -> tuple[str, str] | None:
        """(the parameter's names and metavar, its help with the bracketed extras), or None if hidden."""
        if getattr(param, "hidden", False):
            return None
        if isinstance(param, click.Argument):
            names = param.make_metavar(ctx)
        else:
            names = param.get_help_record(ctx)[0]  # type: ignore[index]  # "--rounds INTEGER", "--strategy, -s NAME"
        extras = []
        default = self.shown_default(param, ctx)
        if default:
            extras.append(f"default: {default}")
        choices = param_choices(param)
        if choices:
            extras.append(f"choices: {', '.join(choices)}")
        describe_range = getattr(param.type, "_describe_range", None)  # click's IntRange, FloatRange
        if describe_range is not None and describe_range():
            extras.append(describe_range())
        if param.required:
            extras.append("required")
        text = param.help or ""
        if extras:
            text = f"{text}  [{'; '.join(extras)}]" if text else f"[{'; '.join(extras)}]"
        return names, text

    def shown_default(self, param: click.Parameter, ctx: click.Context) -> str | None:
        """The default the help shows: the parameter's own (a flag's off, an empty list and None show
        none; a string ``show_default`` is shown as written)."""
        show = getattr(param, "show_default", None)
        if isinstance(show, str):
            return show
        if show is False or (isinstance(param, click.Option) and param.is_flag):
            return None
        default = param.get_default(ctx, call=False)
        if default is None or callable(default):
            return None
        if isinstance(default, (list, tuple)):
            return ", ".join(str(d) for d in default) or None
        return str(default)


def param_choices(param: click.Parameter) -> list[str]:
    """A parameter's fixed set of values (:class:`Names`, ``click.Choice``), else []."""
    if isinstance(param.type, Names):
        return param.type.choices()
    if isinstance(param.type, click.Choice):
        return [str(c) for c in param.type.choices]
    return []


#: ``fedsuite simulate``'s options that set a config field of another name (the rest: their own)
CONFIG_KEYS = {"relaxed_init": "relaxed_init.beta", "neuron_lr": "neuron_lr.preset"}


@functools.cache
def config_defaults() -> dict[str, Any]:
    """Every config field's default, by dotted key (``rounds``, ``neuron_lr.preset``)."""
    from fedsuite.config import config_model, flat_config

    return flat_config(config_model()().model_dump(mode="json"))


# ------------------------------------------------------------------------------------------------
# the group and commands: one-line usage errors, plain help
# ------------------------------------------------------------------------------------------------


class OneLineUsageGroup(PlainHelp, TyperGroup):
    """The ``fedsuite`` group: an unknown command, or an unknown option before it (``fedsuite
    --bogus``), is one line and exit code 2, as any user error (click's default is a boxed usage
    text); so is any other click error a command raises. ``fedsuite`` alone still shows the help.
    A mistyped command gets click's own "Did you mean" (typer would add it a second time)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.suggest_commands = False

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            fail(exc.format_message())

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            fail(exc.format_message())

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:  # not typer.Exit (fail's) nor Abort: neither is a ClickException
            fail(exc.format_message(), code=exc.exit_code)


#: options that were renamed: {old spelling: new}, refused in one line naming the new one where a
#: command has the new (``partition --out`` is a file, and stays)
RENAMED_OPTIONS = {"--out": "--output-dir"}


class OneLineUsageCommand(PlainHelp, TyperCommand):
    """A command whose usage errors (an unknown option, a value of the wrong type, a missing
    argument) are one line and exit code 2, as its other user errors; its help is
    :class:`PlainHelp`'s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        restore_argument_help(self)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        self.refuse_renamed(args)
        try:
            return super().parse_args(ctx, self.prepare(args))
        except click.UsageError as exc:
            fail(exc.format_message())

    def refuse_renamed(self, args: list[str]) -> None:
        """An old spelling of an option this command has under its new name (:data:`RENAMED_OPTIONS`)
        is one line naming the new one (click alone would guess at a look-alike)."""
        have = {opt for param in self.params for opt in getattr(param, "opts", [])}
        for arg in args:
            if arg == "--":
                return
            old = arg.partition("=")[0]
            new = RENAMED_OPTIONS.get(old)
            if new is not None and old not in have and new in have:
                fail(f"{old} is now {new} ({self.name} {new} FOLDER)")

    def prepare(self, args: list[str]) -> list[str]:
        """The arguments as click is to parse them (here: as given)."""
        return args


class ConfigOptionsCommand(OneLineUsageCommand):
    """A command whose options without a default of their own set the run-config field of their
    name, or :data:`CONFIG_KEYS`'s (``fedsuite simulate``, ``partition``): the help shows that
    field's default from the config model (read when the help is shown: it imports the registry)."""

    def shown_default(self, param: click.Parameter, ctx: click.Context) -> str | None:
        if isinstance(param, click.Option) and not param.is_flag and param.default is None:
            default = config_defaults().get(CONFIG_KEYS.get(param.name or "", param.name))
            return None if default is None else str(default)
        return super().shown_default(param, ctx)


class ManyValuesCommand(OneLineUsageCommand):
    """A command whose options in :attr:`many` take one or more values after one flag, as in
    ``--seeds 0 1 2`` (a click option takes one value per flag: the values are handed to it as
    ``--seeds 0 --seeds 1 --seeds 2``): ``fedsuite reproduce`` (``--rows``, ``--methods``,
    ``--seeds``) and ``fedsuite sweep`` (``--seeds``; it has no ``--rows`` or ``--methods``, which
    click refuses as any unknown option)."""

    many = ("--rows", "--methods", "--seeds")

    def prepare(self, args: list[str]) -> list[str]:
        return self.spread(args)

    def spread(self, args: list[str]) -> list[str]:
        out: list[str] = []
        filling, count = None, 0  # the option taking values, and how many it has taken
        for i, arg in enumerate(args):
            name, eq, value = arg.partition("=")
            if filling and (not arg.startswith("-") or re.fullmatch(r"-\d+", arg)):
                out += [filling, arg]
                count += 1
                continue
            if filling and not count:
                raise click.UsageError(f"{filling} expects one or more values")
            filling = None
            if arg == "--":
                return out + args[i:]
            if name in self.many and eq:
                out += [name, value]
            elif arg in self.many:
                filling, count = arg, 0
            else:
                out.append(arg)
        if filling and not count:
            raise click.UsageError(f"{filling} expects one or more values")
        return out
