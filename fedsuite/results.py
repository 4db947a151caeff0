"""Run directories: metrics, summary, checkpoint, plots; a run's reading; and ``fedsuite report`` over many runs.

A run directory holds::

    config.json      the resolved config
    metrics.jsonl    one line per round: round, test_accuracy, test_loss, train_loss, wall_seconds,
                     bytes_sent, bytes_received, cohort, dropped (partition ids), failed (their
                     count), failure_reasons ({partition id: reason}) (+ method metrics)
    summary.json     final/best accuracy, rounds, total time, status, failed_replies and
                     rounds_with_failures (totals), failure (round, partition ids, first error)
                     when the run stopped on too many failed replies
    checkpoint.pt    global arrays + strategy state + round (rewritten atomically every round)
    events.out.tfevents.*  the same metrics for TensorBoard (``tensorboard=true``, the default where
                     the package is installed; :class:`TensorBoardLog`)
    accuracy.png     test accuracy versus round
    diagnostics.png  pool diagnostics versus round (pool methods with ``<method>.diagnostics = true``,
                     see :func:`plot_pool_diagnostics`)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from fedsuite.config import RESUME_MUTABLE, flat_config


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend, imported when a plot is drawn: 0.25 s of
    imports that the CLI and the simulation process would otherwise pay before the first round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class ResultsError(ValueError):
    """A run directory's files cannot be read; the message is one line naming the file."""


def read_metrics(run_dir: str | Path, tolerant: bool = False) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``. A line that is not a JSON object raises :class:`ResultsError`
    naming file and line, or is skipped with ``tolerant`` (a live run's line being written)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("round"), int):
                raise ValueError("not a metrics row (a JSON object with an integer 'round')")
        except ValueError as exc:
            if tolerant:
                continue
            raise ResultsError(f"{path}, line {number}: not a valid metrics row, the file is truncated or "
                               f"corrupt ({exc})") from None
        rows.append(row)
    return rows


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


def tensorboard_installed() -> bool:
    """Whether the ``tensorboard`` package (which torch's ``SummaryWriter`` writes for) is importable."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics row that TensorBoard plots: every finite int or float but ``round``
    (the step) and booleans; lists (cohort, dropped) and dicts (failure_reasons) are not scalars."""
    return {k: float(v) for k, v in row.items() if k != "round" and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardLog:
    """The run's metrics as TensorBoard event files in its folder (``tensorboard --logdir runs``
    shows every run under its folder name): each row's :func:`scalars` at step = round, and the
    config as hparams (the HParams tab compares runs and sweeps by their settings).

    ``purge_from``: on a resume, the round the run continues from; events of that round and later
    that an interrupted attempt wrote are hidden by TensorBoard (``SummaryWriter(purge_step=...)``),
    so each step shows the values of the round that counted."""

    def __init__(self, run_dir: Path, config: dict[str, Any], purge_from: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_from)
        if purge_from is None:  # a new run: its settings, once
            flat = {k: (v if isinstance(v, (int, float, str, bool)) else json.dumps(v, sort_keys=True))
                    for k, v in flat_config(config).items() if v is not None}
            for summary in hparams(flat, {"test_accuracy": 0.0}):
                self.writer.file_writer.add_summary(summary)

    def add(self, row: dict[str, Any]) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=row["round"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class RunRecorder:
    """Appends per-round metrics and keeps summary and plot up to date (called by the ServerApp);
    with ``tensorboard``, the same rows go to a :class:`TensorBoardLog` (after metrics.jsonl, which
    is the record)."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None = None, tensorboard: bool = False) -> None:
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.config = config or {}
        self.tensorboard = tensorboard
        self.board: TensorBoardLog | None = None

    def _board(self, purge_from: int | None = None) -> TensorBoardLog | None:
        if self.tensorboard and self.board is None:
            self.board = TensorBoardLog(self.run_dir, self.config, purge_from)
        return self.board

    def append(self, row: dict[str, Any]) -> None:
        row = _clean(row)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self._board() is not None:
            self.board.add(row)

    def rewind(self, checkpoint_round: int, checkpoint_row: dict[str, Any] | None) -> None:
        """Make ``metrics.jsonl`` end at the checkpoint a run resumes from: keep the rows of earlier
        rounds, then the checkpoint's own row (a checkpoint without one keeps the file's row of that
        round). Rows of a round the checkpoint does not hold, and a half-written last line, go."""
        if not self.metrics_path.is_file():
            if checkpoint_row is None:
                return
            lines = []
        else:
            lines = self.metrics_path.read_text().splitlines()
        rows: list[dict[str, Any]] = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
        keep = [r for r in rows if r["round"] < checkpoint_round]
        if checkpoint_row is not None:
            keep.append(_clean(checkpoint_row))
        elif checkpoint_round > 0:
            keep += [r for r in rows if r["round"] == checkpoint_round][:1]
        tmp = self.metrics_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
        os.replace(tmp, self.metrics_path)
        if self.tensorboard and any(self.run_dir.glob("events.out.tfevents.*")):
            # an earlier attempt logged to TensorBoard: hide its events from the last kept row on,
            # and log that row again (a kill may have come between the checkpoint and its row)
            purge_from = keep[-1]["round"] if keep else 0
            self._board(purge_from)
            if keep:
                self.board.add(keep[-1])

    def close(self) -> None:
        """End the TensorBoard log (if any) without an outcome: a run stopped from outside."""
        if self.board is not None:
            self.board.close()
            self.board = None

    def finish(self, status: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        rows = read_metrics(self.run_dir)
        summary = summarize(rows)
        summary.update({"status": status, **(extra or {})})
        if "failure" in summary:  # the failed round has no metrics row: count its failures too
            summary["failed_replies"] += len(summary["failure"]["partition_ids"])
            summary["rounds_with_failures"] += 1
        if rows:
            plot_accuracy({self.run_dir.name: rows}, self.run_dir / "accuracy.png")
        if has_pool_diagnostics(rows):
            plot_pool_diagnostics(rows, self.run_dir / "diagnostics.png", title=self.run_dir.name)
        self.close()
        # last: the launcher takes summary.json as the sign that the run has ended and stops its processes
        write_json(self.run_dir / "summary.json", summary)
        return summary


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [(r["round"], r["test_accuracy"]) for r in rows if r.get("test_accuracy") is not None]
    out: dict[str, Any] = {"rounds_completed": max((r["round"] for r in rows), default=0)}
    if evals:
        out["final_accuracy"] = evals[-1][1]
        best_round, best = max(evals, key=lambda e: e[1])
        out["best_accuracy"], out["best_round"] = best, best_round
        losses = [r["test_loss"] for r in rows if r.get("test_loss") is not None]
        out["final_loss"] = losses[-1] if losses else None
    failed = [r.get("failed", 0) or 0 for r in rows if r["round"] > 0]
    out["failed_replies"] = int(sum(failed))
    out["rounds_with_failures"] = int(sum(1 for f in failed if f))
    walls = [r["wall_seconds"] for r in rows if r.get("wall_seconds") is not None and r["round"] > 0]
    if walls:
        out["seconds_per_round"] = float(np.median(walls))
        out["total_seconds"] = float(np.sum(walls))
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        return _clean(value.item())
    return value


def plot_accuracy(curves: dict[str, list[dict[str, Any]]], path: Path, title: str | None = None) -> None:
    """Test accuracy versus round, one line per run (or per group of seeds: mean ± std band)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, rows in curves.items():
        pts = [(r["round"], r["test_accuracy"]) for r in rows if r.get("test_accuracy") is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, [100 * y for y in ys], marker="o" if len(xs) < 30 else None, ms=3, label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    if curves:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def has_pool_diagnostics(rows: list[dict[str, Any]]) -> bool:
    """Whether a run's rows carry the pool diagnostics (``strategies/pool.py``)."""
    return any("pool_accuracy" in r for r in rows)


def plot_pool_diagnostics(rows: list[dict[str, Any]], path: Path, title: str | None = None) -> None:
    """Four panels over the rounds that carry the pool diagnostics (``strategies/pool.py``):

    1. test accuracy: the evaluated global model, the pool mean v̄ = (1/K) Σ_s v_s, the K trained pool
       models v_s (median, min-max band) and the K models sent next u'_s (FedMR: recombined; median, band);
    2. test loss of the same (log scale);
    3. mean pairwise distance of the trained pool, whole model and per state_dict entry;
    4. client movement ||v_s − w_s|| (median, min-max band) beside the pool's pairwise distance.
    """
    plt = pyplot()
    diag = [r for r in rows if "pool_accuracy" in r]
    if not diag:
        raise ValueError("no row carries pool diagnostics (run a pool method with <method>.diagnostics=true)")
    x = [r["round"] for r in diag]

    def band(ax, key: str, label: str, color: str, scale: float = 1.0) -> None:
        vals = np.array([[np.nan if v is None else v for v in r[key]] for r in diag], dtype=float) * scale
        ax.plot(x, np.nanmedian(vals, 1), color=color, label=f"{label} (median)")
        ax.fill_between(x, np.nanmin(vals, 1), np.nanmax(vals, 1), color=color, alpha=0.18, label=f"{label} (min-max)")

    fig, axes = plt.subplots(2, 2, figsize=(11.0, 7.2), dpi=110)
    ax = axes[0, 0]
    evaluated = [(r["round"], r["test_accuracy"]) for r in diag if r.get("test_accuracy") is not None]
    if evaluated:
        ax.plot(*zip(*[(rd, 100 * a) for rd, a in evaluated]), color="black", lw=2.2, label="evaluated global")
    ax.plot(x, [100 * r["pool_mean_accuracy"] for r in diag], color="tab:red", ls="--", label="pool mean")
    band(ax, "pool_accuracy", "trained pool models", "tab:blue", 100)
    band(ax, "next_accuracy", "models sent next", "tab:orange", 100)
    ax.set_ylabel("test accuracy (%)")
    ax = axes[0, 1]
    ax.plot(x, [r["pool_mean_loss"] for r in diag], color="tab:red", ls="--", label="pool mean")
    band(ax, "pool_loss", "trained pool models", "tab:blue")
    band(ax, "next_loss", "models sent next (before training)", "tab:orange")
    ax.set_yscale("log")
    ax.set_ylabel("test loss")
    ax = axes[1, 0]
    layers = list(diag[-1]["pool_layer_distance"])
    cmap = plt.get_cmap("viridis")
    for i, key in enumerate(layers):
        ax.plot(x, [r["pool_layer_distance"].get(key, np.nan) for r in diag], color=cmap(i / max(1, len(layers) - 1)),
                lw=1, label=key if len(layers) <= 12 else None)
    ax.plot(x, [r["pool_distance"] for r in diag], color="black", lw=2.2, label="whole model")
    ax.set_ylabel("mean pairwise distance of the trained pool")
    ax = axes[1, 1]
    band(ax, "client_movement", "client movement ||v − w||", "tab:green")
    ax.plot(x, [r["pool_distance"] for r in diag], color="black", lw=1.5, label="pool pairwise distance")
    ax.set_ylabel("L2 distance")
    for ax in axes.flat:
        ax.set_xlabel("round")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------
# fedsuite report
# ------------------------------------------------------------------------------------------------


def load_run(run_dir: Path) -> dict[str, Any]:
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise ResultsError(f"{run_dir} is not a fedsuite run directory (no config.json)")
    try:
        config = json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{config_path} is not valid JSON ({exc})") from None
    needed = ("strategy", "model", "dataset", "partitioner")
    missing = [k for k in needed if not isinstance(config, dict) or k not in config]
    if missing:
        raise ResultsError(f"{config_path} is not a fedsuite run config: it lacks {', '.join(missing)}")
    return {"dir": run_dir, "config": config, "rows": read_metrics(run_dir)}


#: config keys that do not define a setting: runs differing only in these are seeds of one setting
NOT_SETTING = ("seed", *(key for key in RESUME_MUTABLE if key != "rounds"))


def group_label(config: dict[str, Any]) -> str:
    """The base label of a setting: method, model, dataset and partition."""
    label = f"{config['strategy']} {config['model']} {config['dataset']} {config['partitioner']}"
    if config["partitioner"].startswith("dirichlet"):
        label += f"({config['alpha']:g})"
    return label


def group_runs(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Group runs whose configs are equal up to :data:`NOT_SETTING`; label each group by
    :func:`group_label` plus every other key whose value varies between groups (``relaxed_init.beta=0.1``)."""
    keyed: dict[str, list[dict[str, Any]]] = {}
    flats: dict[str, dict[str, Any]] = {}
    for run in runs:
        flat = {k: v for k, v in flat_config(run["config"]).items() if k not in NOT_SETTING}
        key = repr(sorted(flat.items(), key=lambda kv: kv[0]))
        keyed.setdefault(key, []).append(run)
        flats[key] = flat
    shown = {"strategy", "model", "dataset", "partitioner", "alpha"}
    varying = sorted({k for f in flats.values() for k in f
                      if k not in shown and len({repr(g[k]) for g in flats.values() if k in g}) > 1})
    groups: dict[str, list[dict[str, Any]]] = {}
    for key, members in keyed.items():
        flat = flats[key]
        extra = [f"{k}={flat[k]}" for k in varying if k in flat]
        label = " ".join([group_label(members[0]["config"]), *extra])
        groups[label] = members
    return groups


def report(run_dirs: Iterable[Path], target: float | None = None, last: int = 1) -> tuple[list[dict[str, Any]], dict]:
    """One row per group of seeds: final accuracy mean ± std (mean of the last ``last`` evaluations
    per run), best accuracy, rounds to ``target`` accuracy (mean over the runs that reach it)."""
    groups = group_runs([load_run(Path(d)) for d in run_dirs])
    table = []
    curves: dict[str, list[list[dict[str, Any]]]] = {}
    for label, runs in groups.items():
        finals, bests, hits = [], [], []
        for run in runs:
            accs = [(r["round"], r["test_accuracy"]) for r in run["rows"] if r.get("test_accuracy") is not None]
            if not accs:
                continue
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
            "final_std": float(np.std(finals)) if finals else None,
            "best_mean": float(np.mean(bests)) if bests else None,
            "rounds_to_target": float(np.mean(reached)) if reached else None,
            "reached": f"{len(reached)}/{len(hits)}" if target is not None else "",
        })
        curves[label] = [run["rows"] for run in runs]
    return table, curves


def report_table(rows: list[dict[str, Any]], target: float | None) -> tuple[list[str], list[list[str]]]:
    """:func:`report`'s rows as a table: (headers, one list of cells per setting); ``target`` in %."""
    headers = ["setting", "seeds", "final acc (%)", "best acc (%)"] + ([f"rounds to {target:g}%"] if target else [])
    table = []
    for r in rows:
        cells = [
            r["group"], str(r["seeds"]),
            f"{100 * r['final_mean']:.2f} ± {100 * r['final_std']:.2f}" if r["final_mean"] is not None else "-",
            f"{100 * r['best_mean']:.2f}" if r["best_mean"] is not None else "-",
        ]
        if target:
            cells.append(f"{r['rounds_to_target']:.0f} ({r['reached']})" if r["rounds_to_target"] else f"∞ ({r['reached']})")
        table.append(cells)
    return headers, table


def write_report(out: Path, run_dirs: list[Path], rows: list[dict[str, Any]], curves: dict,
                 headers: list[str], cells: list[list[str]]) -> list[Path]:
    """``fedsuite report``'s files in ``out``: report.md (the table), report.json (:func:`report`'s
    rows), accuracy.png, and diagnostics-<run>.png for each run with pool diagnostics. Returns the
    figures written."""
    out.mkdir(parents=True, exist_ok=True)
    md = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    md += ["| " + " | ".join(row) + " |" for row in cells]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "report.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot_groups(curves, out / "accuracy.png")
    figures = [out / "accuracy.png"]
    for i, run_dir in enumerate(run_dirs):
        metrics = read_metrics(run_dir)
        if has_pool_diagnostics(metrics):
            name = f"diagnostics-{run_dir.resolve().name}.png"
            if out / name in figures:  # two runs of one name in different folders
                name = f"diagnostics-{i}-{run_dir.resolve().name}.png"
            plot_pool_diagnostics(metrics, out / name, title=str(run_dir))
            figures.append(out / name)
    return figures


def plot_groups(curves: dict[str, list[list[dict[str, Any]]]], path: Path, title: str | None = None) -> None:
    """Mean accuracy versus round per group, with a ± std band over seeds. Words shared by every
    group label (model, dataset, partition) go to the title (or ``title``, when given), so the legend
    names what differs."""
    plt = pyplot()
    labels = list(curves)
    common = set.intersection(*(set(label.split()) for label in labels)) if len(labels) > 1 else set()
    short = {label: " ".join(w for w in label.split() if w not in common) or label for label in labels}
    cmap = plt.get_cmap("tab20" if len(labels) > 10 else "tab10")
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(8.0 if len(labels) > 8 else 7.0, 4.4), dpi=120)
    for i, (label, runs) in enumerate(curves.items()):
        series = [{r["round"]: r["test_accuracy"] for r in rows if r.get("test_accuracy") is not None} for rows in runs]
        series = [s for s in series if s]
        rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if not rounds:
            continue
        values = np.array([[s[r] for r in rounds] for s in series]) * 100
        mean, std = values.mean(0), values.std(0)
        color = cmap(i % cmap.N)
        ax.plot(rounds, mean, color=color, ls=styles[(i // cmap.N) % len(styles)] if len(labels) <= 20 else "-",
                label=f"{short[label]} (n={len(series)})")
        if len(series) > 1:
            ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if title or common:
        ax.set_title(title or " ".join(w for w in labels[0].split() if w in common), fontsize=9)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left", borderaxespad=0)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def plot_partition(hist: np.ndarray, path: Path, title: str = "") -> None:
    """Stacked bars: samples per class for each client (the partition's label skew at a glance)."""
    plt = pyplot()
    num_clients, num_classes = hist.shape
    fig, ax = plt.subplots(figsize=(min(16, 2 + 0.12 * num_clients), 4.2), dpi=120)
    bottom = np.zeros(num_clients)
    cmap = plt.get_cmap("tab20" if num_classes > 10 else "tab10")
    for c in range(num_classes):
        ax.bar(np.arange(num_clients), hist[:, c], bottom=bottom, width=0.9, color=cmap(c % cmap.N),
               label=str(c) if num_classes <= 20 else None)
        bottom += hist[:, c]
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    ax.set_title(title)
    if num_classes <= 20:
        ax.legend(title="class", fontsize=6, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
