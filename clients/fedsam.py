"""FedSAM's client rule (Qu et al. 2022; a baseline of FedMRUR and FedInit): local SAM, FedAvg server.

    e = ρ g / (‖g‖ + 1e-7);   g̃ = ∇ℓ(w + e; b)   (w restored);   g̃ ← g̃ · min(1, C/‖g̃‖)
    w ← w − η_l (g̃ + λ_wd w)

ρ = 0 gives e = 0 and the plain SGD step of FedAvg.
"""

from clients.sam import SamMomentumClient


class FedSAMClient(SamMomentumClient):
    """Two-pass SAM step, no momentum mixing."""

    sam = True
