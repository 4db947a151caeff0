"""fedsuite's per-round overhead against a plain PyTorch loop doing the identical SGD steps.

FedAvg, ``cnn`` on Fashion-MNIST from ../shared/data (or the generated Synthetic benchmark with an
MLP when that folder is absent), 100 clients, 10 per round, 1 local epoch, batch 50, central
evaluation every round in both. The plain loop uses the same partition, cohorts, initial weights,
per-client seeds and batch order as fedsuite, trains the cohort one client after another in this
process (torch using all cores), and averages in numpy: no Flower, no Ray, no serialisation.

    python benchmarks/overhead.py [--rounds 12] [--dataset fmnist|synthetic]

prints seconds per round (median over rounds 3..R, so start-up is excluded) for each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedsuite import launch, models, runtime
from fedsuite.arrays import weighted_mean
from fedsuite.config import build_config
from fedsuite.results import read_metrics
from fedsuite.seeding import seed_for
from fedsuite.strategy import FedSuiteStrategy, ServerSetup
from fedsuite.training import LocalData, evaluate

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def plain_loop(cfg, rounds: int) -> list[float]:
    """FedAvg written directly in PyTorch; returns seconds per round."""
    torch.set_num_threads(max(1, torch.get_num_threads()))
    bundle = runtime.load_bundle(cfg)
    global_arrays = models.initial_arrays(cfg, bundle)
    sampler = FedSuiteStrategy(ServerSetup(cfg=cfg, node_to_pid={p: p for p in range(cfg.num_clients)},
                                           initial=global_arrays))
    model = models.make_model(cfg, bundle)
    times = []
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        trained, sizes = [], []
        for pid in sampler.sample_cohort(rnd):
            idx = torch.from_numpy(np.asarray(runtime.client_indices(cfg, bundle, pid), dtype=np.int64))
            data = LocalData(bundle.x_train[idx], bundle.y_train[idx], bundle, "none")
            model.load_state_dict({k: torch.from_numpy(v) for k, v in global_arrays.items()})
            seed = seed_for(cfg.seed, pid, rnd)
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
            model.train()
            for _ in range(cfg.local_epochs):
                for x, y in data.batches(cfg.batch_size, gen):
                    opt.zero_grad(set_to_none=True)
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
            trained.append({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
            sizes.append(len(data))
        global_arrays = weighted_mean(trained, sizes, global_arrays)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in global_arrays.items()})
        acc = evaluate(model, bundle.x_test, bundle.y_test, bundle, cfg.eval_batch_size)["accuracy"]
        times.append(time.perf_counter() - t0)
        print(f"  plain round {rnd}: {times[-1]:.3f}s acc {acc:.4f}", flush=True)
    return times


def startup_parts(run_dir: Path) -> dict[str, float]:
    """Where the start-up went: ``summary.json``'s ``timing`` (seconds)."""
    timing = json.loads((run_dir / "summary.json").read_text()).get("timing", {})
    return {k: round(v, 2) for k, v in timing.items() if k.endswith("_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--dataset", choices=["fmnist", "synthetic"], default=None)
    ap.add_argument("--num-cpus", type=int, default=1, help="CPU cores per simulated client")
    args = ap.parse_args()
    dataset = args.dataset or ("fmnist" if (SHARED / "FashionMNIST" / "raw").is_dir() else "synthetic")
    work = Path(tempfile.mkdtemp(prefix="fedsuite-bench-"))
    if dataset == "fmnist":
        (work / "FashionMNIST").symlink_to(SHARED / "FashionMNIST")
    cfg = build_config(values={
        "strategy": "fedavg", "dataset": dataset, "model": "cnn" if dataset == "fmnist" else "mlp",
        "num_clients": 100, "clients_per_round": 10, "local_epochs": 1, "batch_size": 50, "lr": 0.05,
        "rounds": args.rounds, "partitioner": "dirichlet", "alpha": 0.5, "seed": 0, "data_root": str(work),
        "output_dir": str(work / "runs"), "run_name": "bench", "num_cpus": args.num_cpus,
    })
    print(f"dataset={dataset} model={cfg.model} clients=100 K=10 rounds={args.rounds}", flush=True)

    t0 = time.perf_counter()
    outcome = launch.simulate(cfg, work / "runs" / "bench")
    total = time.perf_counter() - t0
    assert outcome.ok, outcome.details
    rows = [r for r in read_metrics(work / "runs" / "bench") if r["round"] > 0]
    fed = [r["wall_seconds"] for r in rows]
    plain = plain_loop(cfg, args.rounds)

    fed_med, plain_med = statistics.median(fed[2:]), statistics.median(plain[2:])
    result = {
        "dataset": dataset, "model": cfg.model, "rounds": args.rounds,
        "fedsuite_s_per_round": round(fed_med, 4), "plain_s_per_round": round(plain_med, 4),
        "ratio": round(fed_med / plain_med, 3),
        "fedsuite_whole_run_s": round(total, 1), "fedsuite_startup_s": round(total - sum(fed), 1),
        "startup_parts_s": startup_parts(work / "runs" / "bench"),
        "final_acc_fedsuite": rows[-1]["test_accuracy"],
    }
    print(json.dumps(result, indent=2))
    print(f"fedsuite {fed_med:.3f} s/round, plain PyTorch {plain_med:.3f} s/round, ratio {fed_med / plain_med:.2f}x")


if __name__ == "__main__":
    main()
