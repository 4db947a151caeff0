"""Every registered method runs end to end: a real Flower simulation (private SuperLink, Ray
clients) of 2 rounds with minimal settings, for each name in ``fedsuite.registry.methods()``, so a
new method is covered the moment it registers. Each run must complete and write one metrics.jsonl
line per round plus round 0, with a finite test accuracy in every line."""

from __future__ import annotations

import json
import math

import pytest

from fedsuite.registry import methods

E2E = {"num_clients": 6, "clients_per_round": 3, "rounds": 2}


@pytest.mark.parametrize("name", sorted(methods()))
def test_method_runs_two_rounds_end_to_end(simulate, name):
    run = simulate(strategy=name, **E2E)
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["round"] for r in rows] == [0, 1, 2]
    for r in rows:
        acc = r["test_accuracy"]
        assert acc is not None and math.isfinite(acc) and 0.0 <= acc <= 1.0, r
    assert run.summary.get("status", "completed") == "completed"
    assert run.checkpoint["round"] == 2
