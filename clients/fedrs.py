"""FedRS's client rule: restricted softmax (Li & Zhan, KDD 2021; a FedNLR baseline, α = 0.5 as in the FedNLR paper).

Client i with local label counts n_{i,c} trains on restricted logits

    z̃_c = s_c · z_c,   s_c = 1 if n_{i,c} > 0 else α          (scaling="hard", the paper's rule)
    s_c = α + (1 − α) · n_{i,c} / max_c' n_{i,c'}               (scaling="proportional", FedRepo code variant)

and minimises CE(z̃, y). z_c = w_cᵀh + b_c is the full logit of the model's ``head``; the rule is stated
on logits, so a head bias is scaled with the weight term. The counts are recomputed from the local
labels every round (FedRS keeps no client state). Evaluation uses the plain model.
With α = 1 every s_c is exactly 1.0, so training is FedAvg's bit for bit.
"""

from __future__ import annotations

import torch

from fedsuite.method.training import ClientRule, LocalTask


def restriction_scale(counts: torch.Tensor, alpha: float, scaling: str = "hard") -> torch.Tensor:
    """The per-class factor s_c of the module docstring, shape [C]."""
    counts = counts.to(torch.float32)
    if scaling == "hard":
        return torch.where(counts > 0, torch.ones_like(counts), torch.full_like(counts, alpha))
    if scaling == "proportional":
        return alpha + (1.0 - alpha) * counts / counts.max().clamp_min(1.0)
    raise ValueError(f"unknown FedRS scaling {scaling!r}")


class FedRSClient(ClientRule):
    """Local SGD on CE(s ⊙ z, y) (restricted softmax)."""

    #: s per class, from the local labels at the round's first batch (``start`` clears it)
    scale: torch.Tensor | None = None

    def start(self, task: LocalTask) -> None:
        self.scale = None

    def logits(self, task: LocalTask, x: torch.Tensor) -> torch.Tensor:
        z = task.model(x)
        if self.scale is None:  # counts from the local labels, once per round
            counts = torch.bincount(task.data.y.to(torch.long), minlength=z.shape[1])
            p = task.method_params
            self.scale = restriction_scale(counts, p.alpha, p.scaling).to(z.device, z.dtype)
        return z * self.scale
