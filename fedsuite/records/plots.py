"""fedsuite's figures, drawn on matplotlib's file-only Agg backend: a run's accuracy curve and its pool
diagnostics (``fedsuite.records.recording``), a report's curves with a ± sample std band per setting
(``fedsuite.records.results``, ``reproduce``, ``sweep``, a search) and its runs' server momentum, a
reproduce report's claimed orderings against the paper's differences, and a partition's label skew
(``fedsuite partition``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend, imported when a plot is drawn: 0.25 s of
    imports that the CLI and the simulation process would otherwise pay before the first round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(curves: dict[str, list[dict[str, Any]]], path: Path, title: str | None = None) -> None:
    """Test accuracy versus round, one line per run (or per group of seeds: mean ± sample std band)."""
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


def has_client_evaluations(client_rows: list[dict[str, Any]]) -> bool:
    """Whether a run's ``clients.jsonl`` rows hold a federated evaluation (``federated_eval``)."""
    return any(r.get("eval_accuracy") is not None for r in client_rows)


def plot_clients(client_rows: list[dict[str, Any]], path: Path, title: str | None = None) -> None:
    """The distribution of the clients' own test accuracies over the rounds (``clients.jsonl``): one
    dot per client and evaluated round, the client mean and the worst decile's mean (the ⌈m/10⌉
    lowest of the round's m accuracies) as lines; a second panel the same for the personalised
    models where the run fine-tuned them (``finetune_steps``)."""
    plt = pyplot()
    kinds = [("eval_accuracy", "global model")]
    if any(r.get("personal_accuracy") is not None for r in client_rows):
        kinds.append(("personal_accuracy", "personalised (fine-tuned)"))
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.4 * len(kinds), 4.0), dpi=120, squeeze=False)
    for ax, (key, label) in zip(axes[0], kinds):
        by_round: dict[int, list[float]] = {}
        for r in client_rows:
            if r.get(key) is not None:
                by_round.setdefault(r["round"], []).append(100 * r[key])
        rounds = sorted(by_round)
        xs = [t for t in rounds for _ in by_round[t]]
        ax.scatter(xs, [a for t in rounds for a in by_round[t]], s=6, alpha=0.35, color="C0", label="a client")
        ax.plot(rounds, [np.mean(by_round[t]) for t in rounds], color="C1", label="client mean")
        worst = [np.mean(sorted(by_round[t])[: max(1, int(np.ceil(len(by_round[t]) / 10)))]) for t in rounds]
        ax.plot(rounds, worst, color="C3", label="worst 10% (mean)")
        ax.set_xlabel("round")
        ax.set_ylabel("accuracy on the client's own test data (%)")
        ax.set_title(label if title is None else f"{title}: {label}", fontsize=9)
        ax.grid(alpha=0.3)
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


def split_labels(labels: list[str]) -> tuple[str, dict[str, str]]:
    """The words every label shares (in the first label's order: a figure's title) and each label
    without them (its legend entry; the whole label where nothing else is left)."""
    common = set.intersection(*(set(label.split()) for label in labels)) if len(labels) > 1 else set()
    shared = " ".join(w for w in labels[0].split() if w in common) if labels else ""
    return shared, {label: " ".join(w for w in label.split() if w not in common) or label for label in labels}


def plot_groups(curves: dict[str, list[list[dict[str, Any]]]], path: Path, title: str | None = None) -> None:
    """Mean accuracy versus round per group, with a ± sample std band over seeds (n − 1). Words shared by every
    group label (model, dataset, partition) go to the title (or ``title``, when given), so the legend
    names what differs."""
    plt = pyplot()
    labels = list(curves)
    shared, short = split_labels(labels)
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
        mean, std = values.mean(0), (values.std(0, ddof=1) if len(series) > 1 else None)
        color = cmap(i % cmap.N)
        ax.plot(rounds, mean, color=color, ls=styles[(i // cmap.N) % len(styles)] if len(labels) <= 20 else "-",
                label=f"{short[label]} (n={len(series)})")
        if len(series) > 1:
            ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if title or shared:
        ax.set_title(title or shared, fontsize=9)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left", borderaxespad=0)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def has_server_momentum(rows: list[dict[str, Any]]) -> bool:
    """Whether a run's rows carry the server momentum's records (``strategies/momentum.py``: FedCM,
    MoFedSAM, FedMRUR)."""
    return any(r.get("momentum_norm") is not None for r in rows)


def plot_server_momentum(curves: dict[str, list[list[dict[str, Any]]]], path: Path,
                         loop_limits: dict[str, float] | None = None, window: int = 10,
                         title: str | None = None) -> None:
    """The server momentum of each group of runs that records it (the others are left out), mean over
    its seeds versus round:

    1. ‖m^t‖, the momentum the server broadcasts (log scale);
    2. d_t = ν / ‖Δ̄‖, the clients' mean update norm over the norm of their mean update, as a moving
       mean over ``window`` rounds. ``loop_limits[label]`` = 1/(1−α) is drawn for a group whose
       momentum is built from the normalised update Δ = d_t Δ̄: its round's momentum is then about
       d_t (α ḡ + (1−α) m^t), which grows while d_t (1−α) > 1, that is while d_t is above the line.

    Names and colours are those of :func:`plot_groups` for the same ``curves``; ``title`` (or the
    words every label shares) heads the figure."""
    plt = pyplot()
    groups = {label: [rows for rows in runs if has_server_momentum(rows)] for label, runs in curves.items()}
    groups = {label: runs for label, runs in groups.items() if runs}
    if not groups:
        raise ValueError("no run records a server momentum (momentum_norm): FedCM, MoFedSAM and FedMRUR do")
    everyone = list(curves)  # names and colours as in the report's accuracy figure (plot_groups)
    shared, short = split_labels(everyone)
    cmap = plt.get_cmap("tab20" if len(everyone) > 10 else "tab10")
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.2), dpi=120)
    for label, runs in groups.items():
        color = cmap(everyone.index(label) % cmap.N)
        for ax, key, smooth in ((axes[0], "momentum_norm", 1), (axes[1], "d_t", window)):
            series = [{r["round"]: r[key] for r in rows if r.get(key) is not None} for rows in runs]
            rounds = sorted(set.intersection(*(set(s) for s in series)))
            if not rounds:
                continue
            values = np.array([[s[r] for r in rounds] for s in series], dtype=float).mean(0)
            if smooth > 1 and len(values) >= smooth:
                values = np.convolve(values, np.ones(smooth) / smooth, mode="valid")
                rounds = rounds[smooth - 1:]
            ax.plot(rounds, values, color=color, lw=1.2, label=f"{short[label]} (n={len(runs)})")
        limit = (loop_limits or {}).get(label)
        if limit is not None:
            axes[1].axhline(limit, color=color, ls=":", lw=1.2, label=f"1/(1−α) = {limit:.3g}: {short[label]}")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("‖m‖, the broadcast momentum")
    axes[1].set_ylabel(f"d_t = ν / ‖Δ̄‖ (mean of {window} rounds)" if window > 1 else "d_t = ν / ‖Δ̄‖")
    for ax in axes:
        ax.set_xlabel("round")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6.5, bbox_to_anchor=(1.01, 1), loc="upper left", borderaxespad=0)
    if title or shared:
        fig.suptitle(title or shared, fontsize=9)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def plot_claims(orderings: list[dict[str, Any]], path: Path, unit: str = "points", title: str | None = None,
                level: str = "95%") -> None:
    """The claimed orderings of a report as a forest plot, one line each, top to bottom: each paired
    seed's difference (dots), their mean with its t-interval as a bar (the verdict's interval at
    ``level``, coloured by the verdict), the paper's difference (a black diamond) and zero (a vertical
    line). ``orderings``: dicts with ``label``, ``differences`` (per seed), ``mean`` and
    ``half_width`` (the interval's, None without two pairs), ``paper`` (the paper's difference),
    ``verdict`` and its ``colour`` (a matplotlib colour); ``unit`` names the difference's unit."""
    plt = pyplot()
    n = len(orderings)
    fig, ax = plt.subplots(figsize=(8.0, 0.9 + 0.42 * n), dpi=120)
    for y, o in zip(range(n - 1, -1, -1), orderings):
        colour = o["colour"]
        diffs = list(o["differences"])
        if diffs:
            ax.plot(diffs, [y] * len(diffs), "o", ms=3.5, color=colour, alpha=0.45, mec="none")
        if o["mean"] is not None:
            half = o["half_width"] if o["half_width"] is not None else 0.0
            ax.errorbar([o["mean"]], [y], xerr=[[half], [half]], fmt="s", ms=5, color=colour, capsize=3, lw=1.4)
        ax.plot([o["paper"]], [y], "D", ms=5, color="black", mfc="none", mew=1.2)
        ax.annotate(o["verdict"], xy=(1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=7,
                    color=colour)
    ax.axvline(0.0, color="black", lw=0.8, alpha=0.6)
    ax.set_yticks(range(n - 1, -1, -1), [o["label"] for o in orderings], fontsize=7)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel(f"difference, better minus worse ({unit}): seeds (dots), mean and its {level} "
                  "t-interval (square), the paper's (diamond)",
                  fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def plot_differences(curves: list[dict[str, Any]], path: Path, level: str = "95%", title: str | None = None) -> None:
    """Each claimed ordering's paired difference versus round, a panel each: the seeds' differences
    (thin), their mean with its t-interval band (coloured by the final verdict), the paper's difference
    (dashed) and zero. ``curves``: dicts with ``label``, ``curve`` (a ``DifferenceCurve`` of
    ``fedsuite.queues.reproduce.verdicts``), ``paper`` and ``colour``."""
    plt = pyplot()
    cols = min(2, len(curves))
    rows = -(-len(curves) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.6 * cols, 3.0 * rows), dpi=120, squeeze=False, layout="constrained")
    for ax, o in zip(axes.flat, curves):
        c, colour = o["curve"], o["colour"]
        for seed in c.per_seed:
            ax.plot(c.rounds, seed, color=colour, lw=0.6, alpha=0.35)
        ax.plot(c.rounds, c.mean, color=colour, lw=1.5, label=f"mean of {len(c.per_seed)} seeds" if len(c.per_seed) > 1 else "one seed")
        if c.half_width is not None:
            ax.fill_between(c.rounds, c.mean - c.half_width, c.mean + c.half_width, color=colour, alpha=0.18,
                            label=f"{level} t-interval")
        ax.axhline(o["paper"], color="black", ls="--", lw=1.0, label="the paper's difference")
        ax.axhline(0.0, color="black", lw=0.6, alpha=0.6)
        ax.set_title(o["label"], fontsize=8)
        ax.set_xlabel("round")
        ax.set_ylabel("difference (points)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(curves):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


#: above this many clients a partition is drawn as an image (:func:`plot_partition`): bars, or even
#: one filled step area per class, of 60,000 clients took minutes to draw
PARTITION_BARS_MAX = 300


def plot_partition(hist: np.ndarray, path: Path, title: str = "") -> str:
    """The partition's label skew at a glance, from ``hist`` (samples per client and class): stacked
    bars, samples per class for each client; past :data:`PARTITION_BARS_MAX` clients a heatmap
    instead (:func:`plot_partition_heatmap`), which the title says. Returns the title drawn."""
    num_clients, num_classes = hist.shape
    if num_clients > PARTITION_BARS_MAX:
        return plot_partition_heatmap(hist, path, title)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(16, 2 + 0.12 * num_clients), 4.2), dpi=120)
    bottom = np.zeros(num_clients)
    cmap = plt.get_cmap("tab20" if num_classes > 10 else "tab10")
    x = np.arange(num_clients)
    for c in range(num_classes):
        ax.bar(x, hist[:, c], bottom=bottom, width=0.9, color=cmap(c % cmap.N), label=str(c) if num_classes <= 20 else None)
        bottom += hist[:, c]
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    ax.set_title(title)
    if num_classes <= 20:
        ax.legend(title="class", fontsize=6, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return title


#: the most columns of a partition's heatmap: past it, each column is the mean of neighbouring clients
PARTITION_COLUMNS = 2000


def plot_partition_heatmap(hist: np.ndarray, path: Path, title: str = "") -> str:
    """A partition of many clients as one image: a column per client, a row per class, coloured by
    the share of the client's samples in that class, the clients ordered by their main class (then
    by its share), under their sample counts. Past :data:`PARTITION_COLUMNS` clients a column is
    the mean of neighbouring clients in that order (and the counts their mean and range): in
    client-id order a mean would wash the skew out, in this one it keeps it (a block per main class,
    as wide as the clients it is the main class of, as bright as their skew). The work is one image
    of at most :data:`PARTITION_COLUMNS` x classes, whatever the number of clients (60,000 in about a
    second, where bars or filled areas per client took minutes). Returns the title drawn, which
    says how the figure shows the clients."""
    plt = pyplot()
    num_clients, num_classes = hist.shape
    sizes = hist.sum(1)
    share = np.divide(hist, sizes[:, None], out=np.zeros(hist.shape, dtype=float), where=sizes[:, None] > 0)
    order = np.lexsort((-share.max(1), share.argmax(1)))
    share, sizes = share[order], sizes[order]
    edges = np.linspace(0, num_clients, min(num_clients, PARTITION_COLUMNS) + 1).round().astype(int)
    starts, widths = edges[:-1], np.diff(edges)  # every column holds at least one client
    centers = (edges[:-1] + edges[1:] - 1) / 2
    fig, (top, ax) = plt.subplots(2, 1, figsize=(12.0, 5.2), dpi=120, sharex=True, layout="constrained",
                                  gridspec_kw={"height_ratios": [1, 3]})
    if widths.max() > 1:
        top.fill_between(centers, np.minimum.reduceat(sizes, starts), np.maximum.reduceat(sizes, starts),
                         color="0.75", lw=0, label="range")
        top.plot(centers, np.add.reduceat(sizes, starts) / widths, color="black", lw=0.6, label="mean")
        top.legend(fontsize=6, loc="upper right")
    else:
        top.plot(centers, sizes, color="black", lw=0.6)
    top.set_ylabel("samples")
    top.grid(alpha=0.3)
    columns = np.add.reduceat(share, starts, axis=0) / widths[:, None]
    image = ax.imshow(columns.T, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=1.0,
                      extent=(-0.5, num_clients - 0.5, num_classes - 0.5, -0.5))
    ax.set_xlabel("clients, ordered by their main class")
    ax.set_ylabel("class")
    if num_classes <= 20:
        ax.set_yticks(range(num_classes))
    fig.colorbar(image, ax=[top, ax], label="share of the client's samples", fraction=0.03, pad=0.01)
    mean = f"; a column is the mean of {num_clients / len(widths):.3g} clients" if widths.max() > 1 else ""
    shown = (f"{title}: class shares per client as a heatmap, clients ordered by their main class "
             f"(more than {PARTITION_BARS_MAX} clients: no bars{mean})")
    top.set_title(shown, fontsize=9)
    fig.savefig(path)
    plt.close(fig)
    return shown
