"""Model zoo: one builder per architecture, looked up by name.

Every builder has the signature ``builder(num_classes, input_shape) -> nn.Module`` where
``input_shape`` is ``(C, H, W)`` for images or ``(D,)`` for vectors (anything else is flattened by
the vector models). :data:`MODELS` maps the registered names to builders; :func:`build_model`
checks the name and the shape and gives one clear ``ValueError`` when either is wrong. What every
model satisfies (``features``, ``head``): :mod:`fedsuite.models.base`.

Registered models, their canonical input and what other inputs do:

=========================  ==================  ==============================================================
name                       canonical input     notes
=========================  ==================  ==============================================================
``mlp``                    (60,) / any         flatten -> 200 -> ReLU -> 200 -> ReLU -> head (FedAvg "2NN")
``logreg``                 (60,) / any         flatten -> head (multinomial logistic regression; FedProx)
``cnn``                    3x32x32, 1x28x28    C == 1: FedMR's ``CNNFashionMnist`` (FEMNIST, 2 conv + 2 FC);
                                               C >= 2: FedMR's ``CNNCifar`` (2 conv + 3 FC, LeNet-5-like)
``lenet5``                 3x32x32             FL-Simulator's ``LeNet`` (FedInit's code): 64-64 conv, 384-192 FC
``resnet18-gn``            3x32x32             torchvision resnet18 topology, ImageNet stem kept, BN -> GN(2)
``resnet20``               3x32x32, 1x28x28    FedMR's pre-activation bottleneck ResNet-20 (C == 1: FEMNIST
                                               variant with the extra stem max-pool)
``vgg9``                   3x32x32             FedNLR's VGG-9 (NIID-Bench ModerateCNN), no norm layers
``vgg11``                  3x32x32             FedInit's VGG-11, no norm layers, 512-512 classifier
``vgg16``                  3x32x32             FedMR's VGG-16-BN, 4096-4096 classifier with dropout
``vgg16_femnist_authors``  1x28x28             FedMR code's ``VGG16_mnist`` (5 convs, not a VGG-16)
=========================  ==================  ==============================================================

Inputs other than the canonical ones:

* The first conv always takes ``C`` input channels (1-channel 28x28 images work everywhere).
* ``vgg9``, ``vgg11`` and ``vgg16`` zero-pad inputs smaller than 32x32 up to 32x32 (centred) inside
  ``features`` (so a true VGG-16-BN also runs on FEMNIST's 28x28, next to the authors' 5-conv
  network), so a 1x28x28 input gives the same classifier sizes as CIFAR. Larger inputs (e.g. 64x64) widen the first FC layer.
* ``cnn`` and ``lenet5`` size their first FC layer from the input (e.g. 1x28x28 ``lenet5``: 1024).
* ``resnet18-gn``, ``resnet20`` and ``vgg16_femnist_authors`` end in a global / adaptive average
  pool and take any image size. ``resnet20`` uses ``AdaptiveAvgPool2d(1)``, identical to the
  authors' ``AvgPool2d(8)`` on 32x32 input and ``AvgPool2d(7)`` on 28x28 input.
* Conv models reject vector inputs ``(D,)`` with a ``ValueError`` naming ``mlp`` / ``logreg``.

Parameter counts (10 classes / 62 for FEMNIST) are pinned in tests/test_models.py.
"""

from __future__ import annotations

from typing import Callable, Sequence

from torch import nn

from fedsuite.models.base import _check_shape
from fedsuite.models.resnet import resnet18_gn, resnet20
from fedsuite.models.small import cnn, lenet5, logreg, mlp
from fedsuite.models.vgg import vgg9, vgg11, vgg16, vgg16_femnist_authors


MODELS: dict[str, Callable[[int, tuple[int, ...]], nn.Module]] = {
    "mlp": mlp,
    "logreg": logreg,
    "cnn": cnn,
    "lenet5": lenet5,
    "resnet18-gn": resnet18_gn,
    "resnet20": resnet20,
    "vgg9": vgg9,
    "vgg11": vgg11,
    "vgg16": vgg16,
    "vgg16_femnist_authors": vgg16_femnist_authors,
}


def build_model(name: str, num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """Build the registered model ``name`` for ``num_classes`` outputs and ``input_shape`` inputs.

    Raises ``ValueError`` for an unknown name (listing the allowed ones), for a bad
    ``num_classes``, or for an input shape the architecture cannot take.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(sorted(MODELS))}")
    return MODELS[name](num_classes, tuple(_check_shape(input_shape)))
