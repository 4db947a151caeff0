"""FedASAM (Caldarola et al., ECCV 2022): local Adaptive SAM, data-size-weighted averaging
(a FedMR baseline; ρ = 0.1, η = 0 from the FedMR authors' code, which the paper does not state; no SWA).

    client:  T = |w| + η ("weight" tensors), e = ρ T² g/(‖T g‖+1e-16), g̃ = ∇ℓ(w+e);
             SGD(momentum, wd) step with g̃                          (clients/fedasam.py)
    server:  w^{t+1} = Σ n_i w_i / Σ n_i   (``weighting="examples"``, η_g = 1)
"""

from typing import Literal

from pydantic import Field

from clients.fedasam import FedASAMClient
from fedsuite.method.registry import register_method
from strategies.momentum import FamilyParams, MomentumStrategy


class FedASAMParams(FamilyParams):
    """[fedasam]: rho 0.1, eta 0.0, weighting "examples", clip_norm 0 (off), server_lr, normalize."""

    rho: float = Field(0.1, ge=0, description="ASAM perturbation radius ρ")
    eta: float = Field(0.0, ge=0, description="ASAM's η in T = |w| + η")
    weighting: Literal["uniform", "examples"] = Field("examples", description="client weights (FedASAM: n_i/Σn)")
    clip_norm: float = Field(0.0, ge=0, description="clip the local gradient to this L2 norm; 0 = off")


class FedASAMStrategy(MomentumStrategy):
    """Data-size-weighted model mean; no momentum."""


register_method(
    "fedasam",
    strategy=FedASAMStrategy,
    client=FedASAMClient,
    params=FedASAMParams,
    summary="Local adaptive SAM (ASAM), data-size-weighted averaging",
    paper="Caldarola et al., ECCV 2022",
)
