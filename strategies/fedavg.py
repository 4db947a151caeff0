"""FedAvg (McMahan et al., AISTATS 2017): the data-size-weighted mean of the client models.

    w^{t+1} = Σ_{i∈S_t} n_i w_{i,K} / Σ_{i∈S_t} n_i

Sends: the global model w^t and ``lr`` (η_l^t). All behaviour is ``FedSuiteStrategy``'s default.
"""

from clients.fedavg import FedAvgClient
from fedsuite.method.registry import register_method
from fedsuite.method.strategy import FedSuiteStrategy


class FedAvgStrategy(FedSuiteStrategy):
    """FedAvg: deterministic cohort, data-size-weighted model average."""


register_method(
    "fedavg",
    strategy=FedAvgStrategy,
    client=FedAvgClient,
    summary="Federated averaging: local SGD, data-size-weighted model mean",
    paper="McMahan et al., AISTATS 2017",
)
