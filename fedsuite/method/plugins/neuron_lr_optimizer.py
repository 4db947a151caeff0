"""Neuron-wise learning rates for any SGD-type optimizer (FedNLR Eq. 18).

FedNLR's local step gives every output neuron m of layer l its own learning rate
η̂_{l,m} = η · s_{l,m} (Eq. 15, :mod:`fedsuite.method.plugins.neuron_lr_scales`):

    w_{l,m} ← w_{l,m} − η̂_{l,m} · ∇_{w_{l,m}} f_k(w)                                    (18)

``w_{l,m}`` is row/filter m of the weight plus bias b_m (a bias shares its neuron's rate), so a scale tensor
``s`` of shape ``[M, 1, ..., 1]`` (weights) or ``[M]`` (biases) broadcasts over the output
dimension. The paper used plain SGD; with momentum μ, dampening τ and weight decay λ the
plug-in scales the *whole* update direction (our extension):

    d_t = g_t + λ w_t                     (weight decay, proximal and correction terms included)
    b_t = μ b_{t−1} + (1 − τ) d_t         (b_1 = d_1; torch.optim.SGD's momentum buffer)
    w_{t+1} = w_t − η · s ⊙ b_t           (nesterov: s ⊙ (d_t + μ b_t))

Because the scales are fixed for the whole round (computed once from the received model)
and the buffer recursion is linear, this is exactly what the inner SGD does when it is fed the
pre-scaled direction s ⊙ (g_t + λ w_t) with its own weight decay switched off for that step:
the buffer then holds s ⊙ b_t. :class:`NeuronLROptimizer` does precisely that, so it is an SGD
whose learning rate is the tensor η·s per parameter, while momentum state, parameter groups and
``zero_grad`` stay the inner optimizer's own.

Composition (the paper reports FedNLR inside FedDyn's local solver; the rest follows): whatever the client rule put into ``p.grad`` before
``opt.step()`` — a proximal/FedDyn term, SCAFFOLD's ``− c_i + c`` correction, a SAM/ASAM
gradient taken at a perturbed point by the rule's own two-pass ``step`` — is multiplied by s,
and weight decay with it. Gradient clipping (done by the rule before ``step``) acts on the
unscaled gradient.

Exactness: the only extra float operations are ``g.add(p, alpha=λ)`` (the very op
``torch.optim.SGD`` uses for weight decay) and ``× s``. With s ≡ 1 the product is exact in
IEEE arithmetic, so the result equals the inner optimizer bit for bit (tests/test_fednlr.py).

Only optimizers whose update is linear in the gradient can take a per-neuron learning rate this
way: fedsuite's ``SGD``, ``torch.optim.SGD`` (and subclasses), or any optimizer class that sets
``neuron_lr_compatible = True``. Adaptive optimizers (Adam: the update is invariant to a
per-element gradient scale) are refused with a clear error.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class NeuronLROptimizer:
    """Wrap an SGD-type ``inner`` optimizer so that parameter ``p`` is stepped with lr ``lr · scales[p]``.

    ``scales`` maps parameters to tensors broadcastable to their shape (``[M, 1, ...]`` or ``[M]``);
    parameters without an entry keep scale 1 (their gradient is passed through untouched, apart
    from folding in weight decay, which gives the same numbers as the inner optimizer).
    """

    def __init__(self, inner: Any, scales: dict[torch.Tensor, torch.Tensor]) -> None:
        if not (isinstance(inner, torch.optim.SGD) or getattr(inner, "neuron_lr_compatible", False)):
            raise TypeError(
                f"neuron_lr needs an SGD-type optimizer (update linear in the gradient); the client rule "
                f"made {type(inner).__name__}. Set `neuron_lr_compatible = True` on the optimizer class "
                "if its update is η·(linear function of the gradient)."
            )
        for group in inner.param_groups:
            if group.get("maximize", False):
                raise ValueError("neuron_lr does not support maximize=True optimizers")
        self.inner = inner
        self._scales: dict[torch.Tensor, torch.Tensor] = {}
        for group in inner.param_groups:
            for p in group["params"]:
                s = scales.get(p)
                if s is not None:
                    s = s.detach().to(device=p.device, dtype=p.dtype)
                    torch.broadcast_shapes(s.shape, p.shape)  # fails loudly on a wrong layout
                    self._scales[p] = s

    # --- the optimizer interface the loop and rules use -----------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:  # anything else (e.g. SAM helpers) is the inner's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def scale_of(self, p: torch.Tensor) -> torch.Tensor | None:
        """s for parameter ``p`` (None = 1)."""
        return self._scales.get(p)

    def lr_tensor(self, p: torch.Tensor) -> torch.Tensor:
        """η̂ for parameter ``p``: the group's lr times its scale, broadcastable to ``p``."""
        lr = next(g["lr"] for g in self.param_groups if any(q is p for q in g["params"]))
        s = self._scales.get(p)
        return torch.as_tensor(lr, dtype=p.dtype, device=p.device) if s is None else lr * s

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step: d = s ⊙ (g + λ w) into ``p.grad``, the inner step with λ = 0, then restore grads."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        originals: list[tuple[torch.Tensor, torch.Tensor]] = []
        saved_wd: list[tuple[dict[str, Any], Any]] = []
        try:
            with torch.no_grad():
                for group in self.param_groups:
                    wd = group.get("weight_decay", 0.0)
                    for p in group["params"]:
                        g = p.grad
                        if g is None:
                            continue
                        d = g.add(p, alpha=wd) if wd != 0 else g  # torch.optim.SGD's own weight-decay op
                        s = self._scales.get(p)
                        if s is not None:
                            d = d.mul(s)
                        if d is not g:
                            originals.append((p, g))
                            p.grad = d
                    if wd != 0:
                        saved_wd.append((group, wd))
                        group["weight_decay"] = 0.0
            self.inner.step()
        finally:
            for group, wd in saved_wd:
                group["weight_decay"] = wd
            for p, g in originals:
                p.grad = g
        return loss


