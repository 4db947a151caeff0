"""FedProx (Li et al., MLSys 2020): FedAvg's server with a proximal term in the local objective.

    client:  min_w ℓ_i(w) + (μ/2)‖w − w_{i,0}‖²     (clients/fedprox.py)
    server:  w^{t+1} = Σ_{i∈S} n_i w_{i,K} / Σ_{i∈S} n_i   (data-size weighted, as the FedMR authors' code)

Sends ``mu`` in every client's config. Default μ = 0.01: the value of the FedMR (CIFAR-10) and FedNLR
papers; the FedMRUR paper gives no μ, and its configs here use 0.1 (worth a sweep {0.1, 0.01,
0.001}); CIFAR-100 uses 0.001 and FEMNIST 0.1 in FedMR. FedInit does not evaluate FedProx.
"""

from pydantic import Field

from clients.fedprox import FedProxClient
from fedsuite.method.params import Params
from fedsuite.method.registry import register_method
from fedsuite.method.strategy import FedSuiteStrategy


class FedProxParams(Params):
    mu: float = Field(0.01, ge=0, description="proximal coefficient μ (0 = FedAvg)")


class FedProxStrategy(FedSuiteStrategy):
    """FedAvg server; clients receive ``mu``."""



register_method(
    "fedprox",
    strategy=FedProxStrategy,
    client=FedProxClient,
    params=FedProxParams,
    summary="Local SGD plus a proximal term (mu/2)||w - w_start||^2, FedAvg server",
    paper="Li et al., MLSys 2020",
)
