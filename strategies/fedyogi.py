"""FedYogi (Reddi et al., ICLR 2021): Yogi as the server optimiser, on Flower's own implementation.

    Δ̄_t = Σ_{i∈S} n_i w_{i,K} / Σ n_i − w^t
    m_t = β₁ m_{t−1} + (1 − β₁) Δ̄_t
    v_t = v_{t−1} − (1 − β₂) Δ̄_t² ⊙ sign(v_{t−1} − Δ̄_t²)      (element-wise, m_0 = v_0 = 0)
    w^{t+1} = w^t + η m_t / (√v_t + τ)

``class FedYogiStrategy(flwr FedYogi, FlowerOptAdapter)``: Flower's update on top of
``FedSuiteStrategy``'s validated mean; Flower's rule is the paper's (no bias correction), unchanged.
None of the four papers evaluates FedYogi, so the defaults are Flower's (η = 0.01, β₁ = 0.9, β₂ = 0.99,
τ = 1e-3), which are within Reddi et al.'s grids. State: m_t, v_t (``state_dict``).
"""

from flwr.serverapp.strategy import FedYogi as FlowerFedYogi
from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.params import Params
from fedsuite.registry import register_method
from strategies._baselines import FlowerOptAdapter, FlowerOptResult


class FedYogiParams(Params):
    server_lr: float = Field(0.01, gt=0, description="server learning rate η")
    beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay β₁")
    beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay β₂")
    tau: float = Field(1e-3, gt=0, description="adaptivity τ")


class FedYogiStrategy(FlowerOptResult, FlowerFedYogi, FlowerOptAdapter):
    """Flower's FedYogi on fedsuite's validated mean."""

    def __init__(self, setup) -> None:
        p = setup.cfg.method_params
        self._pending_setup = setup
        FlowerFedYogi.__init__(self, eta=p.server_lr, eta_l=setup.cfg.lr, beta_1=p.beta1, beta_2=p.beta2, tau=p.tau)


register_method(
    "fedyogi",
    strategy=FedYogiStrategy,
    client=FedAvgClient,
    params=FedYogiParams,
    summary="Yogi server optimiser on the mean client update (Flower's FedYogi)",
    paper="Reddi et al., ICLR 2021",
)
