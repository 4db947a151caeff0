"""FedGen: data-free knowledge distillation with a server-trained generator (Zhu et al., ICML 2021;
a FedMR baseline, set up as in the FedMR authors' code). Clients: ``clients/fedgen.py``.

Round t: the server sends w^t, and from round 2 on the generator G as the extra ArrayRecord
``generator`` plus ``fedgen-alpha`` = α·decay^{t−1}, ``fedgen-beta`` = β·decay^{t−1}, ``fedgen-gen-batch``.
Clients return w_i and their label counts n_{i,c}. Then

    w^{t+1} = Σ_i n_i w_i / Σ_i n_i                                         (weighted averaging)

and G is trained for ``ensemble_epochs`` Adam steps (lr ``gen_lr``, weight decay 1e-2; the code's
10 epochs × 5 teacher iterations) on batches ŷ ~ Uniform(qualified labels), |ŷ| = 128:

    L(G) = ensemble_α · Σ_i mean_b[ ω_{ŷ_b,i} · CE(h_i(G(ε_b, ŷ_b)), ŷ_b) ] + ensemble_η · L_div
    ω_{c,i} = n_{i,c} / Σ_j n_{j,c},   qualified labels: max_i n_{i,c} > 1
    L_div = exp(−mean_{a,b} ‖ε_a − ε_b‖²_mean · |G_a − G_b|_mean)          (the code's DiversityLoss)

with h_i the head of client i's uploaded model (teachers). ensemble_β = 0 in the FedMR authors' code, so
the student-distillation term is omitted. Defaults are that code's CIFAR-10 config:
gen_lr 3e-4, α = β = 0.2; CIFAR-100 uses gen_lr 1e-4, α = 10, β = 1; FEMNIST gen_lr 3e-4, α = β = 10.
Server state (``state_dict``): the generator's weights and buffers, Adam's state, rounds trained.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from pydantic import Field

from clients.fedgen import (
    ALPHA, BETA, COUNTS, GEN_BATCH, GENERATOR, LABEL_COUNTS, RECORDS, FedGenClient, Generator,
)
from fedsuite.method.arrays import NDArrays
from fedsuite.method.params import Params
from fedsuite.method.registry import register_method
from fedsuite.method.seeding import seed_for
from fedsuite.method.strategy import FedSuiteStrategy, ServerSetup
from fedsuite.method.wire import ARRAYS, CONFIG, ClientReply, to_record


class FedGenParams(Params):
    gen_lr: float = Field(3e-4, gt=0, description="generator Adam learning rate")
    alpha: float = Field(0.2, ge=0, description="generative_alpha: weight of the clients' CE on generated features")
    beta: float = Field(0.2, ge=0, description="generative_beta: weight of the clients' KL term")
    decay: float = Field(0.98, gt=0, le=1, description="per-round decay of alpha and beta")
    gen_batch_size: int = Field(128, ge=1, description="generated batch size (server and clients)")
    ensemble_epochs: int = Field(50, ge=1, description="generator steps per round")
    ensemble_alpha: float = Field(1.0, ge=0, description="weight of the teacher loss")
    ensemble_eta: float = Field(1.0, ge=0, description="weight of the diversity loss")
    weight_decay: float = Field(1e-2, ge=0, description="generator Adam weight decay")
    noise_dim: int = Field(100, ge=1, description="generator noise dimension")
    hidden: int = Field(512, ge=1, description="generator hidden width")


def diversity_loss(eps: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """exp(−mean_{a,b} mean_d (ε_a−ε_b)² · mean_d |G_a−G_b|)."""
    layer = (out[:, None, :] - out[None, :, :]).abs().mean(2)
    noise = (eps[:, None, :] - eps[None, :, :]).pow(2).mean(2)
    return torch.exp(torch.mean(-noise * layer))


def teacher_loss(feats: torch.Tensor, y: torch.Tensor, heads: list[tuple[torch.Tensor, torch.Tensor]],
                 weights: torch.Tensor) -> torch.Tensor:
    """Σ_i mean_b ω_{y_b,i} CE(W_i g_b + b_i, y_b); weights [C, K]."""
    total = feats.new_zeros(())
    for i, (w, b) in enumerate(heads):
        ce = F.cross_entropy(feats @ w.T + b, y, reduction="none")
        total = total + torch.mean(ce * weights[y, i])
    return total


def label_weights(counts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """ω [C, K] = n_{i,c} / Σ_j n_{j,c} (0 where no client has c) and the qualified labels."""
    counts = np.asarray(counts, dtype=np.float64)  # [K, C]
    tot = counts.sum(0)
    w = np.where(tot > 0, counts / np.where(tot > 0, tot, 1.0), 0.0).T
    qualified = np.flatnonzero(counts.max(0) > 1)
    return torch.from_numpy(w).float(), torch.from_numpy(qualified)


class FedGenStrategy(FedSuiteStrategy):
    """Weighted averaging + server-side generator training (see module)."""

    def __init__(self, setup: ServerSetup) -> None:
        super().__init__(setup)
        p = self.params
        num_classes, dim = self.template["head.weight"].shape
        with torch.random.fork_rng():
            torch.manual_seed(seed_for(self.cfg.seed, 0xFED6E))
            self.generator = Generator(p.noise_dim, int(num_classes), int(dim), p.hidden)
        self.optimizer = torch.optim.Adam(self.generator.parameters(), lr=p.gen_lr, betas=(0.9, 0.999),
                                          eps=1e-8, weight_decay=p.weight_decay)
        self.trained_rounds = 0

    def train_config(self, server_round: int) -> dict[str, Any]:
        conf = super().train_config(server_round)
        decay = self.params.decay ** (server_round - 1)
        conf.update({ALPHA: self.params.alpha * decay, BETA: self.params.beta * decay,
                     GEN_BATCH: self.params.gen_batch_size})
        return conf

    def generator_arrays(self) -> NDArrays:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.generator.state_dict().items()}

    def client_payload(self, server_round: int, pid: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        content = RecordDict({ARRAYS: arrays, CONFIG: config})
        if self.trained_rounds > 0:
            content[GENERATOR] = to_record(self.generator_arrays())
        return content

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        new = super().aggregate(server_round, replies)
        if replies:  # every reply holds its label counts (RECORDS, checked on receipt): all are teachers
            losses = self.train_generator(replies, server_round)
            self.trained_rounds += 1
            self.round_log.add({"fedgen_teacher_loss_first": losses[0], "fedgen_teacher_loss_last": losses[-1]})
        return new

    def train_generator(self, teachers: list[ClientReply], server_round: int) -> list[float]:
        """``ensemble_epochs`` Adam steps on L(G); returns the teacher loss of every step."""
        p = self.params
        heads = [(torch.from_numpy(r.arrays["head.weight"]).float(), torch.from_numpy(r.arrays["head.bias"]).float())
                 for r in teachers]
        weights, qualified = label_weights(np.stack([r.extras[LABEL_COUNTS][COUNTS] for r in teachers]))
        if len(qualified) == 0:
            return [float("nan")]
        gen = torch.Generator().manual_seed(seed_for(self.cfg.seed, server_round, 0xFED6E))
        self.generator.train()
        losses = []
        for _ in range(p.ensemble_epochs):
            y = qualified[torch.randint(len(qualified), (p.gen_batch_size,), generator=gen)]
            out, eps = self.generator(y, generator=gen)
            t_loss = teacher_loss(out, y, heads, weights)
            loss = p.ensemble_alpha * t_loss + p.ensemble_eta * diversity_loss(eps, out)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(float(t_loss.detach()))
        return losses

    def state_dict(self) -> dict[str, Any]:
        opt = self.optimizer.state_dict()
        opt_state = {k: {n: (v.numpy().copy() if torch.is_tensor(v) else v) for n, v in s.items()} for k, s in opt["state"].items()}
        return {"generator": self.generator_arrays(), "optimizer": {"state": opt_state, "param_groups": opt["param_groups"]},
                "trained_rounds": self.trained_rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state["generator"].items()})
        opt = state["optimizer"]
        self.optimizer.load_state_dict({
            "state": {k: {n: (torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v) for n, v in s.items()}
                      for k, s in opt["state"].items()},
            "param_groups": opt["param_groups"],
        })
        self.trained_rounds = int(state["trained_rounds"])


register_method(
    "fedgen",
    strategy=FedGenStrategy,
    client=FedGenClient,
    params=FedGenParams,
    summary="Data-free KD: server-trained conditional feature generator regularises local training",
    paper="Zhu et al., ICML 2021",
    records=RECORDS,
)
