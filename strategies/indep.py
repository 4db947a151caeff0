"""Indep and IndepAggr: the intuition experiment of FedMR's §3.1 / Fig. 5.

Indep: no aggregation and no recombination. The pool of K models (``strategies.pool``) is kept
slot-wise; each round the K slots are dealt to a freshly sampled cohort in random order, so every
model is trained by a random client each round:

    u_{slot(c)} ← v_c                                           (pool unchanged otherwise)

This is the authors' ``FedIndep`` ("the randomness comes from re-sampling clients each round"). It
equals FedMR-p1.0 (``--set fedmr.segment_fraction=1.0``, whole models shuffled) in distribution,
because the slot-to-client deal is already uniformly random; keeping the slots fixed makes each
model a lineage that can be followed over rounds ("Model-1..4" in Fig. 5).

* ``indep`` reports (and the ServerApp evaluates) one individual model, pool slot ``eval_slot``.
* ``indep-aggr`` trains exactly the same pool (same seed → same models) but reports the uniform
  mean (1/K) Σ_i u_i, evaluated for comparison only and never dispatched.
"""

from __future__ import annotations

from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.method.arrays import NDArrays
from fedsuite.method.registry import register_method
from fedsuite.method.strategy import ServerSetup
from fedsuite.method.wire import ClientReply
from strategies.pool import POOL_RECORDS, PoolParams, PoolStrategy


class IndepParams(PoolParams):
    """Indep's options (section ``[indep]``); ``diagnostics``: :class:`strategies.pool.PoolParams`."""

    eval_slot: int = Field(0, ge=0, description="pool slot whose model is reported and evaluated")


class IndepStrategy(PoolStrategy):
    """Indep: K independent models, each trained by a random client per round; reports one of them."""

    def __init__(self, setup: ServerSetup) -> None:
        super().__init__(setup)
        slot = self.params.eval_slot
        if slot >= self.pool_size:
            raise ValueError(f"indep.eval_slot={slot} but the pool has {self.pool_size} slots (clients_per_round)")

    def round_model(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        return dict(self.pool[self.params.eval_slot])


class IndepAggrStrategy(PoolStrategy):
    """IndepAggr: Indep's pool, reporting its uniform mean (never dispatched)."""


register_method(
    "indep",
    strategy=IndepStrategy,
    client=FedAvgClient,
    params=IndepParams,
    summary="FedMR Fig. 5: K models trained independently by random clients; reports one model",
    paper="Hu et al., KDD 2024, §3.1",
    records=POOL_RECORDS,
)
register_method(
    "indep-aggr",
    strategy=IndepAggrStrategy,
    client=FedAvgClient,
    params=PoolParams,
    summary="FedMR Fig. 5: Indep's pool, reporting the uniform mean of its K models",
    paper="Hu et al., KDD 2024, §3.1",
    records=POOL_RECORDS,
)
