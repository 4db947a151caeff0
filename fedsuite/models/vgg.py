"""The VGGs: ``vgg9`` (FedNLR), ``vgg11`` (FedInit), ``vgg16`` (FedMR) and FedMR code's
``vgg16_femnist_authors``."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsuite.models.base import FeatureModel, _check_classes, _image_shape, _too_small


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
