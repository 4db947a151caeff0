"""Plug-ins that combine with any method; each lives in one module with its typed parameters, its
client half and its server half (contract: :mod:`fedsuite.method.plugins.base`).

* ``relaxed_init`` (:mod:`fedsuite.method.plugins.relaxed_init`): FedInit's relaxed initialisation;
* ``neuron_lr`` (:mod:`fedsuite.method.plugins.neuron_lr`): FedNLR's neuron-wise learning rates, with
  its maths in :mod:`~fedsuite.method.plugins.neuron_lr_scales` (Eqs. 14-17) and
  :mod:`~fedsuite.method.plugins.neuron_lr_optimizer` (Eq. 18).
"""

from __future__ import annotations

from typing import Any

from fedsuite.method.plugins.base import ClientPlugin, ServerHooks
from fedsuite.method.plugins.neuron_lr import NeuronLRPlugin
from fedsuite.method.plugins.relaxed_init import RelaxedInit

#: config section name -> plug-in class, in the order the plug-ins wrap a rule
PLUGINS: dict[str, type[ClientPlugin]] = {cls.name: cls for cls in (NeuronLRPlugin, RelaxedInit)}

__all__ = ["PLUGINS", "ClientPlugin", "ServerHooks", "active_plugins"]


def active_plugins(cfg: Any) -> list[ClientPlugin]:
    """The plug-ins this run uses, in :data:`PLUGINS` order: those its config sections switch on
    and those its method enables at registration (``cfg.plugin_settings``, validated with the config)."""
    return [PLUGINS[name](params) for name, params in cfg.plugin_settings.items()]
