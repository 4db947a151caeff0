"""FedCM's client rule (Xu et al. 2021): client-level momentum toward the last global direction
(a baseline of FedMRUR and FedInit).

    u = α ∇ℓ(w; b) + (1 − α) m^t          (m^t from the server's "momentum" record; m^0 = 0, as FedInit's code)
    u ← u · min(1, C/‖u‖)                   (clip_norm C, 0 = off; FL-Simulator's 10)
    w ← w − η_l (u + λ_wd w)

α = 1 gives u = 1.0·g + 0.0·m = g exactly, i.e. FedAvg's client step.
"""

from clients.sam import SamMomentumClient


class FedCMClient(SamMomentumClient):
    """Local SGD on α g + (1−α) m^t (no SAM pass)."""

    uses_momentum = True
