"""MoFedSAM's client rule (Qu et al. 2022): FedCM's momentum mixing on top of SAM gradients
(FedMRUR's client step with γ = 0).

    e = ρ g / (‖g‖ + 1e-7);   g̃ = ∇ℓ(w + e; b);   u = α g̃ + (1 − α) m^t
    u ← u · min(1, C/‖u‖);     w ← w − η_l (u + λ_wd w)

ρ = 0 gives e = 0, so g̃ is the gradient at w itself and the rule equals FedCM bit for bit; α = 1
gives FedSAM.
"""

from clients.sam import SamMomentumClient


class MoFedSAMClient(SamMomentumClient):
    """Two-pass SAM step, then FedCM's momentum mixing."""

    sam = True
    uses_momentum = True
