"""Federated evaluation and the per-client records (``fedsuite.engine.client_eval``, ``clients.jsonl``).

* the clients' data: unchanged without federated evaluation; with it, a seeded held-out share of
  each partition (or a natural partition's own test split) that is never trained on;
* the round's columns (weighted, client-mean, sample std, worst decile) are the clients' own
  numbers of ``clients.jsonl``, and the personalised accuracy is a fine-tune computed here with plain
  torch from the same start weights, data and seed;
* both transports give the same records bit for bit (client clocks aside);
* a reply without the asked-for metrics is a failed reply with its reason;
* kill -9 and ``--resume``: ``metrics.jsonl``, ``clients.jsonl`` and ``run.clients`` equal the
  uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import MessageType, MetricRecord, RecordDict

import fedsuite
from fedsuite.engine import client_app
from fedsuite.launch import start as launch
from fedsuite.engine import runtime
from fedsuite.engine.client_eval import FINETUNE_TAG, evaluate_clients
from fedsuite.method.client_records import CLIENT_FIELDS, FEDERATED_COLUMNS
from fedsuite.config import ConfigError, build_config
from fedsuite.models import make_model
from fedsuite.method.replies import Reply, check_reply
from fedsuite.records.rows import read_clients, read_metrics
from fedsuite.method.seeding import seed_for
from fedsuite.method.strategy import FedSuiteStrategy, RoundFailure, ServerSetup
from fedsuite.engine.nodes import NodeMap
from fedsuite.engine.transport import InProcessTransport, Link
from fedsuite.method.wire import (
    EVAL_ACCURACY, EVAL_LOSS, METRICS, NUM_EXAMPLES, PARTITION_ID, PERSONAL_ACCURACY, PERSONAL_LOSS,
)
from tests.conftest import FAST, fedsuite_run
from tests.test_resume import _env, _kill_9, _start, _write_toml

EVAL = {"federated_eval": "all", "finetune_steps": 20}
pytestmark = pytest.mark.inprocess  # the ``simulate`` fixture's runs, unless a test names Flower's engine


def config(data_root: Path, **values):
    return build_config(values={**FAST, "data_root": str(data_root), **values})


def without(rows: list[dict], *keys: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in keys} for r in rows]


# --- the clients' data ---------------------------------------------------------------------------
def test_without_federated_evaluation_clients_train_on_their_whole_partition(data_root):
    cfg = config(data_root)
    bundle = runtime.load_bundle(cfg)
    assert cfg.federated_eval == "off"
    for pid in range(cfg.num_clients):
        split = runtime.client_split(cfg, bundle, pid)
        assert np.array_equal(split.train, runtime.client_indices(cfg, bundle, pid)) and len(split.test) == 0


def test_the_held_out_share_is_seeded_disjoint_and_never_trained_on(data_root):
    cfg = config(data_root, federated_eval="cohort", local_test_fraction=0.25)
    bundle = runtime.load_bundle(cfg)
    context = InProcessTransport({}, cfg.num_clients, {}).context
    for pid in range(cfg.num_clients):
        part = runtime.client_indices(cfg, bundle, pid)
        split = runtime.client_split(cfg, bundle, pid)
        assert not split.natural
        assert len(split.test) == round(0.25 * len(part))
        assert np.array_equal(np.sort(np.concatenate([split.train, split.test])), np.sort(part))
        assert not set(split.train) & set(split.test)
        assert np.array_equal(runtime.client_split(cfg, bundle, pid).test, split.test)  # the same draw again
        data = client_app.local_data(cfg, bundle, pid, context(pid), torch.device("cpu"))
        assert torch.equal(data.y, bundle.y_train[torch.tensor(split.train)])  # the client trains on the rest
    other = config(data_root, federated_eval="cohort", local_test_fraction=0.25, seed=8)
    assert not all(np.array_equal(runtime.client_split(other, bundle, p).test,
                                  runtime.client_split(cfg, bundle, p).test) for p in range(cfg.num_clients))
    with pytest.raises(ValueError, match="client 3 has 1 training sample"):
        runtime.holdout(np.array([5]), 0.2, 0, 3)
    with pytest.raises(ConfigError, match="finetune_steps=5 is a step of federated evaluation, which is off"):
        config(data_root, finetune_steps=5)


def test_a_natural_partition_keeps_each_clients_own_test_split(data_root):
    cfg = config(data_root, partitioner="natural", federated_eval="all")
    bundle = runtime.load_bundle(cfg)
    for pid in range(cfg.num_clients):
        split = runtime.client_split(cfg, bundle, pid)
        device = bundle.groups[split.train[0]]
        assert split.natural and np.array_equal(split.train, runtime.client_indices(cfg, bundle, pid))
        assert np.array_equal(split.test, np.flatnonzero(bundle.test_groups == device))  # its own 10%


def test_a_nodes_own_data_file_keeps_its_test_split_or_holds_out_a_share(data_root, tmp_path):
    """A real node's ``data-path``: all of x_train without federated evaluation; with it, its own
    x_test/y_test where the file has them, else the seeded held-out share of its x_train."""
    from flwr.app import Context

    cfg_off, cfg_on = config(data_root), config(data_root, federated_eval="cohort")
    bundle = runtime.load_bundle(cfg_on)
    x, y = np.arange(600, dtype=np.float32).reshape(10, 60), np.arange(10) % 3
    np.savez(tmp_path / "plain.npz", x_train=x, y_train=y)
    np.savez(tmp_path / "own.npz", x_train=x, y_train=y, x_test=x[:2] + 1, y_test=y[:2])
    cpu = torch.device("cpu")

    def node(name: str) -> Context:
        return Context(run_id=0, node_id=1, node_config={"partition-id": 3, "data-path": str(tmp_path / name)},
                       state=RecordDict(), run_config={})

    assert torch.equal(client_app.local_data(cfg_off, bundle, 3, node("plain.npz"), cpu).y, torch.from_numpy(y))
    train, test = runtime.holdout(np.arange(10), 0.2, cfg_on.seed, 3)
    assert torch.equal(client_app.local_data(cfg_on, bundle, 3, node("plain.npz"), cpu).y, torch.from_numpy(y[train]))
    held_out = client_app.local_test_data(cfg_on, bundle, 3, node("plain.npz"), cpu)
    assert torch.equal(held_out.x, torch.from_numpy(x[test]))
    assert torch.equal(client_app.local_data(cfg_on, bundle, 3, node("own.npz"), cpu).x, torch.from_numpy(x))
    own = client_app.local_test_data(cfg_on, bundle, 3, node("own.npz"), cpu)
    assert torch.equal(own.x, torch.from_numpy(x[:2] + 1))


# --- the round's numbers ---------------------------------------------------------------------------
def test_the_rounds_columns_are_the_clients_own_numbers(simulate):
    run = simulate(**EVAL, rounds=3)
    rows, clients = run.rows, read_clients(run.run_dir)
    assert set(clients[0]) == set(CLIENT_FIELDS)
    for row in rows[1:]:
        mine = [c for c in clients if c["round"] == row["round"]]
        assert [c["partition_id"] for c in mine] == list(range(10))  # every client, once
        assert [c["partition_id"] for c in mine if c["sampled"]] == row["cohort"]
        assert all(c["num_steps"] >= 1 and c["train_seconds"] > 0 and c["bytes_received"] > 0
                   for c in mine if c["sampled"])
        assert sum(c["bytes_sent"] for c in mine) == row["bytes_sent"]
        n = np.array([c["eval_examples"] for c in mine], float)
        for prefix, key in (("client", "eval_accuracy"), ("personal", "personal_accuracy")):
            acc = np.array([c[key] for c in mine])
            assert row[f"{prefix}_accuracy_weighted"] == pytest.approx((n * acc).sum() / n.sum(), abs=1e-15)
            assert row[f"{prefix}_accuracy_mean"] == pytest.approx(acc.mean(), abs=1e-15)
            assert row[f"{prefix}_accuracy_std"] == pytest.approx(acc.std(ddof=1), abs=1e-15)
            assert row[f"{prefix}_accuracy_worst10"] == min(acc)  # ⌈10/10⌉ = 1 client
        assert row["clients_evaluated"] == 10 and row["client_eval_failed"] == 0
    assert run.summary["federated_evaluation"] == {"round": 3, **{k: rows[-1][k] for k in FEDERATED_COLUMNS}}
    assert (run.run_dir / "clients.png").is_file()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run.run_dir))
    board.Reload()
    assert [e.value for e in board.Scalars("client_accuracy_worst10")] == pytest.approx(
        [r["client_accuracy_worst10"] for r in rows[1:]], rel=1e-6)  # float32 events
    frame = fedsuite.load_run(run.run_dir).clients
    assert list(frame.columns) == list(CLIENT_FIELDS) and len(frame) == 30


def test_the_personalised_accuracy_is_a_plain_torch_fine_tune(simulate, data_root):
    """Client 4's personalised accuracy in the last round, computed here: the evaluated model
    (FedAvg's w^2, the checkpoint's), 20 SGD steps with torch.optim.SGD on its training share in the
    order a generator seeded (seed, 4, 2, FINETUNE_TAG) draws, then its accuracy and loss on its held-out share."""
    values = {**EVAL, "federated_eval": "cohort", "rounds": 2}
    run = simulate(**values)
    cfg = config(data_root, **values)
    last = [c for c in read_clients(run.run_dir) if c["round"] == 2]
    pid = last[0]["partition_id"]
    bundle = runtime.load_bundle(cfg)
    assert bundle.mean is None and cfg.momentum == 0 and cfg.weight_decay == 0 and cfg.grad_clip is None
    split = runtime.client_split(cfg, bundle, pid)
    x, y = bundle.x_train[split.train], bundle.y_train[split.train]
    xt, yt = bundle.x_train[split.test], bundle.y_train[split.test]
    model = make_model(cfg, bundle)
    model.load_state_dict({k: torch.tensor(v) for k, v in run.checkpoint["arrays"].items()})
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_cpus)
    try:
        g = torch.Generator().manual_seed(seed_for(cfg.seed, pid, 2, FINETUNE_TAG))
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        model.train()
        steps = 0
        while steps < 20:
            order = torch.randperm(len(y), generator=g)
            for start in range(0, len(y), cfg.batch_size):
                if steps == 20:
                    break
                idx = order[start:start + cfg.batch_size]
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
                steps += 1
        assert math.ceil(len(y) / cfg.batch_size) < 20  # the fine-tune went into a second epoch
        model.eval()
        with torch.no_grad():
            logits = model(xt)
            loss = float(F.cross_entropy(logits, yt, reduction="sum").double()) / len(yt)
            accuracy = int((logits.argmax(1) == yt).sum()) / len(yt)
    finally:
        torch.set_num_threads(threads)
    assert last[0]["personal_accuracy"] == accuracy
    assert last[0]["personal_loss"] == loss
    assert last[0]["eval_examples"] == len(yt)


@pytest.mark.xdist_group("test_registry_e2e")
def test_both_transports_give_the_same_evaluation_and_client_records(simulate):
    """Flower's Simulation Engine and the in-process engine: the same metrics.jsonl (wall time
    aside) and clients.jsonl (the clients' own clocks aside), federated and personalised evaluation included."""
    values = {**EVAL, "federated_eval": "cohort", "rounds": 2}
    flower, inprocess = simulate(**values, engine="flower"), simulate(**values)
    assert without(flower.rows, "wall_seconds") == without(inprocess.rows, "wall_seconds")
    assert "personal_accuracy_worst10" in flower.rows[-1]
    a, b = read_clients(flower.run_dir), read_clients(inprocess.run_dir)
    assert len(a) == 8 and without(a, "train_seconds") == without(b, "train_seconds")


# --- a reply without its metrics ------------------------------------------------------------------
def test_an_evaluation_reply_without_its_metrics_is_a_failed_reply_with_its_reason(data_root):
    lacking = RecordDict({METRICS: MetricRecord({PARTITION_ID: 1, NUM_EXAMPLES: 5, EVAL_ACCURACY: 0.5, EVAL_LOSS: 1.0})})
    problem, _ = check_reply(Reply(lacking), None, METRICS, keys=(EVAL_ACCURACY, EVAL_LOSS, PERSONAL_ACCURACY))
    assert problem == "metrics lack 'personal-accuracy'"
    assert check_reply(Reply(lacking), None, METRICS, keys=(EVAL_ACCURACY, EVAL_LOSS)) == (None, {})

    def handler(content, context):  # the first client of the cohort forgets its personalised metrics
        pid = int(context.node_config["partition-id"])
        metrics = {PARTITION_ID: pid, NUM_EXAMPLES: 5, EVAL_ACCURACY: 0.5, EVAL_LOSS: 1.0}
        if pid != cohort[0]:
            metrics.update({PERSONAL_ACCURACY: 0.75, PERSONAL_LOSS: 0.5})
        return RecordDict({METRICS: MetricRecord(metrics)})

    for limit in (0.0, 0.5):
        cfg = config(data_root, num_clients=4, clients_per_round=2, federated_eval="cohort", finetune_steps=1,
                     max_failed_fraction=limit)
        strategy = FedSuiteStrategy(ServerSetup(cfg=cfg, node_to_pid={p: p for p in range(4)}, initial={}))
        w = {"w": np.zeros(2, np.float32)}
        strategy.configure_round(1, w)
        cohort = strategy.round_log.cohort
        transport = Link(InProcessTransport({}, 4, {MessageType.EVALUATE: handler}), NodeMap({p: p for p in range(4)}),
                         4, cfg.round_timeout_s)
        if limit == 0:
            with pytest.raises(RoundFailure, match="federated evaluation: metrics lack 'personal-accuracy'"):
                evaluate_clients(strategy, 1, w, transport)
            continue
        columns = evaluate_clients(strategy, 1, w, transport)
        assert columns["clients_evaluated"] == 1 and columns["client_eval_failed"] == 1
        assert columns["personal_accuracy_mean"] == 0.75 and columns["personal_accuracy_std"] is None
        rows = {r["partition_id"]: r for r in strategy.round_log.client_rows()}
        assert rows[cohort[0]]["eval_failure"] == "metrics lack 'personal-accuracy'"
        assert rows[cohort[0]]["eval_accuracy"] is None and rows[cohort[1]]["personal_accuracy"] == 0.75


# --- kill -9 and --resume --------------------------------------------------------------------------
@pytest.mark.long
def test_kill_9_then_resume_keeps_the_client_records_bit_for_bit(simulate, data_root, tmp_path):
    """A ``fedsuite simulate`` process (in-process engine: one process) with federated and
    personalised evaluation of every client, SIGKILLed once a seeded round's client rows are written,
    then ``--resume``d by name: ``metrics.jsonl`` (wall time aside), ``clients.jsonl`` and
    ``run.clients`` (the clients' clocks aside) and the summary's evaluation equal the uninterrupted run's."""
    values = {**EVAL, "rounds": 6, "dataset_options": {}}  # the benchmark's 100 devices: longer rounds
    reference = simulate(**values)
    out, name = tmp_path / "runs", "killed"
    toml = _write_toml(tmp_path / "run.toml", {**FAST, **values, "engine": "inprocess", "data_root": str(data_root),
                                                "output_dir": str(out), "run_name": name})
    run_dir, log = out / name, tmp_path / "killed.log"
    target = random.Random("client-eval").randint(1, 4)
    proc = _start(toml, log)
    try:
        deadline = time.monotonic() + 540
        while not any(r["round"] >= target for r in read_clients(run_dir, tolerant=True)):
            assert proc.poll() is None, f"the run ended before it could be killed: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the run did not reach the kill point in time"
            time.sleep(0.02)
    finally:
        _kill_9(proc, run_dir)
    assert not (run_dir / "summary.json").exists()
    killed_at = read_metrics(run_dir, torn_tail=True)[-1]["round"]
    assert target <= killed_at < 6

    res = fedsuite_run(["simulate", "--output-dir", str(out), "--run-name", name, "--resume"], env=_env(),
                       cwd=tmp_path, timeout=600)
    assert res.returncode == 0, f"resume failed (killed after round {killed_at}): {res.stdout[-2000:]} {res.stderr[-3000:]}"
    assert without(read_metrics(run_dir), "wall_seconds") == without(reference.rows, "wall_seconds")
    rows, want = read_clients(run_dir), read_clients(reference.run_dir)
    assert len(rows) == 60 and without(rows, "train_seconds") == without(want, "train_seconds")
    resumed, whole = fedsuite.load_run(run_dir), fedsuite.load_run(reference.run_dir)
    assert resumed.clients.drop(columns="train_seconds").equals(whole.clients.drop(columns="train_seconds"))
    assert resumed.summary["federated_evaluation"] == whole.summary["federated_evaluation"]


def test_a_kill_between_the_checkpoint_and_the_client_rows_neither_loses_nor_doubles_them(simulate, data_root,
                                                                                         tmp_path):
    """Round 2's client rows missing and half a row torn off (a kill after the checkpoint and the
    metrics row, during the client rows' append), then round 3's rows present without their checkpoint
    (a kill after an append, before the next checkpoint): each resume's clients.jsonl is the
    uninterrupted run's."""
    values = {**EVAL, "federated_eval": "cohort", "engine": "inprocess", "data_root": str(data_root)}
    reference = simulate(**values, rounds=4)
    run_dir = tmp_path / "r"
    assert launch.simulate(build_config(values={**FAST, **values, "rounds": 2}), run_dir).ok
    lines = (run_dir / "clients.jsonl").read_text().splitlines(keepends=True)
    assert [json.loads(line)["round"] for line in lines] == [1] * 4 + [2] * 4
    (run_dir / "clients.jsonl").write_text("".join(lines[:4]) + lines[4][:40])  # round 2's rows cut
    (run_dir / "summary.json").unlink()
    assert launch.simulate(build_config(values={**FAST, **values, "rounds": 3}), run_dir).ok
    orphan = [{**r, "round": 4, "eval_accuracy": 0.123} for r in read_clients(run_dir) if r["round"] == 3]
    with (run_dir / "clients.jsonl").open("a") as f:  # round 4's rows, whose checkpoint never came
        f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in orphan))
    (run_dir / "summary.json").unlink()
    assert launch.simulate(build_config(values={**FAST, **values, "rounds": 4}), run_dir).ok
    got, want = read_clients(run_dir), read_clients(reference.run_dir)
    assert [r["round"] for r in got] == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
    assert without(got, "train_seconds") == without(want, "train_seconds")


# --- the reports ----------------------------------------------------------------------------------
def test_fedsuite_report_and_a_sweeps_report_show_the_clients_accuracies(simulate, data_root, tmp_path):
    """``fedsuite report``'s table and a sweep's report.md/.csv add the federated-evaluation readings:
    each run's mean of its last ``last`` rounds' values, in %, then the mean over seeds."""
    import csv

    from fedsuite.records.results import report, report_table
    from fedsuite.queues.sweep import SweepRun
    from fedsuite.queues.sweep_report import write_report

    values = {"federated_eval": "cohort", "rounds": 3}
    runs = [simulate(**values, seed=seed) for seed in (7, 8)]
    plain = simulate(rounds=3)

    def reading(run, column, last=2):
        return 100 * np.mean([r[column] for r in run.rows[1:]][-last:])

    want = np.mean([reading(run, "client_accuracy_worst10") for run in runs])
    rows, _ = report([run.run_dir for run in runs], last=2)
    headers, cells = report_table(rows, None)
    assert headers[-4:] == ["client mean (%)", "client weighted (%)", "client std, ddof=1 (%)", "worst 10% (%)"]
    assert rows[0]["client_accuracy_worst10"] == pytest.approx(want, abs=1e-12) and cells[0][-1] == f"{want:.2f}"
    assert "client mean (%)" not in report_table(report([plain.run_dir], last=2)[0], None)[0]

    cfg = config(data_root, **values)
    sweep = [SweepRun(run_dir=run.run_dir, config=None, overrides=[], rounds=3, cfg=cfg, seed=seed,
                      dataset=("synthetic", str(data_root), "{}"), setting={"strategy": "fedavg"})
             for run, seed in zip(runs, (7, 8))]
    write_report(sweep, tmp_path / "sweep", 2, None, "test")
    assert "worst 10% (%)" in (tmp_path / "sweep" / "report.md").read_text()
    with (tmp_path / "sweep" / "report.csv").open() as f:
        (line,) = list(csv.DictReader(f))
    assert float(line["client_accuracy_worst10"]) == pytest.approx(want, abs=1e-12)


def test_a_reproduce_report_shows_the_clients_accuracies_where_runs_have_them(tmp_path):
    """A reproduce target's cells: the federated-evaluation readings in the row's table and report.csv
    (the mean over seeds of each run's mean of its last evaluations); runs without them add no column."""
    import csv

    from fedsuite.queues.reproduce.report import write_report
    from fedsuite.queues.reproduce.planning import plan
    from tests.test_reproduce import _tiny_target, _write_runs

    target = _tiny_target(tmp_path, "")
    specs = {(s.method, s.seed): s for s in plan(target, "paper", tmp_path / "out")}
    _write_runs(specs, {(m, seed): 0.5 for m in ("fedavg", "fedprox") for seed in range(3)})
    write_report(target, list(specs.values()), "paper", tmp_path / "plain")
    assert "client_accuracy_worst10" not in (tmp_path / "plain" / "report.csv").read_text()
    for (method, seed), spec in specs.items():  # FedProx's runs evaluated on the clients, worst decile 0.2 + seed/10
        if method == "fedprox":
            rows = [json.loads(line) for line in (spec.run_dir / "metrics.jsonl").read_text().splitlines()]
            rows[1:] = [{**r, "client_accuracy_mean": 0.5, "client_accuracy_worst10": 0.2 + seed / 10} for r in rows[1:]]
            (spec.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(target, list(specs.values()), "paper", tmp_path / "report").read_text()
    assert "| difference | client mean (%) | worst 10% (%) |" in md
    cells = {c["method"]: c for c in csv.DictReader((tmp_path / "report" / "report.csv").open())}
    assert float(cells["fedprox"]["client_accuracy_worst10"]) == pytest.approx(30.0)
    assert cells["fedavg"]["client_accuracy_worst10"] == ""
