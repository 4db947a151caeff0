"""FedGen's client rule and generator (Zhu et al., ICML 2021; as in the FedMR authors' code).

Generator (as the FedMR authors' code; noise as the reference code, ε ~ U[0, 1)^{noise_dim}):

    G(ε, y) = W₂ ReLU(BN(W₁ [ε; onehot(y)] + b₁)) + b₂  ∈ R^D      (D = the model's feature dimension)

Client objective on a batch (x, y) once the server sends a trained generator (round ≥ 2):

    ℓ = CE(z(x), y) + (B_g / B) · α_t · CE(h(G(ε, ŷ)), ŷ) + β_t · KL(softmax(h(G(ε', y))) ‖ softmax(z(x)))

with h the model's ``head``, ŷ ~ Uniform(labels present locally) of size B_g = ``gen_batch_size`` (128),
B the configured batch size, α_t = α·decay^{t−1}, β_t = β·decay^{t−1} in round t (1-based; the
reference code's exp_lr_decay with decay 0.98), sent by the server as ``fedgen-alpha``/``fedgen-beta``,
and the KL target detached (``KLDivLoss(batchmean)`` as the code).
The generator is frozen on the client and used in eval mode (BN running statistics; our choice, the
code does not say). Every round the client also returns its label counts as the extra ArrayRecord
``label-counts`` {counts [C]}, which the server's teacher loss needs. Clients keep no state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedsuite.method.seeding import GLOBAL_TORCH_RNG
from fedsuite.method.training import ClientRule, LocalResult, LocalTask
from fedsuite.method.wire import ARRAYS_KIND, CONFIG_KIND, Record, Records

#: the extra ArrayRecord the server sends: the generator's weights
GENERATOR = "generator"
#: the config keys of every training message: α_t, β_t and B_g (module docstring)
ALPHA = "fedgen-alpha"
BETA = "fedgen-beta"
GEN_BATCH = "fedgen-gen-batch"
#: the extra ArrayRecord of every reply: the client's label counts n_{i,c}, as its entry :data:`COUNTS` [C]
LABEL_COUNTS = "label-counts"
COUNTS = "counts"
#: FedGen's records (``fedsuite.method.wire.Records``): the generator (from round 2 on, when the server has
#: trained one: optional) and the three config keys in every message; the label counts in every reply
RECORDS = Records(
    message=(Record(GENERATOR, ARRAYS_KIND, optional=True), Record(ALPHA, CONFIG_KIND), Record(BETA, CONFIG_KIND),
             Record(GEN_BATCH, CONFIG_KIND)),
    reply=(Record(LABEL_COUNTS, ARRAYS_KIND, entries=(COUNTS,)),),
)


class Generator(nn.Module):
    """Conditional feature generator G(ε, y) (module docstring)."""

    def __init__(self, noise_dim: int, num_classes: int, feature_dim: int, hidden: int = 512) -> None:
        super().__init__()
        self.noise_dim, self.num_classes = noise_dim, num_classes
        self.fc = nn.Linear(noise_dim + num_classes, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.out = nn.Linear(hidden, feature_dim)

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], num_classes: int) -> "Generator":
        hidden, inp = state["fc.weight"].shape
        with GLOBAL_TORCH_RNG:  # its throwaway initialisation draws from the global RNG (fedsuite.method.seeding)
            gen = cls(int(inp) - num_classes, num_classes, int(state["out.weight"].shape[0]), int(hidden))
        gen.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
        return gen

    def forward(self, y: torch.Tensor, eps: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if eps is None:
            eps = torch.rand(len(y), self.noise_dim, generator=generator, device=y.device)
        h = torch.cat([eps, F.one_hot(y, self.num_classes).to(eps.dtype)], dim=1)
        return self.out(F.relu(self.bn(self.fc(h)))), eps


def fedgen_regularizer(head: nn.Module, logits_x: torch.Tensor, gen_y: torch.Tensor, gen_s: torch.Tensor,
                       y_s: torch.Tensor, alpha: float, beta: float, gen_ratio: float) -> torch.Tensor:
    """(B_g/B)·α·CE(h(gen_s), ŷ) + β·KL(softmax(h(gen_y)) ‖ softmax(z(x))) (module docstring)."""
    target = F.softmax(head(gen_y), dim=1).detach()
    latent = beta * F.kl_div(F.log_softmax(logits_x, dim=1), target, reduction="batchmean")
    teacher = alpha * F.cross_entropy(head(gen_s), y_s)
    return gen_ratio * teacher + latent


def label_counts(task: LocalTask, num_classes: int) -> torch.Tensor:
    return torch.bincount(task.data.y.to(torch.long), minlength=num_classes)


class FedGenClient(ClientRule):
    """Local SGD on CE plus the generator's knowledge-distillation terms (module docstring). Per
    round: the local ``counts`` per class; once the server sends a generator, the frozen ``feature_generator``
    and the ``labels`` present locally (ŷ is drawn from them)."""

    counts: torch.Tensor
    feature_generator: Generator | None = None
    labels: torch.Tensor | None = None

    def start(self, task: LocalTask) -> None:
        num_classes = int(task.model.head.out_features)
        self.counts = counts = label_counts(task, num_classes)
        self.feature_generator = self.labels = None
        if GENERATOR in task.extras:
            gen = Generator.from_state(task.extras[GENERATOR], num_classes).to(task.device).eval()
            gen.requires_grad_(False)
            self.feature_generator = gen
            self.labels = torch.nonzero(counts > 0).flatten().to(task.device)

    def loss(self, task: LocalTask, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self.logits(task, x)
        ce = F.cross_entropy(z, y)
        gen = self.feature_generator
        if gen is None:
            return ce
        available, b_g = self.labels, int(task.config[GEN_BATCH])
        with torch.no_grad():
            gen_y, _ = gen(y, generator=task.generator)
            y_s = available[torch.randint(len(available), (b_g,), generator=task.generator, device=available.device)]
            gen_s, _ = gen(y_s, generator=task.generator)
        reg = fedgen_regularizer(task.model.head, z, gen_y, gen_s, y_s, float(task.config[ALPHA]),
                                 float(task.config[BETA]), b_g / task.cfg.batch_size)
        return ce + reg

    def finish(self, task: LocalTask) -> LocalResult:
        result = super().finish(task)
        result.extras[LABEL_COUNTS] = {COUNTS: self.counts}
        return result
