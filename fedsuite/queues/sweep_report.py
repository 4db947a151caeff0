"""A grid sweep's report (:mod:`fedsuite.queues.sweep`): ``report.md``, ``report.csv`` and
``accuracy.png`` in the sweep's folder. Per setting, the mean ± sample std (n − 1) over its
completed seeds of the reading (each run's mean of its last ``--last`` evaluations,
:func:`fedsuite.records.results.run_value`), the mean best accuracy, the seeds that completed and,
for runs with federated evaluation, the clients' readings; the best setting per group
(``--group-by KEY``: per value of that grid key; else the best of all); the runs that did not
complete, each with its failure; one band per setting in the figure. The runs are a sweep's
``fedsuite.queues.sweep.SweepRun`` (a queued run with its ``setting`` and ``seed``), which this
module does not import: the sweep imports its report.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fedsuite.records import rundir
from fedsuite.queues.reproduce.report import aggregate
from fedsuite.queues.study import setting_label, setting_text


def collect(runs: Sequence[Any], last: int) -> list[dict[str, Any]]:
    """Per setting: the completed seeds' readings (mean of the last ``last`` evaluations, in %),
    their mean ± sample std, the mean best accuracy, the curves and, for runs with federated evaluation,
    the mean over seeds of their ``results.client_readings`` (``clients``)."""
    from fedsuite.records.results import best_accuracy, client_readings, evaluations, reading_columns, run_value
    from fedsuite.records.rows import read_metrics

    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        entry = out.setdefault(setting_label(run.setting), {
            "setting": run.setting, "label": setting_label(run.setting), "values": {}, "bests": [], "curves": [],
            "planned": 0, "incomplete": [], "readings": []})
        entry["planned"] += 1
        if rundir.state(run.run_dir, run.rounds) != "completed":
            entry["incomplete"].append(run)
            continue
        rows = read_metrics(run.run_dir)
        evals = evaluations(rows)
        if not evals:
            entry["incomplete"].append(run)
            continue
        entry["values"][run.seed] = run_value(evals, "accuracy", last)[0]
        entry["bests"].append(100 * best_accuracy(evals))
        entry["curves"].append(rows)
        entry["readings"].append(client_readings(rows, last))
    for entry in out.values():
        values = [entry["values"][s] for s in sorted(entry["values"])]
        entry["mean"], entry["std"] = aggregate(values)
        entry["best"] = float(np.mean(entry["bests"])) if entry["bests"] else None
        # federated evaluation (results.client_readings): the mean over the completed seeds, in %
        entry["clients"] = {c: float(np.mean([r[c] for r in entry["readings"] if c in r]))
                            for c in reading_columns(entry["readings"])}
    return list(out.values())


def best_per_group(settings: Sequence[dict[str, Any]], group_by: str | None) -> dict[str, dict[str, Any]]:
    """The setting with the highest mean reading per value of ``group_by`` (one group, ``all``, when
    None); settings without a completed seed take no part."""
    best: dict[str, dict[str, Any]] = {}
    for entry in settings:
        if entry["mean"] is None:
            continue
        group = "all" if group_by is None else f"{group_by}={setting_text(entry['setting'][group_by])}"
        if group not in best or entry["mean"] > best[group]["mean"]:
            best[group] = entry
    return best


def write_report(runs: Sequence[Any], folder: Path, last: int, group_by: str | None, title: str) -> Path:
    """``report.md``, ``report.csv`` and ``accuracy.png`` (one band per setting) in ``folder``."""
    from fedsuite.records.plots import plot_groups
    from fedsuite.records.results import CLIENT_READINGS, reading_columns

    folder.mkdir(parents=True, exist_ok=True)
    data = collect(runs, last)
    extra = reading_columns([e["clients"] for e in data])
    md = [f"# Sweep: {title}", "",
          f"Reading: each run's mean test accuracy over its last {last} evaluations; per setting the mean ± sample std (n − 1) "
          "over its completed seeds; best = mean over seeds of each run's best evaluation."
          + (" Federated evaluation's columns: the same reading of the clients' accuracies, mean over seeds."
             if extra else ""), "",
          "| setting | reading (%) | seeds | best acc (%) |" + "".join(f" {CLIENT_READINGS[c]} |" for c in extra),
          "|---|---|---|---|" + "---|" * len(extra)]
    rows_csv = []
    for e in data:
        reading = "-" if e["mean"] is None else f"{e['mean']:.2f}" + (f" ± {e['std']:.2f}" if e["std"] is not None else "")
        best_acc = "-" if e["best"] is None else f"{e['best']:.2f}"
        md.append(f"| {e['label']} | {reading} | {len(e['values'])}/{e['planned']} | {best_acc} |"
                  + "".join(f" {e['clients'][c]:.2f} |" if c in e["clients"] else " - |" for c in extra))
        rows_csv.append({**{k: setting_text(v) for k, v in e["setting"].items()},
                         "mean": "" if e["mean"] is None else e["mean"], "std": "" if e["std"] is None else e["std"],
                         "seeds_completed": len(e["values"]), "seeds_planned": e["planned"],
                         "best_mean": "" if e["best"] is None else e["best"],
                         "values": " ".join(f"s{s}={v:.4f}" for s, v in sorted(e["values"].items())),
                         **{c: e["clients"].get(c, "") for c in extra}})
    best = best_per_group(data, group_by)
    md += ["", f"Best setting {'per ' + group_by if group_by else 'of all'}:", ""]
    md += [f"- {group}: **{e['label']}** ({e['mean']:.2f})" for group, e in best.items()] or ["- none completed"]
    incomplete = [rundir.why_incomplete(run.run_dir, run.label, run.rounds) for e in data for run in e["incomplete"]]
    if incomplete:
        md += ["", "Runs that did not complete (not in the numbers above):", "", *[f"- {line}" for line in incomplete]]
    curves = {e["label"]: e["curves"] for e in data if e["curves"]}
    if curves:
        plot_groups(curves, folder / "accuracy.png", title=f"sweep {title}: mean ± sample std over seeds")
        md += ["", "![accuracy](accuracy.png)"]
    (folder / "report.md").write_text("\n".join(md) + "\n")
    with (folder / "report.csv").open("w", newline="") as fh:
        fields = [*(runs[0].setting if runs else {}), "mean", "std", "seeds_completed", "seeds_planned", "best_mean",
                  "values", *extra]
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows_csv)
    return folder / "report.md"
