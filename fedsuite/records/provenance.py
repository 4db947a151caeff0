"""What produced a run: the code (fedsuite's version, the git commit it ran from and whether its
work tree was dirty), the packages and the hardware.

* :func:`code_version`: fedsuite's version and commit (``fedsuite --version`` prints
  :func:`version_line` of it). The commit is read with one ``git status`` call (a timeout of
  :data:`GIT_TIMEOUT_S`) in the folder fedsuite is imported from, and only where that folder is a
  checkout (it holds ``.git``): an installed wheel or the Docker image runs from ``site-packages``
  and records ``commit: null`` with the reason in ``commit_note``, as does a missing ``git`` or one
  that fails. ``dirty``: :data:`CODE_PATHS` differ from the commit (a changed tracked file, or a
  new file git does not ignore; ``changes`` names them); an edit of README.md or the tests does not
  make a run dirty. It never raises.
* :func:`collect`: one start of a run, as the ServerApp records it (``fedsuite.engine.server_app``, once
  per start, in the process that writes ``summary.json``): ``fedsuite``, ``commit``, ``dirty``,
  ``changes``, ``commit_note``, ``python``, ``packages`` (:data:`PACKAGES`), ``platform``,
  ``device`` (``cpu``/``cuda``), ``gpu`` and ``cuda`` (the GPU's model and torch's CUDA version, on
  CUDA), ``cpu`` (its model), ``cpu_cores`` (the machine's), ``cores_available`` (this process's
  affinity), ``started`` (UTC) and ``rounds``. No hostname. On a Ray cluster (``ray_address``) or
  a Deployment Engine the clients may train elsewhere: the hardware is the ServerApp's machine.
* A run's record is the list of its starts, oldest first (``summary.json``'s ``provenance``, also
  kept in every ``checkpoint.pt``, so ``--resume`` carries it over; never in ``config.json``,
  which is the run's settings and what decides whether a run can be reused), each with the
  ``rounds`` of ``metrics.jsonl`` it wrote: ``[first, last]`` (a first start from round 0, the
  initial evaluation), ``[]`` if none. A run resumed on other code lists both versions. A start
  killed before its first checkpoint wrote no round that counts and is not kept; a resumed start
  that fails before it has read the checkpoint lists only itself in its ``summary.json`` (the
  checkpoint still holds the earlier starts). A run resumed from a checkpoint written before
  fedsuite recorded provenance starts its list with an entry that says so (:func:`unrecorded`).
* :func:`report_lines`: the lines ``fedsuite report`` and the reproduce report write about the
  runs they read ("Produced by fedsuite X at commit abc1234 (torch ..., flwr ...)"; the distinct
  versions when runs differ, or one run was resumed on other code).

Light imports only: ``fedsuite --version`` imports this module.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

#: the packages whose versions a run records
PACKAGES = ("torch", "torchvision", "flwr", "ray", "numpy")

#: what a commit covers: a change elsewhere in the checkout (README, docs, tests) leaves a run clean
CODE_PATHS = ("fedsuite", "strategies", "clients", "pyproject.toml")

#: the most seconds the one ``git status`` may take
GIT_TIMEOUT_S = 5.0

#: the changed files a dirty record names (the rest are counted)
MAX_CHANGES = 20


def source_root() -> Path:
    """The folder the running fedsuite is imported from (a checkout's root, or ``site-packages``)."""
    return Path(__file__).resolve().parents[2]  # fedsuite/records/provenance.py


def fedsuite_version() -> str:
    """fedsuite's version from its package metadata, ``unknown`` where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedsuite")
    except PackageNotFoundError:
        return "unknown (fedsuite is not installed: no package metadata)"


def git_state(root: Path) -> dict[str, Any]:
    """``{"commit", "dirty", "changes", "commit_note"}`` of the checkout at ``root``: the commit
    (40 hex digits) and whether :data:`CODE_PATHS` differ from it (a changed tracked file or a new
    file git does not ignore; ``changes``: up to :data:`MAX_CHANGES` of them, as ``git status
    --short`` shows them). Where there is no commit to name, ``commit``, ``dirty`` and ``changes``
    are None and ``commit_note`` says why, in one line."""
    none = {"commit": None, "dirty": None, "changes": None}
    if not (root / ".git").exists():  # a folder (a clone) or a file (a worktree, a submodule)
        return {**none, "commit_note": f"not a git checkout: fedsuite runs from {root} (an installed package?)"}
    # git's own variables (set inside a hook, say) would point it at another repository; no index lock
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
    cmd = ["git", "-C", str(root), "status", "--porcelain=v2", "--branch", "--untracked-files=normal",
           "--", *CODE_PATHS]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return {**none, "commit_note": "git is not installed (no git on PATH), so the commit is unknown"}
    except subprocess.TimeoutExpired:
        return {**none, "commit_note": f"git status in {root} took over {GIT_TIMEOUT_S:g} s; the commit is unknown"}
    except OSError as exc:
        return {**none, "commit_note": f"git could not run ({exc.strerror or exc})"}
    if done.returncode != 0:
        reason = next((line.strip() for line in done.stderr.splitlines() if line.strip()), f"exit code {done.returncode}")
        return {**none, "commit_note": f"git status in {root} failed: {reason}{head_note(root, env)}"}
    commit, changes = None, []
    for line in done.stdout.splitlines():
        if line.startswith("# branch.oid "):
            commit = line.split()[2]
        elif line.startswith("1 "):  # changed: XY (staged, unstaged; "." = unchanged) ... path
            parts = line.split(" ", 8)
            changes.append(f"{parts[1].replace('.', ' ')} {parts[8]}")
        elif line.startswith("2 "):  # renamed or copied: ... score path<TAB>original path
            parts = line.split(" ", 9)
            changes.append(f"{parts[1].replace('.', ' ')} {parts[9].split(chr(9))[0]}")
        elif line.startswith("u "):  # unmerged
            changes.append(f"UU {line.split(' ', 10)[10]}")
        elif line.startswith("? "):
            changes.append(f"?? {line[2:]}")
    if commit is None or commit == "(initial)":
        return {**none, "commit_note": f"{root} is a git checkout without a commit yet"}
    shown = changes[:MAX_CHANGES] + ([f"... and {len(changes) - MAX_CHANGES} more"] if len(changes) > MAX_CHANGES else [])
    return {"commit": commit, "dirty": bool(changes), "changes": shown, "commit_note": None}


def head_note(root: Path, env: dict[str, str]) -> str:
    """Where ``git status`` failed but the commit can still be read (an index git cannot read, say),
    ``"; HEAD is <40 hex>, whether the code differs from it is unknown"``; else ``""``. The commit
    stays unnamed in ``commit``: without the status, nothing says the files are that commit's."""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "HEAD"], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    head = done.stdout.strip()
    if done.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", head):
        return ""
    return f"; HEAD is {head}, whether the code differs from it is unknown"


def changed_count(changes: list[str]) -> int:
    """How many files :func:`git_state`'s ``changes`` stand for (its last line may count the rest)."""
    if changes and changes[-1].startswith("... and "):
        return len(changes) - 1 + int(changes[-1].split()[2])
    return len(changes)


def code_version(root: Path | None = None) -> dict[str, Any]:
    """fedsuite's version and :func:`git_state` of ``root`` (default: :func:`source_root`, where the
    running fedsuite comes from)."""
    return {"fedsuite": fedsuite_version(), **git_state(source_root() if root is None else root)}


def version_line(code: Mapping[str, Any]) -> str:
    """``fedsuite 0.1.0, commit 908e7667b5d4 (dirty: 2 changed files)`` (or the commit note)."""
    text = f"fedsuite {code.get('fedsuite', 'unknown')}"
    if code.get("commit"):
        text += f", commit {code['commit'][:12]}"
        if code.get("dirty"):
            n = changed_count(code.get("changes") or [])
            text += f" (dirty: {n} changed file{'s' if n != 1 else ''})"
    else:
        text += f" ({code.get('commit_note') or 'commit unknown'})"
    return text


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """Installed versions from package metadata (nothing is imported); None for one not installed."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def cpu_model() -> str | None:
    """The CPU's model name: Linux's ``/proc/cpuinfo``, else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def device_facts(device: Any) -> dict[str, Any]:
    """``device`` (``cpu``/``cuda``), and on CUDA the GPU's model and torch's CUDA version."""
    kind = getattr(device, "type", str(device).split(":")[0])
    facts: dict[str, Any] = {"device": kind, "gpu": None, "cuda": None}
    if kind == "cuda":
        import torch

        facts["gpu"] = torch.cuda.get_device_name(device)
        facts["cuda"] = torch.version.cuda
    return facts


def collect(device: Any, root: Path | None = None) -> dict[str, Any]:
    """One start of a run (see the module's doc): the code (:func:`code_version`), Python, the
    packages, the platform, the device it trains on, the CPU; ``started`` (UTC) and ``rounds``
    (``[]``: the caller fills in the rows this start writes). Every part that cannot be read is
    None, or the note says why: collecting never fails a run."""
    from fedsuite.launch.processes import available_cores

    record: dict[str, Any] = {**code_version(root), "python": platform.python_version(),
                              "packages": package_versions(), "platform": platform.platform()}
    try:
        record.update(device_facts(device))
    except Exception as exc:  # a CUDA query that fails: the run itself says more, soon enough
        record.update({"device": getattr(device, "type", str(device)), "gpu": f"unknown ({exc})".splitlines()[0],
                       "cuda": None})
    record.update({"cpu": cpu_model(), "cpu_cores": os.cpu_count(), "cores_available": available_cores(),
                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rounds": []})
    return record


def unrecorded(last_round: int) -> dict[str, Any]:
    """The entry for rounds 0 to ``last_round`` of a run resumed from a checkpoint that holds no
    provenance (written before fedsuite recorded it)."""
    return {"rounds": [0, last_round], "unrecorded": "these rounds were run by a fedsuite that did not record provenance"}


# ------------------------------------------------------------------------------------------------
# reports
# ------------------------------------------------------------------------------------------------


def code_label(entry: Mapping[str, Any]) -> str:
    """One start's code in a report: ``fedsuite 0.1.0 at commit 908e766 (torch 2.14.1, ...; Python 3.12.3)``."""
    if "unrecorded" in entry:
        return "unrecorded code (rounds run before fedsuite recorded provenance)"
    text = f"fedsuite {entry.get('fedsuite', 'unknown')} "
    if entry.get("commit"):
        text += f"at commit {entry['commit'][:7]}" + (" with uncommitted changes" if entry.get("dirty") else "")
    else:
        text += f"at no known commit ({entry.get('commit_note') or 'not recorded'})"
    packages = entry.get("packages") or {}
    order = [name for name in PACKAGES if name in packages] + sorted(set(packages) - set(PACKAGES))  # json sorts keys
    libs = ", ".join(f"{name} {packages[name]}" for name in order if packages[name])
    return text + f" ({libs}; Python {entry.get('python', '?')})"


def hardware_label(entry: Mapping[str, Any]) -> str | None:
    """``cuda (NVIDIA H100 80GB HBM3)`` or ``cpu (Intel Xeon, 2 cores)``; None for an unrecorded entry."""
    if "unrecorded" in entry:
        return None
    cpu = f"{entry.get('cpu') or 'unknown CPU'}, {entry.get('cpu_cores') or '?'} cores"
    if entry.get("device") == "cuda":
        return f"cuda ({entry.get('gpu') or 'unknown GPU'}; {cpu})"
    return f"{entry.get('device') or 'unknown device'} ({cpu})"


def run_entries(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The starts a run's ``summary.json`` records ([] for a run written before provenance was)."""
    entries = summary.get("provenance")
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def run_summaries(run_dirs: Iterable[Path]) -> dict[str, dict[str, Any] | None]:
    """{a short, unique name of each run (its path below the runs' common folder), in the order
    given: its ``summary.json``, or None where it has none that can be read (a run not finished)}."""
    import json

    dirs = [Path(d).resolve() for d in run_dirs]
    if not dirs:
        return {}
    common = Path(os.path.commonpath(dirs)) if len(dirs) > 1 else dirs[0].parent
    found: dict[str, dict[str, Any] | None] = {}
    for d in dirs:
        name = str(d.relative_to(common)) if d != common else d.name
        try:
            summary = json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            summary = None
        found[name] = summary if isinstance(summary, dict) else None
    return found


#: why a run names no code in a report
NOT_FINISHED = "not finished (no summary.json; its checkpoint holds its provenance)"
BEFORE_PROVENANCE = "no provenance recorded (runs from before fedsuite recorded it)"


def _count(names: list[str]) -> str:
    return f"{len(names)} run{'s' if len(names) != 1 else ''}"


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def report_lines(summaries: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """Markdown lines naming the code (and hardware) that produced the runs ``summaries`` ({run
    name: its summary.json, None if it has none}): one "Produced by ..." line where they agree,
    else the distinct versions, each with the runs it produced (a resumed run is under each version
    it ran on), and the runs that name none, with why."""
    if not summaries:
        return []
    code: dict[str, list[str]] = {}
    hardware: dict[str, list[str]] = {}
    bare: dict[str, list[str]] = {}
    for name, summary in summaries.items():
        entries = run_entries(summary) if summary is not None else []
        if not entries:
            bare.setdefault(NOT_FINISHED if summary is None else BEFORE_PROVENANCE, []).append(name)
        for entry in entries:
            runs = code.setdefault(code_label(entry), [])
            if name not in runs:
                runs.append(name)
            where = hardware_label(entry)
            if where is not None and name not in hardware.setdefault(where, []):
                hardware[where].append(name)
    unnamed = sum(len(names) for names in bare.values())
    lines = []
    if len(code) == 1 and not bare:
        lines.append(f"Produced by {next(iter(code))}.")
    else:
        head = f"Produced by {len(code)} code version{'s' if len(code) != 1 else ''}"
        if not code:
            head = "No run names the code that produced it"
        elif bare:
            head += f", and {unnamed} run{'s' if unnamed != 1 else ''} that name{'s' if unnamed == 1 else ''} none"
        if len(code) > 1:
            head += " (the runs differ, or a run was resumed on other code)"
        lines += [head + ":", ""]
        lines += [f"- {label}: {_count(runs)} ({_names(runs)})" for label, runs in code.items()]
        lines += [f"- {why}: {_count(names)} ({_names(names)})" for why, names in bare.items()]
    if len(hardware) == 1:
        lines += ["", f"Trained on {next(iter(hardware))}."]
    elif hardware:
        lines += ["", "Trained on:", ""]
        lines += [f"- {label}: {_count(runs)} ({_names(runs)})" for label, runs in hardware.items()]
    return lines
