"""FedASAM's client rule (Caldarola et al. 2022): local Adaptive SAM (Kwon et al. 2021), a
FedMR baseline (ρ = 0.1, η = 0 from the FedMR authors' code; the paper does not state them).

    T = |w| + η on tensors named "*weight*", T = 1 on the others
    e = ρ T² g / (‖T g‖ + 1e-16);   g̃ = ∇ℓ(w + e; b)   (w restored)
    w ← w − η_l (g̃ + λ_wd w)   with the run's SGD momentum (``momentum``, fresh each round)

ρ = 0 gives e = 0 and the plain SGD step of FedAvg.
"""

from clients.sam import SamMomentumClient


class FedASAMClient(SamMomentumClient):
    """Two-pass ASAM step, no momentum mixing."""

    sam = True
    adaptive = True
