"""Batched, device-side augmentation and normalisation (no PIL, no per-sample Python).

``augment_batch`` works on uint8 or float images ``[B, C, H, W]`` on any device and is
deterministic given the ``torch.Generator`` it is handed. Kinds:

* ``none``           identity.
* ``crop-flip``      random crop back to HxW from the image zero-padded by ``padding`` pixels
                     (default ``max(1, H // 8)``: 4 for 32x32, 8 for 64x64) and a horizontal flip
                     with p=0.5: torchvision's ``RandomCrop(H, padding) + RandomHorizontalFlip``
                     (our choice for FedNLR, whose paper names no augmentation).
* ``crop-flip-p50``  the FedDyn/FL-Simulator code lineage (FedInit's code; our choice for FedMRUR): flip with
                     p=0.5, then, with p=0.5, the padded random crop.
* ``crop``           padded random crop only (the FedInit paper's wording).
* ``flip``           horizontal flip only.

Padding is done with zeros on the tensor handed in: call it on raw uint8 images (black padding,
as torchvision does on PIL images) before :func:`to_float`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .bundle import AUGMENT_KINDS

__all__ = ["augment_batch", "to_float"]


def _rand(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand(n, generator=generator, device=generator.device).to(device)


def _flip(x: torch.Tensor, generator: torch.Generator, p: float = 0.5) -> torch.Tensor:
    mask = _rand(x.shape[0], generator, x.device) < p
    return torch.where(mask[:, None, None, None], x.flip(-1), x)


def _crop(x: torch.Tensor, generator: torch.Generator, padding: int, p: float = 1.0) -> torch.Tensor:
    b, c, h, w = x.shape
    gdev = generator.device
    oy = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=gdev).to(x.device)
    ox = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=gdev).to(x.device)
    if p < 1.0:
        keep = _rand(b, generator, x.device) >= p  # these samples are not cropped
        oy = torch.where(keep, torch.full_like(oy, padding), oy)
        ox = torch.where(keep, torch.full_like(ox, padding), ox)
    padded = F.pad(x, (padding, padding, padding, padding))
    rows = (oy[:, None] + torch.arange(h, device=x.device)[None, :])  # [B, H]
    cols = (ox[:, None] + torch.arange(w, device=x.device)[None, :])  # [B, W]
    bi = torch.arange(b, device=x.device)[:, None, None, None]
    ci = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]


def augment_batch(
    x: torch.Tensor, kind: str, generator: torch.Generator, *, padding: int | None = None
) -> torch.Tensor:
    """Augment a batch of images ``[B, C, H, W]`` (any dtype/device); returns a new tensor.

    Same shape, dtype and device as ``x``. The random draws come from ``generator`` (which may
    live on the CPU while ``x`` is on a GPU), so a seeded generator gives the same result.
    """
    if kind not in AUGMENT_KINDS:
        raise ValueError(f"Unknown augmentation {kind!r}; choose one of {', '.join(AUGMENT_KINDS)}.")
    if kind == "none" or x.shape[0] == 0:
        return x
    if x.dim() != 4:
        raise ValueError(f"augment_batch needs images [B, C, H, W]; got shape {tuple(x.shape)}.")
    pad = max(1, x.shape[-2] // 8) if padding is None else int(padding)
    if kind == "crop-flip":
        return _flip(_crop(x, generator, pad), generator)
    if kind == "crop-flip-p50":
        return _crop(_flip(x, generator), generator, pad, p=0.5)
    if kind == "crop":
        return _crop(x, generator, pad)
    return _flip(x, generator)


def to_float(x: torch.Tensor, bundle: Any) -> torch.Tensor:
    """uint8 images -> float32 ``(x / 255 - mean) / std`` per channel; anything else unchanged.

    ``bundle`` is a :class:`DatasetBundle` (or anything with ``mean``/``std`` attributes).
    """
    if x.dtype != torch.uint8:
        return x
    out = x.to(torch.float32).div_(255.0)
    mean, std = getattr(bundle, "mean", None), getattr(bundle, "std", None)
    if mean is None or std is None:
        return out
    if x.dim() < 3:
        raise ValueError(f"to_float needs images [..., C, H, W]; got shape {tuple(x.shape)}.")
    shape = [1] * x.dim()
    shape[-3] = -1
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(shape)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(shape)
    return out.sub_(m).div_(s)
