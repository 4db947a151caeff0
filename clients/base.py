"""The base client rule: plain local SGD (FedAvg's ClientUpdate), with the hooks later methods use.

    w_{i,0} = start(w^t)                                     (default: w^t)
    for each local step k on a mini-batch b:
        w ← w − η · ( ∇ℓ(w; b) + λ_wd · w ) [with momentum m]  (torch.optim.SGD)
    return w_{i,K}, n_i, mean train loss, K

A rule overrides only what differs. Plug-ins (``clients.plugins``) wrap ``start``,
``make_optimizer`` and ``finish`` for any rule.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fedsuite.training import LocalResult, LocalTask, clip_grad


class ClientRule:
    """Local-training rule. Subclasses override hooks; the loop is ``fedsuite.training``."""

    def __init__(self, plugins: list[Any] | None = None) -> None:
        self.plugins = list(plugins or [])

    # --- hooks a method overrides ---------------------------------------------------------------
    def start(self, task: LocalTask) -> None:
        """Set where training starts. The model already holds the received w^t."""

    def make_optimizer(self, task: LocalTask) -> torch.optim.Optimizer:
        cfg = task.cfg
        return torch.optim.SGD(task.params, lr=task.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def logits(self, task: LocalTask, x: torch.Tensor) -> torch.Tensor:
        return task.model(x)

    def loss(self, task: LocalTask, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local objective on one batch (default: mean cross-entropy)."""
        return F.cross_entropy(self.logits(task, x), y)

    def step(self, task: LocalTask, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
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

    def finish(self, task: LocalTask) -> LocalResult:
        """What is sent back: by default the trained model's full state_dict."""
        arrays = {k: v.detach() for k, v in task.model.state_dict().items()}
        return LocalResult(arrays=arrays, extras={}, metrics={})

    # --- composition with plug-ins (called by the loop) -----------------------------------------
    def run_start(self, task: LocalTask) -> None:
        for plugin in self.plugins:
            plugin.before_start(task)
        self.start(task)
        for plugin in self.plugins:
            plugin.after_start(task)

    def run_make_optimizer(self, task: LocalTask) -> torch.optim.Optimizer:
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
