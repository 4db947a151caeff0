"""SCAFFOLD's client rule, option II (Karimireddy et al., ICML 2020; a baseline of FedInit and FedMRUR).

    local step:   w ← w − η (∇ℓ(w; b) − c_i + c + λ_wd w)     (correction added to the gradient
                  before clipping, via ``adjust_gradient``: clipped with g, as FedInit's code)
    after K steps: c_i⁺ = c_i − c − Δ_i / (K η),   Δ_i = w_{i,K} − w_{i,0}
    reply:        w_{i,K} and Δc_i = c_i⁺ − c_i  (extra ArrayRecord ``"delta-cv"``)

c arrives as the extra ArrayRecord ``"server-cv"``; c_i lives in the client's on-disk state
(``task.state``, name ``"scaffold-ci"``), zero before the first visit. Both cover the trainable
parameters only. With ``--neuron-lr`` the correction is scaled with the gradient by the per-neuron
rates η̂ and the update divides by K η̂ element-wise (our composition; with η̂ ≡ η it is option II). K is the number of steps taken this round, η this
round's local lr. w_{i,0} = ``task.start_point`` (the relaxed start with ``--relaxed-init``, as
FedInit's code).
With c = c_i = 0 (round 1) the steps are plain SGD bit for bit (adding zeros).
"""

from __future__ import annotations

import torch

from fedsuite.method.training import ClientRule, LocalResult, LocalTask
from fedsuite.method.wire import ARRAYS_KIND, TRAINABLE_LAYOUT, Record, Records

#: the extra ArrayRecord the server sends: c, the server control variate
SERVER_CV = "server-cv"
#: the extra ArrayRecord the client replies: Δc_i = c_i⁺ − c_i
DELTA_CV = "delta-cv"
#: SCAFFOLD's records (``fedsuite.method.wire.Records``): c in every training message, Δc_i in every reply,
#: both over the trainable parameters
RECORDS = Records(message=(Record(SERVER_CV, ARRAYS_KIND, TRAINABLE_LAYOUT),),
                  reply=(Record(DELTA_CV, ARRAYS_KIND, TRAINABLE_LAYOUT),))

STATE_NAME = "scaffold-ci"


def control_variate_update(c_i: dict, c: dict, delta: dict, steps: int, lr: float, scales: dict | None = None) -> dict:
    """c_i⁺ = c_i − c − Δ_i ⊘ (K η̂) (option II), η̂ = η · s with per-neuron scales s from the
    neuron-wise-lr plug-in, η̂ = η without it; unchanged when no step
    was taken (K η = 0)."""
    if steps <= 0 or lr <= 0:
        return {n: v.clone() for n, v in c_i.items()}
    scales = scales or {}
    return {n: c_i[n] - c[n] - delta[n] / (steps * (lr * scales[n] if n in scales else lr)) for n in c_i}


class ScaffoldClient(ClientRule):
    """Local SGD with the drift correction c − c_i (per round: ``c``, ``c_i`` and ``correction`` = c − c_i,
    trainable parameters by name)."""

    c: dict[str, torch.Tensor]
    c_i: dict[str, torch.Tensor]
    correction: dict[str, torch.Tensor]

    def start(self, task: LocalTask) -> None:
        params = task.named_params
        zeros = {n: torch.zeros_like(p, memory_format=torch.contiguous_format).detach() for n, p in params.items()}
        c = task.extras[SERVER_CV]  # declared: the ClientApp refuses a message without it
        c_i = task.state.load_arrays(STATE_NAME, task.device) or zeros
        c = {n: c[n].to(task.device, p.dtype) for n, p in params.items()}
        c_i = {n: c_i[n].to(task.device, p.dtype) for n, p in params.items()}
        self.c, self.c_i, self.correction = c, c_i, {n: c[n] - c_i[n] for n in params}

    def adjust_gradient(self, task: LocalTask) -> None:
        self.add_to_gradients(task, self.correction)

    def finish(self, task: LocalTask) -> LocalResult:
        result = super().finish(task)
        delta = {n: p.detach() - task.start_point[n] for n, p in task.named_params.items()}
        # η̂ = η · s per neuron where a plug-in scales the rates (FedNLR), else η
        c_new = control_variate_update(self.c_i, self.c, delta, task.num_steps, task.lr, self.lr_scales())
        task.state.save_arrays(STATE_NAME, c_new)
        result.extras[DELTA_CV] = {n: c_new[n] - self.c_i[n] for n in c_new}
        return result
