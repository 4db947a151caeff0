"""fedsuite from Python (issue 41 item 1): ``fedsuite.simulate``, ``load_run``, ``load_runs``, and
the guide docs/python-api.md, whose code blocks run here as written.

Real simulations, each about a minute on a loaded 2-core machine, so few of them:

* ``api_run``: ``fedsuite.simulate`` of the FAST setup (tests/conftest.py) from a TOML file, shared
  by the tests of one run;
* ``sweep``: ``fedsuite sweep --grid lr=0.05,0.1 --seeds 7`` over the same file, two runs, each a
  ``fedsuite simulate`` process (``fedsuite.queues.reproduce.queue.simulate_command``); the lr=0.05 run is
  the CLI's run of ``api_run``'s config, which it must equal bit for bit;
* one run stopped by SIGINT after its first round;
* the guide's own runs (two methods and a two-setting sweep).

The rest (bad settings, a run folder that exists, resuming a complete run, reading bad folders,
the import's cost) starts no simulation.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
import torch

import fedsuite
from fedsuite.launch import processes
from fedsuite.records import rundir
from fedsuite.launch.api import OWN_KEYWORDS
from fedsuite.records.rows import read_metrics

from tests.conftest import FAST, assert_same_arrays, fedsuite_run

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "python-api.md"


def _env(**extra: str) -> dict[str, str]:
    """This environment, with this checkout first on PYTHONPATH (the processes tests start import it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


def _without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, data_root) -> tuple[Path, Path]:
    """(a folder for this file's runs, the FAST setup as a TOML file)."""
    folder = tmp_path_factory.mktemp("api")
    toml = folder / "fast.toml"
    toml.write_text(tomli_w.dumps({**FAST, "data_root": str(data_root)}))
    return folder, toml


@pytest.fixture(scope="module")
def api_run(setup, worker_ray_cluster) -> tuple[fedsuite.Run, str]:
    """``fedsuite.simulate`` of the FAST setup on Flower's engine, its clients on the xdist worker's
    Ray node (the API's run on a private Ray: the Ctrl-C test below), silent: (the run, what it
    printed)."""
    folder, toml = setup
    printed = io.StringIO()
    with redirect_stdout(printed):  # where a console prints (rich reads sys.stdout when it prints)
        run = fedsuite.simulate(config=toml, output_dir=folder / "runs", run_name="api", progress=False,
                                ray_address=worker_ray_cluster)
    return run, printed.getvalue()


@pytest.fixture(scope="module")
def sweep(setup) -> Path:
    """``fedsuite sweep`` of two settings (lr) x one seed over the FAST file, on the in-process engine
    (``api_run`` is on Flower's, so the two are compared across engines): its folder."""
    folder, toml = setup
    res = fedsuite_run(["sweep", "--config", str(toml), "--grid", "lr=0.05,0.1", "--seeds", "7", "--last", "1",
                        "--output-dir", str(folder / "sweeps"), "--name", "lr", "--engine", "inprocess"], env=_env(),
                       timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return folder / "sweeps" / "lr"


# ------------------------------------------------------------------------------------------------
# fedsuite.simulate
# ------------------------------------------------------------------------------------------------


def test_simulate_returns_the_run_with_its_files_as_python_objects(api_run):
    run, printed = api_run
    assert printed == ""  # progress=False
    assert isinstance(run, fedsuite.Run) and run.status == "completed" and run.error is None
    assert run.dir == (run.dir.parent / "api") and run.dir.is_dir()
    rows = read_metrics(run.dir)
    assert isinstance(run.metrics, pd.DataFrame)
    assert run.metrics["round"].tolist() == [0, 1, 2] == [r["round"] for r in rows]  # one row per round, 0: w^0
    assert set(run.metrics.columns) == {k for r in rows for k in r} and run.metrics.columns[0] == "round"
    for row, (_, cells) in zip(rows, run.metrics.iterrows()):
        for column, cell in cells.items():
            if column in row:
                assert cell == row[column], (row["round"], column)
            else:  # round 0 is the initial model's evaluation: no training columns
                assert row["round"] == 0 and (cell is pd.NA or isinstance(cell, float) and math.isnan(cell)), column
    log = (run.dir / "flower.log").read_text()  # the simulation's log (it was empty): the start, each round, the end
    assert "fedsuite: fedavg on synthetic" in log and "fedsuite: round 1/2" in log and "fedsuite: round 2/2" in log
    assert f"fedsuite: run completed: {run.dir}" in log, log
    for column in ("round", "bytes_sent", "bytes_received", "failed"):  # integers stay integers
        assert pd.api.types.is_integer_dtype(run.metrics[column]), (column, run.metrics[column].dtype)
    assert run.summary == json.loads((run.dir / "summary.json").read_text())
    assert run.config == json.loads((run.dir / "config.json").read_text())
    assert {k: run.config[k] for k in FAST} == FAST
    assert run.settings["faults.delay_s"] == run.config["faults"]["delay_s"]  # sections as dotted keys
    acc = run.summary["final_accuracy"]
    assert repr(run) == f"<Run fedavg on synthetic, seed 7: completed, 2/2 rounds, final accuracy {100 * acc:.2f}%, {run.dir}>"
    again = fedsuite.load_run(run.dir)
    pd.testing.assert_frame_equal(again.metrics, run.metrics)
    assert (again.config, again.summary, again.status) == (run.config, run.summary, run.status)


def test_simulate_equals_fedsuite_simulate_from_the_cli_bit_for_bit(api_run, sweep):
    """The sweep ran its lr=0.05 setting as ``python -m fedsuite.cli.main simulate --config fast.toml --set
    lr=0.05 --set seed=7 --engine inprocess ...``: the resolved config of ``api_run``, in another folder,
    on the other engine. Same seed, same numbers: every metric but the wall time, and the final
    model's arrays."""
    run, _ = api_run
    cli = fedsuite.load_run(sweep / "lr-0.05" / "s7")
    where = ("output_dir", "run_name", "engine", "ray_address")
    assert {k: v for k, v in cli.config.items() if k not in where} == {k: v for k, v in run.config.items() if k not in where}
    assert _without_time(read_metrics(cli.dir)) == _without_time(read_metrics(run.dir))
    pd.testing.assert_frame_equal(cli.metrics.drop(columns="wall_seconds"), run.metrics.drop(columns="wall_seconds"))
    assert_same_arrays(torch.load(cli.dir / "checkpoint.pt", weights_only=False)["arrays"],
                       torch.load(run.dir / "checkpoint.pt", weights_only=False)["arrays"])
    said = (sweep / "lr-0.05" / "s7.log").read_text()  # what that fedsuite simulate printed
    assert f"done: final accuracy {100 * run.summary['final_accuracy']:.2f}%" in said, said[-2000:]


@pytest.mark.parametrize(("settings", "line"), [
    ({"roundz": 3}, "config: roundz: unknown key; did you mean 'rounds'? allowed keys here: alpha, "),
    ({"rounds": 0}, "config: rounds: Input should be greater than or equal to 1 (got 0)"),
    ({"strategy": "fedprox", "fedprox": {"muu": 1}}, "config: fedprox.muu: unknown key; did you mean 'mu'? allowed keys here: mu"),
    ({"strategy": "fedprox", "fedprox.mu": -1}, "config: fedprox.mu: Input should be greater than or equal to 0 (got -1)"),
    ({"strategy": "nope"}, "config: unknown strategy 'nope'; allowed: ccvr, "),
])
def test_bad_settings_raise_the_clis_line_and_create_nothing(tmp_path, settings, line):
    out = tmp_path / "runs"  # a Path: taken as a config file takes its string
    with pytest.raises(fedsuite.ConfigError) as info:
        fedsuite.simulate(**{**FAST, **settings}, output_dir=out, data_root=tmp_path / "data", progress=False)
    message = str(info.value)
    assert message.startswith(line) and "\n" not in message, message
    assert isinstance(info.value, fedsuite.FedsuiteError) and isinstance(info.value, ValueError)
    # raised from fedsuite.simulate itself: no frames of fedsuite's inside, no pydantic error under it
    assert [Path(entry.path).name for entry in info.traceback] == ["test_api.py", "api.py"]
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert not out.exists() and not (tmp_path / "data").exists()


def test_a_section_is_a_dict_or_dotted_keys_and_a_dict_keeps_the_files_other_keys(tmp_path):
    from fedsuite.launch.runner import resolve_config

    toml = tmp_path / "faults.toml"
    toml.write_text("[faults]\ndelay_s = 0.5\ndelay_prob = 0.5\n")
    as_dict = resolve_config(toml, [], {"faults": {"delay_prob": 0.25}})
    dotted = resolve_config(toml, [], {"faults.delay_prob": 0.25})
    assert as_dict.faults.delay_prob == dotted.faults.delay_prob == 0.25
    assert as_dict.faults.delay_s == dotted.faults.delay_s == 0.5  # from the file
    from fedsuite.config import config_model

    assert not set(OWN_KEYWORDS) & set(config_model().model_fields), "a config key would be taken by simulate"


def test_a_run_folder_that_exists_is_refused_in_pythons_words(api_run):
    run, _ = api_run
    before = {p.name: p.read_bytes() for p in run.dir.iterdir() if p.is_file()}
    with pytest.raises(fedsuite.ConfigError, match=re.escape(
            f"run directory {run.dir} exists; choose another run_name or pass resume=True")):
        fedsuite.simulate(**{**FAST, "rounds": 3}, output_dir=run.dir.parent, run_name=run.dir.name, progress=False)
    assert {p.name: p.read_bytes() for p in run.dir.iterdir() if p.is_file()} == before


def test_resuming_a_complete_run_returns_it_untouched(api_run, capsys):
    """``resume=True`` needs only the run's folder (its recorded config is the base); a run that has
    its rounds already is returned as it is, without a simulation, and says so."""
    run, _ = api_run
    before = {p.name: p.read_bytes() for p in run.dir.iterdir() if p.is_file()}
    again = fedsuite.simulate(resume=True, output_dir=run.dir.parent, run_name=run.dir.name)
    # the console wraps at its width, at a space (which it drops) or inside the path: compare without whitespace
    assert "".join(capsys.readouterr().out.split()) == "".join((
        f"{run.dir} is complete (2 rounds): nothing was run or changed; pass a larger rounds to continue it").split())
    assert {p.name: p.read_bytes() for p in run.dir.iterdir() if p.is_file()} == before
    pd.testing.assert_frame_equal(again.metrics, run.metrics)
    assert (again.config, again.summary, again.status) == (run.config, run.summary, "completed")


def test_ctrl_c_stops_every_process_and_raises_with_the_call_that_continues_the_run(setup):
    """SIGINT to a Python process inside ``fedsuite.simulate`` (what Ctrl-C, or a notebook's stop,
    sends it) after round 1: every process of the run stops, the run stays partial, and
    ``RunInterrupted`` (a KeyboardInterrupt) says how far it got and the call that continues it,
    raised from ``simulate`` itself."""
    folder, toml = setup
    run_dir = folder / "runs" / "ctrl-c"
    script = (f"import fedsuite\nfedsuite.simulate(config={str(toml)!r}, rounds=20, output_dir={str(run_dir.parent)!r}, "
              f"run_name='ctrl-c', progress=False)\n")
    err = folder / "ctrl-c.err"
    with err.open("wb") as stderr:
        # SIGINT handled as in a terminal (a process started where SIGINT is ignored inherits that)
        proc = subprocess.Popen([sys.executable, "-c", script], env=_env(), cwd=folder, stdout=subprocess.DEVNULL,
                                stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 600
        while not any(r["round"] >= 1 for r in read_metrics(run_dir, tolerant=True)):
            assert proc.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach round 1 in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        # uncaught, it ends Python with code 1 (KeyboardInterrupt itself, no subclass, ends it by SIGINT)
        assert proc.wait(timeout=120) == 1, err.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = err.read_text()
    match = re.fullmatch(r"fedsuite\.errors\.RunInterrupted: interrupted after round (\d+) of 20; continue the run "
                         r"with: (.+)", said.strip().splitlines()[-1])
    assert match, said
    assert 1 <= int(match[1]) < 20
    assert match[2] == f"fedsuite.simulate(resume=True, output_dir={str(run_dir.parent)!r}, run_name='ctrl-c')"
    assert said.count('  File "') == 2, said  # the caller's line and simulate's raise
    assert not processes.marked("FLWR_HOME", str(run_dir / ".flwr"), simulation_in=str(run_dir))
    assert rundir.state(run_dir) == "partial"
    partial = fedsuite.load_run(run_dir)
    assert partial.status == "partial" and partial.rounds_done == int(match[1]) and partial.summary == {}


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_ctrl_c_after_the_run_completed_is_no_interruption(setup, stop):
    """Ctrl-C (SIGINT) or SIGTERM while ``fedsuite simulate`` stops the run's processes after the
    last round (the ServerApp has recorded the run completed) printed "interrupted ... continue the
    run with --resume" for a complete run, exit 130 (SIGTERM: exit 143 and no "done" line): it is the
    run's ending, "done", exit 0."""
    folder, toml = setup
    run_dir = folder / "runs" / f"ctrl-c-done-{stop.name.lower()}"
    err = folder / f"{run_dir.name}.err"
    with err.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "fedsuite.cli.main", "simulate", "--config", str(toml),
                                 "--output-dir", str(run_dir.parent), "--run-name", run_dir.name], env=_env(),
                                cwd=folder, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 600
        while rundir.summary_status(run_dir) != ("finished:completed", "") and proc.poll() is None:
            assert time.monotonic() < deadline, "the run did not complete in time"
            time.sleep(0.01)
        proc.send_signal(stop)  # the launcher polls summary.json every 0.25 s: it is still stopping the run
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = out.decode() + err.read_text()
    assert proc.returncode == 0 and "interrupted" not in said and "--resume" not in said, said[-3000:]
    assert f"done: final accuracy {100 * fedsuite.load_run(run_dir).summary['final_accuracy']:.2f}%" in said
    assert rundir.state(run_dir) == "completed"


# ------------------------------------------------------------------------------------------------
# load_run, load_runs
# ------------------------------------------------------------------------------------------------


def test_load_runs_reads_a_sweep_with_its_grid_keys_as_columns(sweep):
    runs = fedsuite.load_runs(sweep.parent)  # the folder above the sweep's: runs are found at any depth
    assert isinstance(runs, fedsuite.Runs) and len(runs) == 2
    assert [runs.name(run) for run in runs] == ["lr/lr-0.05/s7", "lr/lr-0.1/s7"]
    assert runs.keys == ["strategy", "lr"]
    assert repr(runs) == f"<Runs: 2 runs under {sweep.parent} (2 completed); keys: strategy, lr>"
    frame = runs.metrics
    assert list(frame.columns[:6]) == ["run", "status", "strategy", "lr", "seed", "round"]
    assert len(frame) == sum(len(read_metrics(run.dir)) for run in runs)
    for run, lr in zip(runs, (0.05, 0.1)):
        rows = read_metrics(run.dir)
        part = frame[frame["run"] == runs.name(run)]
        assert set(part["lr"]) == {lr} and set(part["strategy"]) == {"fedavg"} and set(part["seed"]) == {7}
        assert set(part["status"]) == {"completed"}
        assert part["round"].tolist() == [r["round"] for r in rows]
        assert part["test_accuracy"].tolist() == [r["test_accuracy"] for r in rows]
    # the sweep's own report reads the same numbers (--last 1: each run's final accuracy, in %)
    reported = {float(row["lr"]): float(row["mean"]) for row in csv.DictReader((sweep / "report.csv").open())}
    final = frame[frame["round"] == 2].groupby("lr")["test_accuracy"].mean()
    assert {lr: 100 * acc for lr, acc in final.items()} == pytest.approx(reported)
    # the sweep's folder itself, and one of its runs
    assert [run.dir for run in fedsuite.load_runs(sweep)] == [run.dir for run in runs]
    one = fedsuite.load_run(sweep / "lr-0.1" / "s7")
    pd.testing.assert_frame_equal(one.metrics, runs[1].metrics)
    assert [run.dir for run in fedsuite.load_runs(one.dir)] == [one.dir]


def test_reading_a_folder_that_holds_no_run_is_one_line(tmp_path, api_run):
    with pytest.raises(fedsuite.ResultsError, match="is not a folder"):
        fedsuite.load_run(tmp_path / "nowhere")
    with pytest.raises(fedsuite.ResultsError, match=re.escape(f"{tmp_path} is not a fedsuite run directory (no config.json)")):
        fedsuite.load_run(tmp_path)
    with pytest.raises(fedsuite.ResultsError, match=re.escape(f"no fedsuite runs under {tmp_path}")):
        fedsuite.load_runs(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    run, _ = api_run
    for name in ("config.json", "summary.json"):
        (broken / name).write_bytes((run.dir / name).read_bytes())
    (broken / "metrics.jsonl").write_text((run.dir / "metrics.jsonl").read_text()[:-20])  # a cut-off last line
    with pytest.raises(fedsuite.ResultsError, match=re.escape(f"{broken / 'metrics.jsonl'}, line 3: not a valid metrics row")):
        fedsuite.load_runs(tmp_path)


def test_integer_columns_stay_integers_where_round_0_lacks_them():
    """``run.metrics``'s ``bytes_sent`` came back as floats (1234.0): round 0 has no such column, and a
    missing value made pandas turn the whole column to float. A column of integers stays integer
    (nullable ``Int64`` where rows lack it); floats, lists and booleans are left as pandas reads them."""
    from fedsuite.launch.api import metrics_frame

    rows = [{"round": 0, "test_accuracy": 0.1},
            {"round": 1, "test_accuracy": 0.5, "bytes_sent": 2**40 + 1, "failed": 0, "cohort": [3, 1], "ok": True},
            {"round": 2, "test_accuracy": None, "bytes_sent": 7, "failed": 2, "cohort": [0, 2], "ok": False}]
    frame = metrics_frame(rows)
    assert list(frame.columns) == ["round", "test_accuracy", "bytes_sent", "failed", "cohort", "ok"]
    assert frame["round"].dtype == "int64" and frame["bytes_sent"].dtype == "Int64" == frame["failed"].dtype
    assert frame["bytes_sent"].tolist() == [pd.NA, 2**40 + 1, 7] and frame["failed"].tolist()[1:] == [0, 2]
    assert frame["test_accuracy"].dtype == "float64" and frame["cohort"].tolist()[1] == [3, 1]
    assert frame["ok"].tolist()[1:] == [True, False]


def test_import_fedsuite_imports_neither_torch_nor_flower_ray_or_pandas():
    """The CLI starts with this import; the API's names resolve without importing what they call."""
    code = ("import sys, fedsuite\n"
            "names = (fedsuite.simulate, fedsuite.load_run, fedsuite.load_runs, fedsuite.Run, fedsuite.Runs,\n"
            "         fedsuite.ConfigError, fedsuite.RunFailed, fedsuite.RunInterrupted)\n"
            "import fedsuite.cli.main\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'flwr', 'ray', 'pandas', 'pydantic'}))\n")
    res = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


# ------------------------------------------------------------------------------------------------
# docs/python-api.md runs as written
# ------------------------------------------------------------------------------------------------

#: a fenced block of the guide that runs: ```python (in one namespace, as notebook cells do) or ```bash
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def guide_blocks() -> list[tuple[str, str, int]]:
    """(language, code, the line before the code) of each runnable block of the guide, in order."""
    text = DOCS.read_text()
    return [(m[1], m[2], text.count("\n", 0, m.start(2))) for m in BLOCK.finditer(text)]


def test_the_guide_has_the_blocks_a_reader_runs():
    blocks = guide_blocks()
    code = "\n".join(block for _, block, _ in blocks)
    for call in ("fedsuite.simulate(", "fedsuite.load_runs(", ".plot(", "groupby(", "fedsuite sweep "):
        assert call in code, call


@pytest.mark.long  # four simulations: this file's group is scheduled first (tests/conftest.py)
def test_the_guide_runs_as_written(tmp_path, monkeypatch, capsys):
    """Every ```python block of docs/python-api.md in order, in one namespace (a notebook's kernel),
    and its ```bash blocks in a shell, in a fresh folder that is also HOME (the default data_root,
    ~/.cache/fedsuite/data, is then in it). A traceback points at the guide's own lines."""
    import matplotlib

    matplotlib.use("Agg")  # no display; the guide saves its figure
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    namespace: dict = {"__name__": "__guide__"}
    for language, code, line in guide_blocks():
        if language == "python":
            exec(compile("\n" * line + code, str(DOCS), "exec"), namespace)
        else:
            env = _env(HOME=str(tmp_path), PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
            res = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=900)
            assert res.returncode == 0, f"docs/python-api.md, line {line + 1}:\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
    printed = capsys.readouterr().out

    # what the guide says it shows
    fedavg, fedprox = namespace["fedavg"], namespace["fedprox"]
    assert fedavg.status == fedprox.status == "completed"
    assert fedprox.config["fedprox"] == {"mu": 0.1}
    assert "round 3/3" in printed and f"done: final accuracy {100 * fedavg.summary['final_accuracy']:.2f}%" in printed
    curves = namespace["curves"]
    assert list(curves.columns) == ["fedavg", "fedprox"] and curves.index.tolist() == [0, 1, 2, 3]
    assert curves["fedprox"].tolist() == [r["test_accuracy"] for r in read_metrics(fedprox.dir)]
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    assert [run.dir for run in namespace["runs"]] == sorted([fedavg.dir, fedprox.dir])
    assert "['strategy', 'lr']" in printed
    last = namespace["last"]
    assert sorted(last["lr"]) == [0.02, 0.1] and set(last["round"]) == {3}
    assert "config: local_epoch: unknown key; did you mean 'local_epochs'? allowed keys here: " in printed
