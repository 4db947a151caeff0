"""Seconds per round at paper scale on a GPU: fedsuite against the plain PyTorch loop.

FedInit's scale (the FedInit paper's CIFAR-10 setting, ``experiments/fedinit/resnet18gn_cifar10.toml``): ResNet-18-GN
(11.2 M parameters), 100 clients with 500 samples each, 10 per round, 5 local epochs of batch 50
(500 SGD steps per round), flip + crop augmentation, central evaluation every round. And FedMR's CNN
(``experiments/fedmr/cnn_cifar10.toml``) at 5 local epochs, also evaluated every round. The data are
generated CIFAR-10-shaped arrays (50 000 + 10 000 uint8 images 32x32x3, 10 labels), written once as
an ``npz`` dataset, so nothing is downloaded; speed does not depend on the pixel values.

For each method, ``fedsuite simulate`` runs as users run it (``harness.timed_cli_run``: the CLI, its
simulation process running Flower's Simulation Engine, Ray actors sharing the GPU with
``--num-gpus``), and the plain loop
(``harness.plain_fedavg``: FedAvg, the same cohorts, steps and evaluation, one client after another
in one process) runs the same model. ``--engines inprocess`` times the in-process engine too (every
client called in the run's own process, no Ray: ``fedsuite simulate --engine inprocess``).
Printed per method and engine: fedsuite s/round (median of rounds 2..R),
the plain FedAvg loop's s/round for that model, their ratio, the target (benchmarks/README.md) and
whether it is met; and the plain loop again under ``torch.use_deterministic_algorithms(True)`` (as
fedsuite's clients train on a GPU: deterministic cuDNN and cuBLAS kernels), with fedsuite's ratio to
it, which says how much of fedsuite's time is the price of bit-for-bit repeatable runs. The whole
script runs with fedsuite's ``CUBLAS_WORKSPACE_CONFIG`` (``fedsuite.launch.processes``), which deterministic
cuBLAS needs, so that the two plain loops differ in the switch alone. SAM-type methods do two forward/backward passes per step, so their ratio to plain FedAvg is
about 2 by construction; their target says so.

    python benchmarks/gpu_round.py [--rounds 6] [--num-gpus 0.25] [--methods fedavg fedinit ...]
    python benchmarks/gpu_round.py --engines flower inprocess   # both engines, one plain loop per model
    python benchmarks/gpu_round.py --small --device cpu       # a minutes-long check of the script

``--small`` shrinks everything (2 000 images, 10 clients, 4 per round, 1 epoch, 3 rounds) to check
the script end to end on a CPU; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import tomllib
from pathlib import Path

import numpy as np
import torch

from fedsuite.config import build_config
from fedsuite.launch.processes import DETERMINISTIC_CUBLAS_WORKSPACE

from harness import plain_fedavg, timed_cli_run

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS_WORKSPACE)  # read at cuBLAS's first use: before any CUDA work

ROOT = Path(__file__).resolve().parent.parent
FEDINIT_SCALE = ROOT / "experiments" / "fedinit" / "resnet18gn_cifar10.toml"
FEDMR_CNN = ROOT / "experiments" / "fedmr" / "cnn_cifar10.toml"

#: method -> (base config, strategy, target s/round on one H100, as in benchmarks/README.md)
METHODS: dict[str, tuple[Path, str, float]] = {
    "fedavg": (FEDINIT_SCALE, "fedavg", 1.0),
    "fedinit": (FEDINIT_SCALE, "fedinit", 1.0),
    "fedsam": (FEDINIT_SCALE, "fedsam", 2.0),
    "mofedsam": (FEDINIT_SCALE, "mofedsam", 2.0),
    "fedmrur": (FEDINIT_SCALE, "fedmrur", 2.0),
    "fedmr-cnn": (FEDMR_CNN, "fedmr", 0.3),
}


def cifar10_shaped(path: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """An ``npz`` dataset with CIFAR-10's shapes and dtypes (NHWC uint8, labels 0..9)."""
    rng = np.random.default_rng(seed)
    np.savez(path,
             x_train=rng.integers(0, 256, (n_train, 32, 32, 3), dtype=np.uint8),
             y_train=rng.integers(0, 10, n_train, dtype=np.int64),
             x_test=rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8),
             y_test=rng.integers(0, 10, n_test, dtype=np.int64))
    return path


def method_config(name: str, data: Path, args, engine: str = "flower") -> dict:
    """The run's config: the paper-scale TOML with the generated data and this benchmark's settings."""
    base, strategy, _ = METHODS[name]
    values = tomllib.loads(base.read_text())
    values.update({
        "strategy": strategy, "dataset": "npz", "dataset_options": {"path": data.name, "num_classes": 10},
        "data_root": str(data.parent), "rounds": args.rounds, "eval_every": 1, "local_epochs": 5,
        "num_gpus": args.num_gpus if args.device == "cuda" and engine == "flower" else 0.0, "device": args.device,
        "engine": engine,
        "partitioner": "iid", "seed": 0,
    })
    if args.small:
        values.update({"num_clients": 10, "clients_per_round": 4, "local_epochs": 1})
    return values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--num-gpus", type=float, default=0.25, help="GPU share per simulated client (fedsuite)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--engines", nargs="+", choices=["flower", "inprocess"], default=["flower"],
                    help="what runs the clients (fedsuite simulate --engine); each is timed")
    ap.add_argument("--small", action="store_true", help="tiny sizes: check the script on a CPU")
    ap.add_argument("--out", type=Path, default=None, help="folder for the data and runs (default: a temp dir)")
    args = ap.parse_args()
    if args.small:
        args.rounds = min(args.rounds, 3)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device is visible; use --device cpu --small to check the script on a CPU")
    device = torch.device(args.device)
    work = (args.out or Path(tempfile.mkdtemp(prefix="fedsuite-gpu-bench-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    n_train, n_test = (2000, 500) if args.small else (50000, 10000)
    data = cifar10_shaped(work / "cifar10_shaped.npz", n_train, n_test)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {where}; rounds {args.rounds}; --num-gpus {args.num_gpus}; data {data}", flush=True)

    plain: dict[str, float] = {}  # model name -> plain FedAvg s/round
    plain_det: dict[str, float] = {}  # the same, under torch.use_deterministic_algorithms(True)
    results = []
    for engine, name in [(e, n) for e in args.engines for n in args.methods]:
        values = method_config(name, data, args, engine)
        print(f"{name}: fedsuite simulate --engine {engine} ...", flush=True)
        run = timed_cli_run(values, work / "runs" / f"{name}-{engine}")
        model = values["model"]
        if model not in plain:
            print(f"{name}: plain FedAvg loop ({model}) ...", flush=True)
            cfg = build_config(values={**values, "strategy": "fedavg"})
            plain[model] = statistics.median(plain_fedavg(cfg, args.rounds, device).round_s[1:])
            print(f"{name}: plain FedAvg loop ({model}), deterministic algorithms ...", flush=True)
            plain_det[model] = statistics.median(plain_fedavg(cfg, args.rounds, device, deterministic=True).round_s[1:])
        fed = statistics.median(run["round_s"][1:])
        target = METHODS[name][2]
        results.append({"method": name, "engine": engine, "model": model, "fedsuite_s_per_round": round(fed, 3),
                        "plain_fedavg_s_per_round": round(plain[model], 3), "ratio": round(fed / plain[model], 2),
                        "plain_deterministic_s_per_round": round(plain_det[model], 3),
                        "ratio_to_deterministic": round(fed / plain_det[model], 2),
                        "target_s_per_round": target, "meets_target": fed <= target,
                        "startup_s": round(run["startup_s"], 1)})
        print(json.dumps(results[-1]), flush=True)

    print(f"\n{where}, median of rounds 2..{args.rounds}" + ("  (--small: numbers mean nothing)" if args.small else ""))
    print(f"{'method':10s} {'engine':9s} {'model':12s} {'fedsuite':>9s} {'plain':>7s} {'ratio':>6s} "
          f"{'plain-det':>9s} {'ratio':>6s} {'target':>7s}  met")
    for r in results:
        print(f"{r['method']:10s} {r['engine']:9s} {r['model']:12s} {r['fedsuite_s_per_round']:9.3f} "
              f"{r['plain_fedavg_s_per_round']:7.3f} {r['ratio']:6.2f} {r['plain_deterministic_s_per_round']:9.3f} "
              f"{r['ratio_to_deterministic']:6.2f} {r['target_s_per_round']:7.2f}  "
              f"{'yes' if r['meets_target'] else 'NO'}")


if __name__ == "__main__":
    main()
