"""``fedsuite sweep`` (issue 31 item 1): a grid of settings times seeds as one resumable queue.

* End to end, real processes: a 2 x 2 grid (lr x strategy) with 2 seeds at 2 rounds on the offline
  default is SIGKILLed as a process group part-way, then started again: finished runs are not
  touched, the rest complete, and the report's groups and numbers equal what the runs' own
  ``metrics.jsonl`` give.
* A ``[sweep]`` section in the config file is a grid too.
* Bad grids (unknown key, a value that fails validation, an empty or malformed grid, a group-by
  that is not a grid key) are one line, exit 2, before anything runs or is created.
* A sweep run again reuses only its own runs (issue 42 item 3): with another base ``--set`` it stops
  in one line naming a run and the field, writing nothing; with more rounds it extends them. A
  failed run is named at the start of every later sweep and run again only with
  ``--retry-failed``. A search is refused in the grid's folder (their reports would collide).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedsuite.records import rundir
from fedsuite.records.rows import read_metrics
from fedsuite.queues.study import split_values
from fedsuite.queues.sweep import parse_grid
from tests.conftest import fedsuite_run, tree_snapshot

ROOT = Path(__file__).resolve().parent.parent
BASE = ["--set", "rounds=2", "--set", "num_clients=8", "--set", "clients_per_round=3", "--set", "batch_size=32",
        "--set", "faults.delay_s=0.5"]
#: the queue's runs use the in-process engine: these tests are about the queue (kill, resume, reuse,
#: report), and the engine gives Flower's numbers bit for bit (tests/test_registry_e2e.py); a queue of
#: runs on Flower's engine is test_a_sweep_section_in_the_config_file's, a killed batch of them
#: tests/test_resume.py's
ENGINE = ["--engine", "inprocess"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _sweep(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedsuite.cli.main", "sweep", *args]


def test_values_split_on_top_level_commas_only():
    assert split_values("0.01,0.05, 0.1") == ["0.01", "0.05", "0.1"]
    assert split_values("{a=1,b=2},{a=3}") == ["{a=1,b=2}", "{a=3}"]
    assert split_values("'x,y',z") == ["'x,y'", "z"]
    assert parse_grid(["lr=0.01,0.1", "strategy=fedavg,fedprox", "augment=true,false"]) == {
        "lr": [0.01, 0.1], "strategy": ["fedavg", "fedprox"], "augment": [True, False]}


@pytest.mark.long
def test_a_killed_sweep_resumes_and_reports_what_its_runs_give(tmp_path):
    out = tmp_path / "out"
    folder = out / "grid"
    args = ["--grid", "lr=0.05,0.1", "--grid", "strategy=fedavg,fedprox", "--seeds", "0,1", *BASE,
            "--set", f"data_root={tmp_path / 'data'}", "--output-dir", str(out), "--name", "grid", "--last", "2",
            "--group-by", "strategy", *ENGINE]
    proc = subprocess.Popen(_sweep(*args, "--jobs", "2"), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    runs = lambda: sorted(p for p in folder.glob("*/s*") if p.is_dir())  # noqa: E731
    deadline = time.monotonic() + 900  # a guard against a hang, not a timing
    while proc.poll() is None and time.monotonic() < deadline:
        done = [r for r in runs() if rundir.state(r) == "completed"]
        mid = [r for r in runs() if rundir.state(r) == "partial" and any(x["round"] >= 1 for x in read_metrics(r, tolerant=True))]
        if len(done) >= 2 and mid:
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.stdout.read().decode()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1)
    finished = {r: {p.name: p.read_bytes() for p in r.iterdir() if p.is_file()}
                for r in runs() if rundir.state(r) == "completed"}
    assert 2 <= len(finished) < 8

    again = fedsuite_run(["sweep", *args, "--jobs", "2"], env=_env(), timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "8 runs, " in again.stdout and f"{len(finished)} already done" in again.stdout
    for r, files in finished.items():  # a finished run is not run again
        assert {p.name: p.read_bytes() for p in r.iterdir() if p.is_file()} == files, r
    assert len(runs()) == 8 and all(rundir.state(r) == "completed" for r in runs())
    for r in runs():
        assert [x["round"] for x in read_metrics(r)] == [0, 1, 2], r

    # the report's numbers are the runs' own: per setting, mean ± sample std (n − 1) over seeds of the last 2 evaluations
    rows = {(row["lr"], row["strategy"]): row for row in csv.DictReader((folder / "report.csv").open())}
    assert set(rows) == {("0.05", "fedavg"), ("0.05", "fedprox"), ("0.1", "fedavg"), ("0.1", "fedprox")}
    means = {}
    for (lr, strategy), row in rows.items():
        values = []
        for seed in (0, 1):
            metrics = read_metrics(folder / f"lr-{lr}_strategy-{strategy}" / f"s{seed}")
            values.append(100 * float(np.mean([x["test_accuracy"] for x in metrics if x["round"] > 0][-2:])))
        assert float(row["mean"]) == pytest.approx(np.mean(values)) and float(row["std"]) == pytest.approx(np.std(values, ddof=1))
        assert row["seeds_completed"] == "2" == row["seeds_planned"]
        means[lr, strategy] = np.mean(values)
    md = (folder / "report.md").read_text()
    for strategy in ("fedavg", "fedprox"):
        lr = max(("0.05", "0.1"), key=lambda v: means[v, strategy])
        assert f"- strategy={strategy}: **lr={lr} strategy={strategy}** ({means[lr, strategy]:.2f})" in md
    assert (folder / "accuracy.png").stat().st_size > 0


@pytest.mark.long
def test_a_sweep_reuses_only_its_own_runs_and_names_a_failed_one(tmp_path):
    """One setting that completes and one whose every client reply fails (round 1), 1 round each.
    Run again with another base --set: one line naming the first run and the field, and how many
    more runs differ, exit 2, nothing written. Run again as it was: nothing runs, the failed run is
    named with its round and reason and how to retry, exit 1. With 2 rounds and --retry-failed: the
    completed run is extended, the failed one run again (it fails again: the failure is its
    setting's). A search is refused in the grid's folder, whose report stays."""
    out = tmp_path / "out"
    folder = out / "grid"
    ok, bad = folder / "faults.client_error-0.0" / "s0", folder / "faults.client_error-1.0" / "s0"
    args = ["--grid", "faults.client_error=0.0,1.0", "--seeds", "0", "--set", "num_clients=6", "--set",
            "clients_per_round=2", "--set", "batch_size=32", "--set", f"data_root={tmp_path / 'data'}", "--output-dir",
            str(out), "--name", "grid", *ENGINE]
    sweep = lambda *more: fedsuite_run(["sweep", *args, *more], env=_env(), timeout=900)  # noqa: E731
    first = sweep("--set", "rounds=1")
    assert first.returncode == 1, first.stdout + first.stderr
    assert rundir.state(ok) == "completed" and rundir.state(bad) == "failed"
    failure = rundir.summary(bad)["failure"]["message"]
    assert failure.startswith("round 1: 2 of 2 client replies failed"), failure

    before = tree_snapshot(out)
    changed = sweep("--set", "rounds=1", "--set", "alpha=0.1")
    assert changed.returncode == 2 and changed.stdout == "", changed.stdout + changed.stderr
    assert changed.stderr == (f"error: {ok} holds a run of another config (alpha: recorded 0.5, asked 0.1), and 1 "
                              "more run of this queue differ; nothing was started: ask for the recorded config, or "
                              "give the new runs another folder (another --name or --output-dir)\n"), changed.stderr
    assert tree_snapshot(out) == before

    runs_before = {run: tree_snapshot(run) for run in (ok, bad)}
    again = sweep("--set", "rounds=1")
    assert again.returncode == 1, again.stdout + again.stderr
    named = (f"faults.client_error=1.0 s0: failed, stopped after round 0: {failure} ({bad}); not run again; "
             "--retry-failed runs it again from its last checkpoint")
    assert "2 runs, 1 already done, 0 to run" in again.stdout and named in again.stdout.splitlines(), again.stdout
    assert "start" not in again.stdout and "retry " not in again.stdout, again.stdout
    assert {run: tree_snapshot(run) for run in (ok, bad)} == runs_before
    assert f"- faults.client_error=1.0 s0: failed, stopped after round 0: {failure}" in (folder / "report.md").read_text()

    started = rundir.summary(bad)["timing"]["serverapp_start"]
    retried = sweep("--set", "rounds=2", "--retry-failed")
    assert retried.returncode == 1, retried.stdout + retried.stderr
    assert "2 runs, 0 already done, 2 to run" in retried.stdout, retried.stdout
    assert (f"faults.client_error=1.0 s0: failed, stopped after round 0: {failure} ({bad}); run again "
            "(--retry-failed), from its last checkpoint") in retried.stdout.splitlines(), retried.stdout
    assert f"extend faults.client_error=0.0 s0 -> {ok}" in retried.stdout, retried.stdout
    assert f"retry  faults.client_error=1.0 s0 -> {bad}" in retried.stdout, retried.stdout
    assert [r["round"] for r in read_metrics(ok)] == [0, 1, 2] and rundir.state(ok, 2) == "completed"
    assert rundir.state(bad) == "failed" and rundir.summary(bad)["timing"]["serverapp_start"] > started
    assert rundir.summary(bad)["failure"]["message"] == failure

    report = tree_snapshot(folder)
    search = fedsuite_run(["sweep", "--search", "random", "--space", "lr=choice:0.05", "--set", "rounds=1",
                           "--output-dir", str(out), "--name", "grid"], env=_env(), timeout=300)
    assert search.returncode == 2 and search.stderr == (
        f"error: {folder} holds a grid sweep, whose report.md a search's would replace: give the search another "
        "--name\n"), search.stdout + search.stderr
    assert tree_snapshot(folder) == report


def test_a_sweep_section_in_the_config_file(tmp_path):
    """Two runs at once, each on its private Ray (a sweep on a laptop): each is pinned to its own
    share of the cores, which its Ray, its clients and its central evaluation then use."""
    from fedsuite.launch.processes import core_slices

    config = tmp_path / "mine.toml"
    config.write_text('rounds = 1\nnum_clients = 6\nclients_per_round = 2\n\n[sweep]\n'
                      'grid = { fedprox.mu = [0.0, 0.1] }\nseeds = [3]\n')
    res = fedsuite_run(["sweep", "--config", str(config), "--set", "strategy=fedprox", "--set",
                        f"data_root={tmp_path / 'data'}", "--output-dir", str(tmp_path / "out"), "--jobs", "2"],
                       env=_env(), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    folder = tmp_path / "out" / "mine"
    runs = sorted(p for p in folder.glob("*/s*") if p.is_dir())
    assert [p.parent.name + "/" + p.name for p in runs] == ["fedprox.mu-0.0/s3", "fedprox.mu-0.1/s3"]
    assert [row["fedprox.mu"] for row in csv.DictReader((folder / "report.csv").open())] == ["0.0", "0.1"]
    shares = core_slices(2)
    if shares is not None:  # Linux: each run held one share (on 2 cores: one core each)
        held = [json.loads((p / "summary.json").read_text())["timing"]["cores"] for p in runs]
        assert sorted(held) == sorted(len(s) for s in shares), held  # both started at once: one slot each


def test_a_sweep_section_with_seeds_only_takes_the_grid_from_the_command_line(tmp_path):
    """A [sweep] section is never a config key for the runs; a refused setting writes nothing."""
    config = tmp_path / "seeds.toml"
    config.write_text("rounds = 1\n\n[sweep]\nseeds = [4, 5]\n")
    res = fedsuite_run(["sweep", "--config", str(config), "--grid", "lr=0.1,-1", "--output-dir", str(tmp_path / "out")],
                       env=_env(), timeout=120)
    assert res.returncode == 2 and "setting lr=-1" in res.stderr and "sweep" not in res.stderr.split("lr=-1")[1], res.stderr
    assert not (tmp_path / "out").exists()
    from fedsuite.queues.sweep import plan, read_sweep_section
    stripped, grid, seeds = read_sweep_section(config)
    assert (stripped, grid, seeds) == ({"rounds": 1}, {}, [4, 5])
    runs = plan(tmp_path / "base.toml", [], {"lr": [0.1]}, seeds, tmp_path / "out", base=stripped)
    assert [(r.seed, r.rounds) for r in runs] == [(4, 1), (5, 1)]


@pytest.mark.parametrize(("args", "words"), [
    (["--grid", "nope=1,2"], "nope: unknown key"),
    (["--grid", "lr=0.1,-1"], "setting lr=-1: config: lr"),
    (["--grid", "strategy=fedavg,notamethod"], "unknown strategy 'notamethod'"),
    ([], "the grid is empty"),
    (["--grid", "lr"], "--grid expects key=value1,value2"),
    (["--grid", "lr=0.1,"], "--grid expects key=value1,value2"),
    (["--grid", "lr=0.1", "--grid", "lr=0.2"], "names 'lr' twice"),
    (["--grid", "seed=1,2"], "seed is not a grid key"),
    (["--grid", "lr=0.1", "--group-by", "strategy"], "--group-by 'strategy' is not a grid key"),
    (["--grid", "lr=0.1", "--seeds", "a,b"], "--seeds takes non-negative integers"),
])
def test_a_bad_grid_is_one_line_before_anything_runs(tmp_path, args, words):
    res = fedsuite_run(["sweep", *args, "--output-dir", str(tmp_path / "out")], env=_env(), timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert words in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len([line for line in res.stderr.splitlines() if line.strip()]) <= 2, res.stderr
    assert not (tmp_path / "out").exists()


SMALL = ["--set", "rounds=1", "--set", "num_clients=6", "--set", "clients_per_round=2", "--set", "batch_size=32"]


@pytest.mark.parametrize(("args", "words"), [
    (["--grid", "model=mlp,cnn"], ["setting model=cnn", "model 'cnn' needs image input"]),
    (["--grid", "num_cpus=1,1000"], ["setting num_cpus=1000", "num_cpus=1000 is the CPU cores of one client"]),
    (["--grid", "lr=0.05", "--set", "model=cnn"], ["setting lr=0.05", "model 'cnn' needs image input"]),
])
def test_a_setting_simulate_would_refuse_is_one_line_before_anything_runs(tmp_path, args, words):
    """Every check ``fedsuite simulate`` makes before its run folder exists (here the data check's
    "a model that cannot take the data" and the hardware check) is made for every run of the grid
    before the queue starts: the runs started, failed, and the report said "not run"."""
    out = tmp_path / "out"
    res = fedsuite_run(["sweep", *args, *SMALL, "--set", f"data_root={tmp_path / 'data'}", "--output-dir", str(out),
                        *ENGINE], env=_env(), timeout=600)
    assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
    assert res.stderr.startswith("error: ") and len(res.stderr.splitlines()) == 1, res.stderr
    assert all(w in res.stderr for w in words), res.stderr
    assert not out.exists()


def test_a_reproduce_queue_makes_simulates_checks_before_it_starts(tmp_path):
    """The same checks for a reproduce target's runs (one queue: ``fedsuite.queues.reproduce.queue.pending``)."""
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text('paper = "a tiny table"\n\n[targets.tiny]\ntitle = "t"\nours = "fedprox"\nseeds = [0]\n'
                      'set = ["model=cnn", "rounds=1", "num_clients=6", "clients_per_round=2"]\n\n'
                      '[targets.tiny.methods]\nfedavg = { set = ["strategy=fedavg"] }\n'
                      'fedprox = { set = ["strategy=fedprox"] }\n\n[[targets.tiny.rows]]\nname = "a"\n')
    out = tmp_path / "out"
    res = fedsuite_run(["reproduce", "tiny", "--scale", "paper", "--tables", str(tables), "--output-dir", str(out), "--data-root",
                        str(tmp_path / "data"), *ENGINE], env=_env(), timeout=600)
    assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
    assert res.stderr.startswith("error: a fedavg s0: ") and "model 'cnn' needs image input" in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1 and not list(out.rglob("*")), res.stderr


def test_each_run_gets_the_settings_of_its_own_method(tmp_path):
    """A base setting of one method's section (``--set fedprox.mu=0.1``, or a config file holding
    every baseline's section) beside ``--grid strategy=fedavg,fedprox``: each run's command line
    carries only the settings its method and plug-ins use, which ``fedsuite simulate`` now demands.
    A grid key that some of its settings' runs would not use is refused: those runs would be one
    run under several names."""
    from fedsuite.launch.runner import resolve_config
    from fedsuite.queues.study import SweepError
    from fedsuite.queues.sweep import plan

    runs = plan(None, ["fedprox.mu=0.1", "relaxed_init.storage=server-state"],
                {"strategy": ["fedavg", "fedprox", "fedinit"]}, [0], tmp_path)
    by = {r.setting["strategy"]: r for r in runs}
    assert "fedprox.mu=0.1" not in by["fedavg"].overrides and "fedprox.mu=0.1" in by["fedprox"].overrides
    assert "relaxed_init.storage=server-state" in by["fedinit"].overrides  # fedinit switches relaxed_init on
    assert "relaxed_init.storage=server-state" not in by["fedprox"].overrides
    for run in runs:  # the command line each run's simulate gets passes its checks, and runs the planned config
        assert resolve_config(run.config, run.overrides, {}).active_dump() == run.cfg.active_dump(), run.label
    assert by["fedprox"].cfg.fedprox.mu == 0.1

    baselines = ROOT / "experiments" / "baselines" / "cpu_fmnist.toml"
    for run in plan(baselines, [], {"strategy": ["fedavg", "fedprox", "scaffold"]}, [0], tmp_path / "b"):
        assert resolve_config(run.config, run.overrides, {}).strategy == run.setting["strategy"]

    with pytest.raises(SweepError) as exc:
        plan(None, [], {"strategy": ["fedavg", "fedprox"], "fedprox.mu": [0.01, 0.1]}, [0], tmp_path / "c")
    assert str(exc.value).startswith("setting strategy=fedavg fedprox.mu=0.01: fedprox.mu is a setting of fedprox; "
                                     "this run's strategy is fedavg"), exc.value
    with pytest.raises(SweepError) as exc:  # a base setting no run uses: it would change nothing
        plan(None, ["fedprox.mu=0.1"], {"lr": [0.05, 0.1]}, [0], tmp_path / "d")
    assert str(exc.value) == ("--set fedprox.mu=0.1: no run of the sweep uses it (its first run: fedprox.mu is a "
                              "setting of fedprox; this run's strategy is fedavg)"), exc.value


@pytest.mark.long
def test_a_second_sweep_into_a_running_sweeps_folder_is_refused_naming_the_first(tmp_path):
    """Two identical sweeps at once both started the same runs, and both exited 1 though every run
    completed. The second is refused in one line naming the first's PID (a lock on the sweep's
    folder, which the operating system releases when its holder ends); the first is unaffected."""
    out = tmp_path / "out"
    folder = (out / "twice").resolve()
    args = _sweep("--grid", "lr=0.05", "--seeds", "0", "--set", "rounds=10", "--set", "num_clients=6", "--set",
                  "clients_per_round=2", "--set", "batch_size=32", "--set", "faults.delay_s=1.0", "--set",
                  f"data_root={tmp_path / 'data'}", "--output-dir", str(out), "--name", "twice", *ENGINE)
    first = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = folder / "lr-0.05" / "s0"
    deadline = time.monotonic() + 600  # a guard against a hang, not a timing
    while first.poll() is None and not (run / "config.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert first.poll() is None, first.stdout.read()
    second = fedsuite_run(args[3:], env=_env(), timeout=600)
    assert first.poll() is None, "the first sweep ended before the second was refused: a slower run is needed"
    assert second.returncode == 2 and second.stdout == "", second.stdout + second.stderr
    assert second.stderr == (f"error: {folder} is in use by another fedsuite sweep (PID {first.pid}): wait for it to "
                             "end (the same command then finds its runs done), or give this one another --name or "
                             "--output-dir\n"), second.stderr
    assert first.wait(timeout=600) == 0, first.stdout.read()
    assert rundir.state(run) == "completed"
    again = fedsuite_run(args[3:], env=_env(), timeout=600)  # the lock went with it
    assert again.returncode == 0 and "1 already done, 0 to run" in again.stdout, again.stdout + again.stderr


def test_the_warm_starter_runs_each_command_in_a_process_of_its_own_and_says_how_it_ended(tmp_path):
    """``fedsuite.launch.warm``, which starts a queue's runs: each command is a process of its own (not the
    warm process, not this one) with its output in its log, its cores and its exit code (2 for a
    refused config; minus the signal for a killed run); a run started after the warm process died is
    started the plain way and runs as well."""
    import psutil

    from fedsuite.launch.warm import WarmStarter

    def command(name: str, *more: str) -> list[str]:
        return [sys.executable, "-m", "fedsuite.cli.main", "simulate", "--engine", "inprocess", "--set", "num_clients=6",
                "--set", "clients_per_round=2", "--set", f"data_root={tmp_path / 'data'}", "--output-dir",
                str(tmp_path / "out"), "--run-name", name, *more]

    with WarmStarter() as starter:
        ok = starter.start(command("ok", "--rounds", "1"), tmp_path / "ok.log", None, _env())
        refused = starter.start(command("refused", "--rounds", "0"), tmp_path / "refused.log", None, _env())
        long = starter.start(command("long", "--rounds", "50", "--set", "faults.delay_s=2"), tmp_path / "long.log",
                             [0], _env())
        assert len({ok.pid, refused.pid, long.pid, starter.proc.pid, os.getpid()}) == 5
        assert psutil.Process(long.pid).ppid() == starter.proc.pid
        assert psutil.Process(long.pid).cpu_affinity() == [0]
        assert ok.wait(300) == 0, (tmp_path / "ok.log").read_text()
        assert refused.wait(300) == 2 and "rounds" in (tmp_path / "refused.log").read_text()
        os.kill(long.pid, signal.SIGKILL)
        assert long.wait(60) == -signal.SIGKILL
        assert rundir.state(tmp_path / "out" / "ok") == "completed"
        assert "done: final accuracy" in (tmp_path / "ok.log").read_text()

        starter.proc.kill()
        starter.proc.wait()
        after = starter.start(command("after", "--rounds", "1"), tmp_path / "after.log", None, _env())
        assert isinstance(after, subprocess.Popen) and after.wait(300) == 0, (tmp_path / "after.log").read_text()
    assert rundir.state(tmp_path / "out" / "after") == "completed"
