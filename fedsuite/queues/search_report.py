"""A search's report (:mod:`fedsuite.queues.search`): what became of each trial (:func:`read_trials`,
:func:`trial_outcome`) and ``report.md``, ``trials.csv`` and ``accuracy.png`` in the search's folder
(:func:`write_report`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Sequence

from fedsuite.records import rundir
from fedsuite.queues.study import setting_label, setting_text


def read_trials(folder: Path, stopped: set[str] = frozenset()) -> list[dict[str, Any]]:
    """Every trial the search started (``trials/<trial>.json``, written as it starts): its id,
    setting, run directory, rounds and outcome (:func:`trial_outcome`; ``stopped``: the trials ASHA
    stopped), in the order they started."""
    trials = []
    for path in (folder / "trials").glob("*.json"):
        record = json.loads(path.read_text())
        run_dir = path.with_suffix("")
        trials.append({**record, "run_dir": run_dir, "outcome": trial_outcome(
            run_dir, record["rounds"], record.get("error"), record["trial"] in stopped)})
    return sorted(trials, key=lambda t: t["started"])


def trial_outcome(run_dir: Path, rounds: int, error: str | None, stopped_by_asha: bool = False) -> str:
    """What became of a trial: ``completed``; ``stopped early at round r of R`` (ASHA stopped it: the
    run is partial; r = R when the stop landed after the run's last round but before its summary,
    since a run trains on while Tune decides); ``interrupted at round r of R`` (a partial run that
    ASHA did not stop: the search, or the run, was interrupted; ``--resume`` continues it);
    ``failed: why`` (a run whose record is damaged too: ``rundir.state``)."""
    now = rundir.state(run_dir)
    if error is not None or now in ("failed", "new", "debris", "damaged"):
        return "failed: " + (error or rundir.why_incomplete(run_dir, "its run"))
    if now == "completed":
        return "completed"
    return f"{'stopped early' if stopped_by_asha else 'interrupted'} at round {rundir.rounds_done(run_dir)} of {rounds}"


def write_report(trials: Sequence[dict[str, Any]], folder: Path, rounds: int, last: int, search: str,
                 samples: int | None = None) -> Path:
    """``report.md``, ``trials.csv`` and ``accuracy.png`` (one curve per trial) in ``folder``: every
    trial, and, of ``samples``, those that never started (an interrupted search), each a row with
    no setting; the trials that did not complete are named once more below the table, an
    interrupted one with the command that continues its run."""
    from fedsuite.records.plots import plot_groups
    from fedsuite.records.results import evaluations, run_value
    from fedsuite.records.rows import read_metrics
    from fedsuite.launch.runner import CLI

    samples = len(trials) if samples is None else samples
    rows, curves = [], {}
    for t in trials:
        metrics = read_metrics(t["run_dir"], tolerant=True)
        evals = evaluations(metrics)
        reading = run_value(evals, "accuracy", last)[0] if evals else None
        rows.append({"trial": t["trial"], **{k: setting_text(v) for k, v in t["setting"].items()},
                     "outcome": t["outcome"], "rounds": rundir.rounds_done(t["run_dir"]), "reading": reading,
                     "run_dir": str(t["run_dir"])})
        if evals:
            curves[f"{t['trial']} {setting_label(t['setting'])}"] = [metrics]
    rows.sort(key=lambda r: -1 if r["reading"] is None else r["reading"], reverse=True)
    never = max(0, samples - len(trials))
    rows += [{"trial": "-", "outcome": "never started", "rounds": 0, "reading": None, "run_dir": ""}] * never
    md = [f"# Search: {folder.name} ({search}, {samples} trials)", "",
          f"Reading: each trial's mean test accuracy over its last {last} evaluations (a stopped trial: "
          "over those it did). Sorted by reading.", "",
          "| trial | setting | outcome | rounds | reading (%) |", "|---|---|---|---|---|"]
    by_id = {t["trial"]: t for t in trials}
    for r in rows:
        reading = "-" if r["reading"] is None else f"{r['reading']:.2f}"
        setting = setting_label(by_id[r["trial"]]["setting"]) if r["trial"] in by_id else "-"
        md.append(f"| {r['trial']} | {setting} | {r['outcome']} | {r['rounds']} | {reading} |")
    completed = [r for r in rows if r["outcome"] == "completed" and r["reading"] is not None]
    md += ["", f"Best completed trial: **{completed[0]['trial']}** ({completed[0]['reading']:.2f}), "
           f"run directory `{completed[0]['run_dir']}`" if completed else "No trial completed."]
    incomplete = [f"- {t['trial']} ({setting_label(t['setting'])}): {t['outcome']}"
                  + (f"; continue its run with `{CLI.resume(t['run_dir'])}`" if t["outcome"].startswith("interrupted")
                     else "") for t in trials if not t["outcome"].startswith(("completed", "stopped early"))]
    if never:
        incomplete.append(f"- {never} of the {samples} trials never started (the search was interrupted before "
                          "them): the same command with another --name runs the search again, drawing the same "
                          "settings (the sampling is seeded)")
    if incomplete:
        md += ["", "Trials that did not complete:", "", *incomplete]
    if curves:
        plot_groups(curves, folder / "accuracy.png", title=f"search {folder.name}: one curve per trial")
        md += ["", "![accuracy](accuracy.png)"]
    (folder / "report.md").write_text("\n".join(md) + "\n")
    fields = list(dict.fromkeys(["trial", *(k for r in rows for k in r if k not in ("trial", "outcome", "rounds",
                                                                              "reading", "run_dir")),
                                 "outcome", "rounds", "reading", "run_dir"]))
    with (folder / "trials.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return folder / "report.md"
