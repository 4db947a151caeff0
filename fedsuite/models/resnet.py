"""The ResNets: ``resnet18-gn`` (FedInit, FedMRUR) and ``resnet20`` (FedMR's code)."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor, nn

from fedsuite.models.base import FeatureModel, _check_classes, _image_shape


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
