"""FedYogi (Reddi et al., ICLR 2021): Yogi as the server optimiser on the mean client update.

    Δ̄_t = Σ_{i∈S} n_i w_{i,K} / Σ n_i − w^t          (the validated, data-size-weighted mean − w^t)
    m_t = β₁ m_{t−1} + (1 − β₁) Δ̄_t
    v_t = v_{t−1} − (1 − β₂) Δ̄_t² ⊙ sign(v_{t−1} − Δ̄_t²)      (element-wise, m_0 = v_0 = 0)
    w^{t+1} = w^t + η m_t / (√v_t + τ)

The step is ``fedsuite.method.server_opt.yogi_step`` (its docstring: arithmetic, integer buffers). The rule
is the paper's Algorithm 2 as written, which has no bias correction. None of the
four papers evaluates FedYogi, so the defaults are η = 0.01, β₁ = 0.9, β₂ = 0.99, τ = 1e-3, within
Reddi et al.'s grids. State: m_t, v_t (``state_dict``: ``m_t``, ``v_t``).
"""

from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.method.params import Params
from fedsuite.method.registry import register_method
from fedsuite.method.server_opt import yogi_step
from strategies.adaptive import AdaptiveStrategy


class FedYogiParams(Params):
    server_lr: float = Field(0.01, gt=0, description="server learning rate η")
    beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay β₁")
    beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay β₂")
    tau: float = Field(1e-3, gt=0, description="adaptivity τ")


class FedYogiStrategy(AdaptiveStrategy):
    """Yogi on the validated, data-size-weighted mean."""

    def step(self, server_round, w, mean):
        p = self.params
        return yogi_step(self.moments, w, mean, lr=p.server_lr, beta1=p.beta1, beta2=p.beta2, tau=p.tau)


register_method(
    "fedyogi",
    strategy=FedYogiStrategy,
    client=FedAvgClient,
    params=FedYogiParams,
    summary="Yogi server optimiser on the mean client update",
    paper="Reddi et al., ICLR 2021",
)
