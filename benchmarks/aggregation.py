"""The server's side of a FedAvg round at paper model size, against a plain PyTorch loop.

fedsuite: FedAvg's ``aggregate_train`` (``fedsuite.engine.flower_strategy.MethodStrategy`` over
``FedAvgStrategy``) on K Flower reply Messages, as Flower's loop calls it each round: each reply's layout checked, its arrays decoded once from Flower's wire format and
checked for NaN/inf, the data-size-weighted mean accumulated in float64 and cast back
(``fedsuite.method.arrays.weighted_mean``), the new model encoded as an ArrayRecord.

The plain loop does the same steps as anyone would write them in PyTorch: ``Array.numpy()`` per
array, ``torch.from_numpy``, ``acc += t.double() * (n_i / n)`` per client, ``.float()``, and
``ArrayRecord`` of the result. Both give the same model bit for bit (checked each run).

    python benchmarks/aggregation.py [--model vgg16] [--clients 10] [--repeats 5] [--threads N]

prints the model size, seconds per aggregation (median of the repeats after one warm-up) for
each, and the ratio. ``--threads``: torch's CPU threads for both (default: all cores). In a run the
ServerApp's process uses ``num_cpus`` threads (the cores one client holds; 1 by default).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict

from fedsuite.config import build_config
from fedsuite.engine.flower_strategy import MethodStrategy
from fedsuite.models import MODELS, build_model, count_parameters
from fedsuite.method.strategy import ServerSetup
from fedsuite.upstream import TaskIdentity
from fedsuite.method.wire import to_record
from strategies.fedavg import FedAvgStrategy


def reply(node_id: int, arrays: dict[str, np.ndarray], num_examples: int) -> Message:
    """A reply Message from ``node_id`` as fedsuite's ClientApp sends it after local training."""
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    instruction = Message(RecordDict({}), dst_node_id=node_id, message_type=MessageType.TRAIN)
    TaskIdentity.node_id = node_id
    content = RecordDict({"arrays": to_record(arrays),
                          "metrics": MetricRecord({"num-examples": num_examples, "train-loss": 1.0})})
    return Message(content, reply_to=instruction)


def plain_aggregate(replies: list[Message]) -> ArrayRecord:
    """The plain PyTorch FedAvg aggregation: float64 accumulation, cast back, re-encoded."""
    sizes = [int(m.content["metrics"]["num-examples"]) for m in replies]
    total = float(sum(sizes))
    acc: dict[str, torch.Tensor] = {}
    for msg, n in zip(replies, sizes):
        for key, arr in msg.content["arrays"].items():
            term = torch.from_numpy(arr.numpy()).double() * (n / total)
            acc[key] = term if key not in acc else acc[key].add_(term)
    like = replies[0].content["arrays"]
    out = {}
    for key, value in acc.items():
        dtype = torch.from_numpy(like[key].numpy()).dtype
        out[key] = (value if dtype.is_floating_point else value.round()).to(dtype)  # round: half to even
    return ArrayRecord(out)


def median_seconds(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up: first-touch page faults of the decoded arrays, torch's thread pool
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="vgg16")
    ap.add_argument("--clients", type=int, default=10, help="replies per round (K)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: all cores)")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = build_model(args.model, 10, (3, 32, 32))
    initial = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    k = args.clients
    cfg = build_config(values={"dataset": "synthetic", "model": args.model, "num_clients": k, "clients_per_round": k})
    strategy = MethodStrategy(FedAvgStrategy(ServerSetup(cfg=cfg, node_to_pid={1000 + p: p for p in range(k)}, initial=initial)))
    rng = np.random.default_rng(0)
    def trained(v: np.ndarray, p: int) -> np.ndarray:  # a client's model: noise on floats, counts on integers
        if np.issubdtype(v.dtype, np.floating):
            return v + rng.standard_normal(v.shape, dtype=np.float32) * 0.01
        return v + 5 * (p + 1)

    replies = [reply(1000 + p, {key: trained(v, p) for key, v in initial.items()}, 100 + 7 * p) for p in range(k)]
    size = count_parameters(model) / 1e6
    print(f"model={args.model} ({size:.1f} M parameters, {size * 4 * k / 1e3:.2f} GB of replies) K={k} "
          f"threads={torch.get_num_threads()}", flush=True)

    ours, (record, _) = median_seconds(lambda: strategy.aggregate_train(1, replies), args.repeats)
    plain, plain_record = median_seconds(lambda: plain_aggregate(replies), args.repeats)
    same = all(np.array_equal(record[key].numpy(), plain_record[key].numpy()) for key in initial)
    print(f"fedsuite aggregate_train: {ours:.3f} s")
    print(f"plain PyTorch loop:       {plain:.3f} s")
    print(f"ratio: {ours / plain:.2f}x  (same model bit for bit: {same})")
    if not same:
        raise SystemExit("the two aggregations differ")


if __name__ == "__main__":
    main()
