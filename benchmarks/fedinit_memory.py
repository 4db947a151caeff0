"""Cost of relaxed initialisation (RI) at paper scale: 200 clients with ResNet-18-GN-sized state.

What it measures (the FedInit paper's Tables 8 and 10: RI should cost ~1.02-1.05x FedAvg's time and
no extra RAM beyond one model per client, kept on disk):

* a *plain round*: N clients (default 10 of 200, the 5%-200 setting) each doing S local SGD steps of
  ResNet-18-GN on batches of 50 CIFAR-sized images, with plain PyTorch (``--steps`` per client; the
  paper's 5%-200 setting has 25 steps);
* the same round's *RI machinery* through the real code, in both storage modes:
  - client-state: the ``relaxed_init`` plug-in's ``after_start`` / ``after_finish`` on a real
    ``LocalTask`` per client (load ŵ_i from disk, relax, translate the reply, save ŵ_i to disk);
  - server-state: ``RelaxedInitServer.payload`` / ``observe`` for the cohort (load ŵ_i, build the
    personal start point, store r_i, store the replied w_{i,K}, translate).
  The state of every client the timed cohorts touch is written to disk first (one ResNet-18-GN per
  client, 42.7 MiB), so the loads hit real files; the other clients' files would not be read.

It prints peak RSS, seconds per round of each part, and the RI overhead as a fraction of the plain
round. Run: ``python benchmarks/fedinit_memory.py [--clients 200] [--cohort 10] [--steps 25]
[--dir /tmp/ri-bench]``. Training time grows with ``--steps``; RI's cost does not.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from fedsuite.models import build_model
from fedsuite.method.plugins.relaxed_init import ROUND_KEY, STATE_NAME, RelaxedInit, RelaxedInitParams, RelaxedInitServer, trainable_keys
from fedsuite.method.rounds import RoundLog, ServerSetup
from fedsuite.method.state import ArrayStore, ClientState
from fedsuite.method.training import LocalResult
from fedsuite.method.wire import ClientReply, to_record
from flwr.app import RecordDict


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plain_round(model: torch.nn.Module, cohort: int, steps: int, batch: int) -> float:
    """Plain PyTorch local SGD: ``cohort`` clients x ``steps`` steps (lr 0.1, wd 1e-3, clip 10)."""
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    t0 = time.perf_counter()
    for _ in range(cohort):
        model.load_state_dict(start)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-3)
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            opt.step()
    return time.perf_counter() - t0


def client_state_round(model, state_dir: Path, cohort: list[int], server_round: int) -> float:
    """The plug-in's own hooks on a real LocalTask per client (everything RI adds in client-state mode)."""
    plugin = RelaxedInit(RelaxedInitParams(beta=0.1))
    cfg = SimpleNamespace(strategy="fedavg")
    received = {k: v.clone() for k, v in model.state_dict().items()}
    t0 = time.perf_counter()
    for pid in cohort:
        model.load_state_dict(received)
        task = SimpleNamespace(model=model, received=received, extras={}, cfg=cfg, server_round=server_round,
                               device=torch.device("cpu"), state=ClientState(None, state_dir, pid),
                               scratch={}, metrics={}, data=None)
        plugin.after_start(task)  # load ŵ_i, relax, move the model
        # (local training happens here; its cost is the plain round's)
        arrays = {k: v.detach() for k, v in model.state_dict().items()}
        plugin.after_finish(task, LocalResult(arrays=arrays, extras={}, metrics={}))  # save ŵ_i, translate
    return time.perf_counter() - t0


def server_state_round(hooks: RelaxedInitServer, global_sd: dict[str, np.ndarray], cohort: list[int], server_round: int) -> float:
    record = to_record(global_sd)
    t0 = time.perf_counter()
    replies = []
    for pid in cohort:
        content = RecordDict({"arrays": record})
        hooks.payload(server_round, pid, content)
        replies.append(ClientReply(pid, dict(global_sd), 250, {"num-examples": 250.0}, {}))
    hooks.observe(server_round, replies, RoundLog(round=server_round, cohort=cohort))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--cohort", type=int, default=10)
    ap.add_argument("--steps", type=int, default=25, help="local steps per client in the plain round (5%%-200: 25)")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3, help="RI rounds timed per mode (the mean is printed)")
    ap.add_argument("--dir", type=Path, default=None, help="scratch folder for the on-disk state")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    root = args.dir or Path(tempfile.mkdtemp(prefix="ri-bench-"))
    torch.manual_seed(0)
    model = build_model("resnet18-gn", 10, (3, 32, 32))
    keys = trainable_keys(model)
    nparams = sum(model.state_dict()[k].numel() for k in keys)
    print(f"ResNet-18-GN: {nparams:,} trainable parameters ({4 * nparams / 2**20:.1f} MiB per copy); "
          f"{args.clients} clients, {args.cohort} per round, {args.steps} local steps, {args.threads} threads")
    rss0 = peak_rss_mb()

    # seeded cohorts of the timed rounds, and on-disk state (as after a long run) for every client
    # they touch, in both modes. Clients outside these cohorts are never read by these rounds, so their
    # files would change neither RAM nor time; they are not written, to spare the disk.
    rng = np.random.default_rng(0)
    cohorts = [sorted(rng.choice(args.clients, args.cohort, replace=False).tolist()) for _ in range(args.rounds)]
    touched = sorted(set().union(*cohorts))
    t0 = time.perf_counter()
    w = {k: v.detach().clone() for k, v in model.state_dict().items() if k in keys}
    cstore, sroot = root / "client-state", root / "server"
    sstore = ArrayStore(sroot / "relaxed-init-server")
    for pid in touched:
        ClientState(None, cstore, pid).save_arrays(STATE_NAME, {**w, ROUND_KEY: torch.tensor(0)})
        sstore.save(f"client-{pid}", "last-local-r0", w)
    print(f"wrote the state of the {len(touched)} clients these rounds touch, x 2 modes, in "
          f"{time.perf_counter() - t0:.1f} s; all {args.clients} clients would take "
          f"{args.clients * 4 * nparams / 2**30:.1f} GiB of disk per mode, and no RAM")

    # plain round (the denominator)
    plain_round(model, 1, 2, args.batch)  # warm-up
    t_plain = plain_round(model, args.cohort, args.steps, args.batch)
    rss_plain = peak_rss_mb()

    t_client = [client_state_round(model, cstore, c, r + 1) for r, c in enumerate(cohorts)]
    rss_client = peak_rss_mb()

    setup = ServerSetup(cfg=None, node_to_pid={}, build_model=lambda: model, run_dir=sroot,
                        initial={k: v.detach().numpy() for k, v in model.state_dict().items()})
    hooks = RelaxedInitServer(RelaxedInitParams(beta=0.1, storage="server-state"), setup)
    global_sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    t_server = [server_state_round(hooks, global_sd, c, r + 1) for r, c in enumerate(cohorts)]
    rss_server = peak_rss_mb()

    tc, ts = float(np.mean(t_client)), float(np.mean(t_server))
    print(f"plain round (plain PyTorch, {args.cohort} x {args.steps} steps): {t_plain:8.2f} s")
    print(f"RI client-state machinery per round:            {tc:8.3f} s  -> overhead {100 * tc / t_plain:5.2f} %")
    print(f"RI server-state machinery per round:            {ts:8.3f} s  -> overhead {100 * ts / t_plain:5.2f} %")
    print(f"peak RSS: start {rss0:.0f} MiB, after plain round {rss_plain:.0f} MiB, "
          f"after client-state {rss_client:.0f} MiB, after server-state {rss_server:.0f} MiB "
          f"(all {args.clients} clients' state stays on disk)")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
