"""FedNLR (Wang et al., KDD 2024): FedAvg's server with neuron-wise local learning rates.

Server (the paper's Eq. 19), unchanged FedAvg over the participating clients:

    w^{t+1} = Σ_{k∈K_t} D_k w^k / Σ_{k∈K_t} D_k

Client: FedAvg's local SGD with η̂_{l,m} = η·s_{l,m} (Eq. 14-18), i.e. the ``neuron_lr`` plug-in
(``fedsuite/method/plugins/neuron_lr.py``), which this registration switches on. Sends:
the global model and ``lr``, exactly like FedAvg: FedNLR communicates exactly what FedAvg does.
The ``neuron_lr`` plug-in is on even when ``[neuron_lr] preset`` is unset (then with
``[fednlr] preset``, default ``paper_main``); its server side writes the cohort means of the
per-layer ``nlr-mu-l{l}``, ``nlr-T-l{l}``, ``nlr-smin-l{l}``, ``nlr-smax-l{l}`` into each round's
``metrics.jsonl`` line (Fig. 3 of the paper plots T_l per layer).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.method.params import Params
from fedsuite.method.registry import register_method
from strategies.fedavg import FedAvgStrategy


class FedNLRParams(Params):
    """Section ``[fednlr]``."""


    preset: Literal["paper_main", "paper", "paper_final", "uniform"] = Field(
        "paper_main", description="neuron_lr preset used when [neuron_lr] preset is unset"
    )


register_method(
    "fednlr",
    strategy=FedAvgStrategy,
    client=FedAvgClient,
    params=FedNLRParams,
    enables={"neuron_lr": lambda cfg: {"preset": cfg.fednlr.preset}},
    summary="FedNLR: FedAvg with neuron-wise local learning rates from local activation statistics",
    paper="Wang et al., KDD 2024",
)
