"""What the ``fedsuite`` commands share beyond their options: the one-line user error (:func:`fail`),
usage errors said the same way (:class:`OneLineUsageGroup`, :class:`OneLineUsageCommand`), options
that take several values after one flag (:class:`ManyValuesCommand`, ``fedsuite reproduce``'s
``--seeds 0 1 2``) and a run's progress bar (:class:`RunProgress`). Light imports only:
``fedsuite.cli`` imports this at start-up.
"""

from __future__ import annotations

import re
from typing import Any

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperCommand, TyperGroup

err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    """A user error: one line on stderr, then exit ``code`` (2: bad input; 1: a run failed)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


class RunProgress:
    """The bar of one run: round k/R, the latest test accuracy and the failed replies so far,
    updated from the rows of ``metrics.jsonl`` (``launch.simulate``'s ``on_progress``)."""

    def __init__(self, rounds: int, console: Console) -> None:
        self.rounds = rounds
        self.bar = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=False)
        self.task = self.bar.add_task("starting Flower", total=rounds, start=False, visible=False)

    def begin(self) -> None:
        self.bar.start()
        self.bar.start_task(self.task)
        self.bar.update(self.task, visible=True)

    def show(self, rows: list[dict[str, Any]]) -> None:
        done = [r for r in rows if r["round"] > 0]
        accs = [r["test_accuracy"] for r in rows if r.get("test_accuracy") is not None]
        desc = f"round {done[-1]['round']}/{self.rounds}" if done else "starting Flower"
        if accs:
            desc += f"  acc {100 * accs[-1]:.2f}%"
        failed = sum(r.get("failed", 0) or 0 for r in done)
        if failed:
            desc += f"  [yellow]{failed} failed replies[/]"
        self.bar.update(self.task, completed=done[-1]["round"] if done else 0, description=desc)

    def stop(self) -> None:
        self.bar.stop()


class OneLineUsageGroup(TyperGroup):
    """The ``fedsuite`` group: an unknown command, or an unknown option before it (``fedsuite
    --bogus``), is one line and exit code 2, as any user error (click's default is a boxed usage
    text); ``fedsuite`` alone still shows the help."""

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


class OneLineUsageCommand(TyperCommand):
    """A command whose usage errors (an unknown option, a value of the wrong type, a missing
    argument) are one line and exit code 2, as its other user errors."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, self.prepare(args))
        except click.UsageError as exc:
            fail(exc.format_message())

    def prepare(self, args: list[str]) -> list[str]:
        """The arguments as click is to parse them (here: as given)."""
        return args


class ManyValuesCommand(OneLineUsageCommand):
    """A command whose options in :attr:`many` take one or more values after one flag, as in
    ``--seeds 0 1 2`` (a click option takes one value per flag: the values are handed to it as
    ``--seeds 0 --seeds 1 --seeds 2``)."""

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
