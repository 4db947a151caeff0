"""Run directories read back: metrics rows, a run's reading, and ``fedsuite report`` over many runs
(the ServerApp writes them: ``fedsuite.records.recording``; figures: ``fedsuite.records.plots``).

A run directory holds::

    config.json      the resolved config
    metrics.jsonl    one line per round: round, test_accuracy, test_loss, train_loss, wall_seconds,
                     bytes_sent, bytes_received, cohort, dropped (partition ids), failed (their
                     count), failure_reasons ({partition id: reason}) (+ method metrics, and
                     the cohort mean of each activity measure of the run's components:
                     ``fedsuite.method.activity``; with ``federated_eval``, the clients' accuracies:
                     ``fedsuite.method.client_records.FEDERATED_COLUMNS``)
    clients.jsonl    one line per client and round it took part in: its training reply and its own
                     evaluation (``fedsuite.method.client_records.CLIENT_FIELDS``)
    summary.json     final/best accuracy, rounds, total time, status, failed_replies and
                     rounds_with_failures (totals), failure (round, partition ids, first error)
                     when the run stopped on too many failed replies, provenance (what produced
                     the run, one entry per start: code, commit, packages, hardware; see
                     ``fedsuite.records.provenance``; not in config.json, which is the run's settings),
                     activity (per distinguishing component the run uses: its measure's name,
                     mean over rounds, last value and inert threshold; ``fedsuite.method.activity``)
    checkpoint.pt    global arrays + strategy state + round (rewritten atomically every round)
    events.out.tfevents.*  the same metrics for TensorBoard (``tensorboard=true``, the default where
                     the package is installed; ``fedsuite.records.recording.TensorBoardLog``)
    accuracy.png     test accuracy versus round
    clients.png      the clients' own test accuracies versus round (``federated_eval``)
    diagnostics.png  pool diagnostics versus round (pool methods with ``<method>.diagnostics = true``,
                     see ``fedsuite.records.plots.plot_pool_diagnostics``)
"""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from fedsuite.records import integrity
from fedsuite.config import RESUME_MUTABLE, flat_config
from fedsuite.errors import ResultsError
from fedsuite.records.plots import (has_pool_diagnostics, has_server_momentum, plot_groups, plot_pool_diagnostics,
                            plot_server_momentum)
from fedsuite.records.provenance import report_lines, run_summaries
from fedsuite.records.rows import read_metrics


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a fresh file beside ``path`` (same suffix), then rename it over ``path``:
    a reader, or another process writing the same file, sees the old file or a whole new one, never
    a half-written one; if ``write`` raises, ``path`` is untouched and the temporary file removed."""
    # a name of this process and thread alone, created by ``write`` itself (so with the umask's
    # permissions, not mkstemp's 0600: results are read by other users and containers)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{threading.get_ident()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, data: Any) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n"))


def evaluations(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """``(round, test accuracy in [0, 1])`` of each evaluated round of ``metrics.jsonl`` rows, round 0
    (the initial model) left out: what a run's reading (:func:`run_value`) is taken from, in
    ``reproduce``'s, ``sweep``'s and a search's reports alike."""
    return [(r["round"], r["test_accuracy"]) for r in rows if r["round"] > 0 and r.get("test_accuracy") is not None]


def last_accuracies(evals: Sequence[tuple[int, float]], last: int) -> list[float]:
    """The accuracies of a run's last ``last`` evaluations ``(round, accuracy)``: its final reading's."""
    return [acc for _, acc in evals[-last:]]


def best_accuracy(evals: Sequence[tuple[int, float]]) -> float:
    """A run's best accuracy over its evaluations ``(round, accuracy)``."""
    return max(acc for _, acc in evals)


def run_value(evals: Sequence[tuple[int, float]], metric: str, last: int = 1,
              target_accuracy: float | None = None) -> tuple[float, list[float]]:
    """One run's value from its evaluations ``(round, accuracy in [0, 1])`` (:func:`evaluations`),
    in the units of a reproduce table, a sweep's or a search's report. ``accuracy``: the mean of the
    last ``last`` accuracies in %, and those accuracies (in %); ``rounds``: the first round whose
    accuracy in % reaches ``target_accuracy`` (``inf`` if none)."""
    if metric == "rounds":
        hit = next((rnd for rnd, acc in evals if 100 * acc >= target_accuracy - 1e-9), None)
        return (math.inf if hit is None else float(hit)), []
    tail = [100 * acc for acc in last_accuracies(evals, last)]
    if not tail:
        raise ValueError("a run without evaluations has no value")
    return float(np.mean(tail)), tail


#: the federated-evaluation readings of every report (``federated_eval``: the columns of
#: ``fedsuite.method.client_records.FEDERATED_COLUMNS`` a report shows), column -> the report's label
CLIENT_READINGS = {
    "client_accuracy_mean": "client mean (%)",
    "client_accuracy_weighted": "client weighted (%)",
    "client_accuracy_std": "client std, ddof=1 (%)",
    "client_accuracy_worst10": "worst 10% (%)",
    "personal_accuracy_mean": "personalised mean (%)",
    "personal_accuracy_worst10": "personalised worst 10% (%)",
}


def client_readings(rows: list[dict[str, Any]], last: int) -> dict[str, float]:
    """A run's federated-evaluation readings, read as its accuracy is (:func:`run_value`): per column
    of :data:`CLIENT_READINGS` its ``metrics.jsonl`` rows hold, the mean of its last ``last`` values
    (round 0 left out), in %; {} for a run without federated evaluation."""
    out = {}
    for column in CLIENT_READINGS:
        values = [r[column] for r in rows if r["round"] > 0 and r.get(column) is not None]
        if values:
            out[column] = float(np.mean([100 * v for v in values[-last:]]))
    return out


def reading_columns(readings: Iterable[dict[str, float]]) -> list[str]:
    """The :data:`CLIENT_READINGS` columns that any of ``readings`` holds, in that order: a report's extra columns."""
    held = set().union(*readings)
    return [c for c in CLIENT_READINGS if c in held]


# ------------------------------------------------------------------------------------------------
# fedsuite report
# ------------------------------------------------------------------------------------------------


def load_run(run_dir: Path) -> dict[str, Any]:
    """A run folder's ``config.json``, ``metrics.jsonl`` rows and ``summary.json`` ({} without one),
    as ``fedsuite report`` and ``fedsuite.load_run`` read it. Each file is checked as it is read
    (``fedsuite.records.rundir``: not a link, a folder or unreadable; decodable; one metrics row per round
    from round 0, in order; a summary whose rounds are the metrics'): a damaged one is a
    :class:`~fedsuite.errors.RecordError` (a :class:`ResultsError`) naming it, in one line."""
    config_path = run_dir / "config.json"
    if not os.path.lexists(config_path):
        raise ResultsError(f"{run_dir} is not a fedsuite run directory (no config.json)")
    integrity.record_file(config_path)
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise integrity.damaged(None, f"{config_path} cannot be read ({exc.strerror})", integrity.READ_REMEDY) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ResultsError(f"{config_path} is not valid JSON ({exc})") from None
    needed = ("strategy", "model", "dataset", "partitioner")
    missing = [k for k in needed if not isinstance(config, dict) or k not in config]
    if missing:
        raise ResultsError(f"{config_path} is not a fedsuite run config: it lacks {', '.join(missing)}")
    summary = integrity.recorded_summary(run_dir)
    rows = integrity.recorded_rows(run_dir) or []
    if summary is not None:
        problem = integrity.summary_mismatch(run_dir, summary, rows[-1]["round"] if rows else -1,
                                          run_dir / "metrics.jsonl")
        if problem is not None:
            raise integrity.damaged(None, problem, integrity.READ_REMEDY)
    return {"dir": run_dir, "config": config, "rows": rows, "summary": summary or {}}


def run_dirs(root: Path) -> list[Path]:
    """The run folders at or under ``root`` (those holding ``config.json``), sorted; a run's own
    folders (``app``, ``client-state``, ...) and hidden folders are not searched. A ``config.json``
    that is there but is not a file (a folder, a dangling link) still marks a run: reading it names
    the damage (:func:`load_run`)."""
    if os.path.lexists(root / "config.json"):
        return [root]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if "config.json" in filenames or "config.json" in dirnames:
            found.append(Path(dirpath))
            dirnames.clear()
        else:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
    return sorted(found)


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """The runs ``fedsuite report`` reads from the paths it is given: each path that is a run, and
    every run under each path that is a folder of runs (a sweep's folder, a reproduce output,
    ``runs/``: searched at any depth, as ``fedsuite.load_runs`` searches, :func:`run_dirs`), each
    once, in the order found. A path that is neither (missing, or a folder without a run) is a
    :class:`ResultsError` naming every such path."""
    found: list[Path] = []
    empty = []
    for path in paths:
        runs = run_dirs(path) if path.is_dir() or os.path.lexists(path / "config.json") else []
        if not runs:
            empty.append(str(path))
        found += [run for run in runs if run not in found]
    if empty:
        raise ResultsError(f"no fedsuite runs at or under {', '.join(empty)} (a run's folder holds config.json)")
    return found


#: config keys that do not define a setting: runs differing only in these are seeds of one setting
NOT_SETTING = ("seed", *(key for key in RESUME_MUTABLE if key != "rounds"))


def group_label(config: dict[str, Any]) -> str:
    """The base label of a setting: method, model, dataset and partition."""
    label = f"{config['strategy']} {config['model']} {config['dataset']} {config['partitioner']}"
    if config["partitioner"].startswith("dirichlet"):
        label += f"({config['alpha']:g})"
    return label


def setting(config: dict[str, Any]) -> dict[str, Any]:
    """A run's setting: its config as dotted keys (``fedprox.mu``), less :data:`NOT_SETTING`."""
    return {k: v for k, v in flat_config(config).items() if k not in NOT_SETTING}


def varying_keys(settings: Iterable[dict[str, Any]]) -> list[str]:
    """The keys whose value differs between ``settings`` (:func:`setting`), sorted: a key only some
    settings hold (a method's own section) counts when it differs among those that hold it."""
    settings = list(settings)
    return sorted({k for s in settings for k in s if len({repr(t[k]) for t in settings if k in t}) > 1})


def group_runs(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Group runs whose configs are equal up to :data:`NOT_SETTING`; label each group by
    :func:`group_label` plus every other key whose value varies between groups (``relaxed_init.beta=0.1``)."""
    keyed: dict[str, list[dict[str, Any]]] = {}
    flats: dict[str, dict[str, Any]] = {}
    for run in runs:
        flat = setting(run["config"])
        key = repr(sorted(flat.items(), key=lambda kv: kv[0]))
        keyed.setdefault(key, []).append(run)
        flats[key] = flat
    shown = {"strategy", "model", "dataset", "partitioner", "alpha"}
    varying = [k for k in varying_keys(flats.values()) if k not in shown]
    groups: dict[str, list[dict[str, Any]]] = {}
    for key, members in keyed.items():
        flat = flats[key]
        extra = [f"{k}={flat[k]}" for k in varying if k in flat]
        label = " ".join([group_label(members[0]["config"]), *extra])
        groups[label] = members
    return groups


def report(run_dirs: Iterable[Path], target: float | None = None, last: int = 10) -> tuple[list[dict[str, Any]], dict]:
    """One row per group of seeds: final accuracy mean ± sample std (n − 1) (each run's reading: the mean of its
    last ``last`` evaluations, all of them if it has fewer; round 0, the initial model, is none:
    :func:`evaluations`, as every report reads a run; ``final_std`` the sample standard deviation
    of the readings over seeds, ddof = 1, None with one seed), best accuracy, rounds to ``target`` accuracy
    (mean over the runs that reach it), the group's :func:`momentum_loop_limit` (None where it has
    none) and, for runs with federated evaluation, the mean over seeds of their
    :func:`client_readings`. ``last``'s default is ``fedsuite report``'s and ``sweep``'s."""
    groups = group_runs([load_run(Path(d)) for d in run_dirs])
    table = []
    curves: dict[str, list[list[dict[str, Any]]]] = {}
    for label, runs in groups.items():
        finals, bests, hits, readings = [], [], [], []
        for run in runs:
            accs = evaluations(run["rows"])
            if not accs:
                continue
            readings.append(client_readings(run["rows"], last))
            finals.append(float(np.mean(last_accuracies(accs, last))))
            bests.append(best_accuracy(accs))
            if target is not None:
                hit = next((rnd for rnd, a in accs if a >= target), None)
                hits.append(hit)
        reached = [h for h in hits if h is not None]
        table.append({
            "group": label,
            "seeds": len(finals),
            "final_mean": float(np.mean(finals)) if finals else None,
            "final_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else None,
            "best_mean": float(np.mean(bests)) if bests else None,
            "rounds_to_target": float(np.mean(reached)) if reached else None,
            "reached": f"{len(reached)}/{len(hits)}" if target is not None else "",
            "momentum_loop_limit": momentum_loop_limit(runs[0]["config"]),
            # federated evaluation: the mean over seeds of each run's reading (client_readings), in %
            **{c: float(np.mean([r[c] for r in readings if c in r])) for c in reading_columns(readings)},
        })
        curves[label] = [run["rows"] for run in runs]
    return table, curves


def reading_text(last: int) -> str:
    """What :func:`report_table`'s final accuracy is, said under the table: each run's reading and
    the spread over seeds (``fedsuite simulate`` prints a run's last evaluation alone)."""
    return (f"final acc: each run's mean of its last {last} evaluations (all of them for a run with fewer; "
            f"fedsuite simulate's \"final accuracy\" is the last one alone: --last 1), then the mean over the "
            f"setting's seeds ± their sample std (ddof = 1); one seed has no spread")


def report_table(rows: list[dict[str, Any]], target: float | None,
                 last: int = 10) -> tuple[list[str], list[list[str]]]:
    """:func:`report`'s rows as a table: (headers, one list of cells per setting); ``target`` in %.
    The final accuracy's header names the reading (:func:`reading_text`); a setting of one seed
    shows its mean alone (no "± 0.00")."""
    extra = reading_columns(rows)  # federated evaluation's readings, where runs have them
    headers = ["setting", "seeds", f"final acc (%): mean of last {last} evaluations ± sample std", "best acc (%)"]
    headers += [f"rounds to {target:g}%"] if target else []
    headers += [CLIENT_READINGS[c] for c in extra]
    table = []
    for r in rows:
        final = "-" if r["final_mean"] is None else f"{100 * r['final_mean']:.2f}"
        if r["final_mean"] is not None and r["final_std"] is not None:
            final += f" ± {100 * r['final_std']:.2f}"
        cells = [r["group"], str(r["seeds"]), final, f"{100 * r['best_mean']:.2f}" if r["best_mean"] is not None else "-"]
        if target:
            cells.append(f"{r['rounds_to_target']:.0f} ({r['reached']})" if r["rounds_to_target"] else f"∞ ({r['reached']})")
        cells += [f"{r[c]:.2f}" if c in r else "-" for c in extra]
        table.append(cells)
    return headers, table


def provenance_lines(run_dirs: Iterable[Path]) -> list[str]:
    """What produced the runs (``fedsuite.records.provenance.report_lines`` of their summaries)."""
    return report_lines(run_summaries(run_dirs))


def momentum_loop_limit(config: dict[str, Any]) -> float | None:
    """1/(1−α) for a run (its ``config.json``) whose server momentum is built from the normalised
    update (``normalize = true``, ``momentum_source = "normalized"``): a round's momentum is then
    about d_t (α ḡ + (1−α) m^t), which grows while d_t > 1/(1−α)
    (:func:`fedsuite.records.plots.plot_server_momentum`); None for any other run."""
    own = config.get(config.get("strategy", ""))
    alpha = own.get("alpha") if isinstance(own, dict) else None
    if (isinstance(alpha, (int, float)) and 0 < alpha < 1 and own.get("normalize") is True
            and own.get("momentum_source") == "normalized"):
        return 1.0 / (1.0 - alpha)
    return None


def write_report(out: Path, run_dirs: list[Path], rows: list[dict[str, Any]], curves: dict,
                 headers: list[str], cells: list[list[str]], reading: str = "") -> list[Path]:
    """``fedsuite report``'s files in ``out``: report.md (the table, ``reading`` under it, then the code and hardware
    that produced the runs: :func:`provenance_lines`), report.json (:func:`report`'s rows),
    accuracy.png, momentum.png where runs record a server momentum (FedCM, MoFedSAM, FedMRUR:
    :func:`fedsuite.records.plots.plot_server_momentum`), and diagnostics-<run>.png for each run with pool
    diagnostics. Returns the figures written."""
    out.mkdir(parents=True, exist_ok=True)
    md = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    md += ["| " + " | ".join(row) + " |" for row in cells]
    md += ["", *([reading, ""] if reading else []), *provenance_lines(run_dirs)]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "report.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot_groups(curves, out / "accuracy.png")
    figures = [out / "accuracy.png"]
    if any(has_server_momentum(rows) for runs in curves.values() for rows in runs):
        limits = {r["group"]: r["momentum_loop_limit"] for r in rows if r["momentum_loop_limit"] is not None}
        plot_server_momentum(curves, out / "momentum.png", limits)
        figures.append(out / "momentum.png")
    for i, run_dir in enumerate(run_dirs):
        metrics = read_metrics(run_dir)
        if has_pool_diagnostics(metrics):
            name = f"diagnostics-{run_dir.resolve().name}.png"
            if out / name in figures:  # two runs of one name in different folders
                name = f"diagnostics-{i}-{run_dir.resolve().name}.png"
            plot_pool_diagnostics(metrics, out / name, title=str(run_dir))
            figures.append(out / name)
    return figures
