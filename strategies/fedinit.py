"""FedInit (Sun, Shen & Tao, NeurIPS 2023): FedAvg + relaxed initialisation (RI).

    client i ∈ S^t:  w_{i,0} = w^t + β (w^t − ŵ_i),  K local epochs of SGD,  ŵ_i := w_{i,K}
    server (delta, default, η_g = 1):  w^{t+1} = w^t + Σ_i n_i (w_{i,K} − w_{i,0}) / Σ_i n_i
    server (model, Alg. 1 line 12):    w^{t+1} = Σ_i n_i w_{i,K} / Σ_i n_i

The server rule is FedAvg's unchanged: in delta mode the clients upload w^t + Δ_i, so FedAvg's
model mean *is* w^t + mean Δ_i. FedAvg weights by n_i where the paper writes 1/|S|; the paper's
partition gives every client the same n_i, so the two coincide. FedInit is a registration, not
code: FedAvg's two rules with the ``relaxed_init`` plug-in (``fedsuite/method/plugins/relaxed_init.py``)
switched on. β defaults to 0.1 (the paper's best on CIFAR-10, Table 6); set it, and the storage /
aggregation / first-visit / staleness options, in ``[relaxed_init]`` (``--relaxed-init β``). Sends: the global model and ``lr``;
in ``relaxed_init.storage = "server-state"`` mode also each client's own ``"start"`` = w_{i,0}.
"""

from clients.fedavg import FedAvgClient
from fedsuite.method.registry import register_method
from strategies.fedavg import FedAvgStrategy

#: β of method ``fedinit`` unless ``relaxed_init.beta`` / ``--relaxed-init`` says otherwise
DEFAULT_BETA = 0.1

register_method(
    "fedinit",
    strategy=FedAvgStrategy,
    client=FedAvgClient,
    enables={"relaxed_init": lambda cfg: {"beta": DEFAULT_BETA}},
    summary="FedAvg with relaxed initialisation w_{i,0} = w^t + β(w^t − ŵ_i) (β = 0.1; --relaxed-init β)",
    paper="Sun, Shen & Tao, NeurIPS 2023 (arXiv 2306.05706)",
)
