"""fedsuite's run records for a method run in Flower's own loop (``Strategy.start``), in a ServerApp
of one's own (``fedsuite.engine.server_app.method_strategy``: ``fedsuite.engine.flower_strategy.MethodStrategy``).

Flower's loop calls, each round: ``configure_train``, the exchange, ``aggregate_train``, then the
federated evaluation (``configure_evaluate``/``aggregate_evaluate``), then ``evaluate_fn`` with the
round's global model (and once before round 1 with w^0). :class:`LoopRecords` wraps that
``evaluate_fn``: after each call it writes the round's ``metrics.jsonl`` line (``engine.round_row``:
the evaluation's ``accuracy``/``loss``, and for a training round its ``RoundLog``: cohort, bytes,
dropped clients, train loss, the columns a method, a plug-in or ``aggregate_evaluate`` added: the
federated evaluation's), the round's ``clients.jsonl`` rows (``RoundLog.client_rows``), and
the loop runs inside ``engine.recorded``, the same ``config.json`` ... ``summary.json`` life a
``fedsuite simulate`` run's record has (TensorBoard and ``accuracy.png`` included). A run in Flower's
loop keeps no checkpoint: it cannot be resumed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result

from fedsuite.engine import round_engine as engine
from fedsuite.records import identity
from fedsuite.records import rundir
from fedsuite.records.paths import folder_problem
from fedsuite.errors import RunDirError

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


class LoopRecords:
    """The records of one run of ``strategy`` (a ``MethodStrategy``: its ``cfg`` and its method's
    ``round_log``) in Flower's loop, in ``run_dir`` (see module)."""

    def __init__(self, strategy, run_dir: Path) -> None:
        self.strategy = strategy
        self.run_dir = run_dir
        self.recorder = None
        self.last = time.perf_counter()

    @staticmethod
    def check_folder(run_dir: Path) -> None:
        """Raise ``RunDirError`` (one line) when ``run_dir`` holds a run already, or nothing can be
        written there: a run's records never mix with another's."""
        problem = folder_problem(run_dir)
        if problem is None and rundir.state(run_dir) not in ("new", "debris"):
            problem = f"{run_dir} holds a run already ({rundir.state(run_dir)}): name another run_dir or run_name"
        if problem is not None:
            raise RunDirError(f"records: {problem}")

    def run(self, loop: Callable[[EvaluateFn], Result], evaluate_fn: EvaluateFn) -> Result:
        """``loop(fn)`` (Flower's ``Strategy.start`` with ``fn`` as its ``evaluate_fn``) inside the run's
        record, ``fn`` being ``evaluate_fn`` followed by the round's line."""
        with engine.recorded(self.strategy.cfg, self.run_dir) as (recorder, extra):
            # Flower's loop keeps no checkpoint, so its summary records no identity: one with an identity
            # and no checkpoint reads "damaged" (``rundir.state``); such a run is not resumed in any case
            extra.pop(identity.KEY, None)
            self.recorder = recorder
            self.last = time.perf_counter()
            return loop(self.recording(evaluate_fn))

    def recording(self, evaluate_fn: EvaluateFn) -> EvaluateFn:
        def evaluate_and_record(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            result = evaluate_fn(server_round, arrays)
            test = {k: float(v) for k, v in (result or {}).items() if isinstance(v, (int, float))}
            now = time.perf_counter()
            info = self.strategy.round_log if server_round > 0 else None
            self.recorder.append(engine.round_row(server_round, test, info, now - self.last),
                                 info.client_rows() if info is not None else ())
            self.last = now
            return result

        return evaluate_and_record
