"""FedAdam (Reddi et al., ICLR 2021): Adam as the server optimiser on the mean client update.

    Δ̄_t = Σ_{i∈S} n_i w_{i,K} / Σ n_i − w^t          (the validated, data-size-weighted mean − w^t)
    m_t = β₁ m_{t−1} + (1 − β₁) Δ̄_t,   v_t = β₂ v_{t−1} + (1 − β₂) Δ̄_t²   (element-wise, m_0 = v_0 = 0)
    w^{t+1} = w^t + η_t m_t / (√v_t + τ)

The step is ``fedsuite.method.server_opt.adam_step`` (its docstring: arithmetic, integer buffers).
η_t = η by default (``bias_correction=False``): FedInit's reference code (FL-Simulator; the paper
does not say) applies **no bias correction**, nor does Reddi et al.'s Algorithm 2, so the defaults
reproduce the FedAdam baseline the FedInit paper compares with. ``bias_correction=True`` gives
Adam's η_t = η √(1 − β₂^t) / (1 − β₁^t), t the global round (also right after a resume).
Defaults: η_g = 0.1 (the FedInit paper's Table 7 and main text), β₁ = 0.9, β₂ = 0.99, τ = ε = 0.01
(FL-Simulator's; not in the paper).
State: m_t, v_t (``state_dict``: ``m_t``, ``v_t``).
"""

from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.method.params import Params
from fedsuite.method.registry import register_method
from fedsuite.method.server_opt import adam_lr, adam_step
from strategies.adaptive import AdaptiveStrategy


class FedAdamParams(Params):
    server_lr: float = Field(0.1, gt=0, description="server learning rate η_g")
    beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay β₁")
    beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay β₂")
    tau: float = Field(0.01, gt=0, description="adaptivity ε (tau in Reddi et al.)")
    bias_correction: bool = Field(False, description="Adam bias correction (off in FedInit's code)")


class FedAdamStrategy(AdaptiveStrategy):
    """Adam on the validated, data-size-weighted mean; bias correction per ``bias_correction``."""

    def effective_lr(self, server_round: int):
        """η_t applied in global round ``server_round`` (1-based)."""
        p = self.params
        return adam_lr(p.server_lr, p.beta1, p.beta2, server_round, bias_correction=p.bias_correction)

    def step(self, server_round, w, mean):
        p = self.params
        return adam_step(self.moments, w, mean, lr=self.effective_lr(server_round), beta1=p.beta1, beta2=p.beta2,
                         tau=p.tau)


register_method(
    "fedadam",
    strategy=FedAdamStrategy,
    client=FedAvgClient,
    params=FedAdamParams,
    summary="Adam server optimiser on the mean client update",
    paper="Reddi et al., ICLR 2021",
)
