"""FedNLR's neuron-wise learning rates as a plug-in for any client rule.

Wang et al., "FedNLR: Federated Learning with Neuron-wise Learning Rates", KDD 2024. Each round,
before the first local step, the client measures every neuron's mean activation on its own data
under the *received* model and gives neurons that are weak locally (likely serving absent classes)
small learning rates and strong ones large rates. Per weighted layer l (every Conv/Linear, the
classifier included, in forward order l = 1..L):

    h̄_{l,m} = (1/D_k) Σ_{x∈𝔻_k} h_{l,m}(x)                                                (14)
    μ_l     = μ_0 + a_1 · l/L + a_2 · log_10(M_l)                                       (17)
    T_l     = (max_m h̄_{l,m} − min_m h̄_{l,m}) / ln μ_l                                   (16)
    s_{l,m} = M_l · softmax(h̄_{l,·} / T_l)_m = M_l μ_l^{u_m} / Σ_i μ_l^{u_i},
              u_m = (h̄_{l,m} − min h̄_l) / (max h̄_l − min h̄_l)                          (15)
    η̂_{l,m} = η · s_{l,m}    (mean_m s = 1, max s / min s = μ_l)

and the rule's optimizer steps neuron m's weight row/filter and bias with η̂_{l,m} (Eq. 18).
The plug-in's parts: this module holds its parameters, the round's plan (:func:`make_plan`), the
client half (:class:`NeuronLRPlugin`) and the server half (:class:`NeuronLRDiagnostics`);
:mod:`fedsuite.method.plugins.neuron_lr_scales` the maths of Eqs. 14-17 (μ_l, T_l, s, the
activation statistics); :mod:`fedsuite.method.plugins.neuron_lr_optimizer` the optimizer wrapper
of Eq. 18 (:class:`NeuronLROptimizer`, with its meaning under momentum and weight decay). Choices
the paper leaves open, and how they are made:

* Eq. 15's printed denominator Σ_i q_{l,m} (which would make every rate η) is read as Σ_i q_{l,i}:
  scales have mean 1, as the paper's §7.3 says; the proof of Lemma 4, which normalises the rates to
  sum η, is not followed.
* A conv neuron is an output channel; its activation is averaged over (N, H, W) (shared
  filters allow no finer rate).
* Hidden layers: h = ReLU(layer output), read with a forward hook on the Conv/Linear and ReLU'd
  here (pre-pooling, independent of how the model applies its activation); the classifier (the
  last weighted layer in forward order) uses raw logits by default (it has no ReLU).
* Stats pass: a copy of the received model in eval mode, no_grad, the client's full local data in
  order, no augmentation, no use of the training RNG (the paper does not say), sample-weighted means.
* A bias shares its neuron's rate. Normalisation layers' per-channel γ, β inherit the scale
  of the conv channel feeding them (the most recent weighted layer in forward order with the same
  channel count), or 1 with ``norm_params_scale = "one"`` (the paper's VGG-9 has none). Other parameters: scale 1.
* Degenerate layers (max h̄ − min h̄ ≤ max(1e-12, 1e-8·max|h̄|), M_l = 1, or μ_l ≤ 1) get s ≡ 1
  (Eq. 16 would divide by zero).
* Depth term l/L by default; ``depth_mode = "one_over_L"`` reproduces the paper's literal final
  formula 1 + 1/L + log10 M_l, whose constant depth term contradicts Eq. 17's a_1·l/L.

Presets (the paper's §7.3; μ_0 is given only as the 1 of its final formula): ``paper_main`` (alias
``paper``) = (μ_0, a_1, a_2) = (1, 0.45, 0.3), the main tables' setting; ``paper_final`` = (1, 1, 1),
the paper's final recommendation; ``uniform`` = (1, 0, 0), i.e. μ_l = 1 and every scale exactly 1
(FedAvg bit for bit, with the stats pass still run). ``mu0``/``a1``/``a2`` override the preset's values; ``mu_override`` sets μ_l per layer;
``layers`` restricts NLR to some layers (Fig. 4 ablation). The plug-in keeps no client state.

Activity (``fedsuite.method.activity``, component :data:`SPREAD`): every sampled client reports the spread
of its round's scales over all N neurons of all weighted layers (s_1..s_N pooled, s̄ their mean),

    spread = std(s) / s̄ = √( (1/N) Σ_n (s_n − s̄)² ) / s̄        (coefficient of variation)

as ``neuron-lr-spread``. Why this measure: neuron n steps with η·s_n, so (s_n − s̄)/s̄ is how far
its rate is from the one common rate η·s̄, and the spread is the root mean square of that over the
neurons; it ignores a common factor (s → c·s changes the overall lr, which any method can do, not
the neuron-wise part), and it is 0 exactly when every neuron has the same rate (``uniform``, μ_l ≤
1, degenerate layers: then the plug-in changes nothing but, at most, the overall lr). Eq. 15 gives
every layer mean 1, so s̄ = 1 and there is no between-layer part: the spread is the RMS relative
deviation of the neurons' rates from η. Each neuron counts once, whatever its fan-in. Computed from
the scales the stats pass made anyway, with no random draw: training is unchanged by it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Iterable, Literal

import torch
from pydantic import Field
from torch import nn

from fedsuite.method.activity import Component, ratio
from fedsuite.method.params import Params
from fedsuite.method.plugins.base import ClientPlugin, ServerHooks
from fedsuite.method.plugins.neuron_lr_optimizer import NeuronLROptimizer
from fedsuite.method.plugins.neuron_lr_scales import (
    NeuronLayer, activation_stats, discover_layers, layer_mus, scale_factors, temperature,
)
from fedsuite.method.replies import metric_means
from fedsuite.method.rounds import RoundLog, ServerSetup
from fedsuite.method.training import SGD, LocalTask
from fedsuite.method.wire import ClientReply

#: (μ_0, a_1, a_2) of Eq. 17 per preset
PRESETS: dict[str, tuple[float, float, float]] = {
    "paper_main": (1.0, 0.45, 0.3),
    "paper": (1.0, 0.45, 0.3),
    "paper_final": (1.0, 1.0, 1.0),
    "uniform": (1.0, 0.0, 0.0),
}

#: neuron-wise learning rates as a distinguishing component (``fedsuite.method.activity``): the spread of
#: the scales (module docstring). Inert below 1e-3: the neurons' learning rates differ from one
#: common rate by less than a thousandth (root mean square).
SPREAD = Component(
    name="neuron_lr", measure="neuron-lr-spread", threshold=1e-3,
    meaning="std(s) / mean(s) of the neuron-wise learning-rate scales over all neurons; inert below 1e-3 (the "
            "neurons' rates differ from one common rate by less than a thousandth)")


class NeuronLRParams(Params):
    """Section ``[neuron_lr]`` (CLI ``--neuron-lr PRESET``)."""


    preset: Literal["paper_main", "paper", "paper_final", "uniform"] | None = Field(
        None, description="None = off; paper_main/paper (1, 0.45, 0.3), paper_final (1, 1, 1), uniform (all s = 1)"
    )
    mu0: float | None = Field(None, ge=0, description="μ_0 of Eq. 17 (default: the preset's)")
    a1: float | None = Field(None, ge=0, description="depth coefficient a_1 of Eq. 17 (default: the preset's)")
    a2: float | None = Field(None, ge=0, description="width coefficient a_2 of Eq. 17 (default: the preset's)")
    log_base: float = Field(10.0, gt=1, description="base of the log in Eq. 17")
    depth_mode: Literal["l_over_L", "one_over_L"] = Field(
        "l_over_L", description="depth term l/L (Eq. 17) or the literal 1/L",
        json_schema_extra={"paper": "\"one_over_L\" in the final formula of §7.3 (Eq. 17 has l/L)"})
    mu_override: list[float] | None = Field(None, description="μ_l per weighted layer (length L), replaces Eq. 17")
    layers: list[int] | None = Field(None, description="1-based layers that get neuron-wise rates; others s = 1")
    classifier_activation: Literal["logits", "relu", "softmax"] = Field("logits", description="classifier statistic")
    norm_params_scale: Literal["inherit", "one"] = Field("inherit", description="scale of norm layers' γ, β")
    stats_batch_size: int = Field(500, ge=1, description="batch size of the activation-statistics pass")
    diagnostics: bool = Field(True, description="report per-layer μ_l, T_l, min/max s as client metrics")

    def coefficients(self) -> tuple[float, float, float]:
        mu0, a1, a2 = PRESETS[self.preset or "uniform"]
        return (
            mu0 if self.mu0 is None else self.mu0,
            a1 if self.a1 is None else self.a1,
            a2 if self.a2 is None else self.a2,
        )


def scale_spread(scales: Iterable[torch.Tensor]) -> float:
    """spread = std(s) / mean(s) over every neuron of every layer pooled (population std, float64;
    the module's activity measure). 0.0 exactly when all scales are equal, and for no neurons."""
    pooled = [torch.as_tensor(s, dtype=torch.float64).flatten() for s in scales]
    s = torch.cat(pooled) if pooled else torch.zeros(0, dtype=torch.float64)
    if s.numel() == 0:
        return 0.0
    mean = s.mean()
    return ratio(float(((s - mean) ** 2).mean().sqrt()), float(mean))


# ------------------------------------------------------------------------------------------------
# the per-round plan and the plug-in
# ------------------------------------------------------------------------------------------------


@dataclass
class NeuronLRPlan:
    """What one round's stats pass produced (the plug-in's ``plan``)."""

    layers: list[NeuronLayer]
    hbar: list[torch.Tensor]
    mus: list[float]
    temperatures: list[float]
    scales: list[torch.Tensor]  # float64, per layer
    param_scales: dict[str, torch.Tensor] = field(default_factory=dict)  # param name -> broadcastable scale

    def metrics(self) -> dict[str, float]:
        """Diagnostics per layer l: μ_l, T_l (0 marks a uniform layer), min/max s."""
        out: dict[str, float] = {}
        for l, (mu, t, s) in enumerate(zip(self.mus, self.temperatures, self.scales), start=1):
            out[f"nlr-mu-l{l}"] = float(mu)
            out[f"nlr-T-l{l}"] = float(t) if math.isfinite(t) else 0.0
            out[f"nlr-smin-l{l}"] = float(s.min())
            out[f"nlr-smax-l{l}"] = float(s.max())
        return out


def make_plan(model: nn.Module, batches: Iterable[torch.Tensor], example: torch.Tensor,
              p: NeuronLRParams) -> NeuronLRPlan:
    """Layers, statistics, μ_l, T_l and the scale tensor of every covered parameter (by name)."""
    layers, inherit = discover_layers(model, example)
    hbar = activation_stats(model, layers, batches, p.classifier_activation)
    L = len(layers)
    if p.mu_override is not None:
        if len(p.mu_override) != L:
            raise ValueError(f"neuron_lr.mu_override has {len(p.mu_override)} values; the model has {L} weighted layers")
        mus = [float(m) for m in p.mu_override]
    else:
        mus = layer_mus([layer.size for layer in layers], *p.coefficients(), p.log_base, p.depth_mode)
    if p.layers is not None:
        bad = [l for l in p.layers if not 1 <= l <= L]
        if bad:
            raise ValueError(f"neuron_lr.layers: {bad} out of range 1..{L}")
        mus = [mu if l in p.layers else 1.0 for l, mu in enumerate(mus, start=1)]
    temps = [temperature(h, mu) for h, mu in zip(hbar, mus)]
    scales = [scale_factors(h, mu) for h, mu in zip(hbar, mus)]

    params = dict(model.named_parameters())
    by_layer = {layer.name: s for layer, s in zip(layers, scales)}
    if p.norm_params_scale == "inherit":
        by_layer.update({norm: by_layer[src] for norm, src in inherit.items()})
    param_scales: dict[str, torch.Tensor] = {}
    for module_name, s in by_layer.items():
        for leaf in ("weight", "bias"):
            name = f"{module_name}.{leaf}" if module_name else leaf
            if name in params:
                shape = (s.numel(),) + (1,) * (params[name].dim() - 1)
                param_scales[name] = s.to(torch.float32).reshape(shape)
    return NeuronLRPlan(layers, hbar, mus, temps, scales, param_scales)


class NeuronLRPlugin(ClientPlugin):
    """Neuron-wise learning rates (FedNLR) on top of any SGD-type client rule; see the module doc."""

    name = "neuron_lr"
    params = NeuronLRParams
    component = SPREAD
    #: this round's layers, statistics and scales, from ``before_start`` (None before it runs)
    plan: NeuronLRPlan | None = None

    @classmethod
    def enabled(cls, params: NeuronLRParams) -> bool:
        return params.preset is not None

    def before_start(self, task: LocalTask) -> None:
        """Eq. 14-17 on a copy of the received model w^t, before any local step (Algorithm 1)."""
        model = copy.deepcopy(task.model)
        model.load_state_dict(task.received)
        data, bs = task.data, self.p.stats_batch_size
        batches = (data.inputs(slice(i, i + bs)) for i in range(0, len(data), bs))
        plan = make_plan(model, batches, data.inputs(slice(0, 1)), self.p)
        plan.param_scales = {k: v.to(task.device) for k, v in plan.param_scales.items()}
        self.plan = plan
        task.metrics[SPREAD.measure] = scale_spread(plan.scales)
        if self.p.diagnostics:
            task.metrics.update(plan.metrics())

    def wrap_optimizer(self, task: LocalTask, opt: SGD) -> NeuronLROptimizer:
        """η̂ = η·s per neuron, fixed for the round (Eq. 18)."""
        named = dict(task.model.named_parameters())
        return NeuronLROptimizer(opt, {named[n]: s for n, s in self.plan.param_scales.items() if n in named})

    def lr_scales(self) -> dict[str, torch.Tensor]:
        """s per covered parameter (η̂ = η · s), fixed for the round."""
        return self.plan.param_scales if self.plan is not None else {}

    def server_hooks(self, setup: ServerSetup) -> "NeuronLRDiagnostics | None":
        """Server side: only diagnostics (the method's own aggregation is unchanged)."""
        return NeuronLRDiagnostics() if self.p.diagnostics else None


class NeuronLRDiagnostics(ServerHooks):
    """The server half: writes the example-weighted cohort means of the clients' ``nlr-*`` metrics
    (per-layer μ_l, T_l, min/max s; the paper's Fig. 3 plots T_l) into the round's metrics row."""

    name = "neuron_lr"

    def observe(self, server_round: int, replies: list[ClientReply], round_log: RoundLog) -> list[ClientReply]:
        if replies:
            round_log.add(metric_means(replies, lambda key: key.startswith("nlr-")))
        return replies
