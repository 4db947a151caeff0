"""FedNLR: neuron-wise learning rates (plug-in ``neuron_lr``) and the method ``fednlr``.

Spec fednlr.md §8. Order: pure maths (Eq. 15-17), activation statistics (Eq. 14), the per-neuron-lr
optimizer (Eq. 18), the plug-in at hook level via ``make_task`` (equivalences with FedAvg, every
registered method), and two real simulations (three configs, one shared FedAvg run).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from clients.fedavg import FedAvgClient
import fedsuite.method.plugins.neuron_lr
from fedsuite.method.plugins.neuron_lr import (
    PRESETS,
    SPREAD,
    NeuronLRParams,
    NeuronLRPlan,
    NeuronLRPlugin,
    make_plan,
    scale_spread,
)
from fedsuite.method.plugins.neuron_lr_optimizer import NeuronLROptimizer
from fedsuite.method.plugins.neuron_lr_scales import (
    activation_stats,
    discover_layers,
    layer_mus,
    scale_factors,
    temperature,
)
from fedsuite.method import registry
from fedsuite.models import build_model, count_parameters
from fedsuite.method.plugins import active_plugins
from fedsuite.method.training import run_local_training
from tests.conftest import FAST, assert_same_arrays, make_strategy, make_task


#: the methods' maths, not how messages travel: the in-process engine (``simulate``, tests/conftest.py)
pytestmark = pytest.mark.inprocess

# ------------------------------------------------------------------------------------------------
# Eq. 15-17: scale factors, temperature, μ_l
# ------------------------------------------------------------------------------------------------


def test_worked_example_of_spec():
    """§2.5 / §8.3: h̄ = [0, 1, 2, 4], μ = 3 → T = 4/ln 3, s = [0.567527, 0.746907, 0.982985, 1.702581]."""
    h = torch.tensor([0.0, 1.0, 2.0, 4.0])
    assert temperature(h, 3.0) == pytest.approx(3.640957, abs=1e-6)
    s = scale_factors(h, 3.0)
    np.testing.assert_allclose(s.numpy(), [0.567527, 0.746907, 0.982985, 1.702581], atol=1e-6)
    assert float(s.mean()) == pytest.approx(1.0, abs=1e-12)
    assert float(s.max() / s.min()) == pytest.approx(3.0, rel=1e-12)


@pytest.mark.parametrize("M", [2, 3, 10, 64, 512])
@pytest.mark.parametrize("mu", [1.01, 1.75, 3.0, 10.0])
def test_scale_invariants(M, mu):
    """§8.1, 8.2, 8.4, 8.5: mean 1, max/min = μ, order of h̄ kept, softmax form, affine invariance, bounds."""
    gen = torch.Generator().manual_seed(M * 1000 + int(mu * 100))
    h = torch.rand(M, generator=gen, dtype=torch.float64) * 5 - 1
    s = scale_factors(h, mu)
    assert torch.isfinite(s).all() and (s > 0).all()
    assert float(s.mean()) == pytest.approx(1.0, abs=1e-6)
    assert float(s.max() / s.min()) == pytest.approx(mu, rel=1e-6)
    order = torch.argsort(h)
    assert (torch.diff(s[order]) >= 0).all()
    # closed form = M · softmax(h̄ / T), T from Eq. 16
    T = temperature(h, mu)
    torch.testing.assert_close(s, M * torch.softmax(h / T, 0), rtol=1e-10, atol=1e-12)
    # affine invariance (hence spatial sum and spatial mean give the same scales)
    torch.testing.assert_close(scale_factors(3.7 * h - 11.0, mu), s, rtol=1e-10, atol=1e-12)
    # Lemma 4 bounds for the mean-1 normalisation (§7.2)
    lo, hi = M / (mu * (M - 1) + 1), M * mu / (mu + M - 1)
    assert float(s.min()) >= lo - 1e-12 and float(s.max()) <= hi + 1e-12


def test_bounds_attained_by_two_valued_extremes():
    M, mu = 7, 2.5
    one_high = torch.tensor([0.0] * (M - 1) + [1.0])
    one_low = torch.tensor([1.0] * (M - 1) + [0.0])
    assert float(scale_factors(one_high, mu).max()) == pytest.approx(M * mu / (mu + M - 1), rel=1e-12)
    assert float(scale_factors(one_low, mu).min()) == pytest.approx(M / (mu * (M - 1) + 1), rel=1e-12)


@pytest.mark.parametrize(
    "h, mu",
    [([2.0, 2.0, 2.0], 3.0), ([0.0, 0.0, 0.0, 0.0], 3.0), ([0.0, 1.0, 5.0], 1.0), ([0.0, 1.0, 5.0], 0.5),
     ([4.2], 3.0), ([1.0, float("nan"), 2.0], 3.0), ([1.0, 1.0 + 1e-13], 3.0)],
)
def test_degenerate_layers_are_uniform(h, mu):
    """§8.6 / §7.10: constant or dead layers, μ ≤ 1, M = 1, non-finite stats → s ≡ 1 exactly, no NaN."""
    s = scale_factors(torch.tensor(h), mu)
    assert torch.equal(s, torch.ones(len(h), dtype=torch.float64))
    assert temperature(torch.tensor(h), mu) == math.inf


VGG9_M = [32, 64, 128, 128, 256, 256, 512, 512]


@pytest.mark.parametrize(
    "coef, mode, C, expected",
    [
        (PRESETS["paper_main"], "l_over_L", 10, [1.502, 1.642, 1.782, 1.832, 1.972, 2.022, 2.163, 2.213, 1.750]),
        (PRESETS["paper_main"], "l_over_L", 100, [1.502, 1.642, 1.782, 1.832, 1.972, 2.022, 2.163, 2.213, 2.050]),
        (PRESETS["paper_final"], "l_over_L", 10, [2.616, 3.028, 3.441, 3.552, 3.964, 4.075, 4.487, 4.598, 3.000]),
        (PRESETS["paper_final"], "l_over_L", 100, [2.616, 3.028, 3.441, 3.552, 3.964, 4.075, 4.487, 4.598, 4.000]),
        (PRESETS["paper_final"], "one_over_L", 10, [2.616, 2.917, 3.218, 3.218, 3.519, 3.519, 3.820, 3.820, 2.111]),
        (PRESETS["paper_final"], "one_over_L", 100, [2.616, 2.917, 3.218, 3.218, 3.519, 3.519, 3.820, 3.820, 3.111]),
    ],
)
def test_mu_formula_vgg9_table(coef, mode, C, expected):
    """§8.7: the μ_l table of spec §2.4 (Eq. 17, log10) for both presets and the literal 1/L form."""
    mus = layer_mus(VGG9_M + [C], *coef, log_base=10.0, depth_mode=mode)
    np.testing.assert_allclose(mus, expected, atol=6e-4)


def test_uniform_preset_gives_mu_one():
    assert layer_mus([32, 64, 10], *PRESETS["uniform"]) == [1.0, 1.0, 1.0]
    assert PRESETS["paper"] == PRESETS["paper_main"] == (1.0, 0.45, 0.3)


def test_vgg9_matches_spec_and_layer_order():
    """§4 / §8.17: VGG-9 has 3,491,530 (C=10) / 3,537,700 (C=100) parameters; the discovered neuron
    layers are conv1..conv6, fc1, fc2, head in forward order, M = [32, ..., 512, C], L = 9."""
    model = build_model("vgg9", 10, (3, 32, 32))
    assert count_parameters(model) == 3_491_530
    assert count_parameters(build_model("vgg9", 100, (3, 32, 32))) == 3_537_700
    layers, inherit = discover_layers(model, torch.zeros(1, 3, 32, 32))
    assert [layer.size for layer in layers] == VGG9_M + [10]
    kinds = [type(dict(model.named_modules())[layer.name]) for layer in layers]
    assert kinds == [nn.Conv2d] * 6 + [nn.Linear] * 3
    assert layers[-1].name == "head" and layers[-1].is_classifier and not any(l.is_classifier for l in layers[:-1])
    assert inherit == {}  # no normalisation layers
    assert model.training  # discovery restores the mode


# ------------------------------------------------------------------------------------------------
# Eq. 14: activation statistics
# ------------------------------------------------------------------------------------------------


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 3)
        self.act = nn.ReLU()
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.act(self.fc1(x)))


def _hand_mlp() -> TinyMLP:
    m = TinyMLP()
    with torch.no_grad():
        m.fc1.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
        m.fc1.bias.copy_(torch.tensor([0.0, -1.0, 0.5]))
        m.head.weight.copy_(torch.tensor([[1.0, 1.0, 0.0], [0.0, -1.0, 2.0]]))
        m.head.bias.copy_(torch.tensor([0.5, 0.0]))
    return m


def test_activation_stats_hand_computed_mlp():
    """§8.8: h̄ = mean ReLU(Wx + b) for hidden layers, mean raw logits for the classifier; batch size
    does not matter (sample-weighted)."""
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.0], [3.0, 1.0]])
    # fc1 pre-activations: [1,1,-0.5], [-1,-1,-0.5], [3,0,2.5]; ReLU: [1,1,0], [0,0,0], [3,0,2.5]
    hidden = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [3.0, 0.0, 2.5]])
    logits = hidden @ torch.tensor([[1.0, 1.0, 0.0], [0.0, -1.0, 2.0]]).T + torch.tensor([0.5, 0.0])
    model = _hand_mlp()
    layers, _ = discover_layers(model, x[:1])
    assert [(l.name, l.size, l.is_classifier) for l in layers] == [("fc1", 3, False), ("head", 2, True)]
    full = activation_stats(model, layers, [x])
    torch.testing.assert_close(full[0], hidden.mean(0).double())
    torch.testing.assert_close(full[1], logits.mean(0).double())
    one_by_one = activation_stats(model, layers, [x[i : i + 1] for i in range(3)])
    uneven = activation_stats(model, layers, [x[:2], x[2:]])
    for a, b, c in zip(full, one_by_one, uneven):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)
    relu_cls = activation_stats(model, layers, [x], classifier_activation="relu")[1]
    torch.testing.assert_close(relu_cls, logits.relu().mean(0).double())
    soft_cls = activation_stats(model, layers, [x], classifier_activation="softmax")[1]
    torch.testing.assert_close(soft_cls, torch.softmax(logits.double(), 1).mean(0))


def test_activation_stats_conv_is_per_channel_mean_over_n_h_w():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 5))
    x = torch.randn(6, 2, 6, 6)
    layers, _ = discover_layers(model, x[:1])
    assert [l.name for l in layers] == ["0", "4"]
    hbar = activation_stats(model, layers, [x[:4], x[4:]])
    expected = torch.relu(model[0](x)).double().mean(dim=(0, 2, 3))  # pre-pooling, post-ReLU
    torch.testing.assert_close(hbar[0], expected, rtol=1e-10, atol=1e-10)


def test_stats_are_label_free_and_use_the_received_model_without_touching_training_rng():
    """§8.9, §8.14, §7.8: corrupting labels leaves the scales unchanged; the pass uses w^t (not the
    current model), does not consume the training generator, and leaves the model untouched."""
    task, _ = make_task({"neuron_lr.preset": "paper_main"})
    plugin = NeuronLRPlugin(NeuronLRParams(preset="paper_main"))
    gen_state = task.generator.get_state().clone()
    before = copy.deepcopy(task.model.state_dict())
    with torch.no_grad():  # the model drifted away from w^t: stats must still be of w^t
        for p in task.model.parameters():
            p.add_(0.3)
    drifted = copy.deepcopy(task.model.state_dict())
    plugin.before_start(task)
    plan = plugin.plan
    assert torch.equal(task.generator.get_state(), gen_state)
    assert all(torch.equal(drifted[k], v) for k, v in task.model.state_dict().items())
    assert task.model.training

    task2, _ = make_task({"neuron_lr.preset": "paper_main"})
    task2.data.y = task2.data.y[torch.randperm(len(task2.data.y))].flip(0) % 3
    assert all(torch.equal(before[k], v) for k, v in task2.received.items())
    plugin.before_start(task2)
    for a, b in zip(plan.scales, plugin.plan.scales):
        assert torch.equal(a, b)
    # statelessness: the same inputs give the same scales, no client state is written
    plugin.before_start(task2)
    assert all(torch.equal(a, b) for a, b in zip(plan.scales, plugin.plan.scales))
    assert not any(task2.state.folder.rglob("*"))


# ------------------------------------------------------------------------------------------------
# Eq. 18: the per-neuron-learning-rate optimizer
# ------------------------------------------------------------------------------------------------


def _set_grads(module: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def test_linear_step_scales_each_row_and_bias():
    """§8.11: W_new[m] = W[m] − η s[m] G[m], b_new[m] = b[m] − η s[m] g_b[m]; with weight decay the
    whole direction is scaled: −η s ⊙ (g + λ w)."""
    lin = nn.Linear(3, 2)
    s = torch.tensor([0.5, 1.5])
    for wd in (0.0, 0.1):
        layer = copy.deepcopy(lin)
        _set_grads(layer, 1)
        W, b, G, gb = (t.detach().clone() for t in (layer.weight, layer.bias, layer.weight.grad, layer.bias.grad))
        opt = NeuronLROptimizer(torch.optim.SGD(layer.parameters(), lr=0.1, weight_decay=wd),
                                {layer.weight: s.view(2, 1), layer.bias: s})
        opt.step()
        torch.testing.assert_close(layer.weight, W - 0.1 * s.view(2, 1) * (G + wd * W))
        torch.testing.assert_close(layer.bias, b - 0.1 * s * (gb + wd * b))
        assert torch.equal(layer.weight.grad, G)  # the rule's gradient is left as it was
        torch.testing.assert_close(opt.lr_tensor(layer.weight), 0.1 * s.view(2, 1))


def test_momentum_buffer_is_scaled_update():
    """With momentum μ: b_t = μ b_{t−1} + d_t and w ← w − η s ⊙ b_t (spec §2.6 [R]); two steps by hand."""
    lin = nn.Linear(4, 3)
    s = torch.tensor([0.2, 1.0, 1.8])
    opt = NeuronLROptimizer(torch.optim.SGD(lin.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01),
                            {lin.weight: s.view(3, 1), lin.bias: s})
    w = lin.weight.detach().clone()
    buf = None
    for step in range(2):
        _set_grads(lin, 10 + step)
        d = lin.weight.grad + 0.01 * w
        buf = d if buf is None else 0.9 * buf + d
        w = w - 0.05 * s.view(3, 1) * buf
        opt.step()
        torch.testing.assert_close(lin.weight, w)


def test_conv_rates_reach_the_right_output_channels():
    """A conv weight [M, C, k, k] is scaled per output channel; its bias per channel; a parameter
    without a scale (here the linear layer) takes the plain SGD step."""
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(3, 2))
    _set_grads(model, 3)
    s = torch.tensor([0.0, 1.0, 2.0])
    conv, lin = model[0], model[2]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = NeuronLROptimizer(torch.optim.SGD(model.parameters(), lr=0.1), {conv.weight: s.view(3, 1, 1, 1), conv.bias: s})
    opt.step()
    assert torch.equal(conv.weight[0], before["0.weight"][0]) and conv.bias[0] == before["0.bias"][0]
    for m in (1, 2):
        torch.testing.assert_close(conv.weight[m], before["0.weight"][m] - 0.1 * float(s[m]) * conv.weight.grad[m])
        torch.testing.assert_close(conv.bias[m], before["0.bias"][m] - 0.1 * float(s[m]) * conv.bias.grad[m])
    torch.testing.assert_close(lin.weight, before["2.weight"] - 0.1 * lin.weight.grad)


@pytest.mark.parametrize(
    "kw", [{}, {"momentum": 0.9}, {"momentum": 0.9, "weight_decay": 5e-4}, {"momentum": 0.5, "nesterov": True, "weight_decay": 1e-3},
           {"weight_decay": 0.1, "momentum": 0.9, "dampening": 0.1}],
)
def test_scale_one_equals_torch_sgd_bit_for_bit(kw):
    """§8.11: with s ≡ 1 (multiplied, not skipped) the wrapper is torch.optim.SGD exactly."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
    x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 5, (8,))
    a, b = copy.deepcopy(net), copy.deepcopy(net)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.05, **kw)
    opt_b = NeuronLROptimizer(torch.optim.SGD(b.parameters(), lr=0.05, **kw),
                              {p: torch.ones((p.shape[0],) + (1,) * (p.dim() - 1)) for p in b.parameters()})
    for _ in range(4):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_refuses_adaptive_optimizers():
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="SGD-type"):
        NeuronLROptimizer(torch.optim.Adam(lin.parameters()), {})


# ------------------------------------------------------------------------------------------------
# the plug-in at hook level (make_task)
# ------------------------------------------------------------------------------------------------


def neuron_lr_plan(rule) -> NeuronLRPlan | None:
    """The round's plan of the neuron-lr plug-in wrapping ``rule`` (None without the plug-in)."""
    return next((p.plan for p in rule.plugins if isinstance(p, NeuronLRPlugin)), None)


def _train(values: dict, rule_cls=None, seed: int = 0):
    """One local round; returns the task, the result and the neuron-lr plan the round used."""
    task, cfg = make_task(values, seed=seed)
    rule = (rule_cls or cfg.method.client)(plugins=active_plugins(cfg))
    torch.manual_seed(1234)
    result = run_local_training(rule, task)
    return task, result, neuron_lr_plan(rule)


@pytest.mark.parametrize("extra", [{}, {"momentum": 0.9, "weight_decay": 5e-4, "local_epochs": 2}])
def test_uniform_plugin_equals_fedavg_bit_for_bit(extra):
    """§8.12: all scales 1 (preset uniform, stats pass still run) = FedAvg exactly, also with
    momentum and weight decay; a real preset changes the result."""
    _, plain, _ = _train({"strategy": "fedavg", **extra})
    _, uniform, plan = _train({"strategy": "fedavg", "neuron_lr.preset": "uniform", **extra})
    assert all(torch.equal(s, torch.ones_like(s)) for s in plan.scales)
    for k in plain.arrays:
        assert torch.equal(plain.arrays[k], uniform.arrays[k]), k
    _, nlr, _ = _train({"strategy": "fedavg", "neuron_lr.preset": "paper_main", **extra})
    assert any(not torch.equal(plain.arrays[k], nlr.arrays[k]) for k in plain.arrays)
    assert all(torch.isfinite(v).all() for v in nlr.arrays.values())


class _RecordingOptimizer(torch.optim.SGD):
    """SGD that records the (scaled) gradients it is asked to apply, to check Eq. 18 per step."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.seen: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.seen.append([p.grad.detach().clone() for g in self.param_groups for p in g["params"]])
        return super().step(closure)


class _SAMProbeRule(FedAvgClient):
    """A SAM-type rule (two gradient passes, then ``opt.step()``) that records, per step, the SAM
    gradient it produced and the scales the optimizer held."""

    def start(self, task):
        self.opt, self.sam_grads, self.scales = None, [], []

    def make_optimizer(self, task):
        return _RecordingOptimizer(task.params, lr=task.lr)

    def step(self, task, opt, x, y):
        opt.zero_grad()
        self.loss(task, x, y).backward()
        grads = [p.grad.detach().clone() for p in task.params]
        norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
        with torch.no_grad():
            for p, g in zip(task.params, grads):
                p.add_(0.05 * g / (norm + 1e-12))
        opt.zero_grad()
        loss = self.loss(task, x, y)
        loss.backward()
        with torch.no_grad():
            for p, g in zip(task.params, grads):
                p.sub_(0.05 * g / (norm + 1e-12))
        self.opt = opt
        self.sam_grads.append([p.grad.detach().clone() for p in task.params])
        self.scales.append([opt.scale_of(p) for p in task.params])
        opt.step()
        return float(loss.detach())


def test_sam_type_rule_steps_with_scaled_two_pass_gradient_and_constant_scales():
    """§8.10 and composition with SAM: at every step the inner SGD receives exactly s ⊙ g_SAM (the
    gradient the rule computed at the perturbed point), with the scales computed from w^t before the
    first step and never changed during the round."""
    task, cfg = make_task({"strategy": "fednlr", "local_epochs": 2})
    probe = _SAMProbeRule(plugins=active_plugins(cfg))
    run_local_training(probe, task)
    plan = neuron_lr_plan(probe)
    names = [n for n, p in task.model.named_parameters() if p.requires_grad]
    sam_grads, inner = probe.sam_grads, probe.opt.inner
    assert task.num_steps == len(sam_grads) == len(inner.seen) > 2
    for step_scales, rule_grads, applied in zip(probe.scales, sam_grads, inner.seen):
        for name, s, g, a in zip(names, step_scales, rule_grads, applied):
            assert torch.equal(s, plan.param_scales[name])
            assert torch.equal(a, g * plan.param_scales[name])


def test_fednlr_client_defaults_and_overrides():
    """Method fednlr turns the plug-in on with [fednlr] preset (default paper_main); an explicit
    neuron_lr.preset wins; fednlr with preset uniform is FedAvg bit for bit."""
    task, _, plan = _train({"strategy": "fednlr"})
    sizes = [layer.size for layer in plan.layers]
    assert sizes == [200, 200, 10]
    assert plan.mus == pytest.approx(layer_mus(sizes, *PRESETS["paper_main"]))
    assert task.metrics["nlr-mu-l3"] == pytest.approx(1.75)
    _, _, plan = _train({"strategy": "fednlr", "neuron_lr.preset": "paper_final"})
    assert plan.mus == pytest.approx(layer_mus(sizes, 1, 1, 1))
    _, _, plan = _train({"strategy": "fednlr", "fednlr.preset": "paper_final", "neuron_lr.a2": 0.0})
    assert plan.mus == pytest.approx(layer_mus(sizes, 1, 1, 0))
    _, plain, _ = _train({"strategy": "fedavg"})
    _, uni, _ = _train({"strategy": "fednlr", "fednlr.preset": "uniform"})
    assert_same_arrays({k: v.numpy() for k, v in plain.arrays.items()}, {k: v.numpy() for k, v in uni.arrays.items()})


def test_layers_and_mu_override_options():
    """Fig. 4 ablation: NLR on one layer only; Fig. 5 'manual': μ_l per layer; bad lengths are errors."""
    _, _, plan = _train({"strategy": "fednlr", "neuron_lr.layers": [2], "neuron_lr.mu_override": [2.0, 1.75, 3.0]})
    assert plan.mus == [1.0, 1.75, 1.0]
    assert torch.equal(plan.scales[0], torch.ones(200, dtype=torch.float64))
    assert float(plan.scales[1].max() / plan.scales[1].min()) == pytest.approx(1.75)
    with pytest.raises(ValueError, match="mu_override has 2 values"):
        _train({"strategy": "fednlr", "neuron_lr.mu_override": [2.0, 2.0]})
    with pytest.raises(ValueError, match="out of range"):
        _train({"strategy": "fednlr", "neuron_lr.layers": [4]})


# ------------------------------------------------------------------------------------------------
# activity (issue 39, item 2): the spread std(s) / mean(s) of the scales over all neurons
# ------------------------------------------------------------------------------------------------


def test_scale_spread_known_answers():
    """0 exactly for equal scales (any common value: a common factor is the overall lr, not the
    neuron-wise part); the population coefficient of variation over all neurons pooled otherwise."""
    ones = torch.ones(7, dtype=torch.float64)
    assert scale_spread([ones, torch.ones(3, dtype=torch.float64)]) == 0.0
    assert scale_spread([2.5 * ones]) == 0.0 and scale_spread([]) == 0.0
    # [0.5, 1.5] and [1, 1, 1, 1] pooled: mean 1, variance (0.25 + 0.25) / 6
    two = [torch.tensor([0.5, 1.5], dtype=torch.float64), torch.ones(4, dtype=torch.float64)]
    assert scale_spread(two) == pytest.approx(math.sqrt(1 / 12), rel=1e-12)
    assert scale_spread([3.0 * t for t in two]) == pytest.approx(math.sqrt(1 / 12), rel=1e-12)
    # the spec's worked example, s = [0.567527, 0.746907, 0.982985, 1.702581] (mean 1)
    s = scale_factors(torch.tensor([0.0, 1.0, 2.0, 4.0]), 3.0)
    assert scale_spread([s]) == pytest.approx(float(s.std(unbiased=False)), rel=1e-12)
    # by hand from those: deviations −0.432473, −0.253093, −0.017015, +0.702581; √(mean of squares)
    assert scale_spread([s]) == pytest.approx(math.sqrt((0.432473**2 + 0.253093**2 + 0.017015**2 + 0.702581**2) / 4),
                                              abs=1e-6)
    assert SPREAD.threshold == 1e-3 and SPREAD.name == "neuron_lr"


def test_the_plugin_reports_its_spread_zero_for_uniform_rates():
    """Every client reports the spread of its round's scales: 0 exactly where every neuron keeps
    one rate (preset uniform; μ_l = 1 on every layer), well above 1e-3 with paper_main."""
    _, nlr, plan = _train({"strategy": "fednlr"})
    assert nlr.metrics[SPREAD.measure] == scale_spread(plan.scales) > 100 * SPREAD.threshold
    for values in ({"strategy": "fedavg", "neuron_lr.preset": "uniform"},
                   {"strategy": "fednlr", "neuron_lr.mu_override": [1.0, 1.0, 1.0]}):
        _, result, _ = _train(values)
        assert result.metrics[SPREAD.measure] == 0.0, values


def test_measuring_the_spread_does_not_change_training(monkeypatch):
    """A round with the spread measured and one with the measurement switched off: the same model
    and metrics (but the spread) bit for bit, and the same RNG states."""

    def one_round():
        task, result, _ = _train({"strategy": "fednlr"})
        return result, torch.get_rng_state(), task.generator.get_state()

    measured, rng_m, gen_m = one_round()
    monkeypatch.setattr(fedsuite.method.plugins.neuron_lr, "scale_spread", lambda scales: -1.0)
    unmeasured, rng_u, gen_u = one_round()
    assert unmeasured.metrics[SPREAD.measure] == -1.0 < measured.metrics[SPREAD.measure]
    assert all(torch.equal(measured.arrays[k], unmeasured.arrays[k]) for k in measured.arrays)
    assert {k: v for k, v in measured.metrics.items() if k != SPREAD.measure} == \
        {k: v for k, v in unmeasured.metrics.items() if k != SPREAD.measure}
    assert torch.equal(rng_m, rng_u) and torch.equal(gen_m, gen_u)


def test_norm_layer_parameters_inherit_their_channel_scale():
    """§2.2 [R]: GroupNorm γ, β get the scale of the conv channel feeding them ("inherit"), or none ("one")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    x = torch.randn(5, 1, 6, 6)
    plan = make_plan(model, [x], x[:1], NeuronLRParams(preset="paper_final"))
    assert torch.equal(plan.param_scales["1.weight"], plan.param_scales["0.bias"])
    assert plan.param_scales["0.weight"].shape == (4, 1, 1, 1) and plan.param_scales["4.weight"].shape == (3, 1)
    plan = make_plan(model, [x], x[:1], NeuronLRParams(preset="paper_final", norm_params_scale="one"))
    assert "1.weight" not in plan.param_scales and "1.bias" not in plan.param_scales


# ------------------------------------------------------------------------------------------------
# the plug-in on every registered method whose spec allows it
# ------------------------------------------------------------------------------------------------


def _method_round(method: str, preset: str | None):
    """One local round of ``method``'s client rule on the message its own strategy builds for round 1."""
    values = {"strategy": method}
    if preset:
        values["neuron_lr.preset"] = preset
    task0, _ = make_task(values)
    initial = {k: v.numpy().copy() for k, v in task0.received.items()}
    strategy = make_strategy(method, initial, num_clients=FAST["num_clients"], cohort=FAST["clients_per_round"],
                             unit_round=False, build_model=True, **values)
    pid, content = next(iter(strategy.configure_round(1, initial).items()))  # what the first client receives
    extras = {name: {k: torch.from_numpy(a.numpy().copy()) for k, a in rec.items()}
              for name, rec in content.array_records.items() if name != "arrays"}
    task, cfg = make_task(values, pid=pid, extras=extras, config=dict(content["config"]))
    task.model.load_state_dict(content["arrays"].to_torch_state_dict())
    task.received = {k: v.detach().clone() for k, v in task.model.state_dict().items()}
    rule = cfg.method.client(plugins=active_plugins(cfg))
    torch.manual_seed(4321)
    return rule, run_local_training(rule, task)


@pytest.mark.parametrize("method", sorted(registry.methods()))
def test_plugin_composes_with_every_method(method):
    """For each registered method that allows neuron_lr: the plug-in runs inside the method's own
    rule on the message the method's own strategy sends (scales computed, diagnostics reported,
    finite result), preset uniform reproduces the method without the plug-in bit for bit (model and
    extra uploads; for fednlr itself: FedAvg), and paper_final changes the trained model. A method
    that refuses says why."""
    from fedsuite.config import ConfigError

    spec = registry.methods()[method]
    if "neuron_lr" in spec.refuses:
        with pytest.raises(ConfigError, match=f"neuron_lr does not apply to {method}"):
            make_task({"strategy": method, "neuron_lr.preset": "paper_main"})
        return
    reference = "fedavg" if method == "fednlr" else method  # fednlr without the flag already runs paper_main
    _, plain = _method_round(reference, None)
    rule_u, uniform = _method_round(method, "uniform")
    rule_p, nlr = _method_round(method, "paper_final")
    assert neuron_lr_plan(rule_u) is not None and neuron_lr_plan(rule_p) is not None
    assert "nlr-mu-l1" in nlr.metrics
    for k in plain.arrays:
        assert torch.equal(plain.arrays[k], uniform.arrays[k]), f"{method}: {k} differs with all scales 1"
    for name in plain.extras:
        for k in plain.extras[name]:
            assert torch.equal(plain.extras[name][k], uniform.extras[name][k]), f"{method}: extra {name}/{k}"
    assert all(torch.isfinite(v).all() for v in nlr.arrays.values() if v.is_floating_point())
    assert any(not torch.equal(plain.arrays[k], nlr.arrays[k]) for k in plain.arrays), method


# ------------------------------------------------------------------------------------------------
# real Flower simulations (3 configs; the FedAvg run is shared)
# ------------------------------------------------------------------------------------------------

# these tests run on test_fedinit.py's xdist worker, whose session cache already holds the FAST FedAvg
# run (so it starts once for both files); tests/test_registry_e2e.py's fednlr run is the one below
SIM_GROUP = pytest.mark.xdist_group("test_fedinit")


@SIM_GROUP
def test_simulation_uniform_neuron_lr_equals_fedavg(simulate):
    """§8.12 end to end: FedAvg with neuron_lr preset uniform = FedAvg bit for bit (model and accuracy)."""
    plain = simulate(strategy="fedavg")
    uniform = simulate(strategy="fedavg", **{"neuron_lr.preset": "uniform"})
    assert_same_arrays(plain.arrays, uniform.arrays)
    assert [r["test_accuracy"] for r in plain.rows] == [r["test_accuracy"] for r in uniform.rows]
    assert [r.get("train_loss") for r in plain.rows] == [r.get("train_loss") for r in uniform.rows]
    last = uniform.rows[-1]  # the plug-in's server side logs its diagnostics for any method
    assert last["nlr-mu-l1"] == 1.0 and last["nlr-smin-l1"] == 1.0 == last["nlr-smax-l1"]
    # ... and the summary records that the neuron-wise rates did nothing: spread 0, inert
    assert uniform.summary["activity"] == {"neuron_lr": {"measure": SPREAD.measure, "mean": 0.0, "last": 0.0,
                                                         "threshold": 1e-3, "rounds": 2, "inert": True}}


@SIM_GROUP
def test_simulation_fednlr(simulate):
    """Method fednlr end to end: runs, logs per-layer μ_l (Eq. 17 with paper_main) and scale ranges,
    and trains a different model from FedAvg with the same seeds."""
    plain = simulate(strategy="fedavg")
    nlr = simulate(strategy="fednlr")
    assert len(nlr.rows) == 3 and all(math.isfinite(r["test_accuracy"]) for r in nlr.rows)
    mus = layer_mus([200, 200, 10], *PRESETS["paper_main"])
    for row in nlr.rows[1:]:
        for l, mu in enumerate(mus, start=1):
            assert row[f"nlr-mu-l{l}"] == pytest.approx(mu)
            assert row[f"nlr-smin-l{l}"] < 1.0 < row[f"nlr-smax-l{l}"]
            assert row[f"nlr-T-l{l}"] > 0
    assert any(not np.array_equal(plain.arrays[k], nlr.arrays[k]) for k in plain.arrays)
    spreads = [row[SPREAD.measure] for row in nlr.rows[1:]]
    assert min(spreads) > 100 * SPREAD.threshold
    assert nlr.summary["activity"] == {"neuron_lr": {
        "measure": SPREAD.measure, "mean": pytest.approx(sum(spreads) / 2, rel=1e-12), "last": spreads[-1],
        "threshold": 1e-3, "rounds": 2, "inert": False}}
