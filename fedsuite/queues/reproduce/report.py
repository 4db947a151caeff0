"""The report of a target: per row the published and obtained numbers and the verdicts, as files.

:func:`write_report` (``fedsuite reproduce``'s last step, and ``--report`` alone) writes, for the
runs of a target (:func:`fedsuite.queues.reproduce.planning.plan`), per cell the published value, the
obtained mean ± sample std over the completed seeds (each run's reading: ``fedsuite.records.results.run_value``,
the same as ``sweep``'s and a search's; a cell's: :func:`aggregate`), the mean best accuracy, their
difference (paper scale only) and, per row, each ordering the paper claims judged on the
differences paired by seed against the paper's own difference for the cell
(:mod:`fedsuite.queues.reproduce.verdicts`; where the row names the component that distinguishes an
ordering, with how much it acted in the better method's runs, read from their ``summary.json``:
``fedsuite.method.activity``); as ``report.md``, ``report.csv`` (cells) and ``claims.csv``
(orderings), plus one accuracy-versus-round figure per row (mean over
seeds with a ± sample std band, ``fedsuite.records.plots.plot_groups``) and, where the row's runs record a server
momentum (FedCM, MoFedSAM, FedMRUR), its ‖m‖ and d_t (``fedsuite.records.plots.plot_server_momentum``).
Runs that did not complete are left out of the numbers and named under their row. The report names
the code and hardware that produced the runs in its numbers (``fedsuite.records.provenance.report_lines``:
one line, or the distinct versions when the runs differ). Each file is replaced whole
(``results.write_atomically``): two ``reproduce`` processes of one target (different seeds, say) may
end at the same moment.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fedsuite.method import registry
from fedsuite.records import rundir
from fedsuite.queues.reproduce.planning import RunSpec
from fedsuite.queues.reproduce.tables import Row, Target
from fedsuite.queues.reproduce.verdicts import (ACTIVITY_NOT_RECORDED, COULD_NOT_TELL, DEFAULT_CONFIDENCE, HOLDS,
                                         INERT_HERE, NOT_JUDGED, REVERSED, SMALLER_THAN_PAPERS, VERDICTS, Activity,
                                         check_confidence, claims, difference_over_rounds, verdict,
                                         verdict_rule)
from fedsuite.records.plots import (has_server_momentum, plot_claims, plot_differences, plot_groups,
                                    plot_server_momentum)
from fedsuite.records.provenance import report_lines, run_summaries
from fedsuite.records.results import (CLIENT_READINGS, best_accuracy, client_readings, evaluations, momentum_loop_limit,
                              reading_columns, run_value, write_atomically)
from fedsuite.records.rows import read_metrics


def aggregate(values: Sequence[float], tails: Sequence[Sequence[float]] = (), metric: str = "accuracy",
              spread: str = "seeds") -> tuple[float | None, float | None]:
    """(mean, sample std) of a cell over its seeds' run values. Every std here is the sample
    standard deviation (n − 1 in the denominator, :func:`sample_std`; None with fewer than two
    values). ``accuracy``: the mean of the values; the std over the seeds (``spread="seeds"``) or
    over all seeds' last evaluations pooled (``spread="pooled"``, the paper's ± of FedMR and
    FedNLR). ``rounds``: mean and std over the seeds that reached the target; ``inf`` if none did."""
    if not values:
        return None, None
    if metric == "rounds":
        reached = [v for v in values if math.isfinite(v)]
        if not reached:
            return math.inf, None
        return float(np.mean(reached)), sample_std(reached)
    mean = float(np.mean(values))
    if spread == "pooled":
        pooled = [v for tail in tails for v in tail]
        return mean, sample_std(pooled)
    return mean, sample_std(values)


def sample_std(values: Sequence[float]) -> float | None:
    """The sample standard deviation sqrt(Σ (v − v̄)² / (n − 1)) of ``values``; None for n < 2
    (one value has no spread). The one spread every report, sweep and summary of fedsuite prints."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def _fmt(value: float | None, std: float | None = None, metric: str = "accuracy") -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "∞"
    text = f"{value:.0f}" if metric == "rounds" else f"{value:.2f}"
    return text + (f" ± {std:.2f}" if std is not None else "")


def recorded_activity(run_dir: Path) -> dict[str, float] | None:
    """{component name: the run's mean of its measure over rounds} from its ``summary.json``'s
    ``activity`` (``fedsuite.method.activity``), or None for a run that recorded none (made before activity
    was measured)."""
    activity = rundir.summary(run_dir).get("activity")
    if not isinstance(activity, dict):
        return None
    return {name: float(entry["mean"]) for name, entry in activity.items()
            if isinstance(entry, dict) and isinstance(entry.get("mean"), (int, float))}


#: each verdict's colour in the report's figure of its orderings (``claims.png``)
VERDICT_COLOURS = {HOLDS: "tab:green", REVERSED: "tab:red", COULD_NOT_TELL: "tab:orange",
                   SMALLER_THAN_PAPERS: "tab:purple", INERT_HERE: "tab:gray", NOT_JUDGED: "tab:gray"}


def _row_specs(specs: Sequence[RunSpec], row: Row) -> list[RunSpec]:
    """The runs a row reads: those of its setting (rows sharing a setting share runs), of the methods
    it names where it names them (``methods``), so that a row shows only its own methods' cells."""
    return [s for s in specs if s.row.setting == row.setting and (row.methods is None or s.method in row.methods)]


def collect(target: Target, specs: Sequence[RunSpec], scale: str,
            confidence: float = DEFAULT_CONFIDENCE) -> list[dict[str, Any]]:
    """Per row: its cells (published, obtained mean ± sample std over the completed seeds, best
    accuracy, difference at paper scale), its claims judged at ``confidence`` (with the activity of
    the component that distinguishes each, where the row names one) and verdict, and the curves of
    its completed runs."""
    known = registry.components()
    rows = []
    for row in target.rows:
        mine = _row_specs(specs, row)
        if not mine:
            continue
        methods = [m for m in target.methods if any(s.method == m for s in mine)]
        acc = row.cpu_target_accuracy if scale == "cpu" else row.target_accuracy
        cells, curves, by_seed, activity, rows_by_seed = {}, {}, {}, {}, {}
        for m in methods:
            runs = [s for s in mine if s.method == m]
            values, tails, bests, seed_rows, readings = [], [], [], [], []
            by_seed[m], activity[m], rows_by_seed[m] = {}, {}, {}
            for s in runs:
                if rundir.state(s.run_dir, s.rounds) != "completed":
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
                rows_by_seed[m][s.seed] = metrics
                readings.append(client_readings(metrics, target.last))
                # a run that never reached a rounds target counts as reaching it one round after
                # its end (a lower bound), so that the paired difference stays finite
                by_seed[m][s.seed] = min(value, s.rounds + 1.0) if target.metric == "rounds" else value
                acted = recorded_activity(s.run_dir)
                if acted is not None:
                    activity[m][s.seed] = acted
            mean, std = aggregate(values, tails, target.metric, target.spread)
            pub = row.published.get(m)
            diff = (mean - pub[0] if scale == "paper" and not row.model_deviation and pub and mean is not None
                    and math.isfinite(mean) and math.isfinite(pub[0]) else None)
            cells[m] = {"method": m, "label": target.methods[m][0], "published": pub, "mean": mean, "std": std,
                        "seeds": len(values), "planned": len(runs),
                        "best": float(np.mean(bests)) if bests else None, "diff": diff,
                        # federated evaluation (results.client_readings): the mean over seeds, in %
                        "clients": {c: float(np.mean([r[c] for r in readings if c in r]))
                                    for c in reading_columns(readings)}}
            if seed_rows:
                curves[f"{target.methods[m][0]}"] = seed_rows
        pairs = [(target.ours, m) for m in methods if m != target.ours] + \
                [p for p in target.compare if p[0] in methods and p[1] in methods]
        row_claims = claims({m: v[0] for m, v in row.published.items()}, by_seed, pairs,
                            higher_is_better=target.metric == "accuracy", stated=row.claims,
                            nearest=row.paper_differences,
                            components={pair: known[name] for pair, name in row.components.items()},
                            activity=activity, confidence=confidence)
        rows.append({"row": row, "cells": cells, "claims": row_claims, "verdict": verdict(row_claims),
                     "curves": curves, "rows_by_seed": rows_by_seed, "target_accuracy": acc})
    return rows


def _signed(value: float, metric: str) -> str:
    """A difference with its sign: ``+3.97`` points, ``+100`` rounds, ``+∞``."""
    if math.isinf(value):
        return "+∞" if value > 0 else "−∞"
    return f"{value:+.0f}" if metric == "rounds" else f"{value:+.2f}"


def write_report(target: Target, specs: Sequence[RunSpec], scale: str, folder: Path,
                 confidence: float = DEFAULT_CONFIDENCE) -> Path:
    """Write ``report.md``, ``report.csv`` (one line per cell; with federated evaluation, its
    readings ``fedsuite.records.results.CLIENT_READINGS`` as extra columns here and in each row's table),
    ``claims.csv`` (one line per claimed
    ordering: its paired differences, their mean, standard error and t-interval at ``confidence``
    (``confidence``, ``interval_low``, ``interval_high``, ``half_width``: the smallest difference
    the seeds could detect), the paper's difference (with the nearest cell it comes from
    where the row's own cell is not published: ``paper_difference_source``, empty otherwise), the
    component that distinguishes it with its measure, value and threshold (empty where the row
    names none) and the verdict), ``<row>.png`` (accuracy vs round, band over seeds),
    ``<row>-momentum.png`` where the row's runs record a server momentum
    (:func:`fedsuite.records.plots.plot_server_momentum`) and
    ``claims.png`` (every claimed ordering's paired differences and their mean with its t-interval
    beside the paper's difference, :func:`fedsuite.records.plots.plot_claims`) into ``folder``; returns the
    Markdown path. Every spread is the sample standard deviation (:func:`sample_std`)."""
    check_confidence(confidence)
    level = f"{100 * confidence:g}%"
    folder.mkdir(parents=True, exist_ok=True)
    data = collect(target, specs, scale, confidence)
    unit = "rounds to target" if target.metric == "rounds" else "test accuracy (%)"
    md = [f"# {target.name}: {target.title}", "",
          f"{target.paper}. Published numbers: {target.source}. Scale: **{scale}**.", ""]
    read = [s.run_dir for s in specs if rundir.state(s.run_dir, s.rounds) == "completed"]  # the runs in the numbers
    if read:
        md += [*report_lines(run_summaries(read)), ""]
    if scale == "cpu":
        md += [f"**CPU scale: obtained numbers are not the paper's setting and are compared on orderings only "
               f"(difference: n/a); the paper's difference beside each ordering is the one it measured in its own "
               f"setting.** {target.cpu_note}", ""]
    md += [f"Reading: {target.note}" if target.note else "", "",
           "Obtained = mean ± sample std (n − 1) over the completed seeds of each run's "
           + ("first round reaching the row's target (∞: never)" if target.metric == "rounds" else
              f"mean of its last {target.last} evaluations (std: "
              + ("pooled over those evaluations of all seeds" if target.spread == "pooled" else "over seeds")
              + ")") + "; best = mean over seeds of each run's best evaluation.", "",
          verdict_rule(confidence), "",
          "| row | " + " | ".join(VERDICTS) + " |", "|---|" + "---|" * len(VERDICTS)]
    for d in data:
        md.append(f"| {d['row'].label} | " + " | ".join(
            str(sum(1 for c in d["claims"] if c.verdict == v)) for v in VERDICTS) + " |")
    csv_rows, claim_rows = [], []
    # federated evaluation's readings: report.csv's extra columns, where any run has them
    csv_extra = reading_columns([c["clients"] for d in data for c in d["cells"].values()])
    unit_short = "rounds" if target.metric == "rounds" else "points"
    orderings = [{"label": f"{target.methods[c.better][0]} > {target.methods[c.worse][0]}  [{d['row'].name}]",
                  "differences": [c.differences[s] for s in sorted(c.differences)], "mean": c.result.mean,
                  "half_width": c.result.half_width, "paper": c.paper_difference, "verdict": c.verdict,
                  "colour": VERDICT_COLOURS[c.verdict]} for d in data for c in d["claims"]]
    if orderings:
        write_atomically(folder / "claims.png", lambda tmp: plot_claims(
            orderings, tmp, unit="rounds saved" if target.metric == "rounds" else "points", level=level,
            title=f"{target.name} ({scale} scale): the claimed orderings against the paper's differences"))
        md += ["", f"![the claimed orderings: each seed's difference, their mean with its {level} t-interval, the "
                   "paper's difference](claims.png)"]
    for d in data:
        row = d["row"]
        md += ["", f"## {row.label}" + (f" (target {d['target_accuracy']:g}%)" if d["target_accuracy"] else ""), ""]
        if row.note:
            md += [row.note, ""]
        extra = reading_columns([c["clients"] for c in d["cells"].values()])  # federated evaluation's columns
        md += [f"| method | published | obtained ({unit}) | seeds | best acc (%) | difference |"
               + "".join(f" {CLIENT_READINGS[c]} |" for c in extra), "|---|---|---|---|---|---|" + "---|" * len(extra)]
        # no difference from the published number where the cell is not the paper's (cpu scale,
        # another model): the orderings are compared, not the numbers
        not_paper = "n/a (cpu scale)" if scale == "cpu" else "n/a (other model)" if row.model_deviation else ""
        for m, c in d["cells"].items():
            pub = c["published"]
            diff = not_paper or ("-" if c["diff"] is None else f"{c['diff']:+.2f}")
            md.append(f"| {c['label']} | {_fmt(*pub, target.metric) if pub else '-'} | "
                      f"{_fmt(c['mean'], c['std'], target.metric)} | {c['seeds']}/{c['planned']} | "
                      f"{_fmt(c['best'])} | {diff} |" + "".join(f" {_fmt(c['clients'].get(k))} |" for k in extra))
            csv_rows.append({
                "target": target.name, "scale": scale, "row": row.name, "method": m,
                "published_mean": pub[0] if pub else "", "published_std": pub[1] if pub and pub[1] is not None else "",
                "obtained_mean": "" if c["mean"] is None else c["mean"], "obtained_sample_std": "" if c["std"] is None else c["std"],
                "seeds_completed": c["seeds"], "seeds_planned": c["planned"], "best_mean": "" if c["best"] is None else c["best"],
                "difference": "n/a" if not_paper else ("" if c["diff"] is None else c["diff"]),
                "row_verdict": d["verdict"], **{k: c["clients"].get(k, "") for k in csv_extra}})
        if row.model_deviation and scale == "paper":
            md += ["", f"These runs train another model than the paper's numbers were measured with "
                   f"({row.model_deviation}): the published numbers are shown for reference, and only the "
                   "orderings are compared."]
        md += ["", f"Orderings the paper claims, paired by seed (difference = the first method's value minus the "
               f"second's, in {unit_short}, positive where the paper says; the paper's difference is the same "
               "difference of its published numbers for this cell):", ""]
        # the activity column where the row names the component that distinguishes an ordering
        with_activity = any(c.activity is not None for c in d["claims"])
        if d["claims"]:
            md += [f"| ordering | seeds paired | mean difference | standard error | {level} interval | "
                   "smallest difference these seeds could detect | paper's difference | "
                   + ("component activity | " if with_activity else "") + "verdict |",
                   "|---|---|---|---|---|---|---|---|" + ("---|" if with_activity else "")]
        nearest, measures = [], []
        for c in d["claims"]:
            mean, se, half, word = c.result
            label = f"{target.methods[c.better][0]} > {target.methods[c.worse][0]}"
            paper = _signed(c.paper_difference, target.metric) + ("†" if c.paper_source else "")
            acted = "" if not with_activity else ("- | " if c.activity is None else f"{c.activity.describe()} | ")
            md.append(f"| {label} | {len(c.differences)} | {'-' if mean is None else f'{mean:+.2f}'} | "
                      f"{'-' if se is None else f'{se:.2f}'} | "
                      f"{'-' if half is None else f'[{mean - half:+.2f}, {mean + half:+.2f}]'} | "
                      f"{'-' if half is None else f'{half:.2f}'} | {paper} | {acted}**{word}** |")
            if c.paper_source:
                nearest.append(f"- {label}: {c.paper_source}")
            if c.activity is not None:
                comp = c.activity.component
                measures.append(f"- {label}: `{comp.name}`, measured by `{comp.measure}` in {target.methods[c.better][0]}'s "
                                f"runs: {comp.meaning}")
            claim_rows.append({"target": target.name, "scale": scale, "row": row.name, "better": c.better,
                               "worse": c.worse, "seeds_paired": len(c.differences),
                               "seeds": " ".join(str(s) for s in sorted(c.differences)),
                               "differences": " ".join(f"{c.differences[s]:.4f}" for s in sorted(c.differences)),
                               "mean_difference": "" if mean is None else mean,
                               "standard_error": "" if se is None else se,
                               "confidence": confidence,
                               "interval_low": "" if half is None else mean - half,
                               "interval_high": "" if half is None else mean + half,
                               "half_width": "" if half is None else half,
                               # the published numbers have two decimals: no float noise (3.4200000000000017)
                               "paper_difference": round(c.paper_difference, 6),
                               "paper_difference_source": c.paper_source,
                               **_activity_columns(c.activity),
                               "verdict": word})
        if nearest:
            md += ["", "† The paper publishes no such cell; its difference is read from the nearest cell of its "
                   "tables:", "", *nearest]
        if measures:
            md += ["", "Component activity: the component that distinguishes the ordering, and how much it acted in "
                   "the better method's runs (its measure's mean over each run's rounds, averaged over the paired "
                   "seeds; below the threshold: **inert here**):", "", *measures]
        md += ["", f"**Row: {d['verdict']}.**"]
        incomplete = [rundir.why_incomplete(sp.run_dir, f"{sp.method} seed {sp.seed}", sp.rounds)
                      for sp in _row_specs(specs, row) if rundir.state(sp.run_dir, sp.rounds) != "completed"]
        if incomplete:
            md += ["", "Runs that did not complete (not in the numbers above):", "",
                   *[f"- {line}" for line in incomplete]]
        if d["curves"]:
            png = folder / f"{row.name}.png"
            write_atomically(png, lambda tmp, curves=d["curves"], title=f"{row.label} ({scale} scale)":
                             plot_groups(curves, tmp, title=title))
            md += ["", f"![{row.label}]({png.name})"]
        differences = [] if target.metric != "accuracy" else [
            {"label": f"{target.methods[c.better][0]} > {target.methods[c.worse][0]}", "curve": curve,
             "paper": c.paper_difference, "colour": VERDICT_COLOURS[c.verdict]}
            for c in d["claims"] if c.differences
            for curve in [difference_over_rounds([(d["rows_by_seed"][c.better][s], d["rows_by_seed"][c.worse][s])
                                                  for s in sorted(c.differences)], target.last, confidence)]
            if curve is not None]
        if differences:
            png = folder / f"{row.name}-differences.png"
            write_atomically(png, lambda tmp, curves=differences, title=f"{row.label} ({scale} scale): each ordering's "
                             f"difference over rounds, read as the verdict reads the last round":
                             plot_differences(curves, tmp, level=level, title=title))
            md += ["", f"![{row.label}: each ordering's paired difference over rounds, with its {level} t-interval, "
                       f"as the verdict reads it at the end]({png.name})"]
        if any(has_server_momentum(rows) for runs in d["curves"].values() for rows in runs):
            png = folder / f"{row.name}-momentum.png"
            limits = _momentum_loop_limits(target, specs, row)
            title = f"{row.label} ({scale} scale): the server momentum"
            write_atomically(png, lambda tmp, curves=d["curves"], limits=limits, title=title:
                             plot_server_momentum(curves, tmp, limits, title=title))
            md += ["", f"![{row.label}: the server momentum, ‖m‖ and d_t]({png.name})"]
    write_atomically(folder / "report.md", lambda tmp: tmp.write_text("\n".join(md) + "\n"))
    _write_csv(folder / "report.csv", csv_rows, ["target", "scale", "row", "method", "published_mean", "published_std",
                                                 "obtained_mean", "obtained_sample_std", "seeds_completed", "seeds_planned",
                                                 "best_mean", "difference", "row_verdict", *csv_extra])
    _write_csv(folder / "claims.csv", claim_rows, ["target", "scale", "row", "better", "worse", "seeds_paired", "seeds",
                                                   "differences", "mean_difference", "standard_error",
                                                   "confidence", "interval_low", "interval_high", "half_width",
                                                   "paper_difference", "paper_difference_source", "component",
                                                   "activity_measure", "activity_value", "activity_threshold",
                                                   "verdict"])
    return folder / "report.md"


def _momentum_loop_limits(target: Target, specs: Sequence[RunSpec], row: Row) -> dict[str, float]:
    """1/(1−α) by method label (the row's curves' names) for each method whose runs build the server
    momentum from the normalised update (:func:`fedsuite.records.results.momentum_loop_limit`, read from a
    run's ``config.json``)."""
    limits: dict[str, float] = {}
    for spec in _row_specs(specs, row):
        label, config = target.methods[spec.method][0], spec.run_dir / "config.json"
        if label not in limits and config.is_file():
            limit = momentum_loop_limit(json.loads(config.read_text()))
            if limit is not None:
                limits[label] = limit
    return limits


def _activity_columns(activity: Activity | None) -> dict[str, Any]:
    """claims.csv's columns of an ordering's component: its name, its measure, the better method's
    value (mean over rounds and paired seeds; ``activity not recorded`` for runs made before it was
    measured) and the threshold; empty where the row names no component."""
    if activity is None:
        return {"component": "", "activity_measure": "", "activity_value": "", "activity_threshold": ""}
    c = activity.component
    value = activity.value
    return {"component": c.name, "activity_measure": c.measure, "activity_threshold": c.threshold,
            "activity_value": ACTIVITY_NOT_RECORDED if activity.unrecorded else ("" if value is None else value)}


def _write_csv(path: Path, rows: list[dict[str, Any]], fields: list[str]) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)

    write_atomically(path, write)
