"""FedSAM (Qu et al., ICML 2022): local SAM, FedAvg-style server (a baseline of FedMRUR and FedInit).

    client:  e = ρ g/(‖g‖+1e-7), g̃ = ∇ℓ(w+e) (clipped to C);  w ← w − η_l (g̃ + λ_wd w)
    server:  w^{t+1} = w^t + η_g Δ̄  (uniform mean, FedMRUR's 1/|S_t|; ``weighting="examples"`` for FedAvg's)

ρ = 0.5 is the FedMRUR paper's shared value (§5.1); FedInit's paper uses 0.1 (Table 7).
"""

from pydantic import Field

from clients.fedsam import FedSAMClient
from fedsuite.method.registry import register_method
from strategies.momentum import FamilyParams, MomentumStrategy


class FedSAMParams(FamilyParams):
    """[fedsam]: rho, server_lr, normalize, weighting, clip_norm."""

    rho: float = Field(0.5, ge=0, description="SAM perturbation radius ρ (the FedMRUR paper's §5.1)",
                        json_schema_extra={"paper": "0.1 (the FedInit paper, Table 7)"})


class FedSAMStrategy(MomentumStrategy):
    """Mean of client updates (optionally normalised); no momentum."""


register_method(
    "fedsam",
    strategy=FedSAMStrategy,
    client=FedSAMClient,
    params=FedSAMParams,
    summary="Local sharpness-aware minimisation (SAM), averaged updates",
    paper="Qu et al., ICML 2022",
)
