"""The "a different model for each client" machinery shared by FedMR, FedMut, Indep and IndepAggr.

The server keeps a **pool** of K full models (K = clients per round; the FedMR paper's Algorithm 1):

    L_m = [u_0, …, u_{K-1}]          initially K identical copies of w^0          (as the FedMR authors' code)

One round r (1-based, Flower's ``server_round``):

1. sample the cohort S_r (``FedSuiteStrategy.sample_cohort``) and deal the K slots to it in a
   random order drawn from a generator seeded by (seed, r), so which client trains which slot is
   random, as in the paper's random dispatch; client S_r[i] receives u_{slot(i)} and ``slot`` in its config;
2. every reply v is written back into the slot of the client that sent it (mapped by the reply's
   partition id, so the order of replies is irrelevant):  u_{slot(c)} ← v_c.
   A slot whose client failed keeps the model that was dispatched (so the pool keeps K models); it is logged;
3. the subclass computes the model the round reports (``round_model``: FedMR's uniform mean
   w^glb = (1/K) Σ_i u_i, Indep's single slot, ...) and the next pool (``next_pool``:
   FedMR recombines, FedMut mutates, Indep keeps it).

Wire check: every payload asks (``fedsuite.method.wire.CHECKSUM_REQUEST``) for ``received-checksum``, the
CRC-32 of the "arrays" record the client received (``fedsuite.method.wire.record_checksum``); the server
compares it with the checksum of what it sent to that client, counts a wrong one as a mismatch (a
reply without one fails: it is a declared record, :data:`POOL_RECORDS`), logs every mismatch and writes ``checksum_mismatches`` and ``payload_checksums`` (one per
slot) into the round's metrics row.

Server state (``state_dict``): the pool (and subclass extras). Random draws come from generators
seeded by (seed, round, purpose), so a resumed run repeats exactly the draws of an uninterrupted one.

Diagnostics (``<method>.diagnostics = true``, off by default: they cost 2K + 1 central evaluations
per evaluated round). On every round the ServerApp evaluates (``cfg.evaluates``), with
v_0..v_{K-1} the pool after the round's training (slot order; a failed slot holds what it was sent),
w_s the model slot s was sent and u'_s the model it is sent next round, the metrics row gets

    pool_accuracy, pool_loss         [K]  test accuracy / loss of each v_s
    pool_mean_accuracy, pool_mean_loss    of v̄ = (1/K) Σ_s v_s (FedMR's evaluated global model)
    next_accuracy, next_loss         [K]  of each u'_s before any training (FedMR: the recombined
                                          models; in an aggregation round all equal v̄)
    pool_distance                         (2/(K(K-1))) Σ_{s<t} ||v_s − v_t||   (all float entries)
    pool_layer_distance   {entry: (2/(K(K-1))) Σ_{s<t} ||v_s[l] − v_t[l]||}     (per state_dict entry)
    client_movement                  [K]  ||v_s − w_s|| (None for a failed slot)
    slot_clients                     [K]  the partition id that trained slot s

Recombination permutes each entry's K copies, so the per-entry distances of the recombined pool equal
those of v (Lemma 4.4's argument): one set of distances describes both.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from pydantic import Field

from fedsuite.method.params import Params
from fedsuite.method.arrays import NDArrays, uniform_mean
from fedsuite.method.seeding import round_rng
from fedsuite.method.strategy import FedSuiteStrategy, ServerSetup
from fedsuite.method.wire import (
    ARRAYS, CHECKSUM_REQUEST, CONFIG, RECEIVED_CHECKSUM, RECEIVED_CHECKSUM_RECORD, ClientReply, Records, record_checksum,
    to_record,
)

log = logging.getLogger("fedsuite")

#: purpose tags of the per-round generators (``fedsuite.method.seeding.round_rng``)
SLOT_TAG = 0x51_07
PERM_TAG = 0x9E_C0
MUT_TAG = 0x4D_07

#: the records of every pool method (``fedsuite.method.wire.Records``; FedMR, FedMut, Indep, IndepAggr register
#: with them): every payload asks for the checksum of what the client received, so every reply holds it
POOL_RECORDS = Records(reply=(RECEIVED_CHECKSUM_RECORD,))


class PoolParams(Params):
    """Options every pool method has (its section ``[fedmr]``, ``[fedmut]``, ``[indep]``, ``[indep-aggr]``)."""


    diagnostics: bool = Field(
        False, description="per evaluated round: test accuracy/loss of each pool model, of their mean and of the "
        "models sent next; pairwise pool distances per layer; each client's movement (2K+1 evaluations)")


def pool_distances(models: list[NDArrays], keys: list[str]) -> tuple[float, dict[str, float]]:
    """Mean pairwise L2 distance of K models, over ``keys`` jointly and per key, in float64:

        d = (2/(K(K-1))) Σ_{s<t} sqrt(Σ_l ||u_s[l] − u_t[l]||²),   d_l = (2/(K(K-1))) Σ_{s<t} ||u_s[l] − u_t[l]||

    Each difference is taken element-wise, so equal models give exactly 0. K < 2: all 0."""
    pairs = [(s, t) for s in range(len(models)) for t in range(s + 1, len(models))]
    if not pairs:
        return 0.0, {k: 0.0 for k in keys}
    sq = np.zeros((len(keys), len(pairs)))
    for i, key in enumerate(keys):
        stack = [np.asarray(m[key], dtype=np.float64) for m in models]
        for j, (s, t) in enumerate(pairs):
            diff = stack[s] - stack[t]
            sq[i, j] = float(np.vdot(diff, diff))
    return float(np.sqrt(sq.sum(0)).mean()), {k: float(v) for k, v in zip(keys, np.sqrt(sq).mean(1))}


def model_distance(a: NDArrays, b: NDArrays, keys: list[str]) -> float:
    """||a − b||₂ over ``keys`` jointly (float64)."""
    return float(np.sqrt(sum(float(np.vdot(d, d)) for d in
                             (np.asarray(a[k], dtype=np.float64) - np.asarray(b[k], dtype=np.float64) for k in keys))))


class PoolStrategy(FedSuiteStrategy):
    """A pool of K models, one per slot; client i of the cohort trains slot i's model (see module)."""

    def __init__(self, setup: ServerSetup) -> None:
        super().__init__(setup)
        self.pool_size = self.cfg.cohort_size
        self.pool: list[NDArrays] = [dict(setup.initial) for _ in range(self.pool_size)]
        self.slot_of_pid: dict[int, int] = {}
        self._sent: dict[int, int] = {}  # pid -> checksum of the payload it was sent
        self._slot_records: dict[int, tuple[ArrayRecord, int]] = {}  # id(model) -> (record, crc)
        self.diagnostics = self.params.diagnostics  # every pool method's params are a PoolParams
        if self.diagnostics and setup.evaluate is None:
            raise ValueError("pool diagnostics evaluate models centrally: the ServerSetup needs `evaluate` "
                             "(the ServerApp's test-set evaluation)")
        self.float_keys = [k for k, v in self.template.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]

    # --- hooks for subclasses ---------------------------------------------------------------------
    def round_model(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        """The model this round reports and the ServerApp evaluates (default: uniform pool mean)."""
        return uniform_mean(self.pool, self.template)

    def next_pool(self, server_round: int, replies: list[ClientReply], model: NDArrays) -> list[NDArrays]:
        """The pool dispatched next round (default: unchanged)."""
        return self.pool

    def round_extra(self, server_round: int) -> dict[str, Any]:
        """Extra columns for this round's metrics row."""
        return {}

    # --- dispatch -----------------------------------------------------------------------------------
    def assign_slots(self, server_round: int, cohort: list[int]) -> dict[int, int]:
        """Partition id -> slot for this round: the cohort dealt the slots in a seeded random order."""
        order = round_rng(self.cfg.seed, server_round, SLOT_TAG).permutation(len(cohort))
        return {pid: int(slot) for pid, slot in zip(cohort, order)}

    def prepare_round(self, server_round: int, cohort: list[int]) -> None:
        self.slot_of_pid = self.assign_slots(server_round, cohort)
        self._sent = {}
        self._slot_records = {}

    def client_payload(self, server_round: int, pid: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """Client ``pid`` gets its slot's model u_slot (not the global) and ``slot`` in its config."""
        slot = self.slot_of_pid[pid]
        model = self.pool[slot]
        if id(model) not in self._slot_records:  # identical slots (stage 1) share one record
            record = to_record(model)
            self._slot_records[id(model)] = (record, record_checksum(record))
        record, crc = self._slot_records[id(model)]
        self._sent[pid] = crc
        return RecordDict({ARRAYS: record, CONFIG: ConfigRecord({**dict(config), "slot": slot, CHECKSUM_REQUEST: True})})

    # --- aggregation --------------------------------------------------------------------------------
    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        dispatched = list(self.pool)  # w_s: what each slot was sent
        dispatched_crc = {self.slot_of_pid[pid]: crc for pid, crc in self._sent.items()}
        mismatches, filled = 0, set()
        for reply in replies:
            slot = self.slot_of_pid.get(reply.partition_id)
            if slot is None:
                log.warning("round %s: reply of client %s, which was not sent a model, ignored", server_round, reply.partition_id)
                continue
            received = reply.metrics[RECEIVED_CHECKSUM]  # declared (POOL_RECORDS): a reply without it failed
            if reply.partition_id in self._sent and int(received) != self._sent[reply.partition_id]:
                mismatches += 1
                log.warning("round %s: client %s trained from a model other than slot %s's (checksum %s != %d)",
                            server_round, reply.partition_id, slot, received, self._sent[reply.partition_id])
            self.pool[slot] = reply.arrays
            filled.add(slot)
        failed = sorted(set(self.slot_of_pid.values()) - filled)
        if failed:
            log.warning("round %s: slots %s got no reply and keep the model they were sent", server_round, failed)
        trained = list(self.pool)
        model = self.round_model(server_round, replies)
        self.pool = self.next_pool(server_round, replies, model)
        assert len(self.pool) == self.pool_size
        self.round_log.add({
            "checksum_mismatches": mismatches,
            "failed_slots": failed,
            "payload_checksums": [dispatched_crc.get(s) for s in range(self.pool_size)],
            **self.round_extra(server_round),
        })
        if self.diagnostics and self.cfg.evaluates(server_round):
            self.round_log.add(self.pool_diagnostics(dispatched, trained, filled))
        return model

    def pool_diagnostics(self, dispatched: list[NDArrays], trained: list[NDArrays], filled: set[int]) -> dict[str, Any]:
        """The diagnostics columns (module docstring): ``dispatched`` w_s, ``trained`` v_s, ``self.pool``
        u'_s; ``filled`` the slots whose client replied. A model met twice (same arrays) is evaluated once."""
        cache: dict[tuple[int, ...], dict[str, float]] = {}

        def test(m: NDArrays) -> dict[str, float]:
            key = tuple(id(a) for a in m.values())
            if key not in cache:
                cache[key] = self.setup.evaluate(m)
            return cache[key]

        pool_mean = uniform_mean(trained, self.template)  # kept alive: the cache keys on array ids
        mean = test(pool_mean)
        now, nxt = [test(m) for m in trained], [test(m) for m in self.pool]
        distance, per_layer = pool_distances(trained, self.float_keys)
        pid_of_slot = {slot: pid for pid, slot in self.slot_of_pid.items()}
        return {
            "pool_accuracy": [r["accuracy"] for r in now],
            "pool_loss": [r["loss"] for r in now],
            "pool_mean_accuracy": mean["accuracy"],
            "pool_mean_loss": mean["loss"],
            "next_accuracy": [r["accuracy"] for r in nxt],
            "next_loss": [r["loss"] for r in nxt],
            "pool_distance": distance,
            "pool_layer_distance": per_layer,
            "client_movement": [model_distance(trained[s], dispatched[s], self.float_keys) if s in filled else None
                                for s in range(self.pool_size)],
            "slot_clients": [pid_of_slot.get(s) for s in range(self.pool_size)],
        }

    # --- checkpointing ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"pool": [dict(m) for m in self.pool]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pool = state["pool"]
        if len(pool) != self.pool_size:
            raise ValueError(f"checkpoint pool has {len(pool)} models, this run's pool size is {self.pool_size}")
        self.pool = [dict(m) for m in pool]
