"""Per-round cost of each method relative to FedAvg, and of FedMR's server step.

Part 1 runs every registered method (and FedAvg with each plug-in) for a few rounds on the
in-process engine (``fedsuite.simulate(engine="inprocess")``: the clients called one after another
in this process, the real client rules with the real server records: SCAFFOLD's c, FedCM's momentum,
FedGen's generator), on the same data, model, cohorts and seed, and prints the median seconds of
its rounds 2..R-1 (training and the server step; evaluation only after round R) and the ratio to
FedAvg's. Client rules dominate a round here, so the ratio is the number the issues bound (SAM
family about 2x, FedMRUR at most 2.5x, FedNLR at most 1.3x).

Part 2 times FedMR's recombination of a K=10 pool of ResNet-20 and VGG-16 models (server work per
round) and prints it relative to a plain PyTorch loop's local training of the same round.

    python benchmarks/methods.py [--dataset fmnist|synthetic] [--model cnn] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import fedsuite
from fedsuite.method import registry
from fedsuite.models import build_model

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def round_seconds(name: str, settings: dict, work: Path, rounds: int) -> float:
    """Median wall seconds of rounds 2..R-1 of an in-process run with ``settings``."""
    run = fedsuite.simulate(engine="inprocess", rounds=rounds, eval_every=rounds, output_dir=str(work),
                            run_name=name, progress=False, **settings)
    timed = run.metrics[(run.metrics["round"] >= 2) & (run.metrics["round"] < rounds)]
    return statistics.median(timed["wall_seconds"])


def recombination_cost(k: int = 10) -> None:
    from strategies.fedmr import draw_permutations, make_units, recombine

    for name in ("resnet20", "vgg16"):
        model = build_model(name, 10, (3, 32, 32))
        base = {kk: v.detach().numpy() for kk, v in model.state_dict().items()}
        pool = [{kk: v + np.float32(i) if v.dtype.kind == "f" else v for kk, v in base.items()} for i in range(k)]
        units = make_units(list(base), "tensor")
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        reps = 5
        for _ in range(reps):
            recombine(pool, units, draw_permutations(rng, len(units), k))
        rec = (time.perf_counter() - t0) / reps
        # one local step of the same model on a CIFAR-size batch, times the steps of a round
        x, y = torch.randn(50, 3, 32, 32), torch.randint(0, 10, (50,))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        t0 = time.perf_counter()
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        step = (time.perf_counter() - t0) / 3
        round_train = step * 10 * k  # FedMR's CIFAR setting: 500 samples, batch 50 -> 10 steps/epoch, 1 epoch shown
        mb = sum(v.nbytes for v in base.values()) / 2**20
        print(f"  {name:9s} ({mb:6.1f} MB/model, K={k}): recombination {rec * 1000:8.1f} ms/round, "
              f"one epoch of the round's local training {round_train:7.1f} s -> ratio {rec / round_train:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", choices=["fmnist", "synthetic"], default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=5, help="rounds per run (at least 3; rounds 2..R-1 are timed)")
    ap.add_argument("--skip-recombination", action="store_true")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be at least 3")
    torch.set_num_threads(1)
    dataset = args.dataset or ("fmnist" if (SHARED / "FashionMNIST" / "raw").is_dir() else "synthetic")
    work = Path(tempfile.mkdtemp(prefix="fedsuite-methods-"))
    if dataset == "fmnist":
        (work / "FashionMNIST").symlink_to(SHARED / "FashionMNIST")
    base = {"dataset": dataset, "model": args.model or ("cnn" if dataset == "fmnist" else "mlp"),
            "num_clients": 100, "clients_per_round": 4, "partitioner": "iid", "local_epochs": 1, "batch_size": 50,
            "lr": 0.01, "data_root": str(work), "seed": 0, "num_cpus": 1}
    print(f"Part 1: rounds of 4 clients on the in-process engine ({dataset}, {base['model']}, ~600 samples "
          f"each, batch 50, 1 thread), median of rounds 2..{args.rounds - 1}")
    runs = work / "runs"
    rows = [(method, round_seconds(method, {**base, "strategy": method}, runs, args.rounds))
            for method in registry.methods()]
    for plugin, key, value in (("fedavg + relaxed init", "relaxed_init.beta", 0.1),
                               ("fedavg + neuron-wise lr", "neuron_lr.preset", "paper")):
        name = plugin.replace(" + ", "-").replace(" ", "-")
        rows.append((plugin, round_seconds(name, {**base, "strategy": "fedavg", key: value}, runs, args.rounds)))
    ref = dict(rows)["fedavg"]
    for method, sec in rows:
        print(f"  {method:26s} {sec:7.3f} s/round   {sec / ref:5.2f}x FedAvg")
    if not args.skip_recombination:
        print("Part 2: FedMR server recombination vs the round's training (1 thread)")
        recombination_cost()


if __name__ == "__main__":
    main()
