"""FedProx's client rule (Li et al., MLSys 2020): local SGD on the proximal objective

    h_i(w) = ℓ(w; b) + (μ/2) ‖w − w_{i,0}‖²,   ‖·‖ over all trainable parameters (not buffers)

so each step is  w ← w − η (∇ℓ(w; b) + μ (w − w_{i,0}) + λ_wd w).  The anchor w_{i,0} is
``task.start_point`` (set by the loop after the start hooks): the received w^t, or the relaxed start
with ``--relaxed-init`` (as FedInit's code anchors its "+RI" methods). The term is part of the loss, so it is clipped
together with ∇ℓ. μ = 0 is FedAvg exactly.
"""

from __future__ import annotations

import torch

from fedsuite.method.training import ClientRule, LocalTask


class FedProxClient(ClientRule):
    """Local SGD with the proximal term (μ/2)‖w − w_{i,0}‖²."""

    def loss(self, task: LocalTask, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = super().loss(task, x, y)
        mu = task.method_params.mu
        anchor = task.start_point
        prox = sum(((p - anchor[n]) ** 2).sum() for n, p in task.named_params.items())
        return loss + 0.5 * mu * prox
