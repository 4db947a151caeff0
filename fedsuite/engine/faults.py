"""Fault injection: client tasks that fail on demand (config section ``[faults]``).

Robustness studies, and fedsuite's own tests, need clients that crash, send garbage or straggle.
The ClientApp draws, for each training task, one uniform number per fault kind from a generator
seeded by (seed, partition id, round), in the fixed order below, so the same client fails in the
same round whatever the engine, the worker or the order in which tasks run:

    u_error, u_nan, u_shape, u_delay ~ U[0, 1)
    straggle   if delay_s > 0 and u_delay < delay_prob:  sleep delay_s seconds before training
    raise      if u_error < client_error:                InjectedFault, before training
    NaN        if u_nan   < nan:                         the first floating array of the reply is NaN
    bad shape  if u_shape < wrong_shape:                 the first array of the reply gains a row

A raised task becomes an error reply on the server; non-finite and wrongly shaped arrays are
rejected by the server's reply validation. All three count as failed replies of the round (see
``max_failed_fraction``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

_FAULT_STREAM = 0xFA170


class InjectedFault(RuntimeError):
    """The client error that ``faults.client_error`` asks for."""


@dataclass(frozen=True)
class FaultDraw:
    """Which faults one client task suffers this round."""

    raise_error: bool = False
    nan: bool = False
    wrong_shape: bool = False
    delay_s: float = 0.0

    @classmethod
    def for_task(cls, faults, seed: int, partition_id: int, server_round: int) -> "FaultDraw":
        """The faults of client ``partition_id`` in ``server_round`` (``faults``: the ``[faults]`` section)."""
        u_error, u_nan, u_shape, u_delay = np.random.default_rng(
            [int(seed) & 0xFFFFFFFF, partition_id, server_round, _FAULT_STREAM]
        ).random(4)
        return cls(
            raise_error=bool(u_error < faults.client_error),
            nan=bool(u_nan < faults.nan),
            wrong_shape=bool(u_shape < faults.wrong_shape),
            delay_s=float(faults.delay_s) if faults.delay_s > 0 and u_delay < faults.delay_prob else 0.0,
        )

    def before_training(self, partition_id: int, server_round: int) -> None:
        """Straggle and/or raise, as drawn."""
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        if self.raise_error:
            raise InjectedFault(f"injected fault (faults.client_error): client {partition_id}, round {server_round}")

    def corrupt(self, arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The reply's arrays with the drawn corruption applied (a new dict; inputs untouched)."""
        out = dict(arrays)
        if self.nan:
            key = next((k for k, v in out.items() if v.is_floating_point()), None)
            if key is not None:
                out[key] = torch.full_like(out[key], float("nan"))
        if self.wrong_shape and out:
            key = next(iter(out))
            value = out[key].reshape(1) if out[key].dim() == 0 else out[key]
            out[key] = torch.cat([value, value[:1]], dim=0)
        return out
