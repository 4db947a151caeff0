"""Two runs at once (``fedsuite reproduce``/``sweep --jobs 2``): each pinned to its share of the cores,
as the queue runs them, against both left to share every core, and against the plain PyTorch loop
doing the same two runs' steps one after the other.

Unpinned, each run's private Ray takes every core: it starts one client actor per core, and its
server evaluates on every core while the other run trains, so OpenMP threads spin on cores the other
run holds. Pinned (``processes.core_slices``), each run's Ray, clients and evaluation keep to its own
share. What a run computes is the same either way (the benchmark checks the accuracies).

FedAvg, ``cnn`` on Fashion-MNIST from ../shared/data (else the generated Synthetic benchmark with an
MLP), 100 clients, 10 per round, 1 local epoch, batch 50, central evaluation every round, seeds 0
and 1 side by side:

    python benchmarks/jobs.py [--rounds 12] [--dataset fmnist|synthetic]

prints, per mode, the pair's seconds per round (the slower run's median over rounds 3..R: both
advance one round in that time), the ratio to the plain loop's seconds for one round of each run,
and pinned / unpinned.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
from pathlib import Path

import torch

from fedsuite.config import build_config
from fedsuite.launch.processes import core_slices

from harness import cpu_fedavg_setup, plain_fedavg, timed_cli_run



def pair(values: dict, folder: Path, slices) -> list[dict]:
    """Seeds 0 and 1 as two ``fedsuite simulate`` children at once, on ``slices`` (or unpinned)."""
    results: list[dict] = [{}, {}]

    def one(k: int) -> None:
        results[k] = timed_cli_run({**values, "seed": k}, folder / f"s{k}", cores=None if slices is None else slices[k])

    threads = [threading.Thread(target=one, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not all(results):
        raise RuntimeError(f"a run of the pair did not complete; see {folder}")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--dataset", choices=["fmnist", "synthetic"], default=None)
    args = ap.parse_args()
    slices = core_slices(2)
    if slices is None:
        raise SystemExit("this machine's processes cannot be pinned (no sched_setaffinity): nothing to compare")
    work, values = cpu_fedavg_setup(args.dataset, args.rounds, "fedsuite-bench-jobs-")
    dataset = values["dataset"]
    print(f"dataset={dataset} model={values['model']} clients=100 K=10 rounds={args.rounds}, two runs at once, "
          f"cores per run when pinned: {[sorted(s) for s in slices]}", flush=True)
    pair_s, accuracy = {}, {}
    for mode, cores in (("unpinned", None), ("pinned", slices)):
        runs = pair(values, work / mode, cores)
        pair_s[mode] = max(statistics.median(r["round_s"][2:]) for r in runs)
        accuracy[mode] = [[row["test_accuracy"] for row in r["rows"]] for r in runs]
    if accuracy["pinned"] != accuracy["unpinned"]:
        raise SystemExit("pinned and unpinned runs computed different accuracies: pinning changed a result")
    plain = sum(statistics.median(plain_fedavg(build_config(values={**values, "seed": k}), args.rounds,
                                               torch.device("cpu"), log=False).round_s[2:]) for k in (0, 1))
    result = {
        "dataset": dataset, "rounds": args.rounds, "plain_s_for_one_round_of_each": round(plain, 3),
        **{f"{m}_pair_s_per_round": round(v, 3) for m, v in pair_s.items()},
        **{f"{m}_ratio_to_plain": round(v / plain, 3) for m, v in pair_s.items()},
        "pinned_over_unpinned": round(pair_s["pinned"] / pair_s["unpinned"], 3),
    }
    print(json.dumps(result, indent=2))
    print(f"two runs at once: unpinned {pair_s['unpinned']:.3f} s/round ({pair_s['unpinned'] / plain:.2f}x plain), "
          f"pinned {pair_s['pinned']:.3f} s/round ({pair_s['pinned'] / plain:.2f}x plain); "
          f"pinned/unpinned {pair_s['pinned'] / pair_s['unpinned']:.2f}")


if __name__ == "__main__":
    main()
