"""Per-round cost of each method's client rule relative to FedAvg, and of FedMR's server step.

Part 1 runs one client's local round (the shared loop, ``fedsuite.training``) for every registered
method on the same data, model and seed, and prints seconds per local round and the ratio to
FedAvg's rule — the number the issues bound (SAM family ≈ 2x, FedMRUR ≤ 2.5x, FedNLR ≤ 1.3x).
Methods whose client needs server-sent records (SCAFFOLD's c, FedCM's momentum, FedGen's generator)
get zero-valued ones of the right shape, which costs the same arithmetic as real ones.

Part 2 times FedMR's recombination of a K=10 pool of ResNet-20 and VGG-16 models (server work per
round) and prints it relative to a plain PyTorch loop's local training of the same round.

    python benchmarks/methods.py [--dataset fmnist|synthetic] [--model cnn] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedsuite import models, registry, runtime
from fedsuite.config import build_config
from fedsuite.models import build_model
from fedsuite.plugins import active_plugins
from fedsuite.state import ClientState
from fedsuite.training import LocalData, LocalTask, run_local_training

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

#: server-sent records some client rules read, as zero arrays shaped like the model
EXTRA_RECORDS = ("server-cv", "momentum", "start")


def local_round_seconds(method: str, base: dict, work: Path, repeats: int) -> float:
    cfg = build_config(values={**base, "strategy": method})
    bundle = runtime.load_bundle(cfg)
    idx = torch.from_numpy(np.asarray(runtime.client_indices(cfg, bundle, 0), dtype=np.int64))
    data = LocalData(bundle.x_train[idx], bundle.y_train[idx], bundle, "none")
    times = []
    for rep in range(repeats + 1):
        torch.manual_seed(0)
        model = models.make_model(cfg, bundle)
        received = {k: v.detach().clone() for k, v in model.state_dict().items()}
        extras = {name: {k: torch.zeros_like(v) for k, v in received.items()} for name in EXTRA_RECORDS}
        task = LocalTask(model=model, received=received, extras=extras, config={"server-round": 2, "lr": cfg.lr},
                         cfg=cfg, data=data, state=ClientState(None, work / method, 0), partition_id=0,
                         server_round=2, lr=cfg.lr, device=torch.device("cpu"),
                         generator=torch.Generator().manual_seed(0))
        rule = cfg.method.client(plugins=active_plugins(cfg))
        t0 = time.perf_counter()
        try:
            run_local_training(rule, task)
        except (KeyError, RuntimeError) as exc:  # a rule that needs a real server record we lack
            print(f"  {method}: skipped ({exc.__class__.__name__}: {exc})")
            return float("nan")
        if rep:  # the first repetition warms up caches
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-recombination", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dataset = args.dataset or ("fmnist" if (SHARED / "FashionMNIST" / "raw").is_dir() else "synthetic")
    work = Path(tempfile.mkdtemp(prefix="fedsuite-methods-"))
    if dataset == "fmnist":
        (work / "FashionMNIST").symlink_to(SHARED / "FashionMNIST")
    base = {"dataset": dataset, "model": args.model or ("cnn" if dataset == "fmnist" else "mlp"),
            "num_clients": 100, "partitioner": "iid", "local_epochs": 1, "batch_size": 50, "lr": 0.01,
            "data_root": str(work), "seed": 0}
    print(f"Part 1: one client's local round ({dataset}, {base['model']}, ~600 samples, batch 50, 1 thread)")
    ref = local_round_seconds("fedavg", base, work, args.repeats)
    rows = []
    for method in registry.methods():
        sec = ref if method == "fedavg" else local_round_seconds(method, base, work, args.repeats)
        rows.append((method, sec))
    for plugin, key, value in (("fedavg + relaxed init", "relaxed_init.beta", 0.1),
                               ("fedavg + neuron-wise lr", "neuron_lr.preset", "paper")):
        rows.append((plugin, local_round_seconds("fedavg", {**base, key: value}, work, args.repeats)))
    for method, sec in rows:
        print(f"  {method:26s} {sec:7.3f} s/round   {sec / ref:5.2f}x FedAvg")
    if not args.skip_recombination:
        print("Part 2: FedMR server recombination vs the round's training (1 thread)")
        recombination_cost()


if __name__ == "__main__":
    main()
