"""FedMRUR's client rule (An et al., NeurIPS 2023): MoFedSAM with the hyperbolic graph-fusion
regulariser H (the paper's Eqs. 2-5 and Algorithm 1).

Per mini-batch b, with z_j = Φ(w; x_j) the local model's features (differentiable) and
ẑ_j = Φ(w^t; x_j) those of the frozen received model (no grad, computed once per batch and reused in
both SAM passes):

    lift_β(z) = (√(β + ‖z‖²), z)                       (Lorentz / hyperboloid model, Law et al.'s lift)
    d²_j      = −2β − 2⟨lift_β(z_j), lift_β(ẑ_j)⟩_𝓛     (squared Lorentzian distance, eq. 4)
    R_b(w)    = (1/|b|) Σ_j exp( min(d²_j/σ, 50) )      (eq. 3, mean over the batch, exponent clamped)
    F(w; b)   = CE(head(z), y) + γ R_b(w)

and the MoFedSAM step on F (clients.sam): e = ρ∇F/(‖∇F‖+1e-7), g̃ = ∇F(w+e) (R in both passes: Alg. 1 perturbs along ∇F),
u = α g̃ + (1−α) m^t, clip u to C, w ← w − η_l(u + λ_wd w).

Numerics. With a = √(β+‖z‖²), b = √(β+‖ẑ‖²), s = z·ẑ and δ = ẑ − z, the distance is computed as

    s ≥ 0:  d² = 2(β‖δ‖² + ‖z‖²‖δ_⊥‖²) / (ab + s + β),   δ_⊥ = δ − (z·δ/‖z‖²) z
    s < 0:  d² = 2(ab − s − β)

Both are algebraically −2β + 2(ab − s) (the first multiplies by (ab + s + β)/(ab + s + β) and uses
(β+‖z‖²)(β+‖ẑ‖²) − (β+s)² = β‖δ‖² + ‖z‖²‖δ‖² − (z·δ)² = β‖δ‖² + ‖z‖²‖δ_⊥‖²). Every term is ≥ 0,
so d² ≥ 0 without clamping, there is no cancellation of large numbers for any norm, the
denominator is ≥ 2β > 0, and d² and its gradient are exactly 0 at z = ẑ (so ∇R = 0 at the first
local step). ``manifold="euclidean"`` uses d² = ‖z − ẑ‖² instead (Table 8).

Activity (``fedsuite.method.activity``, component :data:`HYPERBOLIC`). How much the regulariser acted in
a round is its share of the step, on the round's last local step k = K − 1 (first SAM pass, at w):

    share = ‖∇_w (γ R_b)(w)‖ / ‖∇_w CE(head(Φ(w; x)), y)‖     (joint L2 norms over all parameters)

reported as ``fedmrur-hyperbolic-share`` (0 with the regulariser off, and exactly 0 at γ = 0). The
last step, not the first: at the first step w = w^t, so z = ẑ and ∇R = 0 exactly (above), and the
share would read 0 whatever γ and σ. The features drift from ẑ as the round goes on, so the last
step is where the term pulls hardest in the usual case; a share below the threshold there means it
was below it all round. Two ``torch.autograd.grad`` calls on the step's own graph
(``retain_graph``): they return the gradients without writing ``p.grad``, draw nothing from an RNG
and do not run the model again, so the step's numbers are those of an unmeasured run.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from clients.sam import MOMENTUM_RECORDS, SamMomentumClient
from fedsuite.method.activity import Component, joint_norm, ratio
from fedsuite.method.training import LocalResult, LocalTask
from fedsuite.method.wire import METRICS_KIND, Record, Records

EXP_CLAMP = 50.0

#: the regulariser's diagnostics in every reply with the regulariser on (FedMRURClient's docstring)
D2_MEAN, D2_MAX, R_MEAN = "fedmrur-d2-mean", "fedmrur-d2-max", "fedmrur-R-mean"
#: FedMRUR's records (``fedsuite.method.wire.Records``): the family's momentum records, plus the three
#: diagnostics, required where ``[fedmrur] hyperbolic`` is on
RECORDS = MOMENTUM_RECORDS + Records(reply=tuple(
    Record(key, METRICS_KIND, when=lambda cfg: cfg.method_params.hyperbolic) for key in (D2_MEAN, D2_MAX, R_MEAN)))

#: FedMRUR's hyperbolic regulariser as a distinguishing component (``fedsuite.method.activity``): its share
#: of the step, measured on each round's last local step (module docstring). Inert below 1e-3: the
#: term moves the step by less than a thousandth of the cross-entropy's own gradient.
HYPERBOLIC = Component(
    name="fedmrur.hyperbolic", measure="fedmrur-hyperbolic-share", threshold=1e-3,
    meaning="‖∇(γ·R)‖ / ‖∇L_CE‖ on the round's last local step; inert below 1e-3 (the regulariser moves "
            "the step by less than a thousandth of the cross-entropy's gradient)")


def lift(z: torch.Tensor, beta: float) -> torch.Tensor:
    """lift_β(z) = (√(β + ‖z‖²), z): a point of the hyperboloid ⟨x, x⟩_𝓛 = −β (Law et al.)."""
    return torch.cat([torch.sqrt(beta + (z * z).sum(-1, keepdim=True)), z], dim=-1)


def lorentz_inner(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """⟨x, y⟩_𝓛 = −x₀y₀ + Σ_{i≥1} x_i y_i (last dimension)."""
    prod = x * y
    return prod[..., 1:].sum(-1) - prod[..., 0]


def lorentz_sq_dist(z: torch.Tensor, z_hat: torch.Tensor, beta: float) -> torch.Tensor:
    """Squared Lorentzian distance −2β − 2⟨lift_β(z), lift_β(ẑ)⟩_𝓛 per row, in the stable form of
    the module docstring (≥ 0, finite for any finite input, exact 0 and zero gradient at z = ẑ)."""
    nz = (z * z).sum(-1)
    nzh = (z_hat * z_hat).sum(-1)
    a = torch.sqrt(beta + nz)
    b = torch.sqrt(beta + nzh)
    s = (z * z_hat).sum(-1)
    delta = z_hat - z
    coef = (z * delta).sum(-1, keepdim=True) / nz.clamp_min(torch.finfo(z.dtype).tiny).unsqueeze(-1)
    perp = delta - coef * z
    num = beta * (delta * delta).sum(-1) + nz * (perp * perp).sum(-1)
    positive = 2.0 * num / (a * b + s.clamp_min(0.0) + beta)
    negative = 2.0 * (a * b - s.clamp_max(0.0) - beta)
    return torch.where(s >= 0, positive, negative)


def euclidean_sq_dist(z: torch.Tensor, z_hat: torch.Tensor) -> torch.Tensor:
    """‖z − ẑ‖² per row (the "Euclidean manifold" of Table 8)."""
    d = z - z_hat
    return (d * d).sum(-1)


def gradient_share(term: torch.Tensor, base: torch.Tensor, params: list[torch.nn.Parameter]) -> float:
    """‖∇_w term‖ / ‖∇_w base‖ over ``params`` jointly (``fedsuite.method.activity.ratio``: 0/0 = 0), from
    the graph both scalars hang on, which stays usable (``retain_graph``): the caller still
    backpropagates their sum. ``p.grad`` is not touched (``torch.autograd.grad`` returns gradients);
    a parameter neither depends on counts as a zero gradient."""
    g_term = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
    g_base = torch.autograd.grad(base, params, retain_graph=True, allow_unused=True)
    return ratio(joint_norm(g for g in g_term if g is not None), joint_norm(g for g in g_base if g is not None))


def manifold_regularizer(
    z: torch.Tensor, z_hat: torch.Tensor, *, beta: float, sigma: float, manifold: str = "lorentz",
    exp_clamp: float = EXP_CLAMP,
) -> tuple[torch.Tensor, torch.Tensor]:
    """R_b = mean_j exp(min(d²_j/σ, exp_clamp)) and the per-sample d²."""
    d2 = lorentz_sq_dist(z, z_hat, beta) if manifold == "lorentz" else euclidean_sq_dist(z, z_hat)
    return torch.exp(torch.clamp(d2 / sigma, max=exp_clamp)).mean(), d2


class FedMRURClient(SamMomentumClient):
    """MoFedSAM on CE + γ·R (see module). Logs ``fedmrur-d2-mean``, ``fedmrur-d2-max``,
    ``fedmrur-R-mean`` (first SAM pass, over all local steps of the round) and the regulariser's
    activity ``fedmrur-hyperbolic-share`` (:data:`HYPERBOLIC`, on the round's last local step)."""

    sam = True
    uses_momentum = True

    # --- per-round state ------------------------------------------------------------------------
    #: the frozen received model w^t (None with the regulariser off, and after ``finish``)
    global_model: torch.nn.Module | None = None
    #: ẑ of the current batch, Φ(w^t; x)
    z_global: torch.Tensor | None = None
    #: d²_j and R_b of every first-pass loss this round (the logged diagnostics)
    d2_seen: list[torch.Tensor]
    r_seen: list[torch.Tensor]
    #: the local step (0-based) whose first SAM pass measures the regulariser's share: the last
    measured_step: int = -1
    #: ‖∇(γR)‖ / ‖∇CE‖ of that step; 0.0 with the regulariser off; None until measured
    hyperbolic_share: float | None = None

    def start(self, task: LocalTask) -> None:
        super().start(task)
        self.global_model = self.z_global = None
        if task.method_params.hyperbolic:
            frozen = copy.deepcopy(task.model)
            frozen.load_state_dict(task.received)
            frozen.requires_grad_(False)
            frozen.train(task.model.training)  # same mode as the local model, so ẑ = z at w = w^t
            self.global_model = frozen
        self.d2_seen, self.r_seen = [], []
        self.measured_step = task.planned_steps - 1
        self.hyperbolic_share = None if self.global_model is not None else 0.0  # off: the term is absent

    def _features(self, model: torch.nn.Module, x: torch.Tensor, task: LocalTask) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, logits): z is the penultimate feature (the input of the head) or the logits (``feature_layer="logits"``)."""
        if task.method_params.feature_layer == "logits":
            logits = model(x)
            return logits, logits
        z = model.features(x)
        return z, model.head(z)

    def prepare_batch(self, task: LocalTask, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.global_model is not None:
            with torch.no_grad():
                self.z_global = self._features(self.global_model, x, task)[0]

    def loss(self, task: LocalTask, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z, logits = self._features(task.model, x, task)
        ce = F.cross_entropy(logits, y)
        if self.global_model is None:
            return ce
        reg, d2 = manifold_regularizer(
            z, self.z_global, beta=task.method_params.beta,
            sigma=task.method_params.sigma, manifold=task.method_params.manifold,
            exp_clamp=task.method_params.exp_clamp,
        )
        weighted = task.method_params.gamma * reg
        if self.sam_pass == 1:
            self.d2_seen.append(d2.detach())
            self.r_seen.append(reg.detach())
            if task.num_steps == self.measured_step:
                self.hyperbolic_share = gradient_share(weighted, ce, task.params)
        return ce + weighted

    def finish(self, task: LocalTask) -> LocalResult:
        result = super().finish(task)
        if self.d2_seen:
            d2 = torch.cat(self.d2_seen)
            result.metrics[D2_MEAN] = float(d2.mean())
            result.metrics[D2_MAX] = float(d2.max())
            result.metrics[R_MEAN] = float(torch.stack(self.r_seen).mean())
        if self.hyperbolic_share is not None:
            result.metrics[HYPERBOLIC.measure] = self.hyperbolic_share
        self.global_model = self.z_global = None  # the frozen copy is not kept past the round
        return result
