"""The one local-training loop, and central evaluation.

A client rule (``clients/``) customises the loop only through hooks (see ``clients.base.ClientRule``):

    start(task)              where training starts (default: the received model w^t)
    make_optimizer(task)     the optimizer (default: SGD with lr, momentum, weight decay)
    step(task, opt, x, y)    one local step (default: SGD on ``loss``; SAM-type rules override)
    loss(task, x, y)         the objective (default: cross-entropy; FedProx/FedDyn/... add terms)
    finish(task)             what is returned and what is remembered

Plug-ins (relaxed initialisation, neuron-wise learning rates) wrap the same hooks, so any rule can
use them. Batching, augmentation, device placement and metrics are written here once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from fedsuite.data import augment_batch, to_float

if TYPE_CHECKING:
    from clients.base import ClientRule
    from fedsuite.config import BaseRunConfig
    from fedsuite.state import ClientState


@dataclass
class LocalData:
    """One client's training data as tensors on the training device (uint8 images stay uint8)."""

    x: torch.Tensor
    y: torch.Tensor
    bundle: Any  # fedsuite.data.DatasetBundle: normalisation + augmentation settings
    augment: str  # "none" | "crop-flip"

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def batches(self, batch_size: int, generator: torch.Generator):
        """Shuffled mini-batches (last partial batch kept), normalised and augmented on device.

        The permutation is drawn on the generator's own device (a CUDA generator cannot draw a CPU
        permutation), then moved to the data's device."""
        n = len(self)
        order = torch.randperm(n, generator=generator, device=generator.device).to(self.x.device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            xb = to_float(self.x[idx], self.bundle)
            if self.augment != "none":
                xb = augment_batch(xb, self.augment, generator)
            yield xb, self.y[idx]


@dataclass
class LocalTask:
    """Everything a client rule sees during one round of local training."""

    model: torch.nn.Module
    received: dict[str, torch.Tensor]  # w^t as sent by the server (detached copies, on device)
    extras: dict[str, dict[str, torch.Tensor]]  # other ArrayRecords the server sent, by name
    config: dict[str, Any]  # the ConfigRecord the server sent (server-round, lr, method scalars)
    cfg: "BaseRunConfig"
    data: LocalData
    state: "ClientState"
    partition_id: int
    server_round: int
    lr: float
    device: torch.device
    generator: torch.Generator
    start_point: dict[str, torch.Tensor] = field(default_factory=dict)  # w_{i,0}, set after start hooks
    num_steps: int = 0
    loss_sum: torch.Tensor | float = 0.0  # Σ batch losses, kept on the device (no host sync per step)
    scratch: dict[str, Any] = field(default_factory=dict)  # per-round working memory of rules/plug-ins
    metrics: dict[str, float] = field(default_factory=dict)  # extra metrics to report

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


@dataclass
class LocalResult:
    arrays: dict[str, torch.Tensor]  # the model to aggregate (see DESIGN.md: wire format)
    extras: dict[str, dict[str, torch.Tensor]]  # extra ArrayRecords for the server
    metrics: dict[str, float]


def run_local_training(rule: "ClientRule", task: LocalTask) -> LocalResult:
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
    result.metrics.setdefault("train-loss", float(task.loss_sum) / max(task.num_steps, 1))
    result.metrics["num-steps"] = float(task.num_steps)
    result.metrics["num-examples"] = float(len(task.data))
    return result


def clip_grad(params: list[torch.nn.Parameter], max_norm: float | None) -> None:
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)


def flat_norm(tensors) -> torch.Tensor:
    """Global L2 norm over a list of tensors (the ‖·‖ over all parameters jointly)."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors]))


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


def seed_for(*parts: int) -> int:
    """A 63-bit seed derived from integers (seed, partition id, round, ...), stable across runs."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)
