"""FedNLR's per-neuron learning-rate scales: μ_l, T_l and s_{l,m} from the activation statistics
(Wang et al., "FedNLR: Federated Learning with Neuron-wise Learning Rates", KDD 2024, Eqs. 14-17).

Per weighted layer l (every Conv/Linear, the classifier included, in forward order l = 1..L):

    h̄_{l,m} = (1/D_k) Σ_{x∈𝔻_k} h_{l,m}(x)                                                (14)
    μ_l     = μ_0 + a_1 · l/L + a_2 · log_10(M_l)                                       (17)
    T_l     = (max_m h̄_{l,m} − min_m h̄_{l,m}) / ln μ_l                                   (16)
    s_{l,m} = M_l · softmax(h̄_{l,·} / T_l)_m = M_l μ_l^{u_m} / Σ_i μ_l^{u_i},
              u_m = (h̄_{l,m} − min h̄_l) / (max h̄_l − min h̄_l)                          (15)

Pure functions of a model and its data: no parameters, no state, no random draw. How the
plug-in applies them (which parameters, when, with which optimizer) is
:mod:`fedsuite.method.plugins.neuron_lr`; the paper's open choices are made there and here as
its module docstring lists (Eq. 15's denominator, conv neurons, the statistic, degenerate layers,
the depth term).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)


# ------------------------------------------------------------------------------------------------
# pure maths (Eqs. 15-17)
# ------------------------------------------------------------------------------------------------


def layer_mus(sizes: list[int], mu0: float, a1: float, a2: float, log_base: float = 10.0,
              depth_mode: str = "l_over_L") -> list[float]:
    """μ_l = μ_0 + a_1·d_l + a_2·log_base(M_l), d_l = l/L (or 1/L), l = 1..L (Eq. 17; 1/L as printed in the paper's final formula)."""
    L = len(sizes)
    out = []
    for l, m in enumerate(sizes, start=1):
        depth = l / L if depth_mode == "l_over_L" else 1.0 / L
        out.append(mu0 + a1 * depth + a2 * math.log(m) / math.log(log_base))
    return out


def _degenerate(h: torch.Tensor, mu: float) -> bool:
    if h.numel() <= 1 or not mu > 1 or not bool(torch.isfinite(h).all()):
        return True
    spread = float(h.max() - h.min())
    return spread <= max(1e-12, 1e-8 * float(h.abs().max()))


def temperature(hbar: torch.Tensor, mu: float) -> float:
    """T_l = (max h̄ − min h̄) / ln μ (Eq. 16); ``inf`` (a flat softmax) for a degenerate layer."""
    h = torch.as_tensor(hbar, dtype=torch.float64)
    if _degenerate(h, mu):
        return math.inf
    return float(h.max() - h.min()) / math.log(mu)


def scale_factors(hbar: torch.Tensor, mu: float) -> torch.Tensor:
    """s = M·μ^u / Σ μ^u with u = (h̄ − min)/(max − min) (Eq. 15 in a numerically stable closed form).

    float64; mean 1, max/min = μ, monotone in h̄, invariant to h̄ → a·h̄ + b (a > 0). Degenerate
    layers (constant or non-finite h̄, M = 1, μ ≤ 1) give s ≡ 1 exactly.
    """
    h = torch.as_tensor(hbar, dtype=torch.float64).flatten()
    if _degenerate(h, mu):
        return torch.ones_like(h)
    u = (h - h.min()) / (h.max() - h.min())
    w = torch.exp(u * math.log(mu))
    return h.numel() * w / w.sum()


# ------------------------------------------------------------------------------------------------
# neuron layers and activation statistics (Eq. 14)
# ------------------------------------------------------------------------------------------------


@dataclass
class NeuronLayer:
    name: str  # module name in the model
    size: int  # M_l: out_features / out_channels
    is_classifier: bool = False


def _size(module: nn.Module) -> int:
    return module.out_features if isinstance(module, nn.Linear) else module.out_channels


def _channels(module: nn.Module) -> int:
    return module.num_channels if isinstance(module, nn.GroupNorm) else module.num_features


def discover_layers(model: nn.Module, example: torch.Tensor) -> tuple[list[NeuronLayer], dict[str, str]]:
    """Weighted layers in forward-execution order (dummy forward on ``example``), the last one being
    the classifier, and ``{norm module name: weighted layer name}`` for norms that inherit a scale."""
    names = {m: n for n, m in model.named_modules()}
    order: list[nn.Module] = []
    inherit: dict[str, str] = {}
    last: list[nn.Module] = []

    def hook(module, _inp, _out):
        if isinstance(module, WEIGHTED):
            if module not in order:
                order.append(module)
            last[:] = [module]
        elif last and names[module] not in inherit and getattr(module, "weight", None) is not None:
            if _channels(module) == _size(last[0]):
                inherit[names[module]] = names[last[0]]

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, WEIGHTED + NORMS)]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(example)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    layers = [NeuronLayer(names[m], _size(m)) for m in order]
    if layers:
        layers[-1].is_classifier = True
    return layers, inherit


def _per_sample_mean(out: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """[N, M] per-sample activation per neuron: conv -> mean over spatial dims, linear -> over middle dims."""
    out = out.double()
    if isinstance(module, nn.Linear):
        return out.reshape(out.shape[0], -1, out.shape[-1]).mean(1)
    return out.flatten(2).mean(2)


@torch.no_grad()
def activation_stats(model: nn.Module, layers: list[NeuronLayer], batches: Iterable[torch.Tensor],
                     classifier_activation: str = "logits") -> list[torch.Tensor]:
    """h̄_l (float64, length M_l) per layer: Σ over samples of the per-sample mean activation / #samples.

    Hidden layers: ReLU(output); classifier: logits, ReLU(logits) or softmax. The model
    is put in eval mode for the pass and restored afterwards.
    """
    modules = dict(model.named_modules())
    sums = [torch.zeros(layer.size, dtype=torch.float64) for layer in layers]
    counts = [0] * len(layers)

    def make_hook(i: int, layer: NeuronLayer):
        def hook(module, _inp, out):
            if layer.is_classifier:
                act = {"logits": out, "relu": torch.relu(out), "softmax": torch.softmax(out.double(), -1)}[
                    classifier_activation
                ]
            else:
                act = torch.relu(out)
            per = _per_sample_mean(act, module)
            sums[i] += per.sum(0).cpu()
            counts[i] += per.shape[0]

        return hook

    handles = [modules[layer.name].register_forward_hook(make_hook(i, layer)) for i, layer in enumerate(layers)]
    was_training = model.training
    try:
        model.eval()
        for xb in batches:
            model(xb)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return [s / max(c, 1) for s, c in zip(sums, counts)]

