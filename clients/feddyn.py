"""FedDyn's client rule (Acar et al., ICLR 2021), in the sign convention of FedInit's code (FL-Simulator):

    local step:  w ← w − η ( clip[ ∇ℓ(w; b) + λ (h_i − w_{i,0}) ] + (λ_wd + λ) w )
                 i.e. the gradient of  ℓ(w) + λ⟨h_i, w⟩ + (λ/2)‖w − w_{i,0}‖² + (λ_wd/2)‖w‖²
    after K steps: h_i ← h_i + Δ_i,   Δ_i = w_{i,K} − w_{i,0},   h_i = 0 before the first visit

h_i = −∇L_i/λ of the paper (its gradient memory); it lives in the client's on-disk state
(``task.state``, name ``"feddyn-h"``), trainable parameters only. The anchor w_{i,0} is
``task.start_point`` (the relaxed start with ``--relaxed-init``, as FL-Simulator's FedDyn + RI). The linear
and anchor terms go through ``adjust_gradient`` (before clipping), λ w through the optimizer's weight
decay (after clipping), as in FL-Simulator. λ = 0 gives plain SGD steps.

Reply: w_{i,K}. When the start point differs from w^t (relaxed init) the server cannot derive Δ_i
from the uploaded model alone, so the offset r_i = w_{i,0} − w^t is uploaded as the extra record
``"start-offset"`` (2× upload, only in that case).
"""

from __future__ import annotations

import torch

from fedsuite.method.training import SGD, ClientRule, LocalResult, LocalTask
from fedsuite.method.wire import ARRAYS_KIND, TRAINABLE_LAYOUT, Record, Records

STATE_NAME = "feddyn-h"
#: the extra ArrayRecord of a reply whose start point w_{i,0} differs from w^t: r_i = w_{i,0} − w^t
START_OFFSET = "start-offset"
#: FedDyn's records (``fedsuite.method.wire.Records``): r_i over the trainable parameters, present exactly
#: when the start point moved (relaxed initialisation with a non-zero offset), checked when present
RECORDS = Records(reply=(Record(START_OFFSET, ARRAYS_KIND, TRAINABLE_LAYOUT, optional=True),))


class FedDynClient(ClientRule):
    """Local SGD on FedDyn's dynamically regularised objective (per round: ``h`` = h_i and
    ``correction`` = λ (h_i − w_{i,0}), trainable parameters by name)."""

    h: dict[str, torch.Tensor]
    correction: dict[str, torch.Tensor]

    def start(self, task: LocalTask) -> None:
        params = task.named_params
        h = task.state.load_arrays(STATE_NAME, task.device)
        self.h = {n: (h[n].to(task.device, p.dtype) if h else torch.zeros_like(p).detach()) for n, p in params.items()}

    def make_optimizer(self, task: LocalTask) -> SGD:
        alpha = task.method_params.alpha
        # start_point is final now: λ (h_i − w_{i,0}) is fixed for the round
        self.correction = {n: alpha * (self.h[n] - task.start_point[n]) for n in self.h}
        cfg = task.cfg
        return SGD(task.params, lr=task.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay + alpha)

    def adjust_gradient(self, task: LocalTask) -> None:
        self.add_to_gradients(task, self.correction)

    def finish(self, task: LocalTask) -> LocalResult:
        result = super().finish(task)
        params = task.named_params
        task.state.save_arrays(STATE_NAME, {n: self.h[n] + (p.detach() - task.start_point[n]) for n, p in params.items()})
        if any(not torch.equal(task.start_point[n], task.received[n]) for n in params):
            result.extras[START_OFFSET] = {n: task.start_point[n] - task.received[n] for n in params}
        return result
