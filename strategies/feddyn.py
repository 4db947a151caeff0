"""FedDyn (Acar et al., ICLR 2021) as implemented in FedInit's reference code (FL-Simulator, by the
FedInit paper's first author).

    client   FedDyn local objective, h_i ← h_i + Δ_i           (clients/feddyn.py)
    server   h̄ ← h̄ + (1/C) Σ_{i∈S} Δ_i                        (h̄ = (1/C) Σ_{j=1..C} h_j, incremental)
             w^{t+1} = Σ_{i∈S} a_i w_{i,K} / Σ_{i∈S} a_i + h̄   (model average plus the mean h)

This is the paper's  h ← h − (λ/C) Σ_S (θ_i − θ^{t−1}),  θ^t = mean_S θ_i − h/λ  with h = −λ h̄.
Δ_i = w_{i,K} − w_{i,0}: without relaxed init w_{i,0} = w^t, so Δ_i = upload − w^t; with it the client
sends r_i = w_{i,0} − w^t ("start-offset") and, per the relaxed_init aggregation mode, the upload is
w^t + Δ_i (delta: w_{i,K} = upload + r_i) or w_{i,K} (model: Δ_i = upload − w^t − r_i), so the RI offset
enters the model average, as in FL-Simulator's FedDyn + RI. h̄ and the step act on trainable parameters; buffers are
averaged. Weights a_i: uniform (the FedInit paper's 1/|S|, default) or n_i. λ ("alpha") default
0.1 = FedInit Table 7 (CIFAR-10; 0.01/0.001 on CIFAR-100; FedNLR 0.1; FedMRUR suggests 0.01).
The FedInit paper decays the local lr by 0.999 for FedDyn: set ``lr_decay`` in the experiment config.
State: h̄ (``state_dict``).
"""

from typing import Literal

import numpy as np
from pydantic import Field

from clients.feddyn import RECORDS, START_OFFSET, FedDynClient
from fedsuite.method.params import Params
from fedsuite.method.arrays import NDArrays, copy_arrays, weighted_mean
from fedsuite.method.registry import register_method
from fedsuite.method.strategy import FedSuiteStrategy
from fedsuite.method.wire import ClientReply
from strategies._baselines import reply_weights


class FedDynParams(Params):
    alpha: float = Field(0.1, ge=0, description="regularisation coefficient λ (alpha in the FedDyn paper; the FedInit "
                         "paper's Table 7 on CIFAR-10)",
                         json_schema_extra={"paper": "0.01 or 0.001 on CIFAR-100 (the FedInit paper, Table 7)"})
    weighting: Literal["uniform", "examples"] = Field("uniform", description="model mean over S: 1/|S| or n_i")


class FedDynStrategy(FedSuiteStrategy):
    """Model average plus the mean of all clients' accumulated updates."""


    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.keys = setup.trainable_keys()
        self.h: NDArrays = {k: np.zeros(self.template[k].shape, np.float64) for k in self.keys}

    def _model_and_delta(self, r: ClientReply) -> tuple[NDArrays, NDArrays]:
        """(w_{i,K}, Δ_i) of one reply (see module docstring). The offset r_i is a declared optional
        record (``RECORDS``): its absence means the client started from w^t."""
        up = r.arrays
        if START_OFFSET not in r.extras:
            return up, {k: up[k].astype(np.float64) - self.global_arrays[k] for k in self.keys}
        offset = r.extras[START_OFFSET]
        ri = getattr(self.cfg, "relaxed_init", None)
        if getattr(ri, "aggregation", "delta") == "delta":
            model = dict(up)
            model.update({k: (up[k].astype(np.float64) + offset[k]).astype(up[k].dtype) for k in self.keys})
            return model, {k: up[k].astype(np.float64) - self.global_arrays[k] for k in self.keys}
        return up, {k: up[k].astype(np.float64) - self.global_arrays[k] - offset[k] for k in self.keys}

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        pairs = [self._model_and_delta(r) for r in replies]
        mean = weighted_mean([m for m, _ in pairs], reply_weights(replies, self.params.weighting), self.template)
        n = self.cfg.num_clients
        for _, delta in pairs:
            for k in self.keys:
                self.h[k] += delta[k] / n
        out = dict(mean)
        for k in self.keys:
            out[k] = (mean[k].astype(np.float64) + self.h[k]).astype(mean[k].dtype)
        return out

    def state_dict(self):
        return {"h": copy_arrays(self.h)}

    def load_state_dict(self, state):
        self.h = copy_arrays(state["h"])


register_method(
    "feddyn",
    strategy=FedDynStrategy,
    client=FedDynClient,
    params=FedDynParams,
    summary="Dynamic regularisation: linear + proximal local terms, model mean plus mean client drift",
    paper="Acar et al., ICLR 2021",
    records=RECORDS,
)
