"""FedInit (Sun, Shen & Tao, NeurIPS 2023): FedAvg + relaxed initialisation (RI).

    client i ∈ S^t:  w_{i,0} = w^t + β (w^t − ŵ_i),  K local epochs of SGD,  ŵ_i := w_{i,K}
    server (delta, default, η_g = 1):  w^{t+1} = w^t + Σ_i n_i (w_{i,K} − w_{i,0}) / Σ_i n_i
    server (model, Alg. 1 line 12):    w^{t+1} = Σ_i n_i w_{i,K} / Σ_i n_i

(spec fedinit.md §2.2.) The server rule is FedAvg's unchanged: in delta mode the clients upload
w^t + Δ_i, so FedAvg's model mean *is* w^t + mean Δ_i. FedAvg weights by n_i where the paper writes
1/|S|; the paper's partition gives every client the same n_i, so the two coincide (spec §7 A9).
β defaults to 0.1 (spec §2.1, §7 A5); set it, and the storage / aggregation / first-visit /
staleness options, in ``[relaxed_init]`` (``--relaxed-init β``). Sends: the global model and ``lr``;
in ``relaxed_init.storage = "server-state"`` mode also each client's own ``"start"`` = w_{i,0}.
"""

from clients.fedinit import DEFAULT_BETA, FedInitClient
from fedsuite.plugins.relaxed_init import with_relaxed_init
from fedsuite.registry import register_method
from strategies.fedavg import FedAvgStrategy


class FedInitStrategy(FedAvgStrategy):
    """FedAvg's server rule; relaxed initialisation switched on (β = 0.1 unless set)."""

    def active_plugins(self) -> list:
        return with_relaxed_init(super().active_plugins(), self.cfg, DEFAULT_BETA)


register_method(
    "fedinit",
    strategy=FedInitStrategy,
    client=FedInitClient,
    summary="FedAvg with relaxed initialisation w_{i,0} = w^t + β(w^t − ŵ_i) (β = 0.1; --relaxed-init β)",
    paper="Sun, Shen & Tao, NeurIPS 2023 (arXiv 2306.05706)",
)
