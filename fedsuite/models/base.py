"""What every model of the zoo shares: the :class:`FeatureModel` base, the checks of a builder's
arguments, :func:`count_parameters`.

The contract every model satisfies (tests/test_models.py checks it for every registered name):

* ``model.features(x) -> Tensor[B, D]``: the penultimate representation (the input of the final
  classifier). FedMRUR's hyperbolic regulariser and CCVR-style feature statistics use it.
* ``model.head``: the final ``nn.Linear``; ``model(x) == model.head(model.features(x))``.
* ``head`` is the last registered module, so it is the last entry of ``state_dict()`` (the order
  Flower's ndarray list and FedMR's tensor-wise recombination follow).
* Activations are ``nn.ReLU`` modules (not in-place, not functional) wherever a hidden layer has
  one, so FedNLR's activation statistics can hook them.
"""

from __future__ import annotations

from typing import Sequence

from torch import Tensor, nn


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters (buffers such as BN running stats are not counted)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _check_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in input_shape)
    except TypeError:
        raise ValueError(f"input_shape must be a tuple of ints, got {input_shape!r}") from None
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive ints, got {input_shape!r}")
    return shape


def _image_shape(name: str, input_shape: Sequence[int]) -> tuple[int, int, int]:
    shape = _check_shape(input_shape)
    if len(shape) != 3:
        raise ValueError(
            f"model {name!r} needs image input of shape (C, H, W), got {shape}; "
            "use 'mlp' or 'logreg' for vector inputs"
        )
    return shape  # type: ignore[return-value]


def _conv_out(n: int, k: int, s: int = 1, p: int = 0) -> int:
    return (n + 2 * p - k) // s + 1


def _too_small(name: str, shape: tuple[int, ...], need: str) -> ValueError:
    return ValueError(f"input {shape} is too small for model {name!r} ({need})")


def _check_classes(num_classes: int) -> int:
    if int(num_classes) != num_classes or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    return int(num_classes)


class FeatureModel(nn.Module):
    """Base class: ``forward(x) = head(features(x))``; subclasses define ``features`` and ``head``."""

    head: nn.Linear

    def features(self, x: Tensor) -> Tensor:
        """The penultimate representation [B, D]; every registered architecture defines it."""
        raise TypeError(f"{type(self).__name__} does not define features()")

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
