"""FedLC (Zhang et al., ICML 2022): logit-calibrated local loss, FedAvg on the server.

    client:  min_w CE(z(w; x) − τ n_{i,·}^{−1/4}, y)
    server:  w^{t+1} = Σ_{i∈S_t} n_i w_i / Σ_{i∈S_t} n_i

Config ``[fedlc]``: ``tau`` (τ, default 1.0, the FedNLR paper's value). See ``clients/fedlc.py``.
"""

from pydantic import Field

from clients.fedlc import FedLCClient
from fedsuite.method.params import Params
from fedsuite.method.registry import register_method
from fedsuite.method.strategy import FedSuiteStrategy


class FedLCParams(Params):
    tau: float = Field(1.0, ge=0, description="calibration strength τ")


class FedLCStrategy(FedSuiteStrategy):
    """FedLC: the server rule is FedAvg's data-size-weighted mean."""


register_method(
    "fedlc",
    strategy=FedLCStrategy,
    client=FedLCClient,
    params=FedLCParams,
    summary="Logit calibration: CE on z - tau * n_c^(-1/4) with local label counts",
    paper="Zhang et al., ICML 2022",
)
