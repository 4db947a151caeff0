"""The SAM-radius study on FedMRUR's CIFAR-10 cell (JPEG copy): apply the committed choosing rule to
the committed records and draw the figure.

    python experiments/fedmrur/rho_study.py            # prints the table and the choice, writes rho.png

The rule (``results/rho-cifar10/README.md``, committed before the runs): for each method and ρ, the run
**leaves chance by round 50** if one of its evaluations at rounds 5..50 reaches 20% test accuracy, and
**stays finite** if it completed its 300 rounds; the cell takes the largest ρ that passes for both
MoFedSAM and FedMRUR. ρ = 0.05 is read from the cell's own seed-0 runs (500 rounds, the same config,
seed and code) up to round 300; the other radii from ``results/rho-cifar10/runs/<method>-rho<ρ>/``.
A radius whose records are missing is reported as "not run" and cannot pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fedsuite.records.plots import pyplot
from fedsuite.records.rows import read_metrics
from fedsuite.records.rundir import summary

HERE = Path(__file__).resolve().parent
STUDY = HERE / "results" / "rho-cifar10"
CELL = HERE / "results" / "claims-cifar10" / "runs" / "claims-c10-dir0.3"
METHODS = {"mofedsam": "MoFedSAM", "fedmrur": "FedMRUR"}
RADII = (0.05, 0.1, 0.2, 0.5)
ROUNDS, BY_ROUND, CHANCE_LEFT = 300, 50, 0.20


def run_folder(method: str, rho: float) -> Path:
    """Where the records of ``method`` at ``rho`` are: the cell's seed-0 run for 0.05, else the study's."""
    return CELL / f"{method}-s0" if rho == 0.05 else STUDY / "runs" / f"{method}-rho{rho:g}"


def curve(folder: Path) -> list[tuple[int, float]]:
    """(round, test accuracy) of a run's evaluations up to round ``ROUNDS``."""
    return [(r["round"], r["test_accuracy"]) for r in read_metrics(folder)
            if r.get("test_accuracy") is not None and r["round"] <= ROUNDS]


def judge(folder: Path) -> dict:
    """The rule's two tests for one run, with the numbers they read."""
    if not (folder / "metrics.jsonl").is_file():
        return {"ran": False, "passes": False}
    points = curve(folder)
    early = [a for r, a in points if 0 < r <= BY_ROUND]
    rounds_done = max((r for r, _ in points), default=0)
    completed = summary(folder).get("status") == "completed" and rounds_done >= ROUNDS
    left = bool(early) and max(early) >= CHANCE_LEFT
    return {"ran": True, "best_by_50": max(early, default=float("nan")), "left_chance": left,
            "stayed_finite": completed, "passes": left and completed, "points": points,
            "final": sum(a for _, a in points[-10:]) / len(points[-10:]) if points else float("nan")}


def main() -> int:
    results = {(m, rho): judge(run_folder(m, rho)) for m in METHODS for rho in RADII}
    print(f"| method | ρ | best test accuracy by round {BY_ROUND} | left chance | completed {ROUNDS} rounds | "
          f"mean of its last 10 evaluations to round {ROUNDS} | passes |")
    print("|---|---|---|---|---|---|---|")
    for (m, rho), r in results.items():
        if not r["ran"]:
            print(f"| {METHODS[m]} | {rho:g} | not run | | | | no |")
            continue
        print(f"| {METHODS[m]} | {rho:g} | {100 * r['best_by_50']:.1f}% | {'yes' if r['left_chance'] else 'no'} | "
              f"{'yes' if r['stayed_finite'] else 'no'} | {100 * r['final']:.2f}% | {'yes' if r['passes'] else 'no'} |")
    passing = [rho for rho in RADII if all(results[m, rho]["passes"] for m in METHODS)]
    choice = max(passing) if passing else None
    print()
    print(f"Radii that pass for both methods: {', '.join(f'{r:g}' for r in passing) or 'none'}; "
          + (f"the rule picks ρ = {choice:g}." if choice is not None else "none passes: ρ = 0.05 stays, named as failed."))

    plt = pyplot()
    fig, axes = plt.subplots(1, len(METHODS), figsize=(11, 4), dpi=120, sharey=True)
    for ax, m in zip(axes, METHODS):
        for rho in RADII:
            r = results[m, rho]
            if r["ran"]:
                ax.plot(*zip(*[(x, 100 * a) for x, a in r["points"]]), label=f"ρ = {rho:g}"
                        + ("" if r["passes"] else " (fails the rule)"))
        ax.axvline(BY_ROUND, color="black", lw=0.8, ls=":")
        ax.axhline(100 * CHANCE_LEFT, color="black", lw=0.8, ls=":")
        ax.set_title(f"{METHODS[m]}, seed 0", fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("test accuracy (%)")
    fig.suptitle("SAM radius on FedMRUR's CIFAR-10 (JPEG copy) cell, FedMR's CNN: dotted, round 50 and 20%", fontsize=9)
    fig.savefig(STUDY / "rho.png", bbox_inches="tight")
    plt.close(fig)
    print(f"figure -> {STUDY / 'rho.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
