"""FedRS (Li & Zhan, KDD 2021): restricted softmax on the clients, FedAvg on the server.

    client:  min_w CE(s ⊙ z(w; x), y),  s_c = 1 for locally present classes, α for absent ones
    server:  w^{t+1} = Σ_{i∈S_t} n_i w_i / Σ_{i∈S_t} n_i

Config ``[fedrs]``: ``alpha`` (α, default 0.5, the FedNLR paper's value), ``scaling`` ("hard" = the
paper's rule, default; "proportional" = s_c = α + (1−α) n_c / max n). See ``clients/fedrs.py``.
"""

from typing import Literal

from pydantic import Field

from clients.fedrs import FedRSClient
from fedsuite.method.params import Params
from fedsuite.method.registry import register_method
from fedsuite.method.strategy import FedSuiteStrategy


class FedRSParams(Params):
    alpha: float = Field(0.5, ge=0, le=1, description="logit scale of classes absent from the client")
    scaling: Literal["hard", "proportional"] = Field("hard", description="hard: paper; proportional: code variant")


class FedRSStrategy(FedSuiteStrategy):
    """FedRS: the server rule is FedAvg's data-size-weighted mean."""


register_method(
    "fedrs",
    strategy=FedRSStrategy,
    client=FedRSClient,
    params=FedRSParams,
    summary="Restricted softmax: logits of locally absent classes scaled by alpha",
    paper="Li & Zhan, KDD 2021",
)
