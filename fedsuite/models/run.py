"""A run's model, as the engine builds it: :func:`make_model` (the run's architecture),
:func:`initial_arrays` (w^0 from the run's seed), :func:`model_with_state` (an architecture holding a
given state, built without initialising it) and :func:`draws_global_rng` (whether training draws from
torch's process-wide RNG)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from fedsuite.method.seeding import GLOBAL_TORCH_RNG
from fedsuite.models.zoo import build_model


def make_model(cfg, bundle) -> nn.Module:
    """The run's model (``cfg.model``) for a dataset bundle's classes and input shape."""
    return build_model(cfg.model, bundle.num_classes, tuple(bundle.input_shape))


def model_with_state(build: Callable[[], nn.Module], state: dict[str, torch.Tensor],
                     device: torch.device) -> nn.Module:
    """``build()``'s architecture on ``device`` holding copies of ``state`` (strict), built without
    initialising it: the modules are created on the meta device and given copies of the state's
    tensors as their parameters and buffers (``load_state_dict(assign=True)``). A ClientApp
    rebuilds its model for every message, and the random initialisation that ``state`` overwrites
    anyway cost ~0.1 s of CPU per message for ResNet-18-GN. Bit for bit the same model as
    ``build().to(device)`` + load, because ``state`` holds every parameter and persistent buffer; a
    module with a non-persistent buffer (which ``state`` would not restore) or a parameter shared
    between modules (which separate copies would untie) is built and initialised normally instead.
    (Not ``to_empty``: materialising meta tensors imports torch's symbolic-shape machinery, 0.8 s
    of CPU in every process.)"""
    with torch.device("meta"):
        model = build()
    tied = len(list(model.named_parameters(remove_duplicate=False))) != len(list(model.named_parameters()))
    if tied or any(module._non_persistent_buffers_set for module in model.modules()):
        with GLOBAL_TORCH_RNG:  # its initialisation draws from the global RNG (fedsuite.method.seeding)
            model = build().to(device)
        model.load_state_dict(state)
    else:  # copies: the caller's tensors (a message's, the server's model in process) stay as they are
        model.load_state_dict({k: v.to(device, copy=True) for k, v in state.items()}, assign=True)
    return model


def initial_arrays(cfg, bundle) -> dict[str, np.ndarray]:
    """w^0: the model initialised from the run's seed, as numpy arrays in state_dict order."""
    with GLOBAL_TORCH_RNG:
        torch.manual_seed(cfg.seed)
        model = make_model(cfg, bundle)
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


#: modules whose training-mode forward draws from torch's global RNG
GLOBAL_RNG_MODULES = (nn.modules.dropout._DropoutNd, nn.RReLU)


def draws_global_rng(model: nn.Module) -> bool:
    """Whether training ``model`` draws from torch's process-wide RNG (dropout, RReLU): such a
    client's training holds ``fedsuite.method.seeding.GLOBAL_TORCH_RNG`` throughout, so the in-process
    engine trains such clients one at a time, each from its own seed as in its own process."""
    return any(isinstance(module, GLOBAL_RNG_MODULES) for module in model.modules())
