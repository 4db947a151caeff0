"""What the speed benchmarks share: fedsuite run as users run it, timed, and the plain PyTorch
FedAvg loop every benchmark compares it with.

:func:`timed_cli_run` runs ``fedsuite simulate`` as a child process (the CLI, the run's simulation
process with Flower's Simulation Engine, Ray) and reports the start-up (command start to the round-0 evaluation, i.e.
everything before round 1 begins) and the seconds of each round from ``metrics.jsonl``.

:func:`plain_fedavg` is FedAvg written directly in PyTorch.

No Flower, no Ray, no serialisation, no processes: the cohort is trained one client after another in
this process, on ``device``, with what fedsuite's FedAvg does in each round t:

    cohort S_t          = fedsuite's seeded sample (``FedSuiteStrategy.sample_cohort``)
    for i in S_t:  w_i  = w^t, then local_epochs x ⌈n_i / B⌉ SGD steps
                          (lr η·decay^(t-1), momentum, weight decay, gradient clip, the client's
                          seeded batch order and augmentation: ``LocalData.batches``)
    w^{t+1}             = Σ_i n_i w_i / Σ_i n_i        (accumulated in float64 on ``device``)
    central evaluation of w^{t+1} on the test split

The partition, cohorts, initial weights and per-client seeds are fedsuite's, so both sides do the
same steps. Used by ``overhead.py`` (CPU) and ``gpu_round.py`` (GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedsuite import models
from fedsuite.engine import runtime
from fedsuite.method.seeding import seed_for
from fedsuite.method.strategy import FedSuiteStrategy, ServerSetup
from fedsuite.method.training import LocalData, clip_grad, evaluate


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def cpu_fedavg_setup(dataset: str | None, rounds: int, prefix: str) -> tuple[Path, dict]:
    """The CPU benchmarks' FedAvg: ``cnn`` on Fashion-MNIST from ../shared/data (``dataset`` None:
    when that folder is there, else the generated Synthetic benchmark with an MLP), 100 clients,
    10 per round, 1 local epoch, batch 50, lr 0.05, Dirichlet 0.5, seed 0, on the CPU. Returns a
    fresh work folder (the run's data root) and the config values."""
    dataset = dataset or ("fmnist" if (SHARED / "FashionMNIST" / "raw").is_dir() else "synthetic")
    work = Path(tempfile.mkdtemp(prefix=prefix))
    if dataset == "fmnist":
        (work / "FashionMNIST").symlink_to(SHARED / "FashionMNIST")
    return work, {
        "strategy": "fedavg", "dataset": dataset, "model": "cnn" if dataset == "fmnist" else "mlp",
        "num_clients": 100, "clients_per_round": 10, "local_epochs": 1, "batch_size": 50, "lr": 0.05,
        "rounds": rounds, "partitioner": "dirichlet", "alpha": 0.5, "seed": 0, "data_root": str(work),
        "device": "cpu",
    }


def timed_cli_run(config: dict, run_dir: Path, timeout_s: float = 3600.0, cores: set[int] | None = None) -> dict:
    """``fedsuite simulate --config <config as TOML>`` into ``run_dir``; returns ``startup_s`` (command
    start to the round-0 row), ``total_s``, ``round_s`` (each round's ``wall_seconds``), the rows and
    the start-up's parts: seconds from the command's start until the CLI had written the run's app
    (``cli_done_s``, Flower's engine only: its imports and the config, while the simulation process it
    started first does its own imports; the data check runs after it, while that process starts Ray) and until the
    ServerApp started (``serverapp_start_s``: Ray's start and the data check), then
    ``summary.json``'s own parts (data = loading it and building w^0 and the evaluator while the actors start;
    handshake = the wait for the actors' replies beyond that; setup).
    ``cores``: the child (and so the run's every process) runs on these cores only, as a queue's
    run does (``processes.core_slices``). Raises if the run does not complete."""
    import tomli_w

    run_dir = run_dir.resolve()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    toml = run_dir.parent / f"{run_dir.name}.toml"
    toml.write_text(tomli_w.dumps({**config, "output_dir": str(run_dir.parent), "run_name": run_dir.name}))
    metrics = run_dir / "metrics.jsonl"
    t0, wall0 = time.perf_counter(), time.time()
    proc = subprocess.Popen([sys.executable, "-m", "fedsuite.cli.main", "simulate", "--config", str(toml)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores))
    startup = None
    while proc.poll() is None:
        if startup is None and metrics.is_file() and metrics.read_text().strip():
            startup = time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout_s:
            proc.kill()
            raise RuntimeError(f"fedsuite simulate ran past {timeout_s:.0f} s; see {run_dir}")
        time.sleep(0.05)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"fedsuite simulate failed (exit {proc.returncode}): {proc.stderr.read()[-2000:]}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    timing = summary.get("timing", {})
    app = run_dir / "app" / "pyproject.toml"  # Flower's engine only: the in-process engine writes no app
    parts = {
        **({"cli_done_s": app.stat().st_mtime - wall0} if app.is_file() else {}),
        **({"serverapp_start_s": timing["serverapp_start"] - wall0} if "serverapp_start" in timing else {}),
        **{k: v for k, v in timing.items() if k.endswith("_s")},
    }
    return {
        "startup_s": startup, "total_s": total, "rows": rows,
        "round_s": [r["wall_seconds"] for r in rows if r["round"] > 0],
        "startup_parts_s": {k: round(v, 2) for k, v in parts.items()},
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class PlainRun:
    round_s: list[float]  # wall seconds of each round (training, aggregation, evaluation)
    accuracy: list[float]  # test accuracy after each round
    state: dict[str, np.ndarray]  # the global model after the last round


def plain_fedavg(cfg, rounds: int, device: torch.device, log: bool = True, deterministic: bool = False) -> PlainRun:
    """Run ``rounds`` rounds of plain FedAvg for ``cfg``: each round's seconds and test accuracy, and
    the final global model (``tests/test_core.py`` checks that a fedsuite simulation ends with this
    very model, bit for bit). ``deterministic``: under ``torch.use_deterministic_algorithms(True)``,
    as fedsuite's clients train on CUDA (deterministic cuDNN and cuBLAS kernels), restored after."""
    if deterministic:
        before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            return plain_fedavg(cfg, rounds, device, log)
        finally:
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    bundle = runtime.load_bundle(cfg)
    initial = models.initial_arrays(cfg, bundle)
    sampler = FedSuiteStrategy(ServerSetup(cfg=cfg, node_to_pid={p: p for p in range(cfg.num_clients)},
                                           initial=initial))
    model = models.make_model(cfg, bundle).to(device)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in initial.items()})
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    augment = bundle.augment if cfg.augment is None else ("crop-flip" if cfg.augment else "none")
    x_test, y_test = bundle.x_test.to(device), bundle.y_test.to(device)
    times, accuracies = [], []
    for rnd in range(1, rounds + 1):
        sync(device)
        t0 = time.perf_counter()
        acc64 = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        cohort = sampler.sample_cohort(rnd)
        sizes = []
        for pid in cohort:
            idx = torch.tensor(runtime.client_indices(cfg, bundle, pid), dtype=torch.int64)
            sizes.append(len(idx))
        total = float(sum(sizes))
        for pid, n_i in zip(cohort, sizes):
            idx = torch.tensor(runtime.client_indices(cfg, bundle, pid), dtype=torch.int64)
            data = LocalData(bundle.x_train[idx].to(device), bundle.y_train[idx].to(device), bundle, augment)
            model.load_state_dict(global_state)
            seed = seed_for(cfg.seed, pid, rnd)
            torch.manual_seed(seed)
            gen = torch.Generator(device=device).manual_seed(seed)
            params = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.SGD(params, lr=sampler.local_lr(rnd), momentum=cfg.momentum,
                                  weight_decay=cfg.weight_decay)
            model.train()
            for _ in range(cfg.local_epochs):
                for x, y in data.batches(cfg.batch_size, gen):
                    opt.zero_grad(set_to_none=True)
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    clip_grad(params, cfg.grad_clip)
                    opt.step()
            for k, v in model.state_dict().items():
                acc64[k] += v.double() * (n_i / total)
        global_state = {k: (acc64[k].round() if not v.is_floating_point() else acc64[k]).to(v.dtype)
                        for k, v in global_state.items()}
        model.load_state_dict(global_state)
        acc = evaluate(model, x_test, y_test, bundle, cfg.eval_batch_size)["accuracy"]
        sync(device)
        times.append(time.perf_counter() - t0)
        accuracies.append(acc)
        if log:
            print(f"  plain round {rnd}: {times[-1]:.3f}s acc {acc:.4f}", flush=True)
    return PlainRun(times, accuracies, {k: v.cpu().numpy() for k, v in global_state.items()})
