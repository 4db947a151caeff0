"""The round engine apart from its transport (``fedsuite.engine.round_engine``, ``fedsuite.engine.transport``).

Every registered method gives the same records through ``--engine inprocess`` and ``--engine
flower`` (tests/test_registry_e2e.py, bit for bit). Here: the in-process engine's own behaviour
(its start without Ray, failures, Ctrl-C and resume), and a Flower user's own ServerApp that runs a
fedsuite method in Flower's own loop (``Strategy.start``) on Flower's Simulation Engine, its
federated evaluation (``configure_evaluate`` / ``aggregate_evaluate``) included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FAST, assert_same_arrays, assert_same_client_state, assert_same_state

from fedsuite.launch import start as launch
from fedsuite.launch import processes
from fedsuite.config import build_config, to_run_config
from fedsuite.records.rows import read_clients, read_metrics
from fedsuite.engine.runtime import RECORDS_KEY, RUN_DIR_KEY


def inprocess_config(data_root: Path, **values):
    return build_config(values={**FAST, "data_root": str(data_root), "engine": "inprocess", **values})


def test_the_inprocess_engine_starts_no_process_and_no_ray(tmp_path, data_root):
    """A run on the in-process engine happens in the calling process: no child process is started
    (no simulation process, no Ray), and its records are a run's records (round 0 and every round in
    ``metrics.jsonl``, a checkpoint, ``summary.json`` completed)."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    seen: list[int] = []
    outcome = launch.simulate(inprocess_config(data_root, rounds=3), tmp_path / "run",
                              on_progress=lambda rows: seen.append(len(rows)))
    assert outcome.ok, outcome.details
    assert {p.pid for p in me.children(recursive=True)} <= before
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2, 3]
    assert seen == [1, 2, 3, 4]  # progress after round 0 and after every round
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["round"] == 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"


def test_an_inprocess_run_from_the_cli_or_python_starts_no_simulation_process(tmp_path, data_root, monkeypatch):
    """``fedsuite simulate`` and ``fedsuite.simulate`` start Flower's simulation process before the
    config is built (its imports overlap the caller's), unless the inputs already put the run on the
    in-process engine, by option, ``--set`` or the config file (``runner.engine_asked``): that
    process would import torch and be called off. A run whose inputs do not say (here: a resume of
    an in-process run) still runs in process; its prestarted process is ended unused."""
    from fedsuite.launch import runner

    config = tmp_path / "run.toml"
    config.write_text('engine = "inprocess"\nrounds = 1\n')
    assert runner.engine_asked(None, ["engine=inprocess"], {}) == "inprocess"
    assert runner.engine_asked(None, ['engine="flower"'], {"engine": "inprocess"}) == "flower"  # --set wins
    assert runner.engine_asked(config, [], {"engine": "flower"}) == "flower"
    assert runner.engine_asked(config, [], {}) == "inprocess"
    assert runner.engine_asked(tmp_path / "missing.toml", [], {}) is None
    assert runner.engine_asked(None, ["rounds=2"], {}) is None

    def refuse():
        raise AssertionError("a simulation process was started for an in-process run")

    monkeypatch.setattr(launch, "start_simulation_process", refuse)
    values = {**FAST, "data_root": str(data_root), "output_dir": str(tmp_path), "run_name": "run"}
    outcome = runner.run_simulation(config, ["rounds=2"], values, spelling=runner.PYTHON)
    assert outcome.ok and [r["round"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2]
    monkeypatch.undo()
    started: list[int] = []
    prestart = launch.start_simulation_process
    monkeypatch.setattr(launch, "start_simulation_process", lambda: started.append(1) or prestart())
    outcome = runner.run_simulation(None, [], {"output_dir": str(tmp_path), "run_name": "run", "rounds": 3},
                                    resume=True, spelling=runner.PYTHON)
    assert started == [1] and outcome.ok and [r["round"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2, 3]


def test_a_client_error_fails_an_inprocess_run_loudly(tmp_path, data_root):
    """A client that raises is a failed reply, as on Flower's engine, and the in-process engine is a
    simulation: one failed reply of a cohort of 4 fails the run (max_failed_fraction 0), which says
    which client and why in summary.json."""
    cfg = inprocess_config(data_root, rounds=3, **{"faults.client_error": 0.2})
    assert cfg.resolved_max_failed_fraction == 0.0
    outcome = launch.simulate(cfg, tmp_path / "run")
    assert not outcome.ok and outcome.status == "finished:failed"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"
    failure = summary["failure"]
    assert 0 < len(failure["partition_ids"]) < failure["cohort_size"] and failure["max_failed_fraction"] == 0, failure
    assert "injected fault (faults.client_error)" in json.dumps(summary["failure"])
    assert (tmp_path / "run" / "error.txt").is_file()


def test_an_inprocess_run_interrupted_then_resumed_equals_one_uninterrupted(tmp_path, data_root, monkeypatch):
    """A KeyboardInterrupt (Ctrl-C) in round 3 leaves the run partial (no summary.json, the checkpoint
    of round 2); resuming it gives the records of a run never interrupted, bit for bit: metrics,
    model, server state (SCAFFOLD's control variate) and client state."""
    from fedsuite.method.strategy import FedSuiteStrategy

    values = {"strategy": "scaffold", "rounds": 4}
    whole = launch.simulate(inprocess_config(data_root, **values), tmp_path / "whole")
    assert whole.ok, whole.details

    original = FedSuiteStrategy.train_round

    def interrupted(self, server_round, arrays, transport):
        if server_round == 3:
            raise KeyboardInterrupt
        return original(self, server_round, arrays, transport)

    monkeypatch.setattr(FedSuiteStrategy, "train_round", interrupted)
    cfg = inprocess_config(data_root, **values)
    with pytest.raises(KeyboardInterrupt):
        launch.simulate(cfg, tmp_path / "cut")
    assert not (tmp_path / "cut" / "summary.json").exists()
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)["round"] == 2
    monkeypatch.setattr(FedSuiteStrategy, "train_round", original)
    resumed = launch.simulate(cfg, tmp_path / "cut")
    assert resumed.ok, resumed.details

    def records(run: Path):
        rows = [{k: v for k, v in r.items() if k != "wall_seconds"} for r in read_metrics(run)]
        return rows, torch.load(run / "checkpoint.pt", weights_only=False)

    (rows_a, ckpt_a), (rows_b, ckpt_b) = records(tmp_path / "whole"), records(tmp_path / "cut")
    assert rows_a == rows_b
    assert_same_arrays(ckpt_a["arrays"], ckpt_b["arrays"])
    assert_same_state(ckpt_a["strategy"], ckpt_b["strategy"])
    assert_same_client_state(tmp_path / "whole", tmp_path / "cut")


def test_inprocess_refuses_a_ray_cluster(data_root):
    from fedsuite.config import ConfigError

    with pytest.raises(ConfigError, match="engine=inprocess runs every client in the fedsuite process"):
        inprocess_config(data_root, ray_address="127.0.0.1:6379")



@pytest.mark.parametrize("strategy", ["scaffold", "fedgen", "fedinit"])
def test_inprocess_threads_never_change_a_run(simulate, strategy):
    """The in-process engine trains a round's clients on parallel threads (``inprocess_threads``):
    on 1 thread and on 2 a run's ``metrics.jsonl`` (wall time aside), ``clients.jsonl`` (the
    clients' clocks aside), checkpoint and per-client state are the same bit for bit, and the same
    as on Flower's engine. SCAFFOLD keeps client state; FedGen's clients draw from their own
    generators and build a throwaway module (its initialisation draws from torch's global RNG);
    FedInit's clients rebuild w^0 from the run's seed through the global RNG, which the other
    threads must not move meanwhile (``fedsuite.method.seeding.GLOBAL_TORCH_RNG``)."""
    flower = simulate(strategy=strategy)
    for threads in (1, 2):
        here = simulate(strategy=strategy, engine="inprocess", inprocess_threads=threads)
        assert here.metrics_without_time() == flower.metrics_without_time(), threads
        assert_same_arrays(here.arrays, flower.arrays)
        assert_same_state(here.checkpoint["strategy"], flower.checkpoint["strategy"])
        assert_same_client_state(here.run_dir, flower.run_dir)
        mine, theirs = read_clients(here.run_dir), read_clients(flower.run_dir)
        assert [{k: v for k, v in r.items() if k != "train_seconds"} for r in mine] == \
            [{k: v for k, v in r.items() if k != "train_seconds"} for r in theirs]


def test_the_inprocess_engines_client_threads_parse_no_python(data_root, tmp_path, monkeypatch):
    """CPython 3.11 counts the AST builder's recursion depth once per process, not per thread (cpython
    gh-106905): two threads building ASTs at once fail now and then with ``SystemError: AST
    constructor recursion depth mismatch``, which a threaded run showed as a dropped client reply.
    So the in-process engine's client threads parse no Python: a message's arrays are read without
    ``np.load``'s ``ast.literal_eval`` of the .npy header (``fedsuite.method.wire.ndarray``), and the run's
    data and partition are made before the threads start. Checked on a 2-thread run with federated
    evaluation (training and evaluation messages), the data forgotten first."""
    import ast
    import builtins
    import threading

    from fedsuite.engine import runtime

    runtime.forget_data()
    parsed: list[str] = []
    compile_ = builtins.compile

    def recording_compile(source, filename, mode, flags=0, *args, **kwargs):
        if flags & ast.PyCF_ONLY_AST and threading.current_thread().name.startswith("fedsuite-client"):
            parsed.append(str(filename))
        return compile_(source, filename, mode, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", recording_compile)
    cfg = inprocess_config(data_root, inprocess_threads=2, rounds=2, federated_eval="cohort")
    outcome = launch.simulate(cfg, tmp_path / "r")
    assert outcome.ok, outcome.details
    assert len(read_clients(tmp_path / "r")) == 2 * cfg.cohort_size
    assert parsed == []


def test_the_inprocess_engine_runs_as_many_clients_at_once_as_flowers_engine_runs_actors(data_root, monkeypatch):
    """By default the in-process engine trains (cores this process may use) // num_cpus clients at
    once, at least one, as Flower's engine runs one actor per ``num_cpus`` cores;
    ``inprocess_threads`` sets it. The threads reach the transport."""
    from fedsuite.engine import round_engine as engine

    monkeypatch.setattr(engine, "available_cores", lambda: 8)
    assert engine.inprocess_threads(inprocess_config(data_root)) == 8
    assert engine.inprocess_threads(inprocess_config(data_root, num_cpus=3)) == 2
    assert engine.inprocess_threads(inprocess_config(data_root, num_cpus=16)) == 1
    assert engine.inprocess_threads(inprocess_config(data_root, inprocess_threads=3)) == 3
    seen = {}
    monkeypatch.setattr(engine, "execute", lambda cfg, run_dir, transport, *_: seen.update(threads=transport.threads))
    engine.run_inprocess(inprocess_config(data_root, num_cpus=2), data_root / "unused")
    assert seen == {"threads": 4}


def test_a_model_that_draws_from_the_global_rng_trains_one_client_at_a_time():
    """Dropout draws from torch's process-wide RNG: a client whose model has it seeds that RNG and
    holds it for its whole training (``fedsuite.method.seeding.global_seed``), so two such clients on two
    threads draw exactly what each draws alone; a model without it holds the RNG only to seed it."""
    from concurrent.futures import ThreadPoolExecutor

    from fedsuite.models import draws_global_rng, vgg9
    from fedsuite.method.seeding import global_seed

    assert draws_global_rng(vgg9(10, (3, 32, 32)))
    assert not draws_global_rng(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))

    def client(seed: int) -> torch.Tensor:
        drop = torch.nn.Dropout(0.5)
        with global_seed(seed, draws=True):
            first = drop(torch.ones(64))
            time.sleep(0.05)  # the other thread would seed and draw meanwhile
            return torch.cat([first, drop(torch.ones(64))])

    alone = [client(seed) for seed in (1, 2)]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(client, (1, 2)))
    assert all(torch.equal(a, b) for a, b in zip(alone, together))


USER_SERVER_APP = '''
"""A Flower user's own ServerApp: Flower's loop (Strategy.start) with a fedsuite method."""
import json
from pathlib import Path

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedsuite.engine.server_app import method_strategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy, initial = method_strategy(grid, context)  # the method the run config names
    # fedsuite's defaults: the config's rounds, round_timeout_s, and its central evaluation as evaluate_fn
    result = strategy.start(grid=grid, initial_arrays=initial)
    out = Path(context.run_config["output_dir"])
    np.savez(out / "final.npz", **{k: v.numpy() for k, v in result.arrays.items()})
    accuracy = {r: float(m["accuracy"]) for r, m in result.evaluate_metrics_serverapp.items()}
    (out / "accuracy.json").write_text(json.dumps(accuracy))
    federated = {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}  # aggregate_evaluate's
    (out / "federated.json").write_text(json.dumps(federated))
'''


@pytest.mark.xdist_group("test_registry_e2e")
def test_a_flower_users_own_serverapp_runs_a_fedsuite_method(tmp_path, data_root, worker_ray_cluster, simulate):
    """An app folder as a Flower user writes it: their own ServerApp module (Flower's
    ``Strategy.start`` loop with fedsuite's FedMR from ``method_strategy``) and fedsuite's ClientApp,
    run on Flower's Simulation Engine, with federated and personalised evaluation
    (``federated_eval = "cohort"``, ``finetune_steps``). Its final model equals fedsuite's own run of
    the same config bit for bit; its central accuracy after each round (Flower's ``evaluate_fn``, by
    default) is fedsuite's; its federated evaluation (Flower's ``configure_evaluate`` /
    ``aggregate_evaluate``: the ClientApp-side metrics of Flower's ``Result``) gives fedsuite's
    columns of every round; and the records it writes when asked (``records = true``) are fedsuite's
    run's, ``metrics.jsonl`` line by line but for the wall time and ``clients.jsonl`` row by row but
    for the clients' clocks."""
    evaluation = {"federated_eval": "cohort", "finetune_steps": 3}
    cfg = build_config(values={**FAST, "strategy": "fedmr", "data_root": str(data_root),
                               "output_dir": str(tmp_path), "rounds": 2, **evaluation})
    app_dir = tmp_path / "user-app"
    app_dir.mkdir()
    (app_dir / "user_server.py").write_text(textwrap.dedent(USER_SERVER_APP))
    import tomli_w

    pyproject = {
        "project": {"name": "user-app", "version": "1.0.0", "dependencies": []},
        "tool": {"flwr": {"app": {
            "publisher": "someone",
            "components": {"serverapp": "user_server:app", "clientapp": "fedsuite.client_app:app"},
            "config": {**to_run_config(cfg), RUN_DIR_KEY: str(tmp_path / "records"), RECORDS_KEY: True},
        }}},
    }
    (app_dir / "pyproject.toml").write_text(tomli_w.dumps(pyproject))
    env = {**processes.process_env(), "RAY_ADDRESS": worker_ray_cluster}
    proc = subprocess.run([sys.executable, "-m", "fedsuite.launch.simulation", str(app_dir)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    final = dict(np.load(tmp_path / "final.npz"))
    accuracy = json.loads((tmp_path / "accuracy.json").read_text())
    federated = json.loads((tmp_path / "federated.json").read_text())

    ours = simulate(strategy="fedmr", rounds=2, engine="inprocess", **evaluation)
    assert_same_arrays(final, ours.arrays)
    assert [accuracy[str(r)] for r in range(3)] == [row["test_accuracy"] for row in ours.rows]
    columns = [k for k in ours.rows[-1] if k.startswith(("client_", "personal_", "clients_"))]
    assert {"client_accuracy_weighted", "client_accuracy_worst10", "personal_accuracy_mean"} <= set(columns)
    assert sorted(federated) == ["1", "2"]
    for r in (1, 2):  # Flower's ClientApp-side metrics of the round: fedsuite's columns, bit for bit
        assert federated[str(r)] == {k: ours.rows[r][k] for k in columns if ours.rows[r][k] is not None}
    recorded = read_metrics(tmp_path / "records")
    assert [{k: v for k, v in row.items() if k != "wall_seconds"} for row in recorded] == \
        [{k: v for k, v in row.items() if k != "wall_seconds"} for row in ours.rows]
    theirs, mine = read_clients(tmp_path / "records"), read_clients(ours.run_dir)
    assert len(theirs) == 8 and all(c["eval_accuracy"] is not None for c in theirs)  # 4 sampled a round
    assert [{k: v for k, v in c.items() if k != "train_seconds"} for c in theirs] == \
        [{k: v for k, v in c.items() if k != "train_seconds"} for c in mine]
    summary = json.loads((tmp_path / "records" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_accuracy"] == ours.summary["final_accuracy"]
    assert summary["federated_evaluation"] == ours.summary["federated_evaluation"]


def test_in_flowers_loop_the_evaluation_goes_to_the_cohort_and_a_reply_without_its_metrics_fails(
        data_root, monkeypatch):
    """The Flower adapter's ``configure_evaluate`` / ``aggregate_evaluate`` (``MethodStrategy``, Flower's loop): in an evaluated
    round, one ``EVALUATE`` message per cohort client, to its node, holding the evaluated model; the
    replies give the engine's columns as a ``MetricRecord`` (the std of one client left out: None)
    and the clients' rows; a reply without its personalised metrics is a failed reply that fails
    the run at ``max_failed_fraction = 0``. Rounds not evaluated, and ``federated_eval = "off"``,
    send nothing."""
    from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from fedsuite.engine.flower_strategy import MethodStrategy
    from fedsuite.method.strategy import FedSuiteStrategy, RoundFailure, ServerSetup
    from fedsuite.method.wire import (
        ARRAYS, EVAL_ACCURACY, EVAL_LOSS, METRICS, NUM_EXAMPLES, PARTITION_ID, PERSONAL_ACCURACY, PERSONAL_LOSS,
        to_ndarrays, to_record,
    )

    for field, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", SUPERLINK_NODE_ID)):
        monkeypatch.setattr(TaskIdentity, field, value)  # the identity a ServerApp sends under

    def reply(msg: Message, personal: bool) -> Message:
        pid = msg.metadata.dst_node_id - 100
        metrics = {PARTITION_ID: pid, NUM_EXAMPLES: 5 + pid, EVAL_ACCURACY: 0.1 * pid, EVAL_LOSS: 1.0}
        if personal:
            metrics.update({PERSONAL_ACCURACY: 0.75, PERSONAL_LOSS: 0.5})
        return Message(RecordDict({METRICS: MetricRecord(metrics)}), reply_to=msg)

    w = {"w": np.arange(2, dtype=np.float32)}
    for limit, federated_eval in ((0.5, "cohort"), (0.0, "cohort"), (0.0, "off")):
        cfg = inprocess_config(data_root, num_clients=4, clients_per_round=2, rounds=3, eval_every=2,
                     federated_eval=federated_eval, finetune_steps=1 if federated_eval != "off" else 0,
                     max_failed_fraction=limit)
        method = FedSuiteStrategy(ServerSetup(cfg=cfg, node_to_pid={100 + p: p for p in range(4)}, initial=w))
        strategy = MethodStrategy(method)
        method.configure_round(1, w)
        assert list(strategy.configure_evaluate(1, to_record(w), ConfigRecord(), None)) == []  # 1 % 2 != 0
        assert strategy.aggregate_evaluate(1, []) is None
        method.configure_round(2, w)
        cohort = strategy.round_log.cohort
        messages = list(strategy.configure_evaluate(2, to_record(w), ConfigRecord(), None))
        if federated_eval == "off":
            assert messages == [] and strategy.aggregate_evaluate(2, []) is None
            continue
        assert [m.metadata.dst_node_id - 100 for m in messages] == cohort
        assert all(m.metadata.message_type == MessageType.EVALUATE for m in messages)
        assert all(np.array_equal(to_ndarrays(m.content[ARRAYS])["w"], w["w"]) for m in messages)
        replies = [reply(m, personal=i > 0) for i, m in enumerate(messages)]
        if limit == 0:
            with pytest.raises(RoundFailure, match="federated evaluation: metrics lack 'personal-accuracy'"):
                strategy.aggregate_evaluate(2, replies)
            continue
        metrics = strategy.aggregate_evaluate(2, replies)
        assert dict(metrics) == {k: v for k, v in strategy.round_log.columns.items() if v is not None}
        assert metrics["clients_evaluated"] == 1 and metrics["client_eval_failed"] == 1
        assert metrics["client_accuracy_mean"] == 0.1 * cohort[1] and "client_accuracy_std" not in metrics
        rows = {r["partition_id"]: r for r in strategy.round_log.client_rows()}
        assert rows[cohort[0]]["eval_failure"] == "metrics lack 'personal-accuracy'"
        assert rows[cohort[1]]["personal_accuracy"] == 0.75 and rows[cohort[1]]["eval_examples"] == 5 + cohort[1]


def test_records_in_flowers_loop_refuse_a_folder_that_holds_a_run_and_a_key_that_is_not_a_boolean(tmp_path):
    """``records = true`` (a Flower app of one's own, ``fedsuite.engine.flower_loop``) never mixes two runs'
    records: a run directory that holds a run is refused in one line before the handshake; a new or
    empty one is taken. ``records`` must be a TOML boolean."""
    from fedsuite.errors import ConfigError, RunDirError
    from fedsuite.engine.flower_loop import LoopRecords
    from fedsuite.engine.runtime import records_asked

    LoopRecords.check_folder(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    LoopRecords.check_folder(tmp_path / "empty")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RunDirError, match=r"^records: .* holds a run already \(partial\): name another run_dir"):
        LoopRecords.check_folder(tmp_path)
    assert records_asked({RECORDS_KEY: True}) and not records_asked({}) and not records_asked({RECORDS_KEY: False})
    with pytest.raises(ConfigError, match="records must be true or false"):
        records_asked({RECORDS_KEY: "yes"})
