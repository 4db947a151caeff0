"""``fedsuite sweep`` and ``fedsuite reproduce``: the commands of ``fedsuite.queues`` (a grid or a
Ray Tune search of one's own settings; a paper's table), each a resumable queue of ``fedsuite
simulate`` runs and its report, registered on ``fedsuite`` by ``fedsuite.cli.main``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from fedsuite.cli.options import (DATA_ROOT_OPTION, ENGINE_OPTION, LAST_OPTION, reproduce_scales, reproduce_targets,
                                  search_kinds)
from fedsuite.cli.support import SEEDS_FORMS, ManyValuesCommand, Names, fail, parse_seeds, plain_console

#: the commands of this module (``fedsuite.cli.main`` adds them to the app)
commands = typer.Typer(rich_markup_mode=None)
console = plain_console()


@commands.command(cls=ManyValuesCommand)
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


@commands.command(cls=ManyValuesCommand)
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
