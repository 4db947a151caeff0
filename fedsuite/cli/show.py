"""``fedsuite list``, ``fedsuite partition`` and ``fedsuite report``: the commands that show what
there is (the registered methods, datasets, partitioners and models; a partition's label
histogram; runs' results), registered on ``fedsuite`` by ``fedsuite.cli.main``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from fedsuite.cli.options import (ALPHA_OPTION, CLASSES_PER_CLIENT_OPTION, CONFIG_OPTION, DATA_ROOT_OPTION,
                                  DATASET_OPTION, LAST_OPTION, NUM_CLIENTS_OPTION, PARTITIONER_OPTION, common_values,
                                  registry_names)
from fedsuite.cli.support import (ConfigOptionsCommand, Names, OneLineUsageCommand, check_writable_file,
                                  check_writable_folder, fail, plain_console)

#: the commands of this module (``fedsuite.cli.main`` adds them to the app)
commands = typer.Typer(rich_markup_mode=None)
console = plain_console()

#: what ``fedsuite list`` lists
LISTS = ("strategies", "datasets", "partitioners", "models")

#: the figure formats partition's ``--out`` file may have (matplotlib's raster and vector backends)
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def figure_path(out: Path) -> Path:
    """``out`` with ``.png`` added when it has no suffix (matplotlib would add it silently, and the
    path printed would not be the file written); a suffix no backend writes is one line, exit 2."""
    if not out.suffix:
        return out.with_name(out.name + ".png")
    if out.suffix.lower() not in FIGURE_SUFFIXES:
        fail(f"--out {out}: a figure is written as {', '.join(FIGURE_SUFFIXES)}; got {out.suffix!r}")
    return out


#: RST in docstrings: a role (:class:`x`) and an inline literal (``x``)
RST_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`")
RST_LITERAL = re.compile(r"``(.+?)``")


def plain_text(doc: str) -> str:
    """A docstring's words as plain text: RST's roles and inline literals lose their marks."""
    return RST_LITERAL.sub(r"\1", RST_ROLE.sub(r"\1", doc))


def first_line(doc: Optional[str]) -> str:
    return doc.strip().splitlines()[0] if doc and doc.strip() else ""


@commands.command("list", cls=OneLineUsageCommand)
def list_(
    what: Optional[str] = typer.Argument(None, click_type=Names(LISTS), help="the list to print (default: all)"),
    name: Optional[str] = typer.Argument(None, click_type=Names(registry_names("methods")),
                                         help="with strategies: this method alone"),
    markdown: bool = typer.Option(False, "--markdown", help="print Markdown tables (used for README.md)"),
) -> None:
    """List the registered strategies, datasets, partitioners and models; the strategies with each
    method's parameters (type, default, meaning, the paper's value where it differs)."""
    from fedsuite.method import registry

    if what is not None and what not in LISTS:
        fail(f"unknown list {what!r}; allowed: {', '.join(LISTS)}")
    if name is not None and what != "strategies":
        fail(f"a name is listed with strategies: fedsuite list strategies {name}")
    if name is not None and name not in registry.methods():
        fail(f"unknown strategy {name!r}; allowed: {', '.join(registry.methods())}")
    if what == "strategies" and not markdown:  # the methods with their parameters (fedsuite.cli.hyperparams)
        from fedsuite.cli.hyperparams import method_lines

        for method in [name] if name is not None else registry.methods():
            for line in method_lines(method):
                console.print(line, soft_wrap=True)
        return
    tables = {
        "strategies": {n: m.summary for n, m in registry.methods().items()},
        "datasets": {n: first_line(f.__doc__) for n, f in registry.datasets().items()},
        "partitioners": {n: first_line(f.__doc__) for n, f in registry.partitioners().items()},
        "models": {n: first_line(f.__doc__) for n, f in registry.models().items()},
    }
    if markdown:  # the docstrings' ``x`` is a code span in Markdown too
        for kind, rows in tables.items():
            if what in (None, kind):
                print(f"\n**{kind}**\n\n| name | what |\n|---|---|")
                for key, desc in rows.items():
                    if name in (None, key):
                        print(f"| `{key}` | {desc} |")
        return
    for kind, rows in tables.items():
        if what in (None, kind):
            table = Table(title=kind, show_header=False, title_justify="left")
            table.add_column(style="bold")
            table.add_column()
            for key, desc in rows.items():
                table.add_row(key, plain_text(desc))
            console.print(table)


@commands.command(cls=ConfigOptionsCommand)
def partition(
    config: Optional[Path] = CONFIG_OPTION,
    set_: list[str] = typer.Option([], "--set", help="override: key=value (repeatable)"),
    dataset: Optional[str] = DATASET_OPTION,
    partitioner: Optional[str] = PARTITIONER_OPTION,
    alpha: Optional[float] = ALPHA_OPTION,
    classes_per_client: Optional[int] = CLASSES_PER_CLIENT_OPTION,
    num_clients: Optional[int] = NUM_CLIENTS_OPTION,
    seed: Optional[int] = typer.Option(None, help="random seed (fixes the partition)"),
    data_root: Optional[str] = DATA_ROOT_OPTION,
    out: Path = typer.Option(Path("partition.png"), "--out", help="the file the label-histogram plot is saved to "
                             f"({', '.join(FIGURE_SUFFIXES)}; no suffix: .png)"),
    show: int = typer.Option(20, min=0, help="clients shown in the table"),
) -> None:
    """Per-client label histogram of a dataset/partition choice (table + saved plot).

    An option left out takes its value from --config, else the default shown."""
    import numpy as np

    from fedsuite.engine import runtime
    from fedsuite.config import ConfigError, build_config
    from fedsuite.data import label_histogram
    from fedsuite.records.plots import PARTITION_BARS_MAX, plot_partition

    values = common_values(dataset=dataset, partitioner=partitioner, alpha=alpha,
                            classes_per_client=classes_per_client, num_clients=num_clients, seed=seed,
                            data_root=data_root)
    check_writable_file(out, "--out")  # before the data is read; a folder given as --out is refused as it is
    out = figure_path(out.expanduser())
    check_writable_file(out, "--out")
    try:
        cfg = build_config(config, set_, values)
        bundle = runtime.load_bundle(cfg)
        parts = [runtime.client_indices(cfg, bundle, i) for i in range(cfg.num_clients)]
    except ConfigError as exc:
        fail(str(exc))
    except Exception as exc:
        if runtime.is_data_error(exc):
            fail(str(exc))
        raise
    hist = label_histogram(bundle.y_train.numpy(), parts, bundle.num_classes)
    table = Table(title=f"{cfg.dataset} / {cfg.partitioner}: samples per class (first {min(show, len(parts))} clients)")
    table.add_column("client")
    table.add_column("n", justify="right")
    for c in range(bundle.num_classes):
        table.add_column(str(c), justify="right")
    for i in range(min(show, len(parts))):
        table.add_row(str(i), str(int(hist[i].sum())), *[str(int(v)) if v else "." for v in hist[i]])
    console.print(table)
    sizes = hist.sum(1)
    console.print(f"clients: {len(parts)}  sizes min/median/max: {sizes.min()}/{int(np.median(sizes))}/{sizes.max()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_partition(hist, out, title=f"{cfg.dataset} {cfg.partitioner} (N={cfg.num_clients})")
    if len(parts) > PARTITION_BARS_MAX:  # bars of so many clients took minutes to draw, and showed nothing
        console.print(f"the plot shows {len(parts)} clients as a heatmap of their class shares, ordered by their "
                      f"main class (bars up to {PARTITION_BARS_MAX} clients)")
    console.print(f"plot -> {out}")


@commands.command(cls=OneLineUsageCommand)
def report(
    run_dirs: list[Path] = typer.Argument(..., help="run directories, or folders searched for runs at any depth "
                                          "(runs/, a sweep's folder); several seeds of one setting are grouped"),
    target: Optional[float] = typer.Option(None, help="target accuracy in %, for rounds-to-target"),
    last: int = LAST_OPTION,
    output_dir: Path = typer.Option(Path("report"), "--output-dir", help="the folder the report's files are "
                                    "written in: report.md, report.json, accuracy.png (momentum.png where runs "
                                    "record a server momentum; diagnostics-<run>.png per run with pool "
                                    "diagnostics)"),
) -> None:
    """Table of final accuracy (each run's mean of its last --last evaluations; mean ± sample std over
    seeds), rounds to a target, and figures; names the code (fedsuite, commit, packages) and hardware
    that produced the runs. A folder that is not a run (runs/, a sweep's folder) is searched for runs
    at any depth."""
    from fedsuite.records.results import (ResultsError, find_runs, provenance_lines, reading_text, report as make_report,
                                  report_table, write_report)

    if last < 1:
        fail(f"--last must be at least 1 (the number of final evaluations averaged per run), got {last}")
    if target is not None and not (math.isfinite(target) and 0 < target <= 100):
        fail(f"--target is a test accuracy in % (0 < target <= 100), got {target:g}")
    try:
        run_dirs = find_runs(run_dirs)
        rows, curves = make_report(run_dirs, target=None if target is None else target / 100, last=last)
    except ResultsError as exc:
        fail(str(exc))
    check_writable_folder(output_dir, "--output-dir")
    headers, cells = report_table(rows, target, last)
    table = Table(title="fedsuite report")
    for h in headers:
        table.add_column(h)
    for row in cells:
        table.add_row(*row)
    console.print(table)
    console.print(reading_text(last), soft_wrap=True)
    for line in provenance_lines(run_dirs):
        if line:
            console.print(line, highlight=False, soft_wrap=True)
    figures = write_report(output_dir, run_dirs, rows, curves, headers, cells, reading_text(last))
    console.print(f"-> {output_dir / 'report.md'}, " + ", ".join(str(f) for f in figures))
