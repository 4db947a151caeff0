"""FedCM (Xu et al. 2021): client-level momentum (a baseline of FedMRUR and FedInit).

    client:  w ← w − η_l (α g + (1−α) m^t + λ_wd w)               (clients/fedcm.py)
    server:  w^{t+1} = w^t + η_g Δ̄,  m^{t+1} = −Δ̄ / (K̄ η_l^t)    (strategies/momentum.py)

Sends w^t and, from round 2 on, m^t as the ArrayRecord "momentum" (2× FedAvg's downlink).
``normalize=true`` gives FedCM⁺ of Table 7; ``alpha=1`` is FedAvg (with ``normalize=true``: FedAvg⁺).
"""

from clients.fedcm import FedCMClient
from clients.sam import MOMENTUM_RECORDS
from fedsuite.method.registry import register_method
from strategies.momentum import MomentumParams, MomentumStrategy


class FedCMParams(MomentumParams):
    """[fedcm]: alpha (0.1, both papers), momentum_source, server_lr, normalize, weighting, clip_norm."""


class FedCMStrategy(MomentumStrategy):
    """Mean of client updates (optionally normalised), momentum broadcast."""

    sends_momentum = True


register_method(
    "fedcm",
    strategy=FedCMStrategy,
    client=FedCMClient,
    params=FedCMParams,
    summary="Client-level momentum: local steps on α·g + (1−α)·(last global direction)",
    paper="Xu et al., arXiv 2106.10874 (2021)",
    records=MOMENTUM_RECORDS,
)
