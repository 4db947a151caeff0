"""FedLC's client rule: logit calibration by local label counts (Zhang et al., ICML 2022;
a FedNLR baseline, τ = 1 as in the FedNLR paper).

    ℓ(w; x, y) = CE(z(w; x) − τ · n_{i,·}^{−1/4}, y),   n_{i,c} ← max(n_{i,c}, 1e-8)

with n_{i,c} the client's count of class c, recomputed every round from its labels (no state). The
clamp of absent classes to 1e-8 is our choice, as common implementations do (the paper does not
say). With τ = 0 the shift is exactly 0.0 and training is FedAvg's bit for bit; with equal counts
the shift is the same for every class and CE is shift-invariant, so it equals FedAvg up to float
rounding. Evaluation uses the plain model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedsuite.method.training import ClientRule, LocalTask


def calibration_shift(counts: torch.Tensor, tau: float, min_count: float = 1e-8) -> torch.Tensor:
    """τ · max(n_c, 1e-8)^{−1/4}, shape [C]."""
    return tau * counts.to(torch.float64).clamp_min(min_count).pow(-0.25)


def calibrated_loss(logits: torch.Tensor, y: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """mean_b CE(z_b − shift, y_b)."""
    return F.cross_entropy(logits - shift.to(logits.dtype), y)


class FedLCClient(ClientRule):
    """Local SGD on the calibrated cross-entropy."""

    #: τ n_{i,·}^{−1/4}, from the local labels at the round's first batch (``start`` clears it)
    shift: torch.Tensor | None = None

    def start(self, task: LocalTask) -> None:
        self.shift = None

    def loss(self, task: LocalTask, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self.logits(task, x)
        if self.shift is None:
            counts = torch.bincount(task.data.y.to(torch.long), minlength=z.shape[1])
            self.shift = calibration_shift(counts, task.method_params.tau).to(z.device, z.dtype)
        return calibrated_loss(z, y, self.shift)
