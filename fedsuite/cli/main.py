"""The ``fedsuite`` command: simulate, list, partition, report, certs, gateway, sweep, reproduce; ``--version``.

User errors (bad config, unknown names, missing data) print one ``error:`` line and exit with code 2
(``cli_support.fail``), and leave no run directory behind (the data check, ``runtime.check_data``,
runs while the simulation process starts, see ``launch.simulate``; a run it refuses is removed with
everything it started). Ctrl-C stops ``fedsuite simulate`` with the command that continues the run.
This module holds the commands' options and what they print; the logic lives with the modules
that own it: ``runner`` (one ``simulate`` run, from its options to its outcome: the Python API's
``fedsuite.simulate`` runs the same code), ``launch`` (a run's processes), ``rundir`` (a run
directory, ``--resume``), ``runtime`` (the data and hardware checks), ``results`` (the report),
``certs``, ``sweep``, ``search``, ``reproduce``.

Text is printed as written, never read as rich markup (``cli_support``: plain help, plain consoles).
Every option and argument has a help text; a parameter with a fixed set of values takes a
:class:`~fedsuite.cli.support.Names` type, whose set ``--help`` shows (tests/test_cli_text.py).

One spelling per idea across the commands: ``-h``/``--help`` on ``fedsuite`` and every command (set
once, on the app); ``--output-dir``, the folder a command writes its output in (simulate: the run's
folder; sweep: the sweep's; reproduce: a target's runs and reports; report: its files), and
``--out`` only for a single file (partition's figure); ``--data-root`` and ``--engine`` with one
help text wherever they are; ``--seeds`` read by one function (``cli_support.parse_seeds``:
``--seeds 0 1 2`` and ``--seeds 0,1,2`` alike); ``--last`` with one default (a run's reading, as
``report`` and ``sweep`` take it).
"""

from __future__ import annotations

import json
import math
import re
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.table import Table

from fedsuite.cli.support import (
    CONFIG_KEYS,
    SEEDS_FORMS,
    ConfigOptionsCommand,
    ManyValuesCommand,
    Names,
    check_readable,
    check_writable_file,
    check_writable_folder,
    OneLineUsageCommand,
    OneLineUsageGroup,
    err_console,
    fail,
    parse_seeds,
    plain_console,
)

# fedsuite.config and the registry (torch, pydantic, every method) are imported where a command
# needs them: `fedsuite simulate` first starts its simulation process, whose imports then run on
# the second core while this process does its own (fedsuite.launch.start.start_simulation_process).

#: ``-h`` and ``--help`` on ``fedsuite`` and, through click's context, on every command
HELP_OPTION_NAMES = ["-h", "--help"]

app = typer.Typer(cls=OneLineUsageGroup, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"help_option_names": HELP_OPTION_NAMES},
                  help="Federated-learning research suite on Flower.")
console = plain_console()


def registry_names(kind: str) -> Callable[[], list[str]]:
    """The names of one registry (``methods``, ``datasets``, ``partitioners``, ``models``), for
    :class:`Names`: read when ``--help`` shows them."""

    def names() -> list[str]:
        from fedsuite.method import registry

        return sorted(getattr(registry, kind)())

    return names


def neuron_lr_presets() -> list[str]:
    from fedsuite.method.plugins.neuron_lr import PRESETS

    return list(PRESETS)


def search_kinds() -> list[str]:
    from fedsuite.queues.search import SEARCHES

    return list(SEARCHES)


def reproduce_scales() -> list[str]:
    from fedsuite.queues.reproduce.tables import SCALES

    return list(SCALES)


def reproduce_targets() -> list[str]:
    from fedsuite.queues.reproduce.tables import target_names

    return [*target_names(), "list"]


#: what ``fedsuite list`` lists
LISTS = ("strategies", "datasets", "partitioners", "models")


def _print_version(value: bool) -> None:
    """``--version``: fedsuite's version and the commit of the checkout it runs from, with a dirty
    flag (``fedsuite.records.provenance.code_version``; an installed package says it is not a checkout)."""
    if value:
        from fedsuite.records.provenance import code_version, version_line

        print(version_line(code_version()))
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                 help="print fedsuite's version and git commit, and exit"),
) -> None:
    """Federated-learning research suite on Flower."""


#: ``--engine`` of simulate, sweep and reproduce (config key ``engine``; it never changes a run's numbers)
ENGINE_OPTION = typer.Option(None, "--engine", click_type=Names(("flower", "inprocess")),
                             help="what runs the clients: flower (Flower's Simulation Engine, Ray; the default) or "
                             "inprocess (every client called in the run's own process: no Ray, for tests, debugging "
                             "and quick runs; the same numbers)")


#: ``--data-root`` of simulate, sweep and reproduce (config key ``data_root``; simulate shows the
#: config's default, sweep and reproduce pass it to every run, else each run's config says)
DATA_ROOT_OPTION = typer.Option(None, "--data-root", show_default="the runs' config's data_root",
                                help="where the datasets are (config key data_root)")

#: the options ``simulate`` and ``partition`` share: the config file and the data and partition it
#: describes (an option left out takes its value from the config file, else the config's default)
CONFIG_OPTION = typer.Option(None, "--config", "-c", help="TOML config file (default: none, the defaults shown here)")
DATASET_OPTION = typer.Option(None, click_type=Names(registry_names("datasets")), help="dataset name")
PARTITIONER_OPTION = typer.Option(None, click_type=Names(registry_names("partitioners")), help="partitioner name")
ALPHA_OPTION = typer.Option(None, help="Dirichlet concentration")
CLASSES_PER_CLIENT_OPTION = typer.Option(None, help="classes per client (pathological)")
NUM_CLIENTS_OPTION = typer.Option(None, help="number of clients")

#: ``--last`` of report and sweep: one reading of a run (``fedsuite.records.results.run_value``) for both
LAST_DEFAULT = 10
LAST_OPTION = typer.Option(LAST_DEFAULT, "--last", help="a run's reading: the mean of its last k evaluations "
                           "(all of them if it has fewer)")


def _common_values(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


@app.command(cls=ConfigOptionsCommand)
def simulate(
    strategy: Optional[str] = typer.Option(None, "--strategy", "-s", click_type=Names(registry_names("methods")),
                                           help="method name (fedsuite list)"),
    config: Optional[Path] = CONFIG_OPTION,
    set_: list[str] = typer.Option([], "--set", help="override: key=value, e.g. fedprox.mu=0.01 (repeatable; a "
                                   "method's keys, types and defaults: fedsuite list strategies NAME)"),
    dataset: Optional[str] = DATASET_OPTION,
    partitioner: Optional[str] = PARTITIONER_OPTION,
    alpha: Optional[float] = ALPHA_OPTION,
    classes_per_client: Optional[int] = CLASSES_PER_CLIENT_OPTION,
    num_clients: Optional[int] = NUM_CLIENTS_OPTION,
    clients_per_round: Optional[int] = typer.Option(None, help="cohort size K (default: --fraction of the clients, "
                                                    "at least 1)"),
    fraction: Optional[float] = typer.Option(None, help="cohort fraction (if K unset)"),
    rounds: Optional[int] = typer.Option(None, help="federated rounds"),
    local_epochs: Optional[int] = typer.Option(None, help="local epochs"),
    batch_size: Optional[int] = typer.Option(None, help="local batch size"),
    lr: Optional[float] = typer.Option(None, help="local learning rate"),
    model: Optional[str] = typer.Option(None, click_type=Names(registry_names("models")), help="model name"),
    seed: Optional[int] = typer.Option(None, help="random seed"),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", help="parent folder of the run's folder "
                                             "(OUTPUT_DIR/RUN_NAME)"),
    run_name: Optional[str] = typer.Option(None, "--run-name", help="the run's folder name (default: "
                                           "<strategy>-<dataset>-s<seed>-<date>-<time>)"),
    data_root: Optional[str] = DATA_ROOT_OPTION,
    num_cpus: Optional[int] = typer.Option(None, help="CPU cores per simulated client"),
    num_gpus: Optional[float] = typer.Option(None, help="GPU share per simulated client"),
    eval_every: Optional[int] = typer.Option(None, help="evaluate the global model every k rounds"),
    relaxed_init: Optional[float] = typer.Option(None, "--relaxed-init", help="FedInit's β: relaxed initialisation "
                                                 "on any method (default: off)"),
    neuron_lr: Optional[str] = typer.Option(None, "--neuron-lr", click_type=Names(neuron_lr_presets),
                                            help="FedNLR's neuron-wise lr preset on any method (default: off)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run in the same run directory"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="run the clients on this Ray cluster "
                                              "(auto, host:port, ray://...; default: a private Ray for the run)"),
    engine: Optional[str] = ENGINE_OPTION,
) -> None:
    """Run one federated simulation on Flower's Simulation Engine (or, with --engine inprocess, in this process).

    An option left out takes its value from --config, else the default shown. Ctrl-C stops the run
    and prints the --resume command that continues it."""
    # light imports: the runner starts the simulation process before it imports torch and the registry
    from fedsuite.errors import ConfigError, DataError, RunDirError, RunFailed, RunInterrupted
    from fedsuite.launch.runner import CLI, run_simulation

    values = _common_values(
        strategy=strategy, dataset=dataset, partitioner=partitioner, alpha=alpha,
        classes_per_client=classes_per_client, num_clients=num_clients, clients_per_round=clients_per_round,
        fraction=fraction, rounds=rounds, local_epochs=local_epochs, batch_size=batch_size, lr=lr, model=model,
        seed=seed, output_dir=output_dir, run_name=run_name, data_root=data_root, num_cpus=num_cpus,
        num_gpus=num_gpus, eval_every=eval_every, ray_address=ray_address, engine=engine,
    )
    for option, value in (("relaxed_init", relaxed_init), ("neuron_lr", neuron_lr)):
        if value is not None:
            values[CONFIG_KEYS[option]] = value
    # a SIGTERM (e.g. from `timeout` or a job scheduler) stops the run as Ctrl-C does: every process
    # we started is stopped, a run that had recorded itself completed ends "done" (exit 0), any other
    # says how to continue it, exit 143 (the handler is put back afterwards for a caller that invokes
    # the command in-process: tests)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        run_simulation(config, set_, values, resume=resume, console=console, spelling=CLI)
    except (ConfigError, DataError, RunDirError) as exc:  # bad input: nothing was written
        fail(str(exc))
    except RunFailed as exc:
        fail(str(exc), code=1)
    except RunInterrupted as exc:  # every process of the run has stopped: say how to continue it, exit 130 / 143
        err_console.print(str(exc), soft_wrap=True)
        raise typer.Exit(143 if isinstance(exc.__context__, Terminated) else 130) from None
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM during ``fedsuite simulate``: raised where Ctrl-C's KeyboardInterrupt would be, so that
    both stop a run by the same path (every process stopped; a completed run is no interruption)."""


def _terminated(signum, frame) -> None:
    raise Terminated()


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


@app.command("list", cls=OneLineUsageCommand)
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


@app.command(cls=ConfigOptionsCommand)
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

    values = _common_values(dataset=dataset, partitioner=partitioner, alpha=alpha,
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


@app.command(cls=OneLineUsageCommand)
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


@app.command(cls=OneLineUsageCommand)
def certs(
    out: Path = typer.Argument(..., help="credentials folder (created; existing files are kept)"),
    host: list[str] = typer.Option([], "--host", help="a name or IP address SuperNodes and the CLI use to "
                                   "reach the SuperLink (repeatable; localhost and 127.0.0.1 are always in)"),
    supernode: list[str] = typer.Option([], "--supernode", help="make an authentication key pair for this "
                                        "SuperNode name (repeatable)"),
    days: int = typer.Option(825, min=1, help="validity of new certificates, in days"),
    force_server: bool = typer.Option(False, "--force-server", help="re-issue the SuperLink certificate "
                                      "(e.g. for new --host values) from the same CA"),
) -> None:
    """Make a CA, the SuperLink's TLS certificate and SuperNode key pairs for a Deployment Engine federation."""
    from fedsuite.deploy.certs import CertError, make_credentials, server_hosts

    try:
        creds = make_credentials(out, host, supernode, days=days, force_server=force_server)
    except CertError as exc:
        fail(str(exc))
    for path in creds.created:
        console.print(f"wrote {path}", highlight=False)
    console.print(f"SuperLink certificate valid for: {', '.join(server_hosts(creds))}", highlight=False)
    names = creds.supernode_names()
    console.print(f"SuperNode keys: {', '.join(names) if names else '(none)'}; register each public key "
                  f"with `flwr supernode register {creds.root / 'supernodes'}/NAME.pub <connection>`",
                  highlight=False)


@app.command(cls=OneLineUsageCommand)
def connection(
    flwr_home: Path = typer.Argument(..., help="the flwr CLI's home (FLWR_HOME): its config.toml gets the connection"),
    address: str = typer.Argument(..., help="the SuperLink's Control API, HOST:PORT"),
    root_certificates: Optional[Path] = typer.Option(None, "--root-certificates",
                                                     help="the CA certificate (TLS); without it: insecure"),
    name: str = typer.Option("fedsuite", "--name", help="the connection's name"),
) -> None:
    """Write the flwr CLI's connection to a SuperLink (for flwr run, flwr log, fedsuite submit)."""
    from fedsuite.deploy.superlink import write_connection

    check_writable_folder(flwr_home, "FLWR_HOME")
    if root_certificates is not None:
        check_readable(root_certificates, "file", "--root-certificates")
    write_connection(flwr_home, address, root_certificates, name)


@app.command(cls=OneLineUsageCommand)
def submit(
    app_dir: Path = typer.Argument(..., help="the Flower app folder to run"),
    connection: str = typer.Argument(..., help="the flwr connection's name (fedsuite connection)"),
    run_config: Optional[str] = typer.Option(None, "--run-config", help="as flwr run --run-config takes it "
                                             "(default: the app's own config)"),
) -> None:
    """flwr run + flwr log --stream against a SuperLink; exits 0 only if the run finished completed."""
    from fedsuite.deploy.superlink import submit_and_follow

    check_readable(app_dir, "folder", "APP_DIR")
    raise typer.Exit(submit_and_follow(app_dir, connection, run_config or ""))


@app.command(cls=OneLineUsageCommand)
def gateway(
    credentials: Path = typer.Argument(..., help="credentials folder (fedsuite certs): reads ca.crt, server.pem, "
                                       "server.key only"),
    listen: str = typer.Option("0.0.0.0:9093", "--listen", help="HOST:PORT the SuperNodes connect to"),
    superlink: str = typer.Option("127.0.0.1:9092", "--superlink", help="HOST:PORT of the SuperLink, which "
                                  "listens there only (flower-superlink --host/--port)"),
    superlink_name: Optional[str] = typer.Option(None, "--superlink-name", help="the name the SuperLink's "
                                                 "certificate is checked against (default: --superlink's host, "
                                                 "or localhost for an IP address)"),
    workdir: Optional[Path] = typer.Option(None, "--dir", help="folder for nginx.conf, its pid file and logs "
                                           "(default: CREDENTIALS/../gateway)"),
    print_config: bool = typer.Option(False, "--print-config", help="print the nginx configuration and exit"),
    max_body: Optional[str] = typer.Option(None, "--max-body", help="largest request body, e.g. 8m (default: "
                                           "one of Flower's 5 MiB array chunks + 3 MiB); larger gets 413"),
    max_conns: int = typer.Option(32, "--max-conns", help="requests in progress at once per client address "
                                  "(more get 503, which SuperNodes retry)"),
    max_rate: int = typer.Option(100, "--max-rate", help="requests a second per client address, burst twice "
                                 "that (more get 503, which SuperNodes retry)"),
    body_timeout: int = typer.Option(60, "--body-timeout", help="seconds a client may send nothing of its "
                                     "request (then 408), or read nothing of its response"),
) -> None:
    """Publish the SuperLink's Fleet API alone, over TLS, through nginx: SuperNodes connect here; the
    Control API (flwr run, flwr supernode register) stays on the SuperLink's machine. Bodies, requests
    per client address and slow clients are bounded before anything reaches the SuperLink."""
    import os

    from fedsuite.deploy import gateway as gw
    from fedsuite.deploy.certs import CertError, Credentials

    from fedsuite.records.paths import path_problem

    problem = path_problem(credentials)  # a loop; a missing file is named by the credentials' own check
    if problem is not None:
        fail(f"CREDENTIALS: {problem}")
    if workdir is not None:
        check_writable_folder(workdir, "--dir")
    creds = Credentials(credentials)
    folder = workdir or credentials.resolve().parent / "gateway"
    try:
        limits = gw.Limits(None if max_body is None else gw.parse_size(max_body), max_conns, max_rate, body_timeout)
        if print_config:
            print(gw.nginx_config(creds, listen, superlink, folder, superlink_name, limits), end="")
            return
        command = gw.prepare(creds, listen, superlink, folder, superlink_name, limits)
    except (gw.GatewayError, CertError, OSError) as exc:
        fail(str(exc))
    print(f"gateway: {listen} -> Fleet API of {superlink} (nginx, {folder / 'nginx.conf'})", flush=True)
    os.execv(command[0], command)


@app.command(cls=ManyValuesCommand)
def sweep(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="base TOML config (may hold a [sweep] section)"),
    set_: list[str] = typer.Option([], "--set", help="base override: key=value, as for simulate (repeatable)"),
    grid: list[str] = typer.Option([], "--grid", help="a grid key and its values: lr=0.01,0.05 (repeatable)"),
    seeds: Optional[list[str]] = typer.Option(None, "--seeds", metavar="SEEDS",
                                              help=f"seeds of every setting: {SEEDS_FORMS} (default: [sweep] "
                                              "seeds, else 0)"),
    output_dir: Path = typer.Option(Path("runs/sweeps"), "--output-dir", help="parent folder of the sweep's folder "
                                    "(OUTPUT_DIR/NAME)"),
    name: Optional[str] = typer.Option(None, "--name", help="the sweep's folder name, under --output-dir (default: "
                                       "the config file's name, else sweep; a search's: the config file's name "
                                       "and -search, else search)"),
    data_root: Optional[str] = DATA_ROOT_OPTION,
    jobs: int = typer.Option(1, "--jobs", help="simulations at once"),
    num_gpus: Optional[float] = typer.Option(None, "--num-gpus", help="GPU share per simulated client, passed to every run"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="run every simulation's clients on this Ray cluster"),
    engine: Optional[str] = ENGINE_OPTION,
    last: int = LAST_OPTION,
    group_by: Optional[str] = typer.Option(None, "--group-by", help="a grid key: the report names the best setting per value"),
    report_only: bool = typer.Option(False, "--report", help="only write the report from the runs on disk"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="run failed runs again, each from its last "
                                      "checkpoint (without it they are named and left as they are)"),
    search: Optional[str] = typer.Option(None, "--search", click_type=Names(search_kinds),
                                         help="random|asha: a Ray Tune search over --space instead of a grid"),
    space: list[str] = typer.Option([], "--space", help="a search range: lr=log:0.001:0.3, uniform:A:B, int:A:B, choice:a,b (repeatable)"),
    samples: int = typer.Option(8, "--samples", help="a search's number of trials"),
    grace_rounds: Optional[int] = typer.Option(None, "--grace-rounds", help="ASHA's first rung, in rounds (default: a quarter of the rounds)"),
) -> None:
    """Run a grid of settings times seeds as one resumable queue, and report mean ± sample std per setting;
    or, with --search, a Ray Tune search (ASHA stops poor trials early), each trial a fedsuite run.
    A run in the folder of another config than asked stops the command before it starts anything;
    a failed run is named and left as it is, or run again with --retry-failed."""
    from fedsuite.errors import ConfigError
    from fedsuite.queues.reproduce.queue import ReproduceError, placement_options
    from fedsuite.queues.sweep import run_sweep

    seed_list = parse_seeds(seeds)
    if data_root is not None:  # a base setting of every run, before --set (which wins, as on simulate)
        set_ = [f"data_root={json.dumps(data_root)}", *set_]
    if search is None and (space or grace_rounds is not None):
        fail("--space and --grace-rounds belong to a search: add --search random|asha")
    if search is not None and (grid or group_by or report_only):
        fail("a search samples --space: --grid, --group-by and --report belong to a grid sweep "
             "(a grid key's values are a choice: --space key=choice:v1,v2)")
    if search is not None and retry_failed:
        fail("--retry-failed belongs to a grid sweep: a search starts new trials (a trial's run continues with "
             "fedsuite simulate --config <trial>/config.json --resume)")
    try:
        if search is not None:
            from fedsuite.queues.search import run_search

            if jobs < 1 or last < 1:
                fail("--jobs and --last must be at least 1")
            from fedsuite.queues.study import study_folder

            # not the grid's default folder: a grid and a search do not share one (fedsuite.queues.study.study_in)
            folder = study_folder(output_dir, name if name is not None else
                                  f"{config.stem}-search" if config is not None else "search")
            code = run_search(search, space, samples, grace_rounds, config, set_, seed_list or [0], folder, jobs,
                              placement_options(num_gpus, ray_address, engine), last, console)
            raise typer.Exit(code)
        code = run_sweep(config, set_, grid, seed_list, output_dir, name, jobs, placement_options(num_gpus, ray_address, engine),
                         last, group_by,
                         report_only, console, retry_failed)
    except (ReproduceError, ConfigError) as exc:  # SweepError, missing data, a path (fedsuite.records.paths)
        fail(str(exc))
    raise typer.Exit(code)


@app.command(cls=ManyValuesCommand)
def reproduce(
    target: str = typer.Argument(..., click_type=Names(reproduce_targets),
                                 help="a target name (see `fedsuite reproduce list`), or `list`"),
    rows: Optional[list[str]] = typer.Option(None, "--rows", help="only these rows (names as in `list`): --rows a b"),
    methods: Optional[list[str]] = typer.Option(None, "--methods", help="only these methods (columns)"),
    seeds: Optional[list[str]] = typer.Option(None, "--seeds", metavar="SEEDS",
                                              help=f"seeds: {SEEDS_FORMS} (default: the target's, per scale)"),
    scale: Optional[str] = typer.Option(None, "--scale", click_type=Names(reproduce_scales),
                                        show_default="paper with a GPU or --ray-address; without a GPU, cpu where "
                                        "the target has it, else refused",
                                        help="paper: the paper's settings; cpu: the target's "
                                        "CPU-sized variant (orderings only)"),
    jobs: int = typer.Option(1, "--jobs", help="simulations at once"),
    output_dir: Path = typer.Option(Path("runs/reproduce"), "--output-dir", help="parent folder of the runs and "
                                    "reports (OUTPUT_DIR/<paper>/<scale>/...)"),
    data_root: Optional[str] = DATA_ROOT_OPTION,
    num_gpus: Optional[float] = typer.Option(None, "--num-gpus", help="GPU share per simulated client, passed to every run"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="run every simulation's clients on this "
                                              "Ray cluster (host:port, auto)"),
    engine: Optional[str] = ENGINE_OPTION,
    tables: list[Path] = typer.Option([], "--tables", help="another tables file (repeatable)"),
    report_only: bool = typer.Option(False, "--report", help="only write the report from the runs on disk"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="run failed runs again, each from its last "
                                      "checkpoint (without it they are named and left as they are)"),
    confidence: float = typer.Option(0.95, "--confidence", help="the confidence of the report's verdicts: each "
                                     "claimed ordering is judged by its two-sided paired t-interval at this level"),
) -> None:
    """Reproduce a paper's table: run its grid (rows x methods x seeds) as a resumable queue of
    `fedsuite simulate` runs and report obtained beside published. `fedsuite reproduce list` shows the targets.
    A run on disk of another config than the target's stops the command before it starts anything;
    a failed run is named and left as it is, or run again with --retry-failed."""
    from fedsuite.queues.reproduce import run_reproduce
    from fedsuite.queues.reproduce.queue import ReproduceError, placement_options

    try:
        code = run_reproduce(target, rows, methods, parse_seeds(seeds), scale, jobs, output_dir, data_root,
                             placement_options(num_gpus, ray_address, engine), tables,
                             report_only, console, retry_failed, confidence)
    except ReproduceError as exc:
        fail(str(exc))
    raise typer.Exit(code)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
