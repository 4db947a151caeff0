"""FedMRUR (An et al., NeurIPS 2023): manifold regularisation (H) + normalised update reaggregation
(N) on top of MoFedSAM.

    client (clients/fedmrur.py):  F = CE + γ·mean_j exp(d²_𝓛(Φ(w;x_j), Φ(w^t;x_j))/σ),
                                  MoFedSAM step on F with momentum m^t
    server (strategies/momentum.py; Algorithm 1, lines 15-16):
        Δ̄ = (1/S) Σ Δ_i,  ν = (1/S) Σ ‖Δ_i‖,  Δ^{t+1} = ν Δ̄ / max(‖Δ̄‖, 1e-12)
        w^{t+1} = w^t + η_g Δ^{t+1},   m^{t+1} = −Δ^{t+1} / (K̄ η_l^t)

Ablations (Table 4): ``normalize=false`` → FedMRUR-H; ``hyperbolic=false`` (or ``gamma=0``) →
FedMRUR-N; both → MoFedSAM. ``manifold="euclidean"`` is Table 8's Euclidean variant;
``momentum_source="mean"`` builds m from Δ̄ instead of Δ^{t+1}. Logged per round: d_t
(``norm_factor``), ν, ‖Δ^{t+1}‖, ‖m‖, the clients' mean d², max d², mean R, and the regulariser's
activity ``fedmrur-hyperbolic-share`` (component ``fedmrur.hyperbolic``, ``fedsuite.method.activity``).
"""

from typing import Literal

from pydantic import Field

from clients.fedmrur import D2_MAX, D2_MEAN, EXP_CLAMP, HYPERBOLIC, R_MEAN, RECORDS, FedMRURClient
from fedsuite.method.registry import register_method
from strategies.mofedsam import MoFedSAMParams
from strategies.momentum import MomentumStrategy


class FedMRURParams(MoFedSAMParams):
    """[fedmrur]: the paper's §5.1 values (α 0.1, ρ 0.5, γ 0.005, σ 1e4, β 1), N on, C = 10."""

    normalize: bool = Field(True, description="N: normalised update reaggregation")
    hyperbolic: bool = Field(True, description="H: the manifold regulariser")
    gamma: float = Field(0.005, ge=0, description="weight γ of the regulariser")
    sigma: float = Field(1e4, gt=0, description="temperature σ inside exp(d²/σ)")
    beta: float = Field(1.0, gt=0, description="Lorentz-model parameter β (⟨x,x⟩_L = −β)")
    manifold: Literal["lorentz", "euclidean"] = Field("lorentz", description="distance: Lorentzian (paper) or Euclidean (Table 8)")
    feature_layer: Literal["penultimate", "logits"] = Field("penultimate", description="representation Φ")
    exp_clamp: float = Field(EXP_CLAMP, gt=0, description="exponent clamp min(d²/σ, ·)")


class FedMRURStrategy(MomentumStrategy):
    """Normalised reaggregation, global lr, momentum broadcast; logs d_t and the clients' distances."""

    sends_momentum = True
    logged_client_metrics = (D2_MEAN, D2_MAX, R_MEAN)


register_method(
    "fedmrur",
    strategy=FedMRURStrategy,
    client=FedMRURClient,
    params=FedMRURParams,
    summary="MoFedSAM + hyperbolic (Lorentz) feature regulariser + normalised update reaggregation",
    paper="An et al., NeurIPS 2023",
    components=(HYPERBOLIC,),
    records=RECORDS,
)
