"""``fedsuite reproduce``: a paper's table as one resumable, parallel queue of runs, and its report.

A *target* is one table of a paper, read from ``experiments/<paper>/tables.toml`` (or a file given
with ``--tables``): its grid (rows = settings, columns = methods; a row with ``methods = [...]``
runs only those), the config each cell runs (a ``RunConfig`` TOML plus ``--set``-style overrides,
see :func:`cell_overrides`) and the published numbers (optional: a study has none). ``fedsuite reproduce TARGET`` plans one ``fedsuite simulate`` run per (row, method, seed)
under ``--out``, checks that every dataset the runs need is on disk, then works through the queue
with ``--jobs`` simulations at once:

* a run whose ``summary.json`` says ``completed`` is skipped; a run directory that holds a
  ``config.json`` but no finished summary is continued with ``fedsuite simulate --resume`` (the run
  restarts from its last per-round checkpoint, so a killed ``reproduce`` loses at most the rounds
  that were in flight); a run that ended ``failed`` is left as it is and reported;
* each run is a ``fedsuite simulate`` child process in this process's group, started with
  ``PR_SET_PDEATHSIG`` (``fedsuite.reaper.die_with_parent``), so a killed ``reproduce`` takes its
  runs with it; Ctrl-C or SIGTERM stops each run's whole process tree (``fedsuite.launch.stop_tree``).

Runs live at ``<out>/<paper>/<scale>/<setting>/<method>-s<seed>`` (``<paper>`` is the tables
file's folder name, ``<setting>`` the row's ``setting``, default its name), so rows of different
tables that name the same setting share their runs.

The report (:func:`write_report`, also ``--report`` alone) has per cell the published value, the
obtained mean ± std (the target's reading: ``fedsuite.results.run_value``, :func:`aggregate`), their
difference (paper scale only) and, per row, each ordering the paper claims (a row's ``claims``, else read off
its published numbers) judged on the differences paired by seed: holds, within noise, reversed or
not judged (:func:`claims`, :func:`paired_verdict`); as ``report.md``, ``report.csv`` (cells) and
``claims.csv`` (orderings), plus one accuracy-versus-round figure per row (mean over seeds with a
± std band). A ``<paper>-claims`` target holds a paper's headline orderings as such rows.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from fedsuite import rundir
from fedsuite.config import ConfigError, build_config
from fedsuite.results import best_accuracy, evaluations, read_metrics, run_value

#: the tables files that ship with fedsuite: experiments/<paper>/tables.toml
EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
SCALES = ("paper", "cpu")
METRICS = ("accuracy", "rounds")


class ReproduceError(ValueError):
    """A user error (unknown target, row or method, a bad tables file, missing data); one line."""


# ------------------------------------------------------------------------------------------------
# tables files
# ------------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One row of a target's grid: a setting, and the published value of each method in it."""

    name: str
    label: str
    setting: str
    config: Path | None
    set: list[str]
    cpu_set: list[str]
    method_set: dict[str, list[str]]
    published: dict[str, tuple[float, float | None]]
    target_accuracy: float | None = None
    cpu_target_accuracy: float | None = None
    note: str = ""
    methods: list[str] | None = None  # the columns this row runs (None: every method of the target)
    cpu_method_set: dict[str, list[str]] = field(default_factory=dict)  # method_set at cpu scale only
    # the orderings the paper claims in this row, (better, worse) each; None: read them off the
    # published numbers (ours against every other method, and the target's ``compare`` pairs)
    claims: list[tuple[str, str]] | None = None


@dataclass
class Target:
    """One table of a paper (see the module docstring and experiments/*/tables.toml)."""

    name: str
    file: Path
    paper: str
    title: str
    source: str
    ours: str
    metric: str
    reading: str
    last: int
    spread: str
    seeds: list[int]
    set: list[str]
    note: str
    compare: list[tuple[str, str]]
    cpu_set: list[str]
    cpu_seeds: list[int]
    cpu_note: str
    methods: dict[str, tuple[str, list[str]]]  # name -> (label, overrides)
    rows: list[Row]

    @property
    def paper_key(self) -> str:
        """The folder name of the tables file (``fedmr`` for experiments/fedmr/tables.toml)."""
        return self.file.parent.name


def _published(value: Any, where: str) -> tuple[float, float | None]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return float(value[0]), float(value[1])
    raise ReproduceError(f"{where}: a published value is a number or [mean, std], got {value!r}")


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        raise ReproduceError(f"{where}: expected a list of 'key=value' strings, got {value!r}")
    return list(value)


def _pairs(value: Any, where: str) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not value or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(m, str) for m in p) and p[0] != p[1]
            for p in value):
        raise ReproduceError(f"{where}: expected a list of [better, worse] method pairs, got {value!r}")
    return [(p[0], p[1]) for p in value]


def parse_tables(path: Path) -> dict[str, Target]:
    """The targets of one tables file; a missing or malformed key raises :class:`ReproduceError`
    naming the file and the key. Config paths are relative to the file's folder."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ReproduceError(f"tables file {path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ReproduceError(f"tables file {path}: not UTF-8 text (TOML is UTF-8): byte {exc.start} "
                             "cannot be decoded") from None
    out: dict[str, Target] = {}
    for name, t in (data.get("targets") or {}).items():
        where = f"{path}: targets.{name}"
        try:
            cpu = t.get("cpu", {})
            methods = {m: (spec.get("label", m), _strings(spec.get("set", []), f"{where}.methods.{m}"))
                       for m, spec in t["methods"].items()}
            rows = []
            for i, r in enumerate(t["rows"]):
                rw = f"{where}.rows[{i}]"
                config = r.get("config", t.get("config"))
                rows.append(Row(
                    name=r["name"], label=r.get("label", r["name"]), setting=r.get("setting", r["name"]),
                    config=(path.parent / config) if config else None,
                    set=_strings(r.get("set", []), rw + ".set"), cpu_set=_strings(r.get("cpu_set", []), rw + ".cpu_set"),
                    method_set={m: _strings(v, f"{rw}.method_set.{m}") for m, v in r.get("method_set", {}).items()},
                    published={m: _published(v, f"{rw}.published.{m}") for m, v in r.get("published", {}).items()},
                    target_accuracy=r.get("target_accuracy"), cpu_target_accuracy=r.get("cpu_target_accuracy"),
                    note=r.get("note", ""), methods=r.get("methods"),
                    cpu_method_set={m: _strings(v, f"{rw}.cpu_method_set.{m}")
                                    for m, v in r.get("cpu_method_set", {}).items()},
                    claims=_pairs(r["claims"], rw + ".claims") if "claims" in r else None,
                ))
            target = Target(
                name=name, file=path, paper=data.get("paper", path.parent.name), title=t.get("title", name),
                source=t.get("source", ""), ours=t["ours"], metric=t.get("metric", "accuracy"),
                reading=t.get("reading", "last"), last=int(t.get("last", 1)), spread=t.get("spread", "seeds"),
                seeds=[int(s) for s in t.get("seeds", [0])], set=_strings(t.get("set", []), where + ".set"),
                note=t.get("note", ""), compare=[tuple(p) for p in t.get("compare", [])],
                cpu_set=_strings(cpu.get("set", []), where + ".cpu.set"),
                cpu_seeds=[int(s) for s in cpu.get("seeds", [0])], cpu_note=cpu.get("note", ""),
                methods=methods, rows=rows,
            )
        except KeyError as exc:
            raise ReproduceError(f"{where}: missing key {exc.args[0]!r}") from None
        if target.metric not in METRICS:
            raise ReproduceError(f"{where}.metric: {target.metric!r}; allowed: {', '.join(METRICS)}")
        if target.spread not in ("seeds", "pooled"):
            raise ReproduceError(f"{where}.spread: {target.spread!r}; allowed: seeds, pooled")
        unknown = {target.ours, *(m for p in target.compare for m in p)} - set(methods)
        unknown |= {m for r in rows for m in (*r.published, *r.method_set, *r.cpu_method_set, *(r.methods or ()),
                                              *(m for p in r.claims or () for m in p)) if m not in methods}
        if unknown:
            raise ReproduceError(f"{where}: methods {', '.join(sorted(unknown))} are not in its [methods]")
        unrun = [f"{r.name}: {m}" for r in rows if r.methods is not None
                 for m in {m for p in r.claims or () for m in p} if m not in r.methods]
        if unrun:
            raise ReproduceError(f"{where}: a claim names a method its row does not run ({', '.join(sorted(unrun))})")
        if target.metric == "rounds" and any(r.target_accuracy is None for r in rows):
            raise ReproduceError(f"{where}: metric 'rounds' needs target_accuracy on every row")
        out[name] = target
    return out


def load_targets(extra: Sequence[Path] = ()) -> dict[str, Target]:
    """Every target of experiments/*/tables.toml, then of the ``extra`` files (which may add or
    replace targets)."""
    targets: dict[str, Target] = {}
    for path in [*sorted(EXPERIMENTS.glob("*/tables.toml")), *(Path(p) for p in extra)]:
        if not path.is_file():
            raise ReproduceError(f"tables file not found: {path}")
        targets.update(parse_tables(path.resolve()))
    return targets


# ------------------------------------------------------------------------------------------------
# planning: one run per (row, method, seed)
# ------------------------------------------------------------------------------------------------


@dataclass
class RunSpec:
    """One ``fedsuite simulate`` run of the grid."""

    row: Row
    method: str
    seed: int
    run_dir: Path
    config: Path | None
    overrides: list[str]  # --set key=value, in order
    rounds: int
    dataset: tuple[str, str, str]  # (name, data_root, dataset_options as JSON)

    @property
    def label(self) -> str:
        return f"{self.row.setting} {self.method} s{self.seed}"

    def command(self, resume: bool, placement: Sequence[str] = ()) -> list[str]:
        return simulate_command(self.config, self.overrides, resume, placement)


def simulate_command(config: Path | None, overrides: Sequence[str], resume: bool,
                     placement: Sequence[str] = ()) -> list[str]:
    """The ``fedsuite simulate`` command line of a queued run (``--resume`` continues it);
    ``placement``: options that say where every run executes (:func:`placement_options`)."""
    cmd = [sys.executable, "-m", "fedsuite.cli", "simulate"]
    if config is not None:
        cmd += ["--config", str(config)]
    for item in overrides:
        cmd += ["--set", item]
    return cmd + list(placement) + (["--resume"] if resume else [])


def placement_options(num_gpus: float | None, ray_address: str | None) -> list[str]:
    """``fedsuite simulate`` options passed to every run: the GPU share per client and the Ray
    cluster. Neither changes what a run computes, so both may differ when a run is resumed."""
    return ([] if num_gpus is None else ["--num-gpus", f"{num_gpus:g}"]) + \
        ([] if ray_address is None else ["--ray-address", ray_address])


def cell_overrides(target: Target, row: Row, method: str, scale: str) -> list[str]:
    """The ``--set`` overrides of one cell, later ones winning: target.set, row.set, the method's
    set, row.method_set[method]; at ``cpu`` scale then target.cpu.set, row.cpu_set and
    row.cpu_method_set[method]."""
    items = [*target.set, *row.set, *target.methods[method][1], *row.method_set.get(method, [])]
    if scale == "cpu":
        items += [*target.cpu_set, *row.cpu_set, *row.cpu_method_set.get(method, [])]
    return items


def _pick(kind: str, asked: Sequence[str] | None, known: Sequence[str], target: str) -> list[str]:
    if not asked:
        return list(known)
    unknown = [a for a in asked if a not in known]
    if unknown:
        raise ReproduceError(f"unknown {kind} {', '.join(unknown)} in target {target}; allowed: {', '.join(known)}")
    return [k for k in known if k in asked]


def plan(target: Target, scale: str, out: Path, rows: Sequence[str] | None = None,
         methods: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
         data_root: str | None = None) -> list[RunSpec]:
    """The runs of the selected rows x methods x seeds, each config validated (a bad cell raises
    :class:`ReproduceError` naming it). Rows sharing a setting share runs (listed once)."""
    if scale not in SCALES:
        raise ReproduceError(f"unknown scale {scale!r}; allowed: {', '.join(SCALES)}")
    picked_rows = _pick("row", rows, [r.name for r in target.rows], target.name)
    picked_methods = _pick("method", methods, list(target.methods), target.name)
    seed_list = list(seeds) if seeds else (target.cpu_seeds if scale == "cpu" else target.seeds)
    specs: dict[Path, RunSpec] = {}
    # seed-major: a queue stopped part-way leaves whole seeds (every method of a row), so the
    # paired comparisons of the report (:func:`claims`) have as many pairs as the time allowed
    for seed in seed_list:
        for row in target.rows:
            if row.name not in picked_rows:
                continue
            folder = (out / target.paper_key / scale / row.setting).resolve()
            for method in picked_methods:
                if row.methods is not None and method not in row.methods:
                    continue
                run_dir = folder / f"{method}-s{seed}"
                if run_dir in specs:
                    continue
                items = cell_overrides(target, row, method, scale) + [
                    f"seed={seed}", f"output_dir={json.dumps(str(folder))}", f"run_name={json.dumps(run_dir.name)}"]
                if data_root is not None:
                    items.append(f"data_root={json.dumps(data_root)}")
                try:
                    cfg = build_config(row.config, items)
                except ConfigError as exc:
                    raise ReproduceError(f"{target.name}, row {row.name}, method {method}: "
                                         f"{str(exc).splitlines()[0]}") from None
                dataset = (cfg.dataset, cfg.data_root, json.dumps(cfg.dataset_options, sort_keys=True))
                specs[run_dir] = RunSpec(row, method, seed, run_dir, row.config, items, cfg.rounds, dataset)
    return list(specs.values())


def missing_data(specs: Sequence[RunSpec]) -> list[str]:
    """One message per dataset the runs need that is not on disk (the loader's own message: the
    missing files and the expected layout). Loaders are called with downloads off."""
    from fedsuite import registry
    from fedsuite.data import load_dataset
    problems = []
    for name, root, options in sorted({s.dataset for s in specs}):
        opts = json.loads(options)
        if "download" in inspect.signature(registry.datasets()[name]).parameters:
            opts["download"] = False
        try:
            load_dataset(name, Path(root).expanduser(), **opts)
        except Exception as exc:  # DatasetError, and the npz/imagefolder loaders' file errors
            problems.append(f"{name} (data_root {root}): {str(exc).strip()}")
    return problems


# ------------------------------------------------------------------------------------------------
# the queue
# ------------------------------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    """This environment, with this fedsuite first on PYTHONPATH (the runs import the same code)."""
    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}


def interrupt(*_: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the queue like Ctrl-C


def run_queue(specs: Sequence[RunSpec], jobs: int = 1, placement: Sequence[str] = (),
              console=None, poll_s: float = 0.5) -> dict[Path, str]:
    """Run every spec that is not completed or failed, ``jobs`` at a time, each as a ``fedsuite
    simulate`` child (``--resume`` where a partial run exists); show one progress display. A spec
    is anything with ``run_dir``, ``rounds``, ``label`` and ``command(resume, placement)`` (a
    :class:`RunSpec`; ``fedsuite sweep``'s runs). Returns
    each run directory's final state (``rundir.state``, or ``failed`` for a run whose process
    exited non-zero). Ctrl-C/SIGTERM stops every running run's process tree, then re-raises."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from fedsuite import launch, reaper

    console = console or Console()
    states = {s.run_dir: rundir.state(s.run_dir) for s in specs}
    todo = [s for s in specs if states[s.run_dir] in ("new", "partial", "debris")]
    done_at_start = {s.run_dir: (s.rounds if states[s.run_dir] == "completed" else
                                 rundir.rounds_done(s.run_dir) if states[s.run_dir] == "partial" else 0) for s in specs}
    progress = dict(done_at_start)
    running: dict[subprocess.Popen, tuple[RunSpec, Any]] = {}
    started = time.monotonic()
    total_rounds = sum(s.rounds for s in specs)

    def display() -> Table:
        finished = sum(1 for s in specs if states[s.run_dir] in ("completed", "failed"))
        gained = sum(progress.values()) - sum(done_at_start.values())
        left = total_rounds - sum(progress.values())
        elapsed = time.monotonic() - started
        eta = f"{left * elapsed / gained / 60:.0f} min" if gained > 0 else "-"
        table = Table.grid(padding=(0, 2))
        table.add_row(f"[bold]runs {finished}/{len(specs)} done[/], {len(running)} running, "
                      f"{len(todo)} queued; rounds {sum(progress.values())}/{total_rounds}; "
                      f"elapsed {elapsed / 60:.1f} min, ETA {eta}")
        for spec, _ in running.values():
            table.add_row(f"  {spec.label}: round {progress[spec.run_dir]}/{spec.rounds}")
        return table

    def start(spec: RunSpec) -> None:
        state = states[spec.run_dir]
        spec.run_dir.parent.mkdir(parents=True, exist_ok=True)
        log = (spec.run_dir.parent / f"{spec.run_dir.name}.log").open("ab")
        proc = subprocess.Popen(spec.command(resume=state == "partial", placement=placement), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=_child_env(),
                                preexec_fn=reaper.die_with_parent())
        states[spec.run_dir] = "running"
        running[proc] = (spec, log)
        console.print(f"{'resume' if state == 'partial' else 'start '} {spec.label} -> {spec.run_dir}",
                      highlight=False)

    try:
        with Live(display(), console=console, refresh_per_second=2, transient=True) as live:
            while todo or running:
                while todo and len(running) < jobs:
                    start(todo.pop(0))
                for proc in list(running):
                    spec, log = running[proc]
                    progress[spec.run_dir] = max(progress[spec.run_dir], rundir.rounds_done(spec.run_dir))
                    if proc.poll() is None:
                        continue
                    log.close()
                    del running[proc]
                    state = rundir.state(spec.run_dir)
                    states[spec.run_dir] = state if proc.returncode == 0 or state == "failed" else "failed"
                    if states[spec.run_dir] == "completed":
                        progress[spec.run_dir] = spec.rounds
                    console.print(f"{states[spec.run_dir]:9s} {spec.label} (exit {proc.returncode}"
                                  f"{'' if proc.returncode == 0 else f'; log {spec.run_dir}.log'})", highlight=False)
                live.update(display())
                time.sleep(poll_s)
    except BaseException:
        for proc, (spec, log) in running.items():
            launch.stop_tree(proc)
            log.close()
        raise
    return {s.run_dir: states[s.run_dir] for s in specs}


# ------------------------------------------------------------------------------------------------
# the report: pure maths first
# ------------------------------------------------------------------------------------------------


def aggregate(values: Sequence[float], tails: Sequence[Sequence[float]] = (), metric: str = "accuracy",
              spread: str = "seeds") -> tuple[float | None, float | None]:
    """(mean, std) of a cell over its seeds' run values. ``accuracy``: the mean of the values; the
    std over the seeds (``spread="seeds"``, population std, None with fewer than 2 seeds) or over
    all seeds' last evaluations pooled (``spread="pooled"``, the paper's ± of FedMR and FedNLR).
    ``rounds``: mean and std over the seeds that reached the target; ``inf`` if none did."""
    if not values:
        return None, None
    if metric == "rounds":
        reached = [v for v in values if math.isfinite(v)]
        if not reached:
            return math.inf, None
        return float(np.mean(reached)), (float(np.std(reached)) if len(reached) > 1 else None)
    mean = float(np.mean(values))
    if spread == "pooled":
        pooled = [v for tail in tails for v in tail]
        return mean, (float(np.std(pooled)) if len(pooled) > 1 else None)
    return mean, (float(np.std(values)) if len(values) > 1 else None)


#: how the report states the rule (:func:`paired_verdict`)
VERDICT_RULE = (
    "Verdict of each ordering the paper claims: the difference of the reading between the two methods is "
    "taken per seed (a seed fixes the partition, the cohorts and the initial model) over the seeds where both "
    "runs completed; **holds** if its mean exceeds two standard errors (sample sd / √n) in the paper's "
    "direction, **reversed** if it does so in the other direction, **within noise** otherwise; **not judged** "
    "with fewer than two paired seeds. A run that failed is left out and named under its row.")

#: the verdicts of one claimed ordering (:func:`paired_verdict`)
HOLDS, WITHIN_NOISE, REVERSED, NOT_JUDGED = "holds", "within noise", "reversed", "not judged"
VERDICTS = (HOLDS, WITHIN_NOISE, REVERSED, NOT_JUDGED)


def paired_verdict(differences: Sequence[float]) -> tuple[float | None, float | None, str]:
    """(mean, standard error, verdict) of a claimed ordering from its per-seed differences
    d_s = v_better(s) − v_worse(s), signed so that d_s > 0 agrees with the paper:

        d̄ = (1/n) Σ_s d_s,   SE = sd(d) / √n  with sd the sample standard deviation (n − 1),

    and the verdict ``holds`` if d̄ > 2·SE, ``reversed`` if d̄ < −2·SE, ``within noise`` otherwise.
    With fewer than two paired seeds there is no standard error: ``not judged`` (d̄ is still given
    for one seed). A seed fixes the partition, the cohorts and the initial model, so pairing by seed
    removes the part of the spread that both methods share."""
    d = np.asarray(list(differences), dtype=float)
    if d.size == 0:
        return None, None, NOT_JUDGED
    mean = float(d.mean())
    if d.size < 2:
        return mean, None, NOT_JUDGED
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    return mean, se, HOLDS if mean > 2 * se else REVERSED if mean < -2 * se else WITHIN_NOISE


@dataclass
class Claim:
    """One ordering the paper claims: ``better`` beat ``worse``. ``differences``: per seed where both
    runs completed, better's value minus worse's in the direction the paper calls better (in %
    points, or rounds saved for a rounds-to-target table)."""

    better: str
    worse: str
    differences: dict[int, float] = field(default_factory=dict)

    @property
    def result(self) -> tuple[float | None, float | None, str]:
        """(mean difference, standard error, verdict): :func:`paired_verdict`."""
        return paired_verdict([self.differences[s] for s in sorted(self.differences)])

    @property
    def verdict(self) -> str:
        return self.result[2]


def claims(published: dict[str, float], obtained: dict[str, dict[int, float]], pairs: Sequence[tuple[str, str]],
           higher_is_better: bool = True, stated: Sequence[tuple[str, str]] | None = None) -> list[Claim]:
    """The orderings to judge and their per-seed differences. ``obtained``: method -> {seed: run
    value} of the completed runs. The orderings are ``stated`` ((better, worse) pairs, as a claims
    row names them) or, when None, read off the published numbers: for each pair (a, b) with both
    published and not tied there, "a beats b" or "b beats a" as the paper has it. A run value of
    ``inf`` (never reached a rounds target) is the caller's to censor before."""
    sign = 1 if higher_is_better else -1
    if stated is None:
        stated = []
        for a, b in pairs:
            if a in published and b in published and published[a] != published[b]:
                stated.append((a, b) if sign * (published[a] - published[b]) > 0 else (b, a))
    out = []
    for better, worse in stated:
        vb, vw = obtained.get(better, {}), obtained.get(worse, {})
        out.append(Claim(better, worse, {s: sign * (vb[s] - vw[s]) for s in sorted(vb) if s in vw}))
    return out


def verdict(row_claims: Sequence[Claim]) -> str:
    """A row's claims in one phrase: how many got each verdict (``2 hold, 1 within noise``), or
    ``no claim``."""
    if not row_claims:
        return "no claim"
    counts = {v: sum(1 for c in row_claims if c.verdict == v) for v in VERDICTS}
    return ", ".join(f"{n} {'hold' if v == HOLDS and n > 1 else v}" for v, n in counts.items() if n)


# ------------------------------------------------------------------------------------------------
# the report: files
# ------------------------------------------------------------------------------------------------


def _fmt(value: float | None, std: float | None = None, metric: str = "accuracy") -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "∞"
    text = f"{value:.0f}" if metric == "rounds" else f"{value:.2f}"
    return text + (f" ± {std:.2f}" if std is not None else "")


def collect(target: Target, specs: Sequence[RunSpec], scale: str) -> list[dict[str, Any]]:
    """Per row: its cells (published, obtained mean ± std over the completed seeds, best accuracy,
    difference at paper scale), its claims and verdict, and the curves of its completed runs."""
    rows = []
    for row in target.rows:
        mine = [s for s in specs if s.row.setting == row.setting]
        if not mine:
            continue
        methods = [m for m in target.methods if any(s.method == m for s in mine)]
        acc = row.cpu_target_accuracy if scale == "cpu" else row.target_accuracy
        cells, curves, by_seed = {}, {}, {}
        for m in methods:
            runs = [s for s in mine if s.method == m]
            values, tails, bests, seed_rows = [], [], [], []
            by_seed[m] = {}
            for s in runs:
                if rundir.state(s.run_dir) != "completed":
                    continue
                metrics = read_metrics(s.run_dir)
                evals = evaluations(metrics)
                if not evals:
                    continue
                value, tail = run_value(evals, target.metric, target.last, acc)
                values.append(value)
                tails.append(tail)
                bests.append(100 * best_accuracy(evals))
                seed_rows.append(metrics)
                # a run that never reached a rounds target counts as reaching it one round after
                # its end (a lower bound), so that the paired difference stays finite
                by_seed[m][s.seed] = min(value, s.rounds + 1.0) if target.metric == "rounds" else value
            mean, std = aggregate(values, tails, target.metric, target.spread)
            pub = row.published.get(m)
            diff = (mean - pub[0] if scale == "paper" and pub and mean is not None
                    and math.isfinite(mean) and math.isfinite(pub[0]) else None)
            cells[m] = {"method": m, "label": target.methods[m][0], "published": pub, "mean": mean, "std": std,
                        "seeds": len(values), "planned": len(runs),
                        "best": float(np.mean(bests)) if bests else None, "diff": diff}
            if seed_rows:
                curves[f"{target.methods[m][0]}"] = seed_rows
        pairs = [(target.ours, m) for m in methods if m != target.ours] + \
                [p for p in target.compare if p[0] in methods and p[1] in methods]
        row_claims = claims({m: v[0] for m, v in row.published.items() if m in methods}, by_seed, pairs,
                            higher_is_better=target.metric == "accuracy", stated=row.claims)
        rows.append({"row": row, "cells": cells, "claims": row_claims, "verdict": verdict(row_claims),
                     "curves": curves, "target_accuracy": acc})
    return rows


def write_report(target: Target, specs: Sequence[RunSpec], scale: str, folder: Path) -> Path:
    """Write ``report.md``, ``report.csv`` (one line per cell), ``claims.csv`` (one line per claimed
    ordering: its paired differences and verdict) and ``<row>.png`` (accuracy vs round, band over
    seeds) into ``folder``; returns the Markdown path."""
    from fedsuite.results import plot_groups

    folder.mkdir(parents=True, exist_ok=True)
    data = collect(target, specs, scale)
    unit = "rounds to target" if target.metric == "rounds" else "test accuracy (%)"
    md = [f"# {target.name}: {target.title}", "",
          f"{target.paper}. Published numbers: {target.source}. Scale: **{scale}**.", ""]
    if scale == "cpu":
        md += [f"**CPU scale: obtained numbers are not the paper's setting and are compared on orderings only "
               f"(difference: n/a).** {target.cpu_note}", ""]
    md += [f"Reading: {target.note}" if target.note else "", "",
           f"Obtained = mean ± std over the completed seeds of each run's "
           + ("first round reaching the row's target (∞: never)" if target.metric == "rounds" else
              f"mean of its last {target.last} evaluations (std: "
              + ("pooled over those evaluations of all seeds" if target.spread == "pooled" else "over seeds")
              + ")") + "; best = mean over seeds of each run's best evaluation.", "",
          VERDICT_RULE, "",
          "| row | " + " | ".join(VERDICTS) + " |", "|---|" + "---|" * len(VERDICTS)]
    for d in data:
        md.append(f"| {d['row'].label} | " + " | ".join(
            str(sum(1 for c in d["claims"] if c.verdict == v)) for v in VERDICTS) + " |")
    csv_rows, claim_rows = [], []
    unit_short = "rounds" if target.metric == "rounds" else "points"
    for d in data:
        row = d["row"]
        md += ["", f"## {row.label}" + (f" (target {d['target_accuracy']:g}%)" if d["target_accuracy"] else ""), ""]
        if row.note:
            md += [row.note, ""]
        md += [f"| method | published | obtained ({unit}) | seeds | best acc (%) | difference |", "|---|---|---|---|---|---|"]
        for m, c in d["cells"].items():
            pub = c["published"]
            diff = "n/a (cpu scale)" if scale == "cpu" else ("-" if c["diff"] is None else f"{c['diff']:+.2f}")
            md.append(f"| {c['label']} | {_fmt(*pub, target.metric) if pub else '-'} | "
                      f"{_fmt(c['mean'], c['std'], target.metric)} | {c['seeds']}/{c['planned']} | "
                      f"{_fmt(c['best'])} | {diff} |")
            csv_rows.append({
                "target": target.name, "scale": scale, "row": row.name, "method": m,
                "published_mean": pub[0] if pub else "", "published_std": pub[1] if pub and pub[1] is not None else "",
                "obtained_mean": "" if c["mean"] is None else c["mean"], "obtained_std": "" if c["std"] is None else c["std"],
                "seeds_completed": c["seeds"], "seeds_planned": c["planned"], "best_mean": "" if c["best"] is None else c["best"],
                "difference": "n/a" if scale == "cpu" else ("" if c["diff"] is None else c["diff"]),
                "row_verdict": d["verdict"]})
        md += ["", f"Orderings the paper claims, paired by seed (difference = the first method's value minus the "
               f"second's, in {unit_short}, positive where the paper says):", ""]
        if d["claims"]:
            md += ["| ordering | seeds paired | mean difference | standard error | verdict |", "|---|---|---|---|---|"]
        for c in d["claims"]:
            mean, se, word = c.result
            label = f"{target.methods[c.better][0]} > {target.methods[c.worse][0]}"
            md.append(f"| {label} | {len(c.differences)} | {'-' if mean is None else f'{mean:+.2f}'} | "
                      f"{'-' if se is None else f'{se:.2f}'} | **{word}** |")
            claim_rows.append({"target": target.name, "scale": scale, "row": row.name, "better": c.better,
                               "worse": c.worse, "seeds_paired": len(c.differences),
                               "seeds": " ".join(str(s) for s in sorted(c.differences)),
                               "differences": " ".join(f"{c.differences[s]:.4f}" for s in sorted(c.differences)),
                               "mean_difference": "" if mean is None else mean,
                               "standard_error": "" if se is None else se, "verdict": word})
        md += ["", f"**Row: {d['verdict']}.**"]
        incomplete = [rundir.why_incomplete(sp.run_dir, f"{sp.method} seed {sp.seed}") for sp in specs
                      if sp.row.setting == row.setting and rundir.state(sp.run_dir) != "completed"]
        if incomplete:
            md += ["", "Runs that did not complete (not in the numbers above):", "",
                   *[f"- {line}" for line in incomplete]]
        if d["curves"]:
            png = folder / f"{row.name}.png"
            plot_groups(d["curves"], png, title=f"{row.label} ({scale} scale)")
            md += ["", f"![{row.label}]({png.name})"]
    (folder / "report.md").write_text("\n".join(md) + "\n")
    with (folder / "report.csv").open("w", newline="") as fh:
        fields = ["target", "scale", "row", "method", "published_mean", "published_std", "obtained_mean", "obtained_std",
                  "seeds_completed", "seeds_planned", "best_mean", "difference", "row_verdict"]
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(csv_rows)
    with (folder / "claims.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["target", "scale", "row", "better", "worse", "seeds_paired", "seeds",
                                                "differences", "mean_difference", "standard_error", "verdict"])
        writer.writeheader()
        writer.writerows(claim_rows)
    return folder / "report.md"


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2
        raise ReproduceError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fedsuite reproduce", description=(
        "Reproduce a paper's table: run its grid (rows x methods x seeds) as a resumable queue of "
        "`fedsuite simulate` runs and report obtained beside published. `fedsuite reproduce list` "
        "shows the targets."))
    p.add_argument("target", help="a target name (see `fedsuite reproduce list`), or `list`")
    p.add_argument("--rows", nargs="+", help="only these rows (names as in `list`)")
    p.add_argument("--methods", nargs="+", help="only these methods (columns)")
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the target's, per scale)")
    p.add_argument("--scale", choices=SCALES, default="paper",
                   help="paper: the paper's settings; cpu: the target's CPU-sized variant (orderings only)")
    p.add_argument("--jobs", type=int, default=1, help="simulations at once (default 1)")
    p.add_argument("--out", type=Path, default=Path("runs/reproduce"), help="folder for runs and reports")
    p.add_argument("--data-root", help="data_root of every run (where the datasets are)")
    p.add_argument("--num-gpus", type=float, help="GPU share per simulated client, passed to every run")
    p.add_argument("--ray-address", help="run every simulation's clients on this Ray cluster (host:port, auto)")
    p.add_argument("--tables", type=Path, action="append", default=[], help="another tables file (repeatable)")
    p.add_argument("--report", action="store_true", help="only write the report from the runs on disk")
    return p


def main(argv: Sequence[str]) -> int:
    """``fedsuite reproduce ...``; returns the exit code (0 all runs completed, 1 a run failed,
    2 a user error, 130 interrupted)."""
    from rich.console import Console

    console, err = Console(), Console(stderr=True)
    try:
        args = parser().parse_args(list(argv))
        if args.jobs < 1:
            raise ReproduceError(f"--jobs must be at least 1, got {args.jobs}")
        problem = rundir.folder_problem(args.out)
        if problem is not None:
            raise ReproduceError(f"--out: {problem}")
        targets = load_targets(args.tables)
        if args.target == "list":
            print_targets(targets, console)
            return 0
        if args.target not in targets:
            raise ReproduceError(f"unknown target {args.target!r}; allowed: {', '.join(sorted(targets))}")
        target = targets[args.target]
        specs = plan(target, args.scale, args.out, args.rows, args.methods, args.seeds, args.data_root)
        report_dir = (args.out / target.paper_key / args.scale / target.name).resolve()
        if args.report:
            path = write_report(target, specs, args.scale, report_dir)
            console.print(f"report -> {path}")
            return 0
        todo = pending(specs)
    except ReproduceError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    console.print(f"[bold]{target.name}[/] ({args.scale} scale): {len(specs)} runs, "
                  f"{len(specs) - len(todo)} already done, {args.jobs} at a time -> {report_dir.parent}")
    return queue_and_report(specs, args.jobs, placement_options(args.num_gpus, args.ray_address), console,
                            lambda: write_report(target, specs, args.scale, report_dir))


def pending(specs: Sequence[RunSpec]) -> list[RunSpec]:
    """The runs still to run (neither completed nor failed), once every dataset they need is on disk;
    else :class:`ReproduceError` listing what is missing and the expected layout, nothing started."""
    todo = [s for s in specs if rundir.state(s.run_dir) not in ("completed", "failed")]
    problems = missing_data(todo)
    if problems:
        raise ReproduceError("missing data, nothing was started:\n  " + "\n  ".join(problems))
    return todo


def queue_and_report(specs: Sequence[RunSpec], jobs: int, placement: Sequence[str], console,
                     report: Callable[[], Path]) -> int:
    """:func:`run_queue`, stopped like Ctrl-C by SIGTERM, then ``report()``. Returns the exit code:
    0 every run completed, 1 a run did not (its log lies beside it), 130 interrupted."""
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        states = run_queue(specs, jobs, placement, console)
    except KeyboardInterrupt:
        console.print("interrupted: running runs stopped; the same command continues where it stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    path = report()
    failed = [p for p, s in states.items() if s != "completed"]
    console.print(f"report -> {path}" + (f"; {len(failed)} run(s) did not complete (logs beside them)" if failed else ""))
    return 1 if failed else 0


def print_targets(targets: dict[str, Target], console) -> None:
    """One block per target: name, title, grid size, and its row names (for --rows)."""
    for name, t in sorted(targets.items()):
        console.print(f"[bold]{name}[/]  {t.title}  ({len(t.rows)} rows x {len(t.methods)} methods; "
                      f"{t.file.parent.name}/{t.file.name})", highlight=False, soft_wrap=True)
        console.print("  methods: " + " ".join(t.methods), highlight=False, soft_wrap=True)
        console.print("  rows: " + " ".join(r.name for r in t.rows), highlight=False, soft_wrap=True)
