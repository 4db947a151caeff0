"""A warm process that starts a queue's runs (``fedsuite reproduce``, ``fedsuite sweep``) already
imported: each run is still a ``fedsuite simulate`` process of its own, forked from this one.

A run's command process spends about 2.5 CPU-seconds importing torch, the registry of methods, the
CLI and matplotlib before it does anything (2 cores); an in-process run of a few rounds on a small
model spends less than that training. :class:`WarmStarter` starts ``python -m fedsuite.launch.warm`` once
per queue, which imports all that (:data:`PRELOAD`) and then forks one child per run it is asked
for. The child is what ``fedsuite simulate ...`` would have been: its own PID, the run's log as its
output, its share of the cores, the environment the queue gives it, and it dies with the warm
process, which dies with the queue (``PR_SET_PDEATHSIG``). What it computes is the same: a run seeds
everything it draws (``fedsuite.method.seeding``), and nothing here has computed anything before the fork
(the warm process only imports: no torch op, so no thread pool of torch's, runs in it).

Protocol (lines of JSON on the warm process's stdin and stdout): the queue writes
``{"argv": [...], "stdout": path, "stderr": path, "cores": [...] | null, "env": {...}, "cwd": path |
null, "new_session": bool}``; the warm process answers
``{"started": pid}``, and ``{"ended": pid, "code": exit code}`` when it has reaped that child
(a negative code: killed by that signal, as ``subprocess`` reports it). End of stdin ends it.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from fedsuite.launch import reaper
from fedsuite.launch.processes import fedsuite_first

#: what a run's command process imports before its first round, imported once here; ``fedsuite.cli.main``
#: itself is not: each child runs it as ``python -m`` does, as ``__main__`` (which it could not be
#: once imported under its own name), and imports there only the command modules it adds to the app
PRELOAD = ("torch", "typer", "rich.table", "fedsuite.cli.support", "fedsuite.cli.options", "fedsuite.cli.show",
           "fedsuite.cli.deploy", "fedsuite.cli.queues", "fedsuite.method.registry", "fedsuite.launch.runner",
           "fedsuite.launch.start", "fedsuite.engine.round_engine", "fedsuite.engine.client_app", "fedsuite.engine.runtime",
           "matplotlib.pyplot")


class WarmRun:
    """A run forked by the warm process, as much of ``subprocess.Popen`` as the queue and the tests
    use: ``pid``, ``poll()``, ``returncode``, ``wait()``, ``send_signal()``."""

    def __init__(self, pid: int, ended: threading.Event) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = ended

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """``sig`` to the run's process, unless it has ended (and its PID may be another's), as ``Popen``."""
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class WarmStarter:
    """Starts ``fedsuite simulate`` commands as children of one warm process (see module). Use as
    a context manager; :meth:`start` falls back to a plain ``subprocess.Popen`` if the warm process
    is gone (it ended, or never started)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "fedsuite.launch.warm"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=fedsuite_first(os.environ),
                                     preexec_fn=reaper.die_with_parent())
        self.runs: dict[int, tuple[WarmRun, threading.Event]] = {}
        self.started: list[int] = []
        self.lock = threading.Condition()
        self.reader = threading.Thread(target=self._read, name="warm-starter", daemon=True)
        self.reader.start()

    def __enter__(self) -> WarmStarter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.lock:
                if "started" in message:
                    self.started.append(message["started"])
                    self.lock.notify_all()
                else:
                    self._end(message["ended"], message["code"])
        with self.lock:  # the warm process is gone, and its children with it (PDEATHSIG)
            for pid in list(self.runs):
                self._end(pid, -signal.SIGTERM)
            self.started.append(-1)
            self.lock.notify_all()

    def _end(self, pid: int, code: int) -> None:
        run, ended = self.runs.pop(pid, (None, None))
        if run is not None:
            run.returncode = code
            ended.set()

    def start(self, argv: Sequence[str], log: Path, cores: Sequence[int] | None, env: dict[str, str], *,
              stderr: Path | None = None, cwd: Path | None = None,
              new_session: bool = False) -> WarmRun | subprocess.Popen:
        """``argv`` (a ``fedsuite`` command: ``[python, -m, fedsuite.cli.main, ...]``) as a child of the
        warm process, its output appended to ``log`` (its standard error to ``stderr`` if given), on
        ``cores`` (None: this process's), with ``env``, in ``cwd`` (None: this process's), in a
        session of its own with ``new_session``."""
        if list(argv[1:3]) != ["-m", "fedsuite.cli.main"]:
            raise ValueError(f"not a fedsuite command: {argv}")
        request = json.dumps({"argv": list(argv[3:]), "stdout": str(log), "stderr": str(stderr or log),
                              "cores": None if cores is None else sorted(cores), "env": env,
                              "cwd": None if cwd is None else str(cwd), "new_session": new_session})
        cold = functools.partial(self._cold, argv, log, cores, env, stderr, cwd, new_session)
        with self.lock:
            try:
                self.proc.stdin.write(request.encode() + b"\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                return cold()
            self.lock.wait_for(lambda: self.started)
            pid = self.started.pop(0)
            if pid < 0:
                return cold()
            ended = threading.Event()
            run = WarmRun(pid, ended)
            self.runs[pid] = (run, ended)
            return run

    @staticmethod
    def _cold(argv: Sequence[str], log: Path, cores: Sequence[int] | None, env: dict[str, str],
              stderr: Path | None, cwd: Path | None, new_session: bool) -> subprocess.Popen:
        die_with_parent = reaper.die_with_parent()

        def preexec() -> None:
            die_with_parent()
            if cores is not None:
                os.sched_setaffinity(0, cores)

        with open(log, "ab") as out, open(stderr or os.devnull, "ab") as err:
            return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT if stderr is None else err,
                                    stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=new_session,
                                    preexec_fn=preexec)

    def close(self) -> None:
        """End the warm process (its stdin closed), once the runs it started have ended."""
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=5)


def serve() -> None:
    """The warm process: import :data:`PRELOAD`, then fork a run per request until stdin ends,
    reaping the children and saying how each ended. No threads: it forks."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the queue's to handle: it stops the runs
    say = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing an import prints mixes into the protocol
    for module in PRELOAD:
        importlib.import_module(module)
    from fedsuite.method import registry

    registry.methods()  # every method's module
    die_with_this = reaper.die_with_parent()  # for the children: this process's PID, taken before the forks
    children: set[int] = set()
    pending = b""
    open_input = True
    while open_input or children:
        if open_input and select.select([0], [], [], 0.05)[0]:
            chunk = os.read(0, 65536)
            if not chunk:
                open_input = False
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    say.close()  # the queue sees this process's output end when this process ends
                    die_with_this()
                    run_child(request)  # never returns
                if request["cores"] is not None:  # in place when the queue learns the PID (the child sets it too)
                    try:
                        os.sched_setaffinity(pid, request["cores"])
                    except ProcessLookupError:
                        pass
                children.add(pid)
                say.write(json.dumps({"started": pid}) + "\n")
        elif not open_input:
            select.select([], [], [], 0.05)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            say.write(json.dumps({"ended": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")


def run_child(request: dict[str, Any]) -> None:
    """In a forked child (which dies with the warm process, as the warm process dies with the
    queue): become the run's ``fedsuite simulate`` process, then exit with its code."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request["new_session"]:
            os.setsid()
        os.environ.clear()
        os.environ.update(request["env"])
        if request["cwd"] is not None:
            os.chdir(request["cwd"])
        for fd, key in ((1, "stdout"), (2, "stderr")):
            out = os.open(request[key], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(out, fd)
            os.close(out)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        if request["cores"] is not None:
            os.sched_setaffinity(0, request["cores"])
        sys.argv = ["fedsuite", *request["argv"]]  # runpy puts the module's path first, as `python -m` does
        try:
            runpy.run_module("fedsuite.cli.main", run_name="__main__", alter_sys=True)  # `python -m fedsuite.cli.main ...`
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - said in the run's log, and by its exit code
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


if __name__ == "__main__":
    serve()
