"""MoFedSAM (Qu et al., ICML 2022): FedCM with local SAM gradients (FedMRUR's base, Table 4).

    client:  e = ρ g/(‖g‖+1e-7), g̃ = ∇ℓ(w+e);  w ← w − η_l (α g̃ + (1−α) m^t + λ_wd w)
    server:  as FedCM (strategies/momentum.py): w^{t+1} = w^t + η_g Δ̄,  m^{t+1} = −Δ̄/(K̄ η_l^t)
"""

from pydantic import Field

from clients.mofedsam import MoFedSAMClient
from clients.sam import MOMENTUM_RECORDS
from fedsuite.method.registry import register_method
from strategies.momentum import MomentumParams, MomentumStrategy


class MoFedSAMParams(MomentumParams):
    """[mofedsam]: rho (0.5, the FedMRUR paper's §5.1) plus FedCM's keys."""

    rho: float = Field(0.5, ge=0, description="SAM perturbation radius ρ")


class MoFedSAMStrategy(MomentumStrategy):
    """FedCM's server rule."""

    sends_momentum = True


register_method(
    "mofedsam",
    strategy=MoFedSAMStrategy,
    client=MoFedSAMClient,
    params=MoFedSAMParams,
    summary="FedCM's client momentum on local SAM gradients",
    paper="Qu et al., ICML 2022",
    records=MOMENTUM_RECORDS,
)
