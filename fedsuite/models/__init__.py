"""Model zoo: one builder per architecture, looked up by name.

Every builder has the signature ``builder(num_classes, input_shape) -> nn.Module`` where
``input_shape`` is ``(C, H, W)`` for images or ``(D,)`` for vectors (anything else is flattened by
the vector models). :data:`MODELS` maps the registered names to builders; :func:`build_model`
checks the name and the shape and gives one clear ``ValueError`` when either is wrong.

The contract every model satisfies (tests/test_models.py checks it for every registered name):

* ``model.features(x) -> Tensor[B, D]``: the penultimate representation (the input of the final
  classifier). FedMRUR's hyperbolic regulariser and CCVR-style feature statistics use it.
* ``model.head``: the final ``nn.Linear``; ``model(x) == model.head(model.features(x))``.
* ``head`` is the last registered module, so it is the last entry of ``state_dict()`` (the order
  Flower's ndarray list and FedMR's tensor-wise recombination follow).
* Activations are ``nn.ReLU`` modules (not in-place, not functional) wherever a hidden layer has
  one, so FedNLR's activation statistics can hook them.

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

import math
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsuite.method.seeding import GLOBAL_TORCH_RNG

__all__ = [
    "MODELS",
    "build_model",
    "count_parameters",
    "mlp",
    "logreg",
    "cnn",
    "lenet5",
    "resnet18_gn",
    "resnet20",
    "vgg9",
    "vgg11",
    "vgg16",
    "vgg16_femnist_authors",
]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# vector models
# --------------------------------------------------------------------------------------------


class MLP(FeatureModel):
    """Flatten -> Linear(D, h1) -> ReLU -> Linear(h1, h2) -> ReLU -> head."""

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (200, 200)):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(in_features, hidden[0])
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.relu2 = nn.ReLU()
        self.head = nn.Linear(hidden[1], num_classes)

    def features(self, x: Tensor) -> Tensor:
        return self.relu2(self.fc2(self.relu1(self.fc1(self.flatten(x)))))


class LogReg(FeatureModel):
    """Multinomial logistic regression: features = flattened input, head = Linear(D, C)."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.flatten = nn.Flatten()
        self.head = nn.Linear(in_features, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return self.flatten(x)


def mlp(num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """Two hidden layers of 200 ReLU units over the flattened input (McMahan et al.'s 2NN)."""
    shape = _check_shape(input_shape)
    return MLP(math.prod(shape), _check_classes(num_classes))


def logreg(num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """Multinomial logistic regression (FedProx's model on the Synthetic benchmark)."""
    shape = _check_shape(input_shape)
    return LogReg(math.prod(shape), _check_classes(num_classes))


# --------------------------------------------------------------------------------------------
# small CNNs
# --------------------------------------------------------------------------------------------


class CNNCifar(FeatureModel):
    """FedMR code's ``CNNCifar``: conv(C->6,5) ReLU pool, conv(6->16,5) ReLU pool, FC 120, FC 84, head.

    About 62K parameters for 3x32x32 input and 10 classes. No normalisation layers.
    """

    def __init__(self, in_channels: int, num_classes: int, flat: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5)
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.relu2 = nn.ReLU()
        self.fc1 = nn.Linear(flat, 120)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(120, 84)
        self.relu4 = nn.ReLU()
        self.head = nn.Linear(84, num_classes)

    def features(self, x: Tensor) -> Tensor:
        x = self.pool(self.relu1(self.conv1(x)))
        x = self.pool(self.relu2(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.relu4(self.fc2(self.relu3(self.fc1(x))))


class CNNFemnist(FeatureModel):
    """FedMR code's ``CNNFashionMnist`` (its FEMNIST CNN): conv(1->16,5) pool ReLU, conv(16->32,5)
    pool ReLU, FC 512->256 ReLU, head. About 160K parameters for 62 classes. The code's unused
    ``Dropout2d`` is left out (it has no state)."""

    def __init__(self, in_channels: int, num_classes: int, flat: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 5)
        self.pool = nn.MaxPool2d(2)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.relu2 = nn.ReLU()
        self.fc1 = nn.Linear(flat, 256)
        self.relu3 = nn.ReLU()
        self.head = nn.Linear(256, num_classes)

    def features(self, x: Tensor) -> Tensor:
        x = self.relu1(self.pool(self.conv1(x)))
        x = self.relu2(self.pool(self.conv2(x)))
        return self.relu3(self.fc1(torch.flatten(x, 1)))


def _two_conv5_pool(name: str, shape: tuple[int, int, int], channels: int) -> int:
    """Flattened size after conv5 -> pool2 -> conv5 -> pool2 (no padding)."""
    _, h, w = shape
    dims = []
    for n in (h, w):
        n = _conv_out(n, 5) // 2
        n = _conv_out(n, 5) // 2
        dims.append(n)
    if min(dims) < 1:
        raise _too_small(name, shape, "needs H, W >= 16")
    return channels * dims[0] * dims[1]


def cnn(num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """McMahan-style 2-conv CNN as in FedMR's code.

    1-channel input (FEMNIST, 1x28x28): ``CNNFashionMnist`` (2 conv + 2 FC, flatten 512).
    Multi-channel input (CIFAR, 3x32x32): ``CNNCifar`` (2 conv + 3 FC, flatten 400; the paper says
    2 conv + 2 FC, but its CIFAR numbers come from this LeNet-5-like network).
    """
    shape = _image_shape("cnn", input_shape)
    num_classes = _check_classes(num_classes)
    if shape[0] == 1:
        return CNNFemnist(1, num_classes, _two_conv5_pool("cnn", shape, 32))
    return CNNCifar(shape[0], num_classes, _two_conv5_pool("cnn", shape, 16))


class LeNet5(FeatureModel):
    """FL-Simulator's ``LeNet`` (FedInit's code): conv(C->64,5) ReLU pool, conv(64->64,5) ReLU pool,
    FC 1600->384 ReLU, FC 384->192 ReLU, head. 797,962 parameters for 3x32x32 and 10 classes."""

    def __init__(self, in_channels: int, num_classes: int, flat: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 5)
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.relu2 = nn.ReLU()
        self.fc1 = nn.Linear(flat, 384)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(384, 192)
        self.relu4 = nn.ReLU()
        self.head = nn.Linear(192, num_classes)

    def features(self, x: Tensor) -> Tensor:
        x = self.pool(self.relu1(self.conv1(x)))
        x = self.pool(self.relu2(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.relu4(self.fc2(self.relu3(self.fc1(x))))


def lenet5(num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """LeNet-5 as in FL-Simulator (FedInit's CPU-scale model); the first FC is sized from the input."""
    shape = _image_shape("lenet5", input_shape)
    return LeNet5(shape[0], _check_classes(num_classes), _two_conv5_pool("lenet5", shape, 64))


# --------------------------------------------------------------------------------------------
# ResNet-18-GN (FedInit / FedMRUR)
# --------------------------------------------------------------------------------------------


def _gn(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=2, num_channels=channels)


class BasicBlockGN(nn.Module):
    """torchvision's BasicBlock with GroupNorm(2); attribute names kept (``bn1``, ``downsample``)
    so state_dict keys match torchvision / FL-Simulator (except ``fc`` -> ``head``)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = _gn(planes)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = _gn(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), _gn(planes))

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18GN(FeatureModel):
    """torchvision ``resnet18`` topology, every BatchNorm replaced by GroupNorm(2 groups).

    ``cifar_stem=False`` (default, as FL-Simulator, the code FedInit's and FedMRUR's settings come from): 7x7 stride-2 conv +
    3x3 stride-2 max-pool; on 32x32 input stage 4 is 1x1. ``cifar_stem=True``: 3x3 stride-1 conv, no
    max-pool (changes the paper numbers; not registered). No buffers: the whole state is trainable.
    """

    def __init__(self, in_channels: int, num_classes: int, cifar_stem: bool = False):
        super().__init__()
        if cifar_stem:
            self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        self.bn1 = _gn(64)
        self.relu = nn.ReLU()
        self.maxpool: nn.Module = nn.Identity() if cifar_stem else nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlockGN(64, 64), BasicBlockGN(64, 64))
        self.layer2 = nn.Sequential(BasicBlockGN(64, 128, 2), BasicBlockGN(128, 128))
        self.layer3 = nn.Sequential(BasicBlockGN(128, 256, 2), BasicBlockGN(256, 256))
        self.layer4 = nn.Sequential(BasicBlockGN(256, 512, 2), BasicBlockGN(512, 512))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(512, num_classes)
        # torchvision's init: Kaiming-normal (fan_out) convs, norm weight 1 / bias 0, default Linear.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.GroupNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def features(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)


def resnet18_gn(num_classes: int, input_shape: Sequence[int], cifar_stem: bool = False) -> nn.Module:
    """ResNet-18-GN (FedInit, FedMRUR). 11,181,642 params for 10 classes, 11,227,812 for 100."""
    shape = _image_shape("resnet18-gn", input_shape)
    return ResNet18GN(shape[0], _check_classes(num_classes), cifar_stem=cifar_stem)


# --------------------------------------------------------------------------------------------
# ResNet-20 (FedMR code: pre-activation bottleneck)
# --------------------------------------------------------------------------------------------


class PreActBottleneck(nn.Module):
    """BN-ReLU-conv1x1, BN-ReLU-conv3x3(stride), BN-ReLU-conv1x1(x4), plus shortcut on the raw input
    (a bias-free conv1x1 ``downsample`` on the first block of each stage, identity otherwise)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(inplanes)
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        residual = x if self.downsample is None else self.downsample(x)
        out = self.conv1(self.relu(self.bn1(x)))
        out = self.conv2(self.relu(self.bn2(out)))
        out = self.conv3(self.relu(self.bn3(out)))
        return out + residual


class ResNet20(FeatureModel):
    """FedMR code's ``ResNet20_cifar`` / ``ResNet20_mnist``: blocks [2, 2, 2], widths 16/32/64, x4.

    The final ``bn`` (BatchNorm(256)) is declared but not used in ``forward`` (as in the authors'
    code) so that the state_dict has the authors' 119 entries, in their order, ``head`` last.
    ``femnist=True`` adds the stem max-pool(3, stride 1, pad 1) of ``ResNet20_mnist``.
    """

    def __init__(self, in_channels: int, num_classes: int, femnist: bool = False):
        super().__init__()
        self.inplanes = 16
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.maxpool: nn.Module = nn.MaxPool2d(3, 1, 1) if femnist else nn.Identity()
        self.layer1 = self._make_layer(16, 2, 1)
        self.layer2 = self._make_layer(32, 2, 2)
        self.layer3 = self._make_layer(64, 2, 2)
        self.bn = nn.BatchNorm2d(64 * PreActBottleneck.expansion)  # unused in forward (authors' code)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(64 * PreActBottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / n))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 0.5)
                nn.init.zeros_(m.bias)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        exp = PreActBottleneck.expansion
        downsample = None
        if stride != 1 or self.inplanes != planes * exp:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * exp, 1, stride, bias=False))
        layers = [PreActBottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * exp
        layers += [PreActBottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def features(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.conv1(x))
        x = self.layer3(self.layer2(self.layer1(x)))
        return torch.flatten(self.avgpool(x), 1)


def resnet20(num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """FedMR's ResNet-20 as the authors' code builds it (pre-activation bottlenecks). 1-channel input -> FEMNIST variant (stem max-pool)."""
    shape = _image_shape("resnet20", input_shape)
    return ResNet20(shape[0], _check_classes(num_classes), femnist=shape[0] == 1)


# --------------------------------------------------------------------------------------------
# VGGs
# --------------------------------------------------------------------------------------------


def _pad_to(size: int, n: int) -> tuple[int, int]:
    extra = max(0, size - n)
    return extra // 2, extra - extra // 2


class _PaddedVGG(FeatureModel):
    """Shared by vgg9/11/16: zero-pad inputs smaller than ``min_size`` (centred), conv trunk,
    flatten, classifier (everything up to the head), head."""

    def _setup_pad(self, shape: tuple[int, int, int], min_size: int) -> tuple[int, int]:
        _, h, w = shape
        top, bottom = _pad_to(min_size, h)
        left, right = _pad_to(min_size, w)
        self._pad = (left, right, top, bottom)
        return h + top + bottom, w + left + right

    def features(self, x: Tensor) -> Tensor:
        if any(self._pad):
            x = F.pad(x, self._pad)
        x = torch.flatten(self.trunk(x), 1)
        return self.classifier(x)

    def extra_repr(self) -> str:
        return f"input_pad={self._pad}" if any(self._pad) else ""


def _conv_trunk(in_channels: int, cfg: Sequence, batch_norm: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    c = in_channels
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        elif v == "D":
            layers.append(nn.Dropout2d(0.05))
        else:
            layers.append(nn.Conv2d(c, v, 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(v))
            layers.append(nn.ReLU())
            c = v
    return nn.Sequential(*layers)


class VGG9(_PaddedVGG):
    """FedNLR's VGG-9 (NIID-Bench / FedMA ModerateCNN): 6 conv + 3 FC, no normalisation.

    3,491,530 params for 10 classes, 3,537,700 for 100. Init: Kaiming-uniform (ReLU) conv weights,
    Xavier-normal linear weights, PyTorch-default biases (the init the FedNLR paper states; biases not stated).
    """

    CFG = (32, 64, "M", 128, 128, "M", "D", 256, 256, "M")

    def __init__(self, shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        h, w = self._setup_pad(shape, 32)
        self.trunk = _conv_trunk(shape[0], self.CFG)
        flat = 256 * (h // 8) * (w // 8)
        self.classifier = nn.Sequential(
            nn.Dropout(0.1),
            nn.Linear(flat, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Dropout(0.1),
        )
        self.head = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight)


class VGG11(_PaddedVGG):
    """FedInit's VGG-11 (no details in the paper: the standard one): [64,M,128,M,256,256,M,512,512,M,512,512,M], no norm layers,
    classifier Linear(512,512)-ReLU-Linear(512,512)-ReLU-head, no dropout. torchvision VGG init
    (Kaiming-normal fan_out convs, N(0, 0.01) linears, zero biases)."""

    CFG = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")

    def __init__(self, shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        h, w = self._setup_pad(shape, 32)
        self.trunk = _conv_trunk(shape[0], self.CFG)
        flat = 512 * (h // 32) * (w // 32)
        self.classifier = nn.Sequential(nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU())
        self.head = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)


class VGG16(_PaddedVGG):
    """FedMR code's ``VGG16``: VGG-16-BN trunk, (AvgPool(1): a no-op, omitted), classifier
    Linear(512,4096)-ReLU-Dropout(0.5)-Linear(4096,4096)-ReLU-Dropout(0.5), head. PyTorch-default
    init (the authors' code sets none). 33,646,666 params and 97 state_dict entries for 10 classes.
    """

    CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")

    def __init__(self, shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        h, w = self._setup_pad(shape, 32)
        self.trunk = _conv_trunk(shape[0], self.CFG, batch_norm=True)
        flat = 512 * (h // 32) * (w // 32)
        self.classifier = nn.Sequential(
            nn.Linear(flat, 4096),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(4096, 4096),
            nn.ReLU(),
            nn.Dropout(0.5),
        )
        self.head = nn.Linear(4096, num_classes)


def vgg9(num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """FedNLR's VGG-9; inputs smaller than 32x32 are zero-padded to 32x32."""
    return VGG9(_image_shape("vgg9", input_shape), _check_classes(num_classes))


def vgg11(num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """FedInit's VGG-11 (no norm layers); inputs smaller than 32x32 are zero-padded to 32x32."""
    return VGG11(_image_shape("vgg11", input_shape), _check_classes(num_classes))


def vgg16(num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """A true VGG-16-BN; inputs smaller than 32x32 are zero-padded to 32x32 (FedMR's FEMNIST rows use vgg16_femnist_authors)."""
    return VGG16(_image_shape("vgg16", input_shape), _check_classes(num_classes))


class VGG16FemnistAuthors(FeatureModel):
    """FedMR code's ``VGG16_mnist`` (the paper's "VGG-16" on FEMNIST), reproduced as is: 5 convs without BN, each
    followed by ReLU: 1x1 conv(C->64, pad 1), 3x3 64->64, maxpool(2, s1), 3x3 64->128, maxpool(2, s1),
    3x3 128->256, 3x3 256->512, maxpool(2, s2), AdaptiveAvgPool(7x7), flatten 25088, Linear(25088,
    256) (no activation), head Linear(256, C). PyTorch-default init. Not comparable with a VGG-16.
    """

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Conv2d(in_channels, 64, 1, padding=1),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2, 1),
            nn.Conv2d(64, 128, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2, 1),
            nn.Conv2d(128, 256, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 512, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
            nn.AdaptiveAvgPool2d((7, 7)),
            nn.Flatten(),
            nn.Linear(25088, 256),
        )
        self.head = nn.Linear(256, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return self.trunk(x)


def vgg16_femnist_authors(num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """FedMR's FEMNIST "VGG-16" (really a 5-conv net), for reproducing FedMR's Table 1 only."""
    shape = _image_shape("vgg16_femnist_authors", input_shape)
    if min(shape[1:]) < 2:
        raise _too_small("vgg16_femnist_authors", shape, "needs H, W >= 2")
    return VGG16FemnistAuthors(shape[0], _check_classes(num_classes))


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

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
