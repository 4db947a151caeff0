"""Shared local-step pieces of the SAM / client-momentum family (FedSAM, FedASAM, FedCM, MoFedSAM,
FedMRUR), written once and reused by every rule of the family.

Per mini-batch b, with g = ∇F(w; b) the gradient of the rule's objective (no weight decay):

    SAM  (Foret et al.):   e = ρ · g / (‖g‖₂ + 1e-7)
    ASAM (Kwon et al.):    e = ρ · T² g / (‖T g‖₂ + 1e-16),
         T = |w| + η on tensors whose name contains "weight", T = 1 on the others (ASAM's code)
    g̃ = ∇F(w + e; b)                 (same batch; parameters restored to w bit for bit afterwards)
    u  = α · g̃ + (1 − α) · m^t       (FedCM / MoFedSAM mixing, FedMRUR's Alg. 1 line 10;
                                      m^t absent ⇔ m^t = 0, which gives u = α · g̃)
    u  ← u · min(1, C / ‖u‖)          (optional, FL-Simulator's; C = 0 switches it off)
    w  ← w − η_l (u + λ_wd w)         (torch SGD: weight decay added in the step, not scaled by α)

‖·‖ is one L2 norm over all trainable tensors jointly (FedMRUR treats Δ as one vector). ρ = 0 gives
e = 0 exactly, so the second pass evaluates the gradient at w itself; α = 1 gives u = 1.0·g̃ + 0.0·m = g̃ exactly in IEEE
arithmetic. Those are what make MoFedSAM(ρ=0) = FedCM and FedCM(α=1) = FedAvg bit for bit.
"""

from __future__ import annotations

from typing import Callable

import torch

from fedsuite.method.arrays import tensor_norm
from fedsuite.method.training import SGD, ClientRule, LocalTask, clip_grad
from fedsuite.method.wire import ARRAYS_KIND, MOMENTUM, NUM_STEPS_RECORD, TRAINABLE_LAYOUT, Record, Records

#: the records of the family's methods with client momentum (FedCM, MoFedSAM, FedMRUR; ``fedsuite.method.wire.Records``):
#: m^t over the trainable parameters from round 2 on (m^0 = 0 is not sent: optional), and in every
#: reply the local steps K_i, from which the server builds m^{t+1} (strategies/momentum.py)
MOMENTUM_RECORDS = Records(message=(Record(MOMENTUM, ARRAYS_KIND, TRAINABLE_LAYOUT, optional=True),),
                           reply=(NUM_STEPS_RECORD,))



# ------------------------------------------------------------------------------------------------
# pure helpers
# ------------------------------------------------------------------------------------------------


def sam_perturbation(grads: list[torch.Tensor], rho: float, eps: float = 1e-7) -> list[torch.Tensor]:
    """SAM's ascent step e = ρ g / (‖g‖ + eps), ‖·‖ over all tensors jointly."""
    scale = rho / (tensor_norm(grads) + eps)
    return [g * scale for g in grads]


def asam_perturbation(
    names: list[str], params: list[torch.Tensor], grads: list[torch.Tensor], rho: float, eta: float,
    eps: float = 1e-16,
) -> list[torch.Tensor]:
    """Adaptive SAM's ascent step e = ρ T² g / (‖T g‖ + eps) with T = |w| + η on "weight" tensors and
    T = 1 elsewhere (Kwon et al. 2021, as in their code)."""
    scaled = [(p.detach().abs() + eta) * g if "weight" in n else g for n, p, g in zip(names, params, grads)]
    scale = rho / (tensor_norm(scaled) + eps)
    return [
        (p.detach().abs() + eta) * tg * scale if "weight" in n else tg * scale
        for n, p, tg in zip(names, params, scaled)
    ]


@torch.no_grad()
def mix_momentum(grads: list[torch.Tensor], momentum: list[torch.Tensor | None] | None, alpha: float) -> None:
    """In place: g ← α g + (1 − α) m (m = 0 where absent), FedCM's client step."""
    for i, g in enumerate(grads):
        g.mul_(alpha)
        m = None if momentum is None else momentum[i]
        if m is not None:
            g.add_(m, alpha=1.0 - alpha)


# ------------------------------------------------------------------------------------------------
# the family's client rule
# ------------------------------------------------------------------------------------------------


class SamMomentumClient(ClientRule):
    """Local SGD with an optional SAM/ASAM second pass and optional client momentum (see module).

    The hyperparameters are read from the run's method section (``task.method_params``, typed):
    ``rho`` (read only when ``sam``; 0 gives e = 0), ``alpha`` (only when ``uses_momentum``; 1: no
    mixing), ``clip_norm`` (every family member; 0: off), ``eta`` (only when ``adaptive``). A key the
    method's section lacks is an AttributeError, never a silent default. Subclasses fix what their method does not have via class attributes and
    add loss terms via ``loss`` / ``prepare_batch``.
    """

    #: whether the rule takes SAM's second gradient pass at w + e
    sam: bool = False
    #: use ASAM's adaptive perturbation instead of SAM's
    adaptive: bool = False
    #: whether the rule mixes in the server's momentum direction (FedCM family)
    uses_momentum: bool = False

    # --- per-round state (set by ``start`` and the steps) ---------------------------------------
    #: the trainable parameters' names, in ``task.params`` order (ASAM's "weight" test)
    param_names: list[str]
    #: m^t per trainable parameter (None where the server sent none), or None without momentum
    momentum: list[torch.Tensor | None] | None = None
    #: which SAM pass the loss is being taken in: 1 at w, 2 at w + e (FedMRUR logs pass 1 only)
    sam_pass: int = 1
    #: e of the latest SAM step
    perturbation: list[torch.Tensor] | None = None

    # --- hooks --------------------------------------------------------------------------------
    def start(self, task: LocalTask) -> None:
        named = list(task.named_params.items())
        self.param_names = [n for n, _ in named]
        momentum = task.extras[MOMENTUM] if self.uses_momentum and MOMENTUM in task.extras else None
        self.momentum = None if momentum is None else [
            momentum[n].to(device=p.device, dtype=p.dtype) if n in momentum else None for n, p in named
        ]
        self.sam_pass, self.perturbation = 1, None

    def prepare_batch(self, task: LocalTask, x: torch.Tensor, y: torch.Tensor) -> None:
        """Called once per mini-batch before both SAM passes (FedMRUR computes ẑ here)."""

    def step(self, task: LocalTask, opt: SGD, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = task.params
        self.prepare_batch(task, x, y)
        opt.zero_grad(set_to_none=True)
        loss = self.loss(task, x, y)
        loss.backward()
        if self.sam:  # always two passes, also at ρ = 0 (then e = 0 and w + e = w exactly)
            self.sam_second_pass(task, params, task.method_params.rho, lambda: self.loss(task, x, y))
        self.adjust_gradient(task)
        clip_norm = task.method_params.clip_norm
        clip_grad(params, clip_norm if clip_norm > 0 else None)
        clip_grad(params, task.cfg.grad_clip)
        opt.step()
        return loss.detach()

    def sam_second_pass(
        self, task: LocalTask, params: list[torch.nn.Parameter], rho: float, closure: Callable[[], torch.Tensor]
    ) -> None:
        """Replace ``p.grad`` by the gradient at w + e (e from SAM or ASAM); restore w exactly."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if self.adaptive:
            e = asam_perturbation(self.param_names, params, grads, rho, task.method_params.eta)
        else:
            e = sam_perturbation(grads, rho)
        saved = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, ei in zip(params, e):
                p.add_(ei)
        for p in params:
            p.grad = None
        self.sam_pass = 2
        closure().backward()
        self.sam_pass = 1
        with torch.no_grad():
            for p, w in zip(params, saved):
                p.copy_(w)
        self.perturbation = e

    def adjust_gradient(self, task: LocalTask) -> None:
        if self.uses_momentum:
            params = task.params
            momentum = self.momentum or [None] * len(params)
            # a parameter without a data gradient still follows m (u = (1−α)m); without m it is left alone
            grads = [p.grad if p.grad is not None or m is None else torch.zeros_like(p) for p, m in zip(params, momentum)]
            live = [i for i, g in enumerate(grads) if g is not None]
            mix_momentum([grads[i] for i in live], [momentum[i] for i in live], task.method_params.alpha)
            for i in live:
                params[i].grad = grads[i]
