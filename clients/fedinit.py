"""FedInit's client rule: FedAvg's local SGD from a relaxed start (Sun, Shen & Tao, NeurIPS 2023).

    w_{i,0} = w^t + β (w^t − ŵ_i)            (spec fedinit.md §2.1; ŵ_i = last local model, w^0 at first)
    w ← w − η_t (∇ℓ(w; b) + λ_wd w)  for K local epochs      (spec §2.3 C3-C4)
    ŵ_i := w_{i,K};  upload w^t + (w_{i,K} − w_{i,0})       (delta, default) or w_{i,K} (model)

All of it is the ``relaxed_init`` plug-in (``fedsuite/plugins/relaxed_init.py``) on FedAvg's rule;
this class only switches the plug-in on with β = :data:`DEFAULT_BETA` (spec §2.1: best on CIFAR-10,
(R)'s default) when the run did not set ``relaxed_init.beta`` itself. Every other option
(``storage``, ``aggregation``, ``first_visit``, ``max_staleness``) is read from ``[relaxed_init]``.
"""

from clients.fedavg import FedAvgClient
from fedsuite.plugins.relaxed_init import with_relaxed_init
from fedsuite.training import LocalTask

#: β of method ``fedinit`` unless ``relaxed_init.beta`` / ``--relaxed-init`` says otherwise
DEFAULT_BETA = 0.1


class FedInitClient(FedAvgClient):
    """FedAvg's rule with relaxed initialisation always on."""

    def run_start(self, task: LocalTask) -> None:
        self.plugins = with_relaxed_init(self.plugins, task.cfg, DEFAULT_BETA)
        super().run_start(task)
