"""The vector models (``mlp``, ``logreg``) and the small CNNs (``cnn``, ``lenet5``)."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor, nn

from fedsuite.models.base import FeatureModel, _check_classes, _check_shape, _conv_out, _image_shape, _too_small


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
