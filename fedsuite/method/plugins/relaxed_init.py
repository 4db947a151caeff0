"""Relaxed initialisation (RI), FedInit's start point, as a plug-in for every method.

Paper: Sun, Shen & Tao, *Understanding How Consistency Works in Federated Learning via Stage-wise Relaxed Initialization*,
NeurIPS 2023, Algorithm 1. Where the paper is silent, FedInit's reference code (FL-Simulator, by
the first author) decides.

Client i, sampled in round t, starts local training at (Alg. 1 line 6)

    w_{i,0} = s + β (s − ŵ_i)          s = the host rule's start point (w^t for every host but FedMR-type)

where ŵ_i = w_{i,K} of the last round client i trained in, kept (stale) while it is not sampled, and
ŵ_i = w^0 before its first round (Alg. 1 line 1; the paper's w^{t−1}_{i,K} is undefined for
clients that did not train in round t−1, and this is what FL-Simulator does). Only trainable parameters are relaxed; buffers
stay as the host set them (the paper's models have none). After training, ŵ_i := w_{i,K}. The host's
loop then sees ``task.start_point == w_{i,0}``, so every anchor and every Δ_i of the host (FedProx /
FedDyn prox anchor, SCAFFOLD's Δ_i, FedCM's momentum) refers to the relaxed start, as in FL-Simulator's "+RI" methods.

What goes back:

* ``aggregation="delta"`` (default; what produced the paper's numbers: its Table 6 and FL-Simulator
  apply η_g = 1 to the mean delta): arrays = w_{i,K} − r_i with
  r_i = β (s − ŵ_i) = w_{i,0} − s, i.e. s + Δ_i with Δ_i = w_{i,K} − w_{i,0}. Any server rule that aggregates
  models therefore aggregates w^t + mean Δ_i, measured from the relaxed starts.
  Computed as w_{i,K} − r_i, not s + (w_{i,K} − w_{i,0}): the two agree up to one float32 rounding,
  and the subtraction form leaves w_{i,K} bitwise unchanged when r_i = 0.
* ``aggregation="model"`` (Algorithm 1 line 12, the proofs): arrays = w_{i,K}. For FedDyn + RI this
  is what FL-Simulator does (its FedDyn averages models).

β = 0 is FedAvg bit for bit, by construction rather than by luck of rounding: with β = 0, and
whenever the offset is zero by rule (first visit with ``zero_offset``, ŵ_i older than
``max_staleness``), the relaxation is not computed at all, the start point *is* s, and no
translation is applied, so the reply is the host's w_{i,K} unchanged.

Storage:

* ``"client-state"`` (canonical, no extra communication): ŵ_i lives on the client's disk
  (``task.state.save_arrays``; one model per client, not in RAM), with the round it was made.
  w^0 for a first visit is rebuilt on the client from the run's seed with
  ``fedsuite.models.initial_arrays`` (the very function the ServerApp builds w^0 with; inside
  ``torch.random.fork_rng`` so the local RNG stream is untouched). Chosen over the server sending
  w^0 on a first visit because it needs no server bookkeeping, no extra bytes, and still works after a
  SuperNode restart that lost its state: the client then falls back to ``first_visit``.
* ``"server-state"`` (how FL-Simulator simulates it): the strategy keeps every ŵ_i on disk under the run
  directory (``fedsuite.method.state.ArrayStore``) and sends each sampled client its own w_{i,0} as the
  extra ArrayRecord ``"start"``. The client trains from it and replies w_{i,K}; the server stores it as
  ŵ_i and applies the same delta translation. The maths (and the float operations) are those of
  client-state mode, so the two modes give identical models and metrics (tests/test_fedinit.py).
  It relaxes around the model the host sends in ``"arrays"``, so it needs a host whose client starts
  from the received model (the client checks this and says so otherwise).

Activity (``fedsuite.method.activity``, component :data:`RELAXATION`): every sampled client reports how
far relaxation moved its start point, relative to the model it would otherwise start from,

    offset_i = ‖w_{i,0} − s‖ / ‖s‖ = ‖r_i‖ / ‖s‖        (joint L2 norms over the relaxed parameters)

as ``relaxed-init-offset`` (s = w^t for every host but FedMR-type ones, whose own start point is
the recombined model, so the measure is the relaxation's move alone). It is exactly 0 with β = 0,
whenever the offset is zero by rule (first visit with ``zero_offset``, ŵ_i older than
``max_staleness``) and in the first round (whose model is w^0 = ŵ_i). Computed from tensors the
plug-in holds anyway (s + r_i and s; in server-state mode the sent w_{i,0} and s), before the
model is moved, with no random draw: training is unchanged by it.

Options (section ``[relaxed_init]``, CLI ``--relaxed-init β``): ``beta`` (None = off),
``storage``, ``aggregation``, ``first_visit`` ("w0": ŵ_i = w^0, Alg. 1 line 1; "zero_offset": a
first-time client starts at s), ``max_staleness`` (None = ∞; else a ŵ_i made more than that many
rounds ago gives a zero offset; it does not apply to w^0, which ``first_visit`` governs; an ablation).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from fedsuite.method.activity import Component, joint_norm, ratio
from fedsuite.method.params import Params
from fedsuite.method.arrays import trainable_keys
from fedsuite.models import initial_arrays
from fedsuite.method.plugins.base import ClientPlugin, ServerHooks
from fedsuite.method.rounds import RoundLog, ServerSetup
from fedsuite.method.seeding import GLOBAL_TORCH_RNG
from fedsuite.method.state import ArrayStore
from fedsuite.method.training import LocalResult, LocalTask
from fedsuite.method.wire import ARRAYS, ClientReply, to_ndarrays, to_record

Tensors = dict[str, torch.Tensor]

STATE_NAME = "relaxed_init-last_local"  # ŵ_i in the client's ClientState
ROUND_KEY = "__round__"  # the round ŵ_i was made in, stored beside it
START_RECORD = "start"  # server-state mode: the extra ArrayRecord with w_{i,0}

#: relaxed initialisation as a distinguishing component (``fedsuite.method.activity``): the start point's
#: offset relative to the model (module docstring). Inert below 1e-4: the start point moves by less
#: than a ten-thousandth of the model's norm. Lower than the other components' 1e-3 because it is
#: measured against the model, not against what a round does to it: a round of local SGD moves the
#: model by a few percent of its norm (FedInit's CPU recipe, Fashion-MNIST CNN, lr 0.1, 24 steps:
#: 13% in a client's first round), so an offset of 1e-4 of the model is still at most a hundredth
#: of a round's own move while that move is at least 1% of the model.
RELAXATION = Component(
    name="relaxed_init", measure="relaxed-init-offset", threshold=1e-4,
    meaning="‖w_{i,0} − w^t‖ / ‖w^t‖, the start point's offset relative to the model; inert below 1e-4 (the "
            "start point moves by less than a ten-thousandth of the model's norm)")


class RelaxedInitParams(Params):
    """Section ``[relaxed_init]``: FedInit's relaxed initialisation on any method."""


    beta: float | None = Field(None, description="relaxation β (None = off); w_{i,0} = w^t + β (w^t − ŵ_i)")
    storage: Literal["client-state", "server-state"] = Field(
        "client-state", description="where ŵ_i lives: on the client, or on the server (personalised start)")
    aggregation: Literal["delta", "model"] = Field(
        "delta", description="upload w^t + (w_{i,K} − w_{i,0}) (delta) or w_{i,K} (model)")
    first_visit: Literal["w0", "zero_offset"] = Field(
        "w0", description="ŵ_i before a client's first round: w^0, or no offset")
    max_staleness: int | None = Field(
        None, ge=0, description="ŵ_i older than this many rounds gives no offset (None = never)")


# ------------------------------------------------------------------------------------------------
# the maths, as pure functions
# ------------------------------------------------------------------------------------------------


def relaxation_offset(start: Tensors, last_local: Tensors, beta: float, keys: list[str]) -> Tensors:
    """r_i = β (s − ŵ_i) for every key in ``keys``, so that w_{i,0} = s + r_i. Client-state
    and server-state mode both compute r_i (and w_{i,0} = s + r_i) with exactly these float ops."""
    out = {}
    for k in keys:
        r = start[k] - last_local[k].to(start[k].device, start[k].dtype)
        out[k] = r.mul_(beta)
    return out


def relaxed_start(start: Tensors, last_local: Tensors, beta: float, keys: list[str]) -> Tensors:
    """w_{i,0} = s + β (s − ŵ_i) for every key in ``keys``. β = 0 returns ``start``'s
    tensors themselves (no arithmetic), so the start point is s bit for bit."""
    if beta == 0:
        return {k: start[k] for k in keys}
    r = relaxation_offset(start, last_local, beta, keys)
    return {k: start[k] + r[k] for k in keys}


def translate(arrays: dict[str, Any], offset: dict[str, Any] | None) -> dict[str, Any]:
    """Delta-mode upload: w_{i,K} − r_i = s + (w_{i,K} − w_{i,0}) for relaxed keys; others unchanged.
    ``offset=None`` (no relaxation happened) returns ``arrays`` untouched."""
    if offset is None:
        return arrays
    return {k: (v - offset[k]) if k in offset else v for k, v in arrays.items()}


_W0_CACHE: dict[tuple, Tensors] = {}


def initial_params(cfg: Any, bundle: Any, keys: list[str]) -> Tensors:
    """w^0's trainable parameters, rebuilt from the run's seed exactly as the ServerApp builds w^0
    (``fedsuite.models.initial_arrays``), without disturbing the caller's RNG state. Cached per
    process for the last configuration (a Ray worker serves many clients of one run)."""
    key = (cfg.model_dump_json(), bundle.num_classes, tuple(bundle.input_shape))
    # the global RNG is the process's: other clients' threads leave it alone meanwhile (fedsuite.method.seeding)
    with GLOBAL_TORCH_RNG:
        if key not in _W0_CACHE:
            with torch.random.fork_rng(devices=[]):
                arrays = initial_arrays(cfg, bundle)
            _W0_CACHE.clear()
            _W0_CACHE[key] = {k: torch.from_numpy(arrays[k]) for k in arrays}
        cached = _W0_CACHE[key]
    return {k: cached[k] for k in keys}


def start_offset(relaxed: Tensors, start: Tensors) -> float:
    """offset_i = ‖w_{i,0} − s‖ / ‖s‖ over the keys of ``relaxed`` (= w_{i,0}) jointly (float64
    sums; 0/0 = 0): how far relaxation moved the start point, relative to s (the module's activity).
    Both storage modes pass w_{i,0} = s + r_i as the same float32 sum (the client's, or the one the
    server sent), so they report the same number."""
    return ratio(joint_norm(relaxed[k] - start[k] for k in relaxed), joint_norm(start[k] for k in relaxed))


def effective_offset_source(p: RelaxedInitParams, server_round: int, stored_round: int | None) -> str:
    """Which ŵ_i applies: "stored" (the client's last local model), "w0", or "none" (zero offset)."""
    if stored_round is None:
        return "w0" if p.first_visit == "w0" else "none"
    if p.max_staleness is not None and server_round - stored_round > p.max_staleness:
        return "none"
    return "stored"


# ------------------------------------------------------------------------------------------------
# client side
# ------------------------------------------------------------------------------------------------


class RelaxedInit(ClientPlugin):
    """Relaxed initialisation on any client rule (see module docstring for the maths)."""

    name = "relaxed_init"
    params = RelaxedInitParams
    component = RELAXATION
    #: r_i = w_{i,0} − s when this client translates its upload (``aggregation="delta"``), else None
    offset: Tensors | None = None

    @classmethod
    def enabled(cls, params: RelaxedInitParams) -> bool:
        return params.beta is not None

    @property
    def beta(self) -> float:
        return float(self.p.beta or 0.0)

    def after_start(self, task: LocalTask) -> None:
        keys = trainable_keys(task.model)
        state = task.model.state_dict()
        start = {k: state[k] for k in keys}  # s: the host's start point (views into the model)
        self.offset = None  # r_i when this client translates its upload
        if self.p.storage == "server-state":
            self._server_start(task, keys, start)
            return
        offset = self._client_offset(task, keys, start)
        if offset is None:  # zero offset by rule: the start point is s, nothing to translate
            task.metrics[RELAXATION.measure] = 0.0
            return
        # w_{i,0} = s + r_i as the in-place add below makes it, measured before s is moved (views)
        task.metrics[RELAXATION.measure] = start_offset({k: start[k] + offset[k] for k in offset}, start)
        with torch.no_grad():
            for name, p in task.model.named_parameters():
                if name in offset:
                    p.add_(offset[name])  # w_{i,0} = s + r_i, in place (the same op as relaxed_start)
        self.offset = offset

    def _client_offset(self, task: LocalTask, keys: list[str], start: Tensors) -> Tensors | None:
        if self.beta == 0:
            return None
        stored = task.state.load_arrays(STATE_NAME, task.device)
        stored_round = int(stored.pop(ROUND_KEY)) if stored is not None else None
        source = effective_offset_source(self.p, task.server_round, stored_round)
        if source == "none":
            return None
        last = stored if source == "stored" else initial_params(task.cfg, task.data.bundle, keys)
        return relaxation_offset(start, last, self.beta, keys)

    def _server_start(self, task: LocalTask, keys: list[str], start: Tensors) -> None:
        sent = task.extras.get(START_RECORD)
        if sent is None:
            raise RuntimeError(
                "relaxed_init.storage='server-state' but the server sent no 'start' record; "
                "the strategy must be a FedSuiteStrategy (its server hooks send it)")
        if any(not torch.equal(start[k], task.received[k]) for k in keys):
            raise RuntimeError(
                f"relaxed_init.storage='server-state' relaxes around the received model, but "
                f"{task.cfg.strategy}'s client starts elsewhere; use relaxed_init.storage='client-state'")
        relaxed = {k: sent[k].to(start[k].device, start[k].dtype) for k in keys if k in sent}  # w_{i,0} as sent
        task.metrics[RELAXATION.measure] = start_offset(relaxed, start)  # before s is overwritten (views)
        with torch.no_grad():
            for name, p in task.model.named_parameters():
                if name in sent:
                    p.copy_(sent[name])

    def after_finish(self, task: LocalTask, result: LocalResult) -> LocalResult:
        offset = self.offset
        if self.p.storage == "client-state":
            if self.beta != 0:  # β = 0 never reads ŵ_i: do not pay for writing it
                state = task.model.state_dict()
                keep = {k: state[k] for k in trainable_keys(task.model)}
                keep[ROUND_KEY] = torch.tensor(task.server_round, dtype=torch.int64)
                task.state.save_arrays(STATE_NAME, keep)  # ŵ_i := w_{i,K}
            if self.p.aggregation == "delta":
                result.arrays = translate(result.arrays, offset)
        # server-state: the reply carries w_{i,K}; the server stores it and translates (RelaxedInitServer)
        return result

    def server_hooks(self, setup: ServerSetup) -> "RelaxedInitServer | None":
        return RelaxedInitServer(self.p, setup) if self.p.storage == "server-state" else None


# ------------------------------------------------------------------------------------------------
# server side (server-state mode)
# ------------------------------------------------------------------------------------------------


class RelaxedInitServer(ServerHooks):
    """Server-state RI (as FL-Simulator): keeps ŵ_i of every client on disk, sends w_{i,0} as ``"start"``,
    stores the replied w_{i,K} as ŵ_i and applies the delta translation before the host aggregates.

    Files: ``<run_dir>/relaxed-init-server/client-<pid>/last-local-r<round>.pt`` (ŵ_i made in that
    round; the previous generation is kept so a checkpoint one round older can be restored). The
    offsets r_i of the round in flight are held in RAM (N model-sized arrays, as many as the replies
    the server holds anyway). ``state_dict()`` = {pid: round of ŵ_i}.
    """

    name = "relaxed_init"

    def __init__(self, params: RelaxedInitParams, setup: ServerSetup) -> None:
        self.p = params
        self.keys = setup.trainable_keys()  # buffers are not relaxed
        # no run folder (a strategy built outside a run): a scratch folder, removed with this object
        self._scratch = None if setup.run_dir is not None else tempfile.TemporaryDirectory(prefix="fedsuite-ri-")
        root = Path(setup.run_dir) if self._scratch is None else Path(self._scratch.name)
        self.store = ArrayStore(root / "relaxed-init-server")
        self.initial = {k: torch.from_numpy(np.asarray(setup.initial[k])) for k in self.keys}
        self.index: dict[int, int] = self._scan()  # pid -> round its ŵ_i was made in
        self.offsets: dict[int, Tensors] = {}  # r_i of this round's cohort (N models, like the replies)

    @property
    def beta(self) -> float:
        return float(self.p.beta or 0.0)

    def _scan(self) -> dict[int, int]:
        """The newest ŵ_i generation on disk per client (a resumed run before ``load_state_dict``)."""
        index: dict[int, int] = {}
        for path in self.store.root.glob("client-*/last-local-r*.pt"):
            pid = int(path.parent.name.split("-")[1])
            rnd = int(re.search(r"-r(\d+)\.pt$", path.name).group(1))
            index[pid] = max(index.get(pid, -1), rnd)
        return index

    def payload(self, server_round: int, pid: int, content: Any) -> None:
        sent = to_ndarrays(content[ARRAYS])
        start = {k: torch.from_numpy(np.asarray(sent[k])) for k in self.keys}
        offset = None
        if self.beta != 0:
            source = effective_offset_source(self.p, server_round, self.index.get(pid))
            if source != "none":
                last = self.store.load(f"client-{pid}", f"last-local-r{self.index[pid]}") if source == "stored" else self.initial
                offset = relaxation_offset(start, last, self.beta, self.keys)
        self.offsets.pop(pid, None)
        if offset is None:
            relaxed = start
        else:
            relaxed = {k: start[k] + offset[k] for k in self.keys}  # w_{i,0} = s + r_i
            if self.p.aggregation == "delta":  # r_i, needed to translate this client's reply
                self.offsets[pid] = offset
        content[START_RECORD] = to_record({k: v.numpy() for k, v in relaxed.items()})

    def observe(self, server_round: int, replies: list[ClientReply], round_log: RoundLog) -> list[ClientReply]:
        for reply in replies:
            pid = reply.partition_id
            w_k = {k: torch.from_numpy(np.asarray(reply.arrays[k])) for k in self.keys}
            self._save_last(pid, server_round, w_k)
            offset = self.offsets.pop(pid, None)
            if offset is not None:
                moved = translate({k: torch.from_numpy(np.asarray(v)) for k, v in reply.arrays.items()}, offset)
                reply.arrays = {k: v.numpy() for k, v in moved.items()}
        self.offsets.clear()
        return replies

    def _save_last(self, pid: int, server_round: int, arrays: Tensors) -> None:
        owner = f"client-{pid}"
        keep = {server_round, self.index.get(pid, server_round)}
        self.store.save(owner, f"last-local-r{server_round}", arrays)
        self.index[pid] = server_round
        for path in self.store.root.joinpath(owner).glob("last-local-r*.pt"):
            if int(re.search(r"-r(\d+)\.pt$", path.name).group(1)) not in keep:
                path.unlink()

    def state_dict(self) -> dict[str, Any]:
        return {"index": dict(self.index)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index = {int(k): int(v) for k, v in state.get("index", {}).items()}

