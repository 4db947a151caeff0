"""Small pieces shared by the part-A baselines (not a method: modules named ``_*`` are not registered).

* :func:`trainable_keys`: the state_dict keys of trainable parameters (control variates, FedDyn's h,
  FedExP's norms and server steps act on these; buffers such as BatchNorm statistics are averaged).
* :func:`server_step`: ``w^t + η_g (mean − w^t)`` written as ``mean + (η_g − 1)(mean − w^t)``, so
  η_g = 1 returns the mean itself, bit for bit equal to FedAvg's aggregate.
* :func:`reply_weights`: data-size weights (FedAvg, FedNova, FedExP) or uniform 1/|S| (SCAFFOLD and
  FedDyn papers; spec fedinit.md §7 A9).
* :class:`FlowerOptAdapter`: lets a Flower server optimiser (``FedAdam``, ``FedAvgM``, ``FedYogi``)
  sit in front of :class:`FedSuiteStrategy` in the MRO, so Flower's ``__init__`` runs unchanged and
  its ``aggregate_train`` updates our validated, sorted, data-size-weighted mean.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord

from strategies.base import ClientReply, FedSuiteStrategy, NDArrays, ServerSetup, to_ndarrays, to_record

Weighting = Literal["uniform", "examples"]


def trainable_keys(setup: ServerSetup) -> list[str]:
    """Names of trainable parameters: from a fresh model when the setup can build one, else every
    floating-point array of w^0 (hand-built setups in tests)."""
    if setup.build_model is not None:
        model = setup.build_model()
        names = {n for n, p in model.named_parameters() if p.requires_grad}
        return [k for k in setup.initial if k in names]
    return [k for k, v in setup.initial.items() if np.issubdtype(v.dtype, np.floating)]


def reply_weights(replies: list[ClientReply], weighting: Weighting) -> list[float]:
    return [float(r.num_examples) if weighting == "examples" else 1.0 for r in replies]


def server_step(mean: NDArrays, current: NDArrays, eta: float, keys: list[str]) -> NDArrays:
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
    out = {}
    for k, ref in like.items():
        a = np.asarray(arrays[k])
        out[k] = np.rint(a).astype(ref.dtype) if np.issubdtype(ref.dtype, np.integer) else a.astype(ref.dtype)
    return out


class FlowerOptAdapter(FedSuiteStrategy):
    """Base for ``class X(flwr.serverapp.strategy.Y, FlowerOptAdapter)``.

    MRO: X → Flower's Y (→ FedOpt) → FlowerOptAdapter → FedSuiteStrategy → Flower FedAvg. Flower's
    ``__init__`` chain ends here (``super().__init__(fraction_train=..., ...)``), where the setup
    stashed by the subclass is handed to :class:`FedSuiteStrategy`; Flower's own keyword arguments
    (sampling fractions, record keys) are dropped because FedSuiteStrategy fixes them.
    ``configure_train``/``aggregate_train`` of Flower's class call ``super()``, i.e. our
    deterministic cohort and our validated mean; Flower's update is then applied to that mean.
    """

    _pending_setup: ServerSetup | None = None

    def __init__(self, setup: ServerSetup | None = None, **_flower_kwargs: Any) -> None:
        setup = setup if setup is not None else self._pending_setup
        if setup is None:
            raise TypeError(f"{type(self).__name__} needs a ServerSetup")
        FedSuiteStrategy.__init__(self, setup)

    def state_dict(self) -> dict[str, Any]:
        """Flower's adaptive-optimiser moments m_t, v_t (FedAdam, FedYogi)."""
        return {"m_t": state_arrays(getattr(self, "m_t", None)), "v_t": state_arrays(getattr(self, "v_t", None))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.m_t, self.v_t = state_arrays(state["m_t"]), state_arrays(state["v_t"])

    def finish_round(self, arrays: ArrayRecord | None) -> ArrayRecord | None:
        """Cast Flower's result back to the model's dtypes and remember it as the global model."""
        if arrays is None:
            return None
        self.global_arrays = conform(to_ndarrays(arrays), self.template)
        return to_record(self.global_arrays)


def state_arrays(arrays: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    """A copy of a dict of arrays for ``state_dict`` (``None`` stays ``None``)."""
    return None if arrays is None else {k: np.array(v, copy=True) for k, v in arrays.items()}
