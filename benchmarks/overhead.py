"""fedsuite's per-round overhead against a plain PyTorch loop doing the identical SGD steps.

FedAvg, ``cnn`` on Fashion-MNIST from ../shared/data (or the generated Synthetic benchmark with an
MLP when that folder is absent), 100 clients, 10 per round, 1 local epoch, batch 50, central
evaluation every round in both. The plain loop uses the same partition, cohorts, initial weights,
per-client seeds and batch order as fedsuite, trains the cohort one client after another in this
process (torch using all cores): ``harness.plain_fedavg``, no Flower, no Ray, no serialisation; then
once more with the malloc thresholds that fedsuite's processes set (``fedsuite.engine.allocator``),
so that the ratio can be read both ways: against PyTorch as a plain script runs it, and with that
setting taken out of the comparison.
fedsuite runs as users run it: ``fedsuite simulate`` as a child process (``harness.timed_cli_run``).

    python benchmarks/overhead.py [--rounds 12] [--dataset fmnist|synthetic] [--num-cpus 2]
                                  [--ray-address HOST:PORT] [--engine flower|inprocess]

prints seconds per round (median over rounds 3..R, so start-up is excluded) for each, the ratio, and
fedsuite's start-up: from the command's start to the round-0 evaluation (the first round begins).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from fedsuite.config import build_config
from fedsuite.engine import allocator

from harness import cpu_fedavg_setup, plain_fedavg, timed_cli_run



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--dataset", choices=["fmnist", "synthetic"], default=None)
    ap.add_argument("--num-cpus", type=int, default=1, help="CPU cores per simulated client")
    ap.add_argument("--ray-address", default=None,
                    help="run the clients on this running Ray cluster (`ray start --head`) instead of a "
                         "private Ray started by the run: the start-up without Ray's own start")
    ap.add_argument("--engine", choices=["flower", "inprocess"], default="flower",
                    help="the run's engine: Flower's Simulation Engine (what users run) or the in-process one")
    args = ap.parse_args()
    work, values = cpu_fedavg_setup(args.dataset, args.rounds, "fedsuite-bench-")
    dataset = values["dataset"]
    values["num_cpus"] = args.num_cpus
    values["engine"] = args.engine
    if args.ray_address:
        values["ray_address"] = args.ray_address
    print(f"dataset={dataset} model={values['model']} clients=100 K=10 rounds={args.rounds} engine={args.engine}",
          flush=True)

    run = timed_cli_run(values, work / "runs" / "bench")
    fed = run["round_s"]
    cfg = build_config(values=values)
    plain = plain_fedavg(cfg, args.rounds, torch.device("cpu")).round_s
    # the same loop once more with the malloc thresholds fedsuite's processes set
    # (fedsuite.engine.allocator): how much of the ratio is that setting, how much the engine
    tuned = plain_fedavg(cfg, args.rounds, torch.device("cpu"), log=False).round_s if allocator.tune() else None

    fed_med, plain_med = statistics.median(fed[2:]), statistics.median(plain[2:])
    tuned_med = statistics.median(tuned[2:]) if tuned else None
    result = {
        "dataset": dataset, "model": values["model"], "rounds": args.rounds, "engine": args.engine,
        "fedsuite_s_per_round": round(fed_med, 4), "plain_s_per_round": round(plain_med, 4),
        "ratio": round(fed_med / plain_med, 3),
        "plain_with_fedsuites_allocator_s_per_round": round(tuned_med, 4) if tuned_med else None,
        "ratio_to_that": round(fed_med / tuned_med, 3) if tuned_med else None,
        "fedsuite_whole_run_s": round(run["total_s"], 1), "fedsuite_startup_s": round(run["startup_s"], 1),
        "startup_parts_s": run["startup_parts_s"],
        "final_acc_fedsuite": run["rows"][-1]["test_accuracy"],
    }
    print(json.dumps(result, indent=2))
    print(f"fedsuite {fed_med:.3f} s/round, plain PyTorch {plain_med:.3f} s/round, ratio {fed_med / plain_med:.2f}x; "
          f"start-up (command to round 1) {run['startup_s']:.1f} s")
    if tuned_med:
        print(f"the plain loop with fedsuite's malloc thresholds (fedsuite.engine.allocator): {tuned_med:.3f} s/round, "
              f"ratio {fed_med / tuned_med:.2f}x")


if __name__ == "__main__":
    main()
