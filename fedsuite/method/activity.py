"""How much a method's own distinguishing component acted in a run (issue 39, item 2).

A *component* is the part of a method that a claimed ordering is about: FedMRUR's hyperbolic
regulariser (FedMRUR against FedMRUR-N), FedInit's relaxed initialisation (FedInit against FedAvg,
SCAFFOLD + RI against SCAFFOLD), FedNLR's neuron-wise learning rates (FedNLR against FedAvg). A
component can be switched on and still do nothing (a regulariser whose gradient is a millionth of
the loss's); an ordering between the method and the method without it then compares a method with
itself, and its outcome was decided before the run started.

Each component is a :class:`Component`, declared beside the code it measures (its ``measure`` is a
number every client computes each round, cheaply, without touching the training: no parameter, no
gradient buffer and no random draw of the round changes):

* ``fedmrur.hyperbolic`` (``clients/fedmrur.py``): the regulariser's share of the step,
  ‖∇(γ·R)‖ / ‖∇L_CE‖;
* ``relaxed_init`` (``fedsuite/method/plugins/relaxed_init.py``): the start point's offset relative to
  the model, ‖w_{i,0} − s‖ / ‖s‖;
* ``neuron_lr`` (``fedsuite/method/plugins/neuron_lr.py``): the spread of the neuron-wise learning-rate
  factors, std(s) / mean(s).

A method registers its components (``fedsuite.method.registry.register_method(components=...)``), a
plug-in names its own (``ClientPlugin.component``); a run uses those of its method and of its
active plug-ins (``cfg.components``). The server writes the example-weighted cohort mean of each
measure into the round's ``metrics.jsonl`` line under the measure's name
(``FedSuiteStrategy.aggregate_train``), and ``summary.json`` gets :func:`summarize_activity`'s
``activity`` object. ``fedsuite reproduce`` reads it to call an ordering **inert here**
(``fedsuite.queues.reproduce.verdicts``).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:  # imported by joint_norm, the one function here that computes on tensors: reading
    import torch   # a run's config or records (fedsuite.config, fedsuite.records.results) never loads torch


@dataclass(frozen=True)
class Component:
    """One distinguishing component of a method and its activity measure.

    ``name``: the config switch that turns it on (``fedmrur.hyperbolic``, ``relaxed_init``,
    ``neuron_lr``), the name a tables file's ``components`` uses. ``measure``: the client metric
    and ``metrics.jsonl`` column holding the per-round value (≥ 0; 0 means the component changed
    nothing). ``threshold``: a run whose mean of the measure over its rounds is below it counts as
    inert. ``meaning``: the measure and its threshold in one line, for the report."""

    name: str
    measure: str
    threshold: float
    meaning: str

    def __post_init__(self) -> None:
        if not self.threshold > 0:
            raise ValueError(f"component {self.name}: the threshold must be > 0, got {self.threshold!r}")


def joint_norm(tensors: Iterable[torch.Tensor]) -> float:
    """‖(t_1, …, t_n)‖₂ over all tensors jointly, accumulated in float64 (a measure, not a step:
    float32 sums of squares of a large model lose digits). 0.0 for no tensors."""
    import torch

    total = 0.0
    for t in tensors:
        total += float(torch.sum(t.detach().double() ** 2))
    return math.sqrt(total)


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator for two norms, with 0 / 0 = 0 (nothing moved against nothing) and a
    zero denominator under a non-zero numerator read as the largest finite float (the component is
    all there is; finite, because a record writes a non-finite number as null)."""
    if denominator > 0:
        return min(numerator / denominator, sys.float_info.max)
    return 0.0 if numerator == 0 else sys.float_info.max


def summarize_activity(rows: Sequence[dict[str, Any]], components: Sequence[Component]) -> dict[str, dict[str, Any]]:
    """``summary.json``'s ``activity``: for each component of the run whose measure some round
    recorded, ``{"measure", "mean", "last", "threshold", "rounds", "inert"}`` with ``mean`` the mean
    of the measure over the rounds that recorded it, ``last`` the last of those, ``rounds`` their
    number and ``inert`` = mean < threshold. A component no round recorded (a run that failed in
    its first round, rounds recorded before the measure existed) is left out."""
    out: dict[str, dict[str, Any]] = {}
    for c in components:
        values = [float(r[c.measure]) for r in rows
                  if r.get("round", 0) > 0 and isinstance(r.get(c.measure), (int, float))
                  and not isinstance(r.get(c.measure), bool)]
        if not values:
            continue
        mean = sum(values) / len(values)
        out[c.name] = {"measure": c.measure, "mean": mean, "last": values[-1], "threshold": c.threshold,
                       "rounds": len(values), "inert": mean < c.threshold}
    return out
