"""Array maths shared by server rules, client rules and plug-ins; one copy of each.

* :func:`weighted_sum64` / :func:`weighted_mean`: Σ_i w_i a_i / Σ_i w_i per key, accumulated in
  float64 (``acc += a_i · (w_i / Σ w)``, in reply order) and cast back (integers rounded);
* :func:`server_step`: w^t + η (mean − w^t), written so that η = 1 returns the mean bit for bit;
* :func:`conform`: cast to a template's dtypes;
* :func:`trainable_keys`: state_dict names of a model's trainable parameters (control variates,
  relaxations and norms act on these; buffers such as BatchNorm statistics are averaged);
* :func:`norm` (numpy, float64) and :func:`tensor_norm` (torch): one L2 norm over all arrays jointly.
"""

from __future__ import annotations

import warnings
from typing import Iterable, Sequence

import numpy as np
import torch

NDArrays = dict[str, np.ndarray]


#: elements per block of :func:`weighted_sum64` (float64: 4 MiB for the accumulator and its scratch
#: together, so both stay in cache while every client's slice is added)
SUM_BLOCK = 1 << 19


def weighted_sum64(arrays: Sequence[NDArrays], weights: Sequence[float], like: NDArrays) -> dict[str, np.ndarray]:
    """Σ_i a_i (w_i / Σ w) per key of ``like``, as float64 arrays (no cast back).

    Each term is rounded as ``acc += float64(a_i) * (w_i / Σ w)`` in reply order (the product rounded,
    then the sum), exactly as numpy's ``acc += a.astype(float64) * c`` would: the result is bit for
    bit that loop's. It runs in torch, one cache-sized block of elements at a time across all
    clients, on torch's intra-op threads (``benchmarks/aggregation.py``; 6x numpy's loop for a
    134 M-parameter model on 2 cores, ``benchmarks/README.md``)."""
    total = float(sum(weights))
    scales = [w / total for w in weights]
    out: dict[str, np.ndarray] = {}
    scratch = torch.empty(SUM_BLOCK, dtype=torch.float64)
    for key, ref in like.items():
        flat = [_tensor_view(a[key]).reshape(-1) for a in arrays]  # a copy only where not contiguous
        acc = torch.zeros(np.size(ref), dtype=torch.float64)
        for lo in range(0, acc.numel(), SUM_BLOCK):
            hi = min(lo + SUM_BLOCK, acc.numel())
            acc_block, term = acc[lo:hi], scratch[: hi - lo]
            for a, scale in zip(flat, scales):
                term.copy_(a[lo:hi])  # exact: every float32 and every integer below 2^53 is a float64
                term.mul_(scale)
                acc_block.add_(term)
        out[key] = acc.numpy().reshape(np.shape(ref))
    return out


def _tensor_view(array: np.ndarray) -> torch.Tensor:
    """``array`` as a tensor sharing its memory. The callers here only read it, so torch's warning
    about a read-only array (a view of an immutable buffer) does not apply."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.asarray(array))


def cast_like(value: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """A new array: ``value`` in ``ref``'s dtype, integers rounded half to even (``np.rint``); floats
    are cast by torch (round to nearest even, as numpy's ``astype``; 3.4x faster on 2 cores)."""
    if np.issubdtype(ref.dtype, np.integer):
        return np.rint(value).astype(ref.dtype)
    target = torch.from_numpy(np.empty(0, dtype=ref.dtype)).dtype
    return _tensor_view(value).to(target, copy=True).numpy()


def weighted_mean(arrays: Sequence[NDArrays], weights: Sequence[float], like: NDArrays) -> NDArrays:
    """Σ_i a_i w_i / Σ_i w_i per key, in float64, cast back to ``like``'s dtypes (ints rounded)."""
    mean = weighted_sum64(arrays, weights, like)
    return {key: cast_like(mean[key], ref) for key, ref in like.items()}


def uniform_mean(models: Sequence[NDArrays], like: NDArrays) -> NDArrays:
    """(1/K) Σ_i u_i per key in float64; integer buffers rounded back to their dtype."""
    return weighted_mean(models, [1.0] * len(models), like)


def server_step(mean: NDArrays, current: NDArrays, eta: float, keys: Iterable[str]) -> NDArrays:
    """w^{t+1} = w^t + η (mean − w^t) on ``keys`` (float64, cast back); other arrays = mean."""
    if eta == 1.0:
        return dict(mean)
    out = dict(mean)
    for k in keys:
        m = mean[k].astype(np.float64)
        out[k] = (m + (eta - 1.0) * (m - current[k].astype(np.float64))).astype(mean[k].dtype)
    return out


def conform(arrays: NDArrays, like: NDArrays) -> NDArrays:
    """Cast to ``like``'s dtypes (integer buffers rounded), in ``like``'s key order."""
    return {k: cast_like(np.asarray(arrays[k]), ref) for k, ref in like.items()}


def copy_arrays(arrays: NDArrays | None) -> NDArrays | None:
    """A copy of a dict of arrays (for ``state_dict``); ``None`` stays ``None``."""
    return None if arrays is None else {k: np.array(v, copy=True) for k, v in arrays.items()}


def trainable_keys(model: torch.nn.Module) -> list[str]:
    """state_dict names of the trainable parameters, in state_dict order."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def norm(arrays: Iterable[np.ndarray]) -> float:
    """‖(a_1, …, a_n)‖₂ over all arrays jointly, in float64."""
    return float(np.sqrt(sum(float(np.vdot(a, a)) for a in arrays)))


def tensor_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """‖(t_1, …, t_n)‖₂ over all tensors jointly (a 0-dim tensor on their device)."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors]))
