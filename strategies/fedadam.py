"""FedAdam (Reddi et al., ICLR 2021): Adam as the server optimiser, on Flower's own implementation.

    Δ̄_t = Σ_{i∈S} n_i w_{i,K} / Σ n_i − w^t          (our validated, sorted mean; Flower's FedOpt)
    m_t = β₁ m_{t−1} + (1 − β₁) Δ̄_t,   v_t = β₂ v_{t−1} + (1 − β₂) Δ̄_t²   (element-wise, m_0 = v_0 = 0)
    w^{t+1} = w^t + η_t m_t / (√v_t + τ)

``class FedAdamStrategy(flwr FedAdam, FlowerOptAdapter)``: Flower's ``FedOpt.configure_train``
remembers w^t and hands over to our cohort/payload code; Flower's ``FedAdam.aggregate_train`` runs on
top of ``FedSuiteStrategy.aggregate_train`` (validated replies, weighted mean).

Where Flower differs from FedInit's code: Flower multiplies η by the bias correction
√(1 − β₂^(r+1)) / (1 − β₁^(r+1)) (r = Flower's round counter). FedInit's reference code
(FL-Simulator; the paper does not say): **no bias correction**, η_t = η. Default ``bias_correction=False``: for that
round η is rescaled so that Flower's product equals η (the only override). ``bias_correction=True``
gives Adam's η √(1 − β₂^t) / (1 − β₁^t) with t the global round (also right after a resume).
Defaults: η_g = 0.1 (the FedInit paper's Table 7 and main text), β₁ = 0.9, β₂ = 0.99, τ = ε = 0.01
(FL-Simulator's; not in the paper).
State: m_t, v_t (``state_dict``).
"""

import math

from flwr.serverapp.strategy import FedAdam as FlowerFedAdam
from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.params import Params
from fedsuite.registry import register_method
from strategies._baselines import FlowerOptAdapter, FlowerOptResult


class FedAdamParams(Params):
    server_lr: float = Field(0.1, gt=0, description="server learning rate η_g")
    beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay β₁")
    beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay β₂")
    tau: float = Field(0.01, gt=0, description="adaptivity ε (tau in Reddi et al.)")
    bias_correction: bool = Field(False, description="Adam bias correction (off in FedInit's code)")


class FedAdamStrategy(FlowerOptResult, FlowerFedAdam, FlowerOptAdapter):
    """Flower's FedAdam on fedsuite's validated mean; bias correction per ``bias_correction``."""

    def __init__(self, setup) -> None:
        p = setup.cfg.method_params
        self._pending_setup = setup
        FlowerFedAdam.__init__(self, eta=p.server_lr, eta_l=setup.cfg.lr, beta_1=p.beta1, beta_2=p.beta2, tau=p.tau)

    def effective_lr(self, global_round: int) -> float:
        """η_t actually applied in ``global_round`` (1-based)."""
        p = self.params
        if not p.bias_correction:
            return p.server_lr
        return p.server_lr * math.sqrt(1 - p.beta2**global_round) / (1 - p.beta1**global_round)

    def aggregate_train(self, server_round, replies):
        p = self.params
        flower_factor = math.sqrt(1 - p.beta2 ** (server_round + 1.0)) / (1 - p.beta1 ** (server_round + 1.0))
        self.eta = self.effective_lr(self.global_round(server_round)) / flower_factor
        try:
            return super().aggregate_train(server_round, replies)  # FlowerOptResult's, then Flower's
        finally:
            self.eta = p.server_lr


register_method(
    "fedadam",
    strategy=FedAdamStrategy,
    client=FedAvgClient,
    params=FedAdamParams,
    summary="Adam server optimiser on the mean client update (Flower's FedAdam)",
    paper="Reddi et al., ICLR 2021",
)
