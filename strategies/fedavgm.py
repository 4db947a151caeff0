"""FedAvgM (Hsu et al., 2019): server momentum on the mean client update, Flower's implementation.

    g_t = w^t − Σ_{i∈S} n_i w_{i,K} / Σ n_i                 (pseudo-gradient of our validated mean)
    v_t = g_t (t = 1),   v_t = β v_{t−1} + g_t (t > 1)       (PyTorch SGD-momentum convention)
    w^{t+1} = w^t − η v_t

``class FedAvgMStrategy(flwr FedAvgM, FlowerOptAdapter)``: Flower's ``FedAvgM`` runs on top of
``FedSuiteStrategy``'s validated mean, unchanged. η = 1 and β = 0 are FedAvg. None of the four papers
evaluates FedAvgM; defaults follow Hsu et al. (η = 1, β = 0.9). State: v_t (``state_dict``).
"""

import numpy as np
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM
from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.params import Params
from fedsuite.registry import register_method
from strategies._baselines import FlowerOptAdapter, FlowerOptResult


class FedAvgMParams(Params):
    server_lr: float = Field(1.0, gt=0, description="server learning rate η")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="server momentum β")


class FedAvgMStrategy(FlowerOptResult, FlowerFedAvgM, FlowerOptAdapter):
    """Flower's FedAvgM on fedsuite's validated mean."""

    def __init__(self, setup) -> None:
        p = setup.cfg.method_params
        self._pending_setup = setup
        FlowerFedAvgM.__init__(self, server_learning_rate=p.server_lr, server_momentum=p.server_momentum)

    def state_dict(self):
        if self.momentum_vector is None:
            return {"momentum": None}
        return {"momentum": {k: np.array(v, copy=True) for k, v in zip(self.template, self.momentum_vector)}}

    def load_state_dict(self, state):
        mom = state.get("momentum")
        self.momentum_vector = None if mom is None else [np.array(mom[k], copy=True) for k in self.template]


register_method(
    "fedavgm",
    strategy=FedAvgMStrategy,
    client=FedAvgClient,
    params=FedAvgMParams,
    summary="Server momentum on the mean client update (Flower's FedAvgM)",
    paper="Hsu et al., arXiv:1909.06335, 2019",
)
