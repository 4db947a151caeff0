"""What produced a run (issue 41, item 3: ``fedsuite.records.provenance``).

* ``fedsuite --version`` (and ``-V``) in this checkout names its commit and whether the code is
  dirty, as git says; from a copy of the code that is not a checkout, or with no git on PATH, it
  says why there is no commit; in a fresh repository it follows commits and edits (an edit outside
  the code, README.md, leaves it clean).
* A real simulation's ``summary.json`` records one provenance entry with every field, of the
  running code, packages and machine; ``config.json`` holds none of it.
* The same run resumed by another commit of the code (a git repository of a copy of it, run
  through ``PYTHONPATH``) records both starts, each with its rounds; the checkpoint carries them.
* ``fedsuite report`` and the reproduce report name the code: one line for runs of one version,
  the distinct versions (and the runs that record none) otherwise.

The runs: the ``simulate`` fixture's FedAvg run of tests/test_core.py (shared through its xdist
group) and one resume of a copy of it, on the worker's Ray node.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from datetime import datetime
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedsuite.cli import main as cli
from fedsuite.records import provenance
from fedsuite.queues.reproduce.report import write_report
from fedsuite.queues.reproduce.planning import plan
from fedsuite.queues.reproduce.tables import parse_tables
from fedsuite.records.rows import read_metrics
from tests.test_reproduce import TINY

#: the records a run writes, not how messages travel: the in-process engine (``simulate``, tests/conftest.py)
pytestmark = pytest.mark.inprocess

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT = (ROOT / ".git").exists() and shutil.which("git") is not None
needs_checkout = pytest.mark.skipif(not CHECKOUT, reason="the tests run from a git checkout with git installed")
#: the cached run the provenance of a simulation is read from (tests/test_core.py's, same group)
RUN = {"strategy": "fedavg", "rounds": 3}
shares_test_core_runs = pytest.mark.xdist_group("test_core")  # its worker has the run cached


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false",
                           *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def checkout_state() -> tuple[str, bool]:
    """This checkout's commit and whether fedsuite's code differs from it, as git tells."""
    dirty = git(ROOT, "status", "--porcelain", "--untracked-files=normal", "--", *provenance.CODE_PATHS)
    return git(ROOT, "rev-parse", "HEAD"), bool(dirty)


def code_copy(folder: Path, repository: bool) -> Path:
    """fedsuite's packages copied into ``folder`` (for ``PYTHONPATH``), optionally as a git repository
    with one commit."""
    folder.mkdir(parents=True)
    for package in ("fedsuite", "strategies", "clients"):
        shutil.copytree(ROOT / package, folder / package, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "README.md").write_text("a copy of fedsuite's code\n")
    if repository:
        git(folder, "init", "-q")
        git(folder, "add", "-A")
        git(folder, "commit", "-q", "-m", "copy")
    return folder


def env_from(copy: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(copy), **extra}


def version_cli(cwd: Path, env: dict[str, str] | None = None, flag: str = "--version") -> str:
    out = subprocess.run([sys.executable, "-m", "fedsuite.cli.main", flag], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


# ------------------------------------------------------------------------------------------------
# fedsuite --version
# ------------------------------------------------------------------------------------------------


@needs_checkout
def test_version_names_this_checkouts_commit_and_dirty_flag(tmp_path):
    commit, dirty = checkout_state()
    line = version_cli(tmp_path)
    assert line.startswith(f"fedsuite {version('fedsuite')}, commit {commit[:12]}"), line
    assert ("(dirty: " in line) == dirty, line
    assert version_cli(tmp_path, flag="-V") == line


def test_version_outside_a_checkout_says_why_there_is_no_commit(tmp_path):
    """A copy of the code that is no repository (as an installed wheel, or the Docker image, runs
    from site-packages): no commit, and the folder it runs from."""
    copy = code_copy(tmp_path / "src", repository=False)
    line = version_cli(tmp_path, env_from(copy))
    assert line == (f"fedsuite {version('fedsuite')} (not a git checkout: fedsuite runs from {copy.resolve()} "
                    "(an installed package?))")
    state = provenance.code_version(copy)
    assert (state["commit"], state["dirty"], state["changes"]) == (None, None, None)
    assert state["commit_note"].startswith("not a git checkout")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_version_of_a_repository_follows_its_commits_and_edits(tmp_path):
    copy = code_copy(tmp_path / "src", repository=True)
    first = git(copy, "rev-parse", "HEAD")
    assert version_cli(tmp_path, env_from(copy)) == f"fedsuite {version('fedsuite')}, commit {first[:12]}"
    assert provenance.code_version(copy) == {"fedsuite": version("fedsuite"), "commit": first, "dirty": False,
                                             "changes": [], "commit_note": None}

    (copy / "README.md").write_text("edited\n")  # outside the code: the run's code is still the commit
    assert provenance.git_state(copy)["dirty"] is False
    with (copy / "fedsuite" / "records" / "provenance.py").open("a") as fh:
        fh.write("# an edit\n")
    (copy / "strategies" / "scratch.py").write_text("x = 1\n")  # new, not ignored
    state = provenance.git_state(copy)
    assert state["dirty"] is True and state["changes"] == [" M fedsuite/records/provenance.py", "?? strategies/scratch.py"]
    assert version_cli(tmp_path, env_from(copy)).endswith(f"commit {first[:12]} (dirty: 2 changed files)")

    git(copy, "add", "-A")
    git(copy, "commit", "-q", "-m", "second")
    second = git(copy, "rev-parse", "HEAD")
    assert second != first and provenance.git_state(copy)["commit"] == second
    assert provenance.git_state(copy)["dirty"] is False

    # no git on PATH: no commit, and the reason; the command still works
    line = version_cli(tmp_path, env_from(copy, PATH=str(tmp_path / "nothing-here")))
    assert line == f"fedsuite {version('fedsuite')} (git is not installed (no git on PATH), so the commit is unknown)"
    # many changes: the first MAX_CHANGES named, the rest counted
    for i in range(provenance.MAX_CHANGES + 2):
        (copy / "clients" / f"scratch_{i:02d}.py").write_text("x = 1\n")
    state = provenance.git_state(copy)
    assert len(state["changes"]) == provenance.MAX_CHANGES + 1 and state["changes"][-1] == "... and 2 more"
    assert state["changes"][0] == "?? clients/scratch_00.py"
    assert provenance.version_line(provenance.code_version(copy)).endswith(
        f"(dirty: {provenance.MAX_CHANGES + 2} changed files)")
    # git that fails (a broken .git): its first line of error
    broken = code_copy(tmp_path / "broken", repository=False)
    (broken / ".git").write_text("not a gitdir\n")
    note = provenance.git_state(broken)["commit_note"]
    assert note.startswith(f"git status in {broken} failed: fatal: ") and "\n" not in note
    assert "HEAD is" not in note  # nothing to read a commit from either
    # an index git cannot read (seen on a queue's worktree): no commit claimed, but the note names HEAD
    (copy / ".git" / "index").write_bytes(b"DIRC\x00\x00\x00\x02\x00\x00\x00\x01" + b"ds" * 40)
    state = provenance.git_state(copy)
    assert (state["commit"], state["dirty"], state["changes"]) == (None, None, None)
    assert re.fullmatch(rf"git status in {re.escape(str(copy))} failed: .*; HEAD is {second}, whether the code "
                        r"differs from it is unknown", state["commit_note"]), state["commit_note"]


# ------------------------------------------------------------------------------------------------
# a run's record
# ------------------------------------------------------------------------------------------------


def assert_complete_entry(entry: dict, rounds: list[int]) -> None:
    """Every field of one start's provenance, with its type, and what this machine says."""
    assert entry["fedsuite"] == version("fedsuite")
    assert entry["python"] == platform.python_version()
    assert entry["packages"] == {name: version(name) for name in provenance.PACKAGES}
    assert all(isinstance(v, str) and v for v in entry["packages"].values())
    assert entry["platform"] == platform.platform()
    assert (entry["device"], entry["gpu"], entry["cuda"]) == ("cpu", None, None)  # FAST runs on the CPU
    assert isinstance(entry["cpu"], str) and entry["cpu"] == provenance.cpu_model()
    assert entry["cpu_cores"] == os.cpu_count() and 1 <= entry["cores_available"] <= entry["cpu_cores"]
    assert datetime.strptime(entry["started"], "%Y-%m-%dT%H:%M:%SZ")
    assert entry["rounds"] == rounds
    assert (entry["commit"] is None) == (entry["dirty"] is None) == (entry["commit_note"] is not None)
    if entry["commit"] is not None:
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]) and isinstance(entry["dirty"], bool)
        assert isinstance(entry["changes"], list) and bool(entry["changes"]) == entry["dirty"]
    assert "hostname" not in json.dumps(entry) and platform.node() not in json.dumps(entry)


@shares_test_core_runs
def test_a_runs_summary_records_what_produced_it_and_its_config_does_not(simulate):
    res = simulate(**RUN)
    (entry,) = res.summary["provenance"]
    assert_complete_entry(entry, rounds=[0, 3])
    if CHECKOUT:  # the simulation process ran this checkout's code
        commit, dirty = checkout_state()
        assert (entry["commit"], entry["dirty"]) == (commit, dirty)
    assert res.checkpoint["provenance"] == res.summary["provenance"]
    config = (res.run_dir / "config.json").read_text()
    assert not any(word in config for word in ("provenance", "commit", "torchvision", platform.python_version()))


@pytest.fixture(scope="module")
def resumed(cached_simulate, tmp_path_factory):
    """A copy of the cached 3-round run, resumed to 4 rounds by another code: a git repository of a
    copy of fedsuite (``PYTHONPATH``), at its own commit. Returns (run_dir, that commit)."""
    original = cached_simulate(engine="inprocess", **RUN)  # this file's runs (pytestmark)
    base = tmp_path_factory.mktemp("resumed")
    run_dir = base / "runs" / "r"
    shutil.copytree(original.run_dir, run_dir, ignore=shutil.ignore_patterns(".flwr", "app", "ray-logs", "*.log"))
    copy = code_copy(base / "src", repository=True)
    out = subprocess.run([sys.executable, "-m", "fedsuite.cli.main", "simulate", "--output-dir", str(run_dir.parent),
                          "--run-name", "r", "--resume", "--rounds", "4"], cwd=base, env=env_from(copy),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return run_dir, git(copy, "rev-parse", "HEAD")


@shares_test_core_runs
def test_a_run_resumed_on_other_code_records_both_starts(simulate, resumed):
    run_dir, other = resumed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and [r["round"] for r in read_metrics(run_dir)] == [0, 1, 2, 3, 4]
    first, second = summary["provenance"]
    assert first == simulate(**RUN).summary["provenance"][0]  # the first start's entry, as it was
    assert_complete_entry(second, rounds=[4, 4])
    assert (second["commit"], second["dirty"], second["changes"]) == (other, False, [])
    assert second["commit"] != first["commit"] and second["started"] >= first["started"]
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["provenance"] == summary["provenance"]


# ------------------------------------------------------------------------------------------------
# reports
# ------------------------------------------------------------------------------------------------


def labels(entry: dict) -> str:
    return provenance.code_label(entry)


@shares_test_core_runs
def test_fedsuite_report_names_the_code_that_produced_its_runs(simulate, resumed, tmp_path):
    one = simulate(**RUN)
    (entry,) = one.summary["provenance"]
    run_dir, other = resumed
    res = CliRunner().invoke(cli.app, ["report", str(one.run_dir), "--output-dir", str(tmp_path / "one")])
    assert res.exit_code == 0, res.output
    line = f"Produced by {labels(entry)}."
    assert line.startswith(f"Produced by fedsuite {version('fedsuite')} at ")
    assert f"torch {version('torch')}, torchvision {version('torchvision')}, flwr {version('flwr')}" in line
    if entry["commit"]:
        assert f"at commit {entry['commit'][:7]}" in line
    md = (tmp_path / "one" / "report.md").read_text()
    assert line in md and line in " ".join(res.output.split())
    assert f"Trained on cpu ({entry['cpu']}, {os.cpu_count()} cores)." in md

    # the resumed run ran on two versions; a run from before provenance records none
    older = tmp_path / "older"
    shutil.copytree(one.run_dir, older, ignore=shutil.ignore_patterns(".flwr", "app", "ray-logs"))
    summary = json.loads((older / "summary.json").read_text())
    del summary["provenance"]
    (older / "summary.json").write_text(json.dumps(summary))
    res = CliRunner().invoke(cli.app, ["report", str(one.run_dir), str(run_dir), str(older), "--output-dir", str(tmp_path / "all")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "all" / "report.md").read_text()
    second = json.loads((run_dir / "summary.json").read_text())["provenance"][1]
    assert ("Produced by 2 code versions, and 1 run that names none (the runs differ, or a run was resumed "
            "on other code):") in md
    # the report's names: each run's path below the runs' common folder, in the order given
    name_one, name_resumed, name_older = provenance.run_summaries([one.run_dir, run_dir, older])
    assert name_resumed.endswith("runs/r") and name_older.endswith("older")
    assert f"- {labels(entry)}: 2 runs ({name_one}, {name_resumed})" in md
    assert f"- {labels(second)}: 1 run ({name_resumed})" in md
    assert f"at commit {other[:7]} (" in labels(second)
    assert f"- no provenance recorded (runs from before fedsuite recorded it): 1 run ({name_older})" in md


@shares_test_core_runs
def test_the_reproduce_report_names_the_code_of_the_runs_in_its_numbers(resumed, tmp_path):
    run_dir, other = resumed
    tables = tmp_path / "tiny" / "tables.toml"
    tables.parent.mkdir()
    tables.write_text(TINY.format(dataset="synthetic").replace('"rounds=2"', '"rounds=4"'))
    target = parse_tables(tables)["tiny"]
    specs = plan(target, "paper", tmp_path / "out")
    (placed,) = [s for s in specs if (s.method, s.seed) == ("fedavg", 0)]
    shutil.copytree(run_dir, placed.run_dir, ignore=shutil.ignore_patterns(".flwr", "app", "ray-logs"))
    md = write_report(target, specs, "paper", tmp_path / "report").read_text()
    first, second = json.loads((run_dir / "summary.json").read_text())["provenance"]
    assert "Produced by 2 code versions (the runs differ, or a run was resumed on other code):" in md
    assert f"- {labels(first)}: 1 run (fedavg-s0)" in md and f"- {labels(second)}: 1 run (fedavg-s0)" in md
    assert md.index("Produced by") < md.index("## ")  # before the rows: what the numbers come from
