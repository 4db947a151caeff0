"""A run keeps its identity (``fedsuite.records.identity``): no record of another run is ever used as its own.

* A checkpoint, a client-state file or a summary copied in from another run (another learning
  rate) is refused by ``--resume`` in one line naming the file and the differing field, exit code
  2, nothing touched; a checkpoint written before identities, copied in from another run, is caught
  by its metrics row. Before, the foreign checkpoint was resumed without a word and rewrote the
  run's metrics rows with the other run's.
* A checkpoint written before identities, of the run's own, is continued as before.
* ``fedsuite sweep`` counts a run done only from a record that passes that check: a run whose
  checkpoint was deleted, is garbage or another run's is named ``damaged``, never counted done,
  extended or reported as completed or as "partial (the queue continues it)".
* A partition cache whose contents were altered (indices reordered), one of other inputs or one
  without an identity is recomputed, never used.

The kill-and-resume side (a run folder is made with its config.json; ``--resume`` of a folder
without one is refused) is in tests/test_resume.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedsuite.cli import main as cli
from fedsuite.records import identity
from fedsuite.records import rundir
from fedsuite.data.partition import partition_indices
from fedsuite.records.rows import read_metrics
from fedsuite.method.state import STATE_KEY
from tests.conftest import fedsuite_run, tree_snapshot

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 3
SCAFFOLD = {"strategy": "scaffold", "rounds": ROUNDS}  # a method whose clients keep state
pytestmark = pytest.mark.inprocess  # the records are the subject; the in-process engine writes Flower's


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _copy(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to, ignore=shutil.ignore_patterns(".flwr"))
    return to


def _state_file(run_dir: Path) -> Path:
    """The newest client-state file of the run's first client folder."""
    folder = sorted((run_dir / "client-state").glob("client-*"))[0]
    return max(folder.glob("*.r*.pt"), key=lambda p: int(p.name.rsplit(".r", 1)[1].split(".")[0]))


def _without_identity(path: Path) -> None:
    """A checkpoint as fedsuite wrote it before run identities."""
    held = torch.load(path, weights_only=False)
    del held[identity.KEY]
    torch.save(held, path)


def _resume(run_dir: Path, *more: str):
    return CliRunner().invoke(cli.app, ["simulate", "--output-dir", str(run_dir.parent), "--run-name", run_dir.name,
                                        "--resume", *more])


FOREIGN = {
    # what is copied from the lr=0.1 run into the lr=0.05 run, and the words of the refusal
    "checkpoint": (lambda mine, other: shutil.copy(other / "checkpoint.pt", mine / "checkpoint.pt"),
                   "checkpoint.pt is another run's (lr: 0.1 there, 0.05 here)"),
    "checkpoint-without-identity": (
        lambda mine, other: (shutil.copy(other / "checkpoint.pt", mine / "checkpoint.pt"),
                             _without_identity(mine / "checkpoint.pt")),
        f"checkpoint.pt holds another run's round {ROUNDS} (test_accuracy:"),
    "client-state": (lambda mine, other: shutil.copy(_state_file(other), _state_file(mine)),
                     "is another run's (its run identity"),
    "summary": (lambda mine, other: shutil.copy(other / "summary.json", mine / "summary.json"),
                "summary.json is another run's (lr: 0.1 there, 0.05 here)"),
}


@pytest.mark.parametrize("record", list(FOREIGN))
def test_a_record_of_another_run_is_refused_and_never_counted_done(record, simulate, tmp_path):
    mine_done, other_done = simulate(**SCAFFOLD), simulate(**SCAFFOLD, lr=0.1)
    mine = _copy(mine_done.run_dir, tmp_path / "runs" / "mine")
    copy, words = FOREIGN[record]
    copy(mine, other_done.run_dir)
    before = tree_snapshot(mine)
    res = _resume(mine, "--rounds", str(ROUNDS + 1))
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert text.startswith("error: --resume: ") and words in text and "Traceback" not in res.output, res.output
    assert tree_snapshot(mine) == before  # its rows were not rewritten with the other run's
    assert read_metrics(mine) == mine_done.rows
    # a queue's judgement: never done, and why
    assert rundir.state(mine, ROUNDS) == "damaged" and rundir.state(mine, ROUNDS + 1) == "damaged"
    assert words in rundir.why_incomplete(mine, "mine", ROUNDS)


def test_a_checkpoint_written_before_identities_of_the_run_itself_is_continued(simulate, tmp_path):
    """The legacy rule: a checkpoint (and client state, summary) without an identity in a folder whose
    config.json is the run's, whose metrics row agrees with metrics.jsonl, is the run's: it is counted
    done and extended as before."""
    done = simulate(**SCAFFOLD)
    run_dir = _copy(done.run_dir, tmp_path / "runs" / "legacy")
    _without_identity(run_dir / "checkpoint.pt")
    summary = json.loads((run_dir / "summary.json").read_text())
    del summary[identity.KEY]
    (run_dir / "summary.json").write_text(json.dumps(summary))
    for path in (run_dir / "client-state").rglob("*.pt"):
        held = torch.load(path, weights_only=True)
        del held[STATE_KEY]
        torch.save(held, path)
    assert rundir.state(run_dir, ROUNDS) == "completed"
    res = _resume(run_dir, "--rounds", str(ROUNDS + 1))
    assert res.exit_code == 0, res.output
    assert [r["round"] for r in read_metrics(run_dir)] == list(range(ROUNDS + 2))
    assert read_metrics(run_dir)[:ROUNDS + 1] == done.rows
    assert rundir.state(run_dir, ROUNDS + 1) == "completed"


def test_a_finished_runs_results_without_checkpoint_count_done_only_without_identity(simulate, tmp_path):
    """Committed records keep config.json, metrics.jsonl and summary.json; a run written before
    identities is read from them as before. A run whose summary carries an identity keeps its
    checkpoint as part of its record: deleted, the run is damaged."""
    done = simulate(**SCAFFOLD)
    legacy = _copy(done.run_dir, tmp_path / "runs" / "legacy")
    for name in ("checkpoint.pt", "client-state"):
        shutil.rmtree(legacy / name) if name == "client-state" else (legacy / name).unlink()
    summary = json.loads((legacy / "summary.json").read_text())
    del summary[identity.KEY]
    (legacy / "summary.json").write_text(json.dumps(summary))
    assert rundir.state(legacy, ROUNDS) == "completed"
    current = _copy(done.run_dir, tmp_path / "runs" / "current")
    (current / "checkpoint.pt").unlink()
    assert rundir.state(current, ROUNDS) == "damaged"
    assert "checkpoint.pt is missing" in rundir.why_incomplete(current, "current", ROUNDS)


def test_a_sweep_counts_a_run_done_only_from_its_own_whole_record(tmp_path):
    """Four settings (lr) at 1 round; then lr=0.02's checkpoint is deleted, lr=0.05's is garbage
    and lr=0.1's is lr=0.2's. The same sweep again: 1 already done, the three named damaged with
    why, exit 1, none reported completed or "partial (the queue continues it)". At 2 rounds: only
    lr=0.2 is extended; the damaged runs are left as they were (before, the foreign checkpoint's
    run was "extend ... completed" with its row 1 rewritten to the other run's)."""
    out = tmp_path / "out"
    folder = out / "grid"
    args = ["--grid", "lr=0.02,0.05,0.1,0.2", "--seeds", "0", "--set", "num_clients=6", "--set", "clients_per_round=2",
            "--set", "batch_size=32", "--set", f"data_root={tmp_path / 'data'}", "--output-dir", str(out), "--name",
            "grid", "--engine", "inprocess"]
    sweep = lambda *more: fedsuite_run(["sweep", *args, *more], env=_env(), timeout=900)  # noqa: E731
    first = sweep("--set", "rounds=1")
    assert first.returncode == 0, first.stdout + first.stderr
    run = {lr: folder / f"lr-{lr}" / "s0" for lr in ("0.02", "0.05", "0.1", "0.2")}
    assert all(rundir.state(r, 1) == "completed" for r in run.values())
    (run["0.02"] / "checkpoint.pt").unlink()
    (run["0.05"] / "checkpoint.pt").write_bytes(b"not a checkpoint")
    shutil.copy(run["0.2"] / "checkpoint.pt", run["0.1"] / "checkpoint.pt")
    damaged = {"0.02": "checkpoint.pt is missing", "0.05": "checkpoint.pt cannot be read",
               "0.1": "checkpoint.pt is another run's (lr: 0.2 there, 0.1 here)"}
    before = {lr: tree_snapshot(run[lr]) for lr in damaged}
    rows = {lr: read_metrics(run[lr]) for lr in damaged}

    again = sweep("--set", "rounds=1")
    assert again.returncode == 1, again.stdout + again.stderr
    assert "4 runs, 1 already done, 0 to run" in again.stdout, again.stdout
    report = (folder / "report.md").read_text()
    for lr, words in damaged.items():
        line = next((x for x in again.stdout.splitlines() if x.startswith(f"lr={lr} s0: damaged")), "")
        assert words in line and "not run" in line, again.stdout
        assert f"- lr={lr} s0: damaged, not continued: " in report and words in report, report
    assert "(the queue continues it)" not in report, report
    assert not [x for x in report.splitlines() if "partial" in x and any(f"lr={lr} s0" in x for lr in damaged)]

    extended = sweep("--set", "rounds=2")
    assert extended.returncode == 1, extended.stdout + extended.stderr
    assert f"extend lr=0.2 s0 -> {run['0.2']}" in extended.stdout, extended.stdout
    for lr in damaged:
        assert f"lr={lr} s0 ->" not in extended.stdout, extended.stdout  # neither started nor extended
        assert not any(x.startswith("completed") and f"lr={lr} s0" in x for x in extended.stdout.splitlines())
        assert tree_snapshot(run[lr]) == before[lr] and read_metrics(run[lr]) == rows[lr]
    assert rundir.state(run["0.2"], 2) == "completed"
    assert "(the queue continues it)" not in (folder / "report.md").read_text()


def _cache(cache_dir: Path) -> Path:
    (found,) = cache_dir.glob("*.npz")
    return found


def test_a_partition_cache_is_used_only_with_its_inputs_and_contents(tmp_path):
    """A cache whose indices were reordered (a valid file: before, trusted, and a run's results
    changed), a cache of another partition under this one's name, and a cache without an identity
    (an earlier fedsuite's) are each recomputed and rewritten; a whole cache is used as it is."""
    labels = np.random.default_rng(0).integers(0, 10, 2000)
    cache_dir = tmp_path / "partitions"
    want = partition_indices(labels, "dirichlet", 10, 3, alpha=0.5, cache_dir=cache_dir)
    path = _cache(cache_dir)
    with np.load(path) as z:
        held = {k: z[k] for k in z.files}
    assert partition_indices(labels, "dirichlet", 10, 3, alpha=0.5, cache_dir=cache_dir)[0].tolist() == want[0].tolist()

    flat = held["indices"].copy()
    end = held["offsets"][1]
    flat[:end] = flat[:end][::-1]  # client 0's samples in another order: the same set, another training
    other = partition_indices(labels, "iid", 10, 3, cache_dir=tmp_path / "other")
    with np.load(_cache(tmp_path / "other")) as z:
        other_held = {k: z[k] for k in z.files}
    altered = {
        "reordered": {**held, "indices": flat},
        "another-partition": other_held,
        "no-identity": {"indices": flat, "offsets": held["offsets"]},
    }
    assert [p.tolist() for p in other] != [p.tolist() for p in want]
    for name, contents in altered.items():
        np.savez(path, **contents)
        got = partition_indices(labels, "dirichlet", 10, 3, alpha=0.5, cache_dir=cache_dir)
        assert [p.tolist() for p in got] == [p.tolist() for p in want], name
        with np.load(path) as z:  # rewritten whole
            assert z["indices"].tolist() == held["indices"].tolist() and str(z["digest"]) == str(held["digest"]), name
