"""The client-rule base, the one local-training loop, and central evaluation.

A client rule (``clients/``) subclasses :class:`ClientRule` (plain local SGD, FedAvg's ClientUpdate)
and customises the loop only through its hooks:

    start(task)              where training starts (default: the received model w^t)
    make_optimizer(task)     the optimizer (default: SGD with lr, momentum, weight decay)
    step(task, opt, x, y)    one local step (default: SGD on ``loss``; SAM-type rules override)
    loss(task, x, y)         the objective (default: cross-entropy; FedProx/FedDyn/... add terms)
    finish(task)             what is returned and what is remembered

    w_{i,0} = start(w^t)                                     (default: w^t)
    for each local step k on a mini-batch b:
        w ← w − η · ( ∇ℓ(w; b) + λ_wd · w ) [with momentum m]  (:class:`SGD`)
    return w_{i,K}, n_i, mean train loss, K

Plug-ins (relaxed initialisation, neuron-wise learning rates) wrap the same hooks, so any rule can
use them. Batching, augmentation, device placement and metrics are written here once.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from fedsuite.data import augment_batch, to_float
from fedsuite.method.state import ClientState
from fedsuite.method.wire import NUM_EXAMPLES, NUM_STEPS, TRAIN_LOSS


class SGD:
    """Local SGD with momentum and weight decay: for each parameter w with gradient g,

        d = g + λ_wd · w
        m ← d (first step),  m ← μ · m + d (later steps)      [μ > 0; no dampening, no Nesterov]
        w ← w − η · m                                          [m = d when μ = 0]

    ``torch.optim.SGD``'s update, bit for bit, with the same operations in the same order (its
    per-tensor loop on the CPU, its ``torch._foreach`` ops on CUDA, as it picks them;
    tests/test_core.py), without ``torch.optim``: every ``torch.optim`` optimizer imports
    ``torch._dynamo`` on first use (its ``add_param_group``, ``zero_grad`` and ``step`` are
    wrapped to keep ``torch.compile`` out), about 1.3 CPU-seconds in every process that trains (each
    ClientApp actor, each in-process run), for a compiler fedsuite never calls.

    The interface the loop, the rules and the plug-ins use: ``param_groups`` (one group: ``params``,
    ``lr``, ``momentum``, ``weight_decay``), ``state[p]["momentum_buffer"]``, :meth:`zero_grad`,
    :meth:`step`. An update linear in the gradient, so FedNLR's neuron-wise rates apply to it
    (``neuron_lr_compatible``)."""

    neuron_lr_compatible = True

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD needs lr, momentum and weight_decay >= 0 (got {lr}, {momentum}, {weight_decay})")
        self.param_groups: list[dict[str, Any]] = [
            {"params": list(params), "lr": lr, "momentum": momentum, "weight_decay": weight_decay}]
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params and params[0].is_cuda:
                self._step_foreach(params, group["lr"], group["momentum"], group["weight_decay"])
                continue
            for p in params:
                d = p.grad
                if group["weight_decay"] != 0:
                    d = d.add(p, alpha=group["weight_decay"])
                if group["momentum"] != 0:
                    buf = self.state[p].get("momentum_buffer")
                    if buf is None:
                        buf = self.state[p]["momentum_buffer"] = d.detach().clone()
                    else:
                        buf.mul_(group["momentum"]).add_(d, alpha=1)
                    d = buf
                p.add_(d, alpha=-group["lr"])

    def _step_foreach(self, params: list[torch.Tensor], lr: float, momentum: float, weight_decay: float) -> None:
        """:meth:`step` on CUDA: one kernel per operation for all parameters, not one per
        parameter (a GPU step is launch-bound)."""
        grads = [p.grad for p in params]
        if weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
        if momentum != 0:
            bufs = [self.state[p].get("momentum_buffer") for p in params]
            if all(b is not None for b in bufs):
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, grads, alpha=1)
            else:
                for i, (p, g) in enumerate(zip(params, grads)):
                    if bufs[i] is None:
                        bufs[i] = self.state[p]["momentum_buffer"] = g.detach().clone()
                    else:
                        bufs[i].mul_(momentum).add_(g, alpha=1)
            grads = bufs
        torch._foreach_add_(params, grads, alpha=-lr)


@dataclass
class LocalData:
    """One client's training data as tensors on the training device (uint8 images stay uint8)."""

    x: torch.Tensor
    y: torch.Tensor
    bundle: Any  # fedsuite.data.DatasetBundle: normalisation + augmentation settings
    augment: str  # "none" | "crop-flip"

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def inputs(self, index: slice | torch.Tensor) -> torch.Tensor:
        """The examples ``x[index]`` as the model takes them: uint8 images as float32
        ``(x / 255 - mean) / std`` per channel (``fedsuite.data.to_float``), anything else unchanged."""
        return to_float(self.x[index], self.bundle)

    def batches(self, batch_size: int, generator: torch.Generator):
        """Shuffled mini-batches (last partial batch kept), normalised and augmented on device.

        The permutation is drawn on the generator's own device (a CUDA generator cannot draw a CPU
        permutation), then moved to the data's device."""
        n = len(self)
        order = torch.randperm(n, generator=generator, device=generator.device).to(self.x.device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            xb = self.inputs(idx)
            if self.augment != "none":
                xb = augment_batch(xb, self.augment, generator)
            yield xb, self.y[idx]


@dataclass
class LocalTask:
    """Everything a client rule sees during one round of local training."""

    model: torch.nn.Module
    received: dict[str, torch.Tensor]  # w^t as sent by the server (detached copies, on device)
    extras: dict[str, dict[str, torch.Tensor]]  # other ArrayRecords the server sent, by name
    config: dict[str, Any]  # the ConfigRecord the server sent (server-round, lr, per-round values)
    cfg: Any  # fedsuite.config.BaseRunConfig (the config module sits above this one)
    data: LocalData
    state: ClientState
    partition_id: int
    server_round: int
    lr: float
    device: torch.device
    generator: torch.Generator
    start_point: dict[str, torch.Tensor] = field(default_factory=dict)  # w_{i,0}, set after start hooks
    num_steps: int = 0
    loss_sum: torch.Tensor | float = 0.0  # Σ batch losses, kept on the device (no host sync per step)
    metrics: dict[str, float] = field(default_factory=dict)  # extra metrics to report

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The trainable parameters, in the model's order."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def named_params(self) -> dict[str, torch.nn.Parameter]:
        """The trainable parameters by name, in the model's order (the keys of ``fedsuite.method.arrays.trainable_keys``)."""
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    @property
    def planned_steps(self) -> int:
        """K = local_epochs · ⌈n_i / B⌉: the local steps :func:`run_local_training` takes this round
        (:meth:`LocalData.batches` keeps the last partial batch). A rule that acts on one given
        step of the round (FedMRUR measures its regulariser on the last) counts with this."""
        return self.cfg.local_epochs * math.ceil(len(self.data) / self.cfg.batch_size)

    @property
    def method_params(self) -> Any:
        """The run's section of the active method (``[<strategy>]``, a validated pydantic model): the one
        place a client rule reads its hyperparameters from. Values that change per round (``lr``,
        FedGen's decayed weights) come from the server in ``config`` instead."""
        return self.cfg.method_params


@dataclass
class LocalResult:
    arrays: dict[str, torch.Tensor]  # the model to aggregate (see DESIGN.md: wire format)
    extras: dict[str, dict[str, torch.Tensor]]  # extra ArrayRecords for the server
    metrics: dict[str, float]


class ClientRule:
    """Local-training rule. Subclasses override hooks; the loop is :func:`run_local_training`.

    A rule is built for one message (one client's round), so what it works out during the round
    (SCAFFOLD's control variates, FedMRUR's frozen w^t, ...) lives in typed attributes that its
    ``start`` hook sets; what it needs from a plug-in it asks here (:meth:`lr_scales`)."""

    def __init__(self, plugins: list[Any] | None = None) -> None:
        self.plugins = list(plugins or [])

    # --- hooks a method overrides ---------------------------------------------------------------
    def start(self, task: LocalTask) -> None:
        """Set where training starts. The model already holds the received w^t."""

    def make_optimizer(self, task: LocalTask) -> SGD:
        cfg = task.cfg
        return SGD(task.params, lr=task.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def logits(self, task: LocalTask, x: torch.Tensor) -> torch.Tensor:
        return task.model(x)

    def loss(self, task: LocalTask, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local objective on one batch (default: mean cross-entropy)."""
        return F.cross_entropy(self.logits(task, x), y)

    def step(self, task: LocalTask, opt: SGD, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One local step; returns the batch loss as a detached 0-dim tensor (a Python float would
        force a host-device sync every step). Default: a first-order step on ``loss``."""
        opt.zero_grad(set_to_none=True)
        loss = self.loss(task, x, y)
        loss.backward()
        self.adjust_gradient(task)
        clip_grad(task.params, task.cfg.grad_clip)
        opt.step()
        return loss.detach()

    def adjust_gradient(self, task: LocalTask) -> None:
        """Change ``p.grad`` in place before clipping and the optimizer step (SCAFFOLD, FedCM)."""

    @staticmethod
    def add_to_gradients(task: LocalTask, correction: dict[str, torch.Tensor]) -> None:
        """g_n ← g_n + correction_n for every parameter n with a gradient: a drift correction fixed
        for the round (SCAFFOLD's c − c_i, FedDyn's λ(h_i − w_{i,0}))."""
        for n, p in task.named_params.items():
            if p.grad is not None:
                p.grad.add_(correction[n])

    def statistics(self, model: torch.nn.Module, data: LocalData, cfg: Any) -> dict[str, torch.Tensor]:
        """The answer to a statistics query (``fedsuite.method.wire.STATISTICS_QUERY``) about the received
        model, which is not trained and sees no plug-in: statistics must describe w itself. Only rules
        whose server asks (CCVR) implement it."""
        raise TypeError(f"{type(self).__name__} answers no statistics query (a rule whose server sends one "
                        f"defines ClientRule.statistics, as CCVR's does)")

    def finish(self, task: LocalTask) -> LocalResult:
        """What is sent back: by default the trained model's full state_dict."""
        arrays = {k: v.detach() for k, v in task.model.state_dict().items()}
        return LocalResult(arrays=arrays, extras={}, metrics={})

    # --- composition with plug-ins (called by the loop) -----------------------------------------
    def lr_scales(self) -> dict[str, torch.Tensor]:
        """Per-parameter factors s of this round's learning rate, η̂ = η · s (broadcastable to the
        parameter, by name), as the plug-ins set them (FedNLR's neuron-wise rates); a parameter
        missing from the dict steps with η. Rules whose update divides by the step size (SCAFFOLD's
        control variate) ask here."""
        scales: dict[str, torch.Tensor] = {}
        for plugin in self.plugins:
            for name, s in plugin.lr_scales().items():
                scales[name] = scales[name] * s if name in scales else s
        return scales

    def run_start(self, task: LocalTask) -> None:
        for plugin in self.plugins:
            plugin.before_start(task)
        self.start(task)
        for plugin in self.plugins:
            plugin.after_start(task)

    def run_make_optimizer(self, task: LocalTask) -> SGD:
        opt = self.make_optimizer(task)
        for plugin in self.plugins:
            opt = plugin.wrap_optimizer(task, opt)
        return opt

    def run_finish(self, task: LocalTask) -> LocalResult:
        result = self.finish(task)
        for plugin in self.plugins:
            result = plugin.after_finish(task, result)
        result.metrics.update(task.metrics)
        return result


def run_local_training(rule: ClientRule, task: LocalTask) -> LocalResult:
    """Local training of one client for ``cfg.local_epochs`` epochs, driven by ``rule``'s hooks."""
    model = task.model
    model.train()
    rule.run_start(task)
    task.start_point = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = rule.run_make_optimizer(task)
    for _ in range(task.cfg.local_epochs):
        for x, y in task.data.batches(task.cfg.batch_size, task.generator):
            loss = rule.step(task, opt, x, y)
            task.num_steps += 1
            # float64 on the loss's device: the same sum as Python floats, without a sync per step
            task.loss_sum = task.loss_sum + (loss.double() if torch.is_tensor(loss) else loss)
    result = rule.run_finish(task)
    result.metrics.setdefault(TRAIN_LOSS, float(task.loss_sum) / max(task.num_steps, 1))
    result.metrics[NUM_STEPS] = float(task.num_steps)
    result.metrics[NUM_EXAMPLES] = float(len(task.data))
    return result


def clip_grad(params: list[torch.nn.Parameter], max_norm: float | None) -> None:
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bundle, batch_size: int) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on (x, y) in eval mode."""
    model.eval()
    n = int(y.shape[0])
    # accumulated on the evaluation device, read once at the end (no host sync per batch)
    correct = torch.zeros((), dtype=torch.int64, device=y.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=y.device)
    for start in range(0, n, batch_size):
        xb = to_float(x[start : start + batch_size], bundle)
        yb = y[start : start + batch_size]
        logits = model(xb)
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
        correct += (logits.argmax(1) == yb).sum()
    loss = float(loss_sum) / max(n, 1)
    return {"accuracy": int(correct) / max(n, 1), "loss": loss if math.isfinite(loss) else float("nan")}


def arrays_evaluator(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, bundle, batch_size: int,
                     num_threads: int | None = None) -> Callable[[dict[str, Any]], dict[str, float]]:
    """``evaluate(arrays)``: load ``arrays`` (a state_dict as numpy arrays) into ``model`` and return
    :func:`evaluate`'s accuracy and loss on (x, y). The ServerApp's central evaluation of the global
    model and of the pool diagnostics (``strategies/pool.py``) both go through it.

    ``num_threads``: torch's intra-op threads while evaluating (the caller's setting is restored
    after); the ServerApp's choice is ``engine.evaluation_threads``. On a CPU the central
    evaluation of 10,000 test images is about half of a small model's round (1.9 s on one thread,
    1.05 s on two, Fashion-MNIST ``cnn``)."""

    def evaluate_arrays(arrays: dict[str, Any]) -> dict[str, float]:
        model.load_state_dict({k: torch.tensor(v) for k, v in arrays.items()})
        before = torch.get_num_threads()
        if num_threads:
            torch.set_num_threads(num_threads)
        try:
            return evaluate(model, x, y, bundle, batch_size)
        finally:
            torch.set_num_threads(before)

    return evaluate_arrays
