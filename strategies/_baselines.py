"""A small piece shared by the part-A baselines (not a method: modules named ``_*`` are not registered).

* :func:`reply_weights`: each reply's aggregation weight for SCAFFOLD's and FedDyn's ``weighting``:
  its data size n_i (``"examples"``, FedAvg's weights) or 1 (``"uniform"``: 1/|S| once normalised,
  as in the SCAFFOLD and FedDyn papers, and FedInit's code).
"""

from __future__ import annotations

from typing import Literal

from fedsuite.method.wire import ClientReply

Weighting = Literal["uniform", "examples"]


def reply_weights(replies: list[ClientReply], weighting: Weighting) -> list[float]:
    return [float(r.num_examples) if weighting == "examples" else 1.0 for r in replies]
