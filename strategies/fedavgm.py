"""FedAvgM (Hsu et al., 2019): server momentum on the mean client update.

    g_t = w^t − Σ_{i∈S} n_i w_{i,K} / Σ n_i                 (pseudo-gradient of the validated mean)
    v_t = g_t (t = 1),   v_t = β v_{t−1} + g_t (t > 1)       (PyTorch SGD-momentum convention)
    w^{t+1} = w^t − η v_t

The step is ``fedsuite.method.server_opt.momentum_step`` (its docstring: arithmetic, integer buffers).
v_1 = g_1 rather than (1 − β) g_1: heavy-ball momentum without dampening, as ``torch.optim.SGD``
and Hsu et al.'s description. η = 1 and β = 0 are FedAvg, bit for bit (the mean is returned
as is). None of the four papers evaluates FedAvgM; defaults follow Hsu et al. (η = 1, β = 0.9).
State: v_t, and the unrounded w^t of integer buffers (``state_dict``: ``momentum``, ``unrounded``).
"""

from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.method.params import Params
from fedsuite.method.registry import register_method
from fedsuite.method.server_opt import Momentum, momentum_step
from fedsuite.method.strategy import FedSuiteStrategy
from fedsuite.method.wire import ClientReply, NDArrays


class FedAvgMParams(Params):
    server_lr: float = Field(1.0, gt=0, description="server learning rate η")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="server momentum β")


class FedAvgMStrategy(FedSuiteStrategy):
    """Server momentum on the validated, data-size-weighted mean."""

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.momentum = Momentum()

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        p = self.params
        mean = super().aggregate(server_round, replies)
        new, self.momentum = momentum_step(self.momentum, self.global_arrays, mean, lr=p.server_lr,
                                           beta=p.server_momentum)
        return new

    def state_dict(self):
        return self.momentum.state_dict()

    def load_state_dict(self, state):
        self.momentum = Momentum.from_state_dict(state)


register_method(
    "fedavgm",
    strategy=FedAvgMStrategy,
    client=FedAvgClient,
    params=FedAvgMParams,
    summary="Server momentum on the mean client update",
    paper="Hsu et al., arXiv:1909.06335, 2019",
)
