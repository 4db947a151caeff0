"""SCAFFOLD, option II (Karimireddy et al., ICML 2020; a baseline of FedInit, FedMRUR and FedNLR).

    server sends  w^t and c (extra ArrayRecord "server-cv"; 2× download)
    client        corrected SGD, returns w_{i,K} and Δc_i ("delta-cv")      (clients/scaffold.py)
    server        w^{t+1} = w^t + η_g Δ̄,   Δ̄ = Σ_{i∈S} a_i (w_{i,K} − w^t) / Σ_{i∈S} a_i
                  c ← c + (1/C) Σ_{i∈S} Δc_i,   C = num_clients,   c = 0 at start

Weights a_i: ``weighting="uniform"`` (1/|S|, the SCAFFOLD and FedInit papers, default) or
``"examples"`` (n_i, FedAvg's). η_g = 1 (the FedInit paper's global lr). With --relaxed-init in
delta mode the uploaded model is w^t + Δ_i with Δ_i measured from the relaxed start, so Δ̄ is the
mean Δ_i from the relaxed starts, as in FedInit's code.
State: c (checkpointed through ``state_dict``).
"""

from typing import Literal

import numpy as np
from pydantic import Field

from clients.scaffold import DELTA_CV, RECORDS, SERVER_CV, ScaffoldClient
from fedsuite.method.params import Params
from fedsuite.method.arrays import NDArrays, copy_arrays, server_step, weighted_mean
from fedsuite.method.registry import register_method
from fedsuite.method.strategy import FedSuiteStrategy
from fedsuite.method.wire import ClientReply, to_record
from strategies._baselines import reply_weights


class ScaffoldParams(Params):
    server_lr: float = Field(1.0, gt=0, description="global learning rate η_g")
    weighting: Literal["uniform", "examples"] = Field("uniform", description="mean over S: 1/|S| or n_i")


class ScaffoldStrategy(FedSuiteStrategy):
    """Server control variate c, sent to every client; model step η_g Δ̄."""

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.keys = setup.trainable_keys()
        self.c: NDArrays = {k: np.zeros_like(self.template[k]) for k in self.keys}
        self._c_record = None

    def prepare_round(self, server_round, cohort):
        self._c_record = to_record(self.c)  # one record per round, shared by all messages

    def client_payload(self, server_round, pid, arrays, config):
        content = super().client_payload(server_round, pid, arrays, config)
        content[SERVER_CV] = self._c_record
        return content

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        mean = weighted_mean([r.arrays for r in replies], reply_weights(replies, self.params.weighting), self.template)
        new = server_step(mean, self.global_arrays, self.params.server_lr, self.keys)
        total = {k: np.zeros(self.c[k].shape, np.float64) for k in self.keys}
        for r in replies:  # each holds Δc_i over the trainable parameters (RECORDS, checked on receipt)
            dc = r.extras[DELTA_CV]
            for k in self.keys:
                total[k] += dc[k].astype(np.float64)
        n = self.cfg.num_clients
        self.c = {k: (self.c[k].astype(np.float64) + total[k] / n).astype(self.c[k].dtype) for k in self.keys}
        return new

    def state_dict(self):
        return {"c": copy_arrays(self.c)}

    def load_state_dict(self, state):
        self.c = copy_arrays(state["c"])


register_method(
    "scaffold",
    strategy=ScaffoldStrategy,
    client=ScaffoldClient,
    params=ScaffoldParams,
    summary="Control variates c, c_i correct client drift (option II); 2x communication",
    paper="Karimireddy et al., ICML 2020",
    records=RECORDS,
)
