"""Server side shared by the adaptive server optimisers of Reddi et al. (ICLR 2021): FedAdam,
FedYogi, FedAdagrad. Each round takes the validated, data-size-weighted mean x̄_t of the client
models (FedAvg's rule, ``FedSuiteStrategy.aggregate``) and applies one step of its optimiser
(``fedsuite.method.server_opt``) to w^t with Δ̄_t = x̄_t − w^t; the moments m_t, v_t are the method's
server state (``state_dict``: ``m_t``, ``v_t``). A method of the family says only its step.
"""

from __future__ import annotations

from abc import abstractmethod

from fedsuite.method.server_opt import Moments
from fedsuite.method.strategy import FedSuiteStrategy
from fedsuite.method.wire import ClientReply, NDArrays


class AdaptiveStrategy(FedSuiteStrategy):
    """x̄_t, then :meth:`step` over the moments kept here."""

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.moments = Moments()

    @abstractmethod
    def step(self, server_round: int, w: NDArrays, mean: NDArrays) -> tuple[NDArrays, Moments]:
        """The optimiser's step from w^t = ``w`` and x̄_t = ``mean`` with ``self.moments``:
        (w^{t+1}, the new moments)."""

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        new, self.moments = self.step(server_round, self.global_arrays, super().aggregate(server_round, replies))
        return new

    def state_dict(self):
        return self.moments.state_dict()

    def load_state_dict(self, state):
        self.moments = Moments.from_state_dict(state)
