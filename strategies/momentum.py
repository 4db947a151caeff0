"""Server side shared by the SAM / client-momentum family (FedSAM, FedASAM, FedCM, MoFedSAM, FedMRUR):
(optionally normalised) update aggregation with a global learning rate, and the client-momentum
direction broadcast as the extra ArrayRecord ``"momentum"`` (the FedMRUR paper's Algorithm 1 and
its baselines).

With Δ_i = w_i − w^t (trainable parameters), p_i = 1/S (``weighting="uniform"``, the FedMRUR paper's
1/|S_t|) or n_i/Σn (``"examples"``, FedAvg's), and S = number of usable replies:

    Δ̄       = Σ_i p_i Δ_i                      ν = Σ_i p_i ‖Δ_i‖        (‖·‖: one L2 norm over all)
    d_t      = ν / max(‖Δ̄‖, ε₀) if ``normalize`` (N; ε₀ = 1e-12 guards cancelling updates) else 1
    Δ^{t+1}  = d_t · Δ̄
    w^{t+1}  = w^t + η_g Δ^{t+1}                (η_g = ``server_lr``; buffers: plain mean)
    m^{t+1}  = − Δ^{t+1} / (K̄ η_l^t)           (``momentum_source="normalized"``, the Δ Alg. 1
                                                  steps with; ``"mean"`` uses Δ̄; K̄ = mean_i K_i;
                                                  η_l^t = this round's local lr)

w^{t+1} is evaluated in float64 as  w̄ + (η_g d_t − 1)(w̄ − w^t)  with w̄ = Σ_i p_i w_i accumulated
exactly like FedAvg's ``weighted_mean``; this is the same number as w^t + η_g d_t Δ̄, and when
η_g d_t = 1 it is w̄ itself, so e.g. FedCM(α=1, weighting=examples) reproduces FedAvg bit for bit.
m^0 = 0 is not sent: clients then mix in nothing, which equals mixing in zeros.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from pydantic import Field

from fedsuite.method.params import Params
from fedsuite.method.arrays import NDArrays, cast_like, norm, weighted_sum64
from fedsuite.method.strategy import FedSuiteStrategy, ServerSetup
from fedsuite.method.wire import MOMENTUM, NUM_STEPS, ClientReply, to_record

EPS0 = 1e-12


class FamilyParams(Params):
    """Keys every method of the family has (server aggregation + client clipping)."""


    server_lr: float = Field(1.0, gt=0, description="global lr η_g (displacement units: 1 = average of the client models)")
    normalize: bool = Field(False, description="N: normalised update reaggregation")
    weighting: Literal["uniform", "examples"] = Field(
        "uniform", description="client weights p_i: uniform 1/S (FedMRUR's paper) or n_i/Σn (FedAvg)"
    )
    clip_norm: float = Field(10.0, ge=0, description="clip the local update direction u to this L2 norm; 0 = off")


class MomentumParams(FamilyParams):
    """FedCM-type methods: client momentum α and where m^{t+1} comes from."""

    alpha: float = Field(0.1, ge=0, le=1, description="weight of the fresh local gradient; 1−α on m^t")
    momentum_source: Literal["normalized", "mean"] = Field(
        "normalized", description="m^{t+1} from Δ^{t+1} (normalised, Alg. 1) or from the plain mean Δ̄"
    )


class MomentumStrategy(FedSuiteStrategy):
    """Normalised/global-lr aggregation and (if ``sends_momentum``) the FedCM momentum (see module)."""

    #: whether m^{t+1} is computed and broadcast (FedCM, MoFedSAM, FedMRUR)
    sends_momentum: bool = False
    #: client metrics (example-weighted means) copied into the round's metrics.jsonl line
    logged_client_metrics: tuple[str, ...] = ()

    def __init__(self, setup: ServerSetup) -> None:
        super().__init__(setup)
        self.momentum: NDArrays | None = None  # m^t, gradient units (the FedCM/MoFedSAM convention)
        self._momentum_record: ArrayRecord | None = None
        self.trainable = setup.trainable_keys()

    # --- downlink -------------------------------------------------------------------------------
    def client_payload(self, server_round: int, pid: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        content = super().client_payload(server_round, pid, arrays, config)
        if self.sends_momentum and self._momentum_record is not None:
            content[MOMENTUM] = self._momentum_record
        return content

    def set_momentum(self, momentum: NDArrays | None) -> None:
        self.momentum = momentum
        self._momentum_record = None if momentum is None else to_record(momentum)

    # --- server rule ----------------------------------------------------------------------------
    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        p = self.params
        w_t = self.global_arrays
        weights = [1.0] * len(replies) if p.weighting == "uniform" else [float(r.num_examples) for r in replies]
        total = float(sum(weights))

        # w̄ = Σ p_i w_i in float64, the very sum FedAvg's weighted_mean casts back
        mean = weighted_sum64([r.arrays for r in replies], weights, self.template)

        # Δ̄, ν, d_t over the trainable parameters
        delta_bar = {k: mean[k] - w_t[k].astype(np.float64) for k in self.trainable}
        norm_bar = norm(delta_bar.values())
        nu = sum(
            (wt / total) * norm(r.arrays[k].astype(np.float64) - w_t[k].astype(np.float64) for k in self.trainable)
            for r, wt in zip(replies, weights)
        )
        d_t = nu / max(norm_bar, EPS0) if p.normalize else 1.0
        scale = p.server_lr * d_t

        out: NDArrays = {}
        for key, ref in self.template.items():
            acc = mean[key]
            if key in delta_bar:
                acc = acc + (scale - 1.0) * delta_bar[key]
            out[key] = cast_like(acc, ref)

        info = {
            "norm_factor": d_t,
            "d_t": nu / norm_bar if norm_bar > 0 else None,
            "mean_client_update_norm": nu,
            "mean_update_norm": norm_bar,
            "global_update_norm": d_t * norm_bar,
        }
        if self.sends_momentum:
            # K_i: a declared record of the methods that send momentum (clients/sam.py, MOMENTUM_RECORDS)
            k_bar = float(np.mean([r.metrics[NUM_STEPS] for r in replies]))
            lr = self.local_lr(server_round)
            factor = d_t if p.momentum_source == "normalized" else 1.0
            if k_bar > 0 and lr > 0:
                self.set_momentum({
                    k: (-(factor * delta_bar[k]) / (k_bar * lr)).astype(self.template[k].dtype) for k in self.trainable
                })
            else:
                self.set_momentum({k: np.zeros_like(self.template[k]) for k in self.trainable})
            info["momentum_norm"] = norm(v.astype(np.float64) for v in self.momentum.values())
        self.round_log.add(info)
        return out

    def aggregate_metrics(self, replies: list[ClientReply]) -> dict[str, float]:
        metrics = super().aggregate_metrics(replies)
        self.round_log.add({key: metrics[key] for key in self.logged_client_metrics if key in metrics})
        return metrics

    # --- checkpointing --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["momentum"] = None if self.momentum is None else {k: v.copy() for k, v in self.momentum.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        momentum = state.get("momentum")
        self.set_momentum(None if momentum is None else {k: np.asarray(v) for k, v in momentum.items()})
