"""FedNLR's client rule: FedAvg's local SGD with neuron-wise learning rates (spec fednlr.md §2.6, §2.8).

    s_{l,m} from the received w^t on the local data (Eq. 14-17, ``fedsuite.plugins.neuron_lr``)
    for each mini-batch b:  w_{l,m} ← w_{l,m} − η s_{l,m} ∇_{w_{l,m}} ℓ(w; b)              (18)
    return w_{i,K}

The rule is :class:`clients.fedavg.FedAvgClient` with the ``neuron_lr`` plug-in switched on: if
the run's ``[neuron_lr]`` section did not switch it on (``preset`` unset), the rule adds the
plug-in itself with the ``[neuron_lr]`` settings and ``preset = [fednlr] preset`` (default
``paper_main``, the paper's main-table setting, spec §2.4/§7.5). An explicit
``neuron_lr.preset`` (``--neuron-lr``) wins.
"""

from __future__ import annotations

from clients.fedavg import FedAvgClient
from fedsuite.plugins.neuron_lr import NeuronLRPlugin
from fedsuite.training import LocalTask


def fednlr_plugin_params(cfg):
    """The ``[neuron_lr]`` settings with ``preset`` taken from ``[fednlr]`` (used when the run did not
    switch the plug-in on itself)."""
    return cfg.neuron_lr.model_copy(update={"preset": cfg.fednlr.preset})


class FedNLRClient(FedAvgClient):
    """Local SGD with η̂_{l,m} = η·s_{l,m}; all the work is the ``neuron_lr`` plug-in's."""

    def __init__(self, plugins=None) -> None:
        super().__init__(plugins)
        self._own: NeuronLRPlugin | None = None
        if not any(isinstance(p, NeuronLRPlugin) for p in self.plugins):
            self._own = NeuronLRPlugin(None)  # params resolved per task in run_start
            self.plugins.append(self._own)

    def run_start(self, task: LocalTask) -> None:
        if self._own is not None:
            self._own.p = fednlr_plugin_params(task.cfg)
        super().run_start(task)
