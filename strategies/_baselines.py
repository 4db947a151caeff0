"""Small pieces shared by the part-A baselines (not a method: modules named ``_*`` are not registered).

* :func:`reply_weights`: data-size weights (FedAvg, FedNova, FedExP) or uniform 1/|S| (SCAFFOLD and
  FedDyn papers, and FedInit's).
* :class:`FlowerOptAdapter`: lets a Flower server optimiser (``FedAdam``, ``FedAvgM``, ``FedYogi``)
  sit in front of :class:`FedSuiteStrategy` in the MRO, so Flower's ``__init__`` runs unchanged and
  its ``aggregate_train`` updates our validated, sorted, data-size-weighted mean;
  :class:`FlowerOptResult`, listed first, takes Flower's result back into the model's dtypes:
  ``class X(FlowerOptResult, flwr Y, FlowerOptAdapter)``.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

from flwr.app import ArrayRecord, Message

from fedsuite.arrays import conform, copy_arrays
from fedsuite.strategy import FedSuiteStrategy, ServerSetup
from fedsuite.wire import ClientReply, to_ndarrays, to_record

Weighting = Literal["uniform", "examples"]


def reply_weights(replies: list[ClientReply], weighting: Weighting) -> list[float]:
    return [float(r.num_examples) if weighting == "examples" else 1.0 for r in replies]


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
    flower_round_api = True

    def __init__(self, setup: ServerSetup | None = None, **_flower_kwargs: Any) -> None:
        setup = setup if setup is not None else self._pending_setup
        if setup is None:
            raise TypeError(f"{type(self).__name__} needs a ServerSetup")
        FedSuiteStrategy.__init__(self, setup)

    def state_dict(self) -> dict[str, Any]:
        """Flower's adaptive-optimiser moments m_t, v_t (FedAdam, FedYogi)."""
        return {"m_t": copy_arrays(getattr(self, "m_t", None)), "v_t": copy_arrays(getattr(self, "v_t", None))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.m_t, self.v_t = copy_arrays(state["m_t"]), copy_arrays(state["v_t"])


class FlowerOptResult:
    """The first base of a Flower server optimiser's strategy, ``class X(FlowerOptResult, flwr Y,
    FlowerOptAdapter)``: its ``aggregate_train`` runs after Flower's update (which ran on our
    validated mean), casts Flower's result back to the model's dtypes and remembers it as the global
    model. A subclass that overrides ``aggregate_train`` (FedAdam) calls ``super()``, which is this."""

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, Any]:
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return None, metrics
        self.global_arrays = conform(to_ndarrays(arrays), self.template)
        return to_record(self.global_arrays), metrics
