"""The wire format between the ServerApp and the ClientApp: record names, conversions, checksums,
and the validated reply a server rule works on.

A training message (server → client) holds

* ``"arrays"`` (:data:`ARRAYS`): the model the client starts from (state_dict order);
* ``"config"`` (:data:`CONFIG`): ``server-round``, ``lr`` and per-round values of the method, and
  :data:`CHECKSUM_REQUEST` where the server wants to verify what the client received;
* extra ArrayRecords a method or plug-in adds (SCAFFOLD's ``"server-cv"``, the momentum direction
  :data:`MOMENTUM`, relaxed initialisation's ``"start"``, ...).

A reply (client → server) holds ``"arrays"`` (what is aggregated), ``"metrics"`` (:data:`METRICS`:
``num-examples``, ``train-loss``, ``partition-id``, ``received-checksum`` when the config asked for
it, and the rule's own) and the rule's extra ArrayRecords.

An evaluation message (message type ``"evaluate"``: federated evaluation, ``federated_eval``) holds
``"arrays"`` (the global model to evaluate) and ``"config"`` (``server-round``, ``lr``); the client
evaluates it on its own test data (``fedsuite.runtime.client_split``) and replies with ``"metrics"``:
``partition-id``, ``num-examples`` (its test samples) and :func:`evaluation_keys`.

A statistics query (message type :data:`STATISTICS_QUERY`, server → client) holds ``"arrays"`` (the
model w to describe) and ``"config"`` (``server-round``); the client trains nothing and replies with
the ArrayRecord :data:`STATISTICS` (whatever its rule's ``statistics`` computes, e.g. CCVR's per-class
feature moments) and ``"metrics"`` (``partition-id``, ``num-examples``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict

from fedsuite.arrays import NDArrays

#: record names used by more than one side or method
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
#: the MetricRecord of a node's answer to the partition query (``fedsuite.nodes``), holding :data:`PARTITION_ID`
INFO = "info"
#: keys every client reports: its partition id (partition query and replies) and, in ``"metrics"``,
#: its number of examples (the aggregation weight)
PARTITION_ID = "partition-id"
NUM_EXAMPLES = "num-examples"
#: metric: the local SGD steps the client took (the shared loop reports it: FedNova, the FedCM family)
NUM_STEPS = "num-steps"
#: the metric of a reply to a training message that asked for :data:`CHECKSUM_REQUEST`
RECEIVED_CHECKSUM = "received-checksum"
#: config keys of every training message and statistics query
SERVER_ROUND = "server-round"
#: the server's momentum direction m^t (FedCM family), an extra ArrayRecord of the training message
MOMENTUM = "momentum"
#: a config key: when true, the ClientApp reports ``received-checksum`` (:func:`record_checksum` of the
#: arrays it received). Server rules that send each client its own model ask for it
#: (strategies/pool.py); others do not, and the client saves a CRC over the model (about 30 ms for
#: ResNet-18-GN) per message
CHECKSUM_REQUEST = "report-checksum"
#: the message type of a statistics query (Flower routes it to the ClientApp's ``@app.query("statistics")``)
STATISTICS_QUERY = "query.statistics"
#: the ArrayRecord of a statistics reply
STATISTICS = "statistics"
#: metric of every training reply: the seconds the client's local training took (its own clock;
#: ``clients.jsonl``'s ``train_seconds``, never averaged or compared between runs)
TRAIN_SECONDS = "train-seconds"
#: metric of every training reply: the mean loss of the client's local steps
TRAIN_LOSS = "train-loss"
#: config key of an evaluation message: the local learning rate of a personalised evaluation's steps
LR = "lr"
#: metrics of an evaluation reply (message type ``"evaluate"``, Flower's ``MessageType.EVALUATE``):
#: the global model's accuracy and mean cross-entropy on the client's own test data (whose size is
#: the reply's :data:`NUM_EXAMPLES`) ...
EVAL_ACCURACY = "eval-accuracy"
EVAL_LOSS = "eval-loss"
#: ... and, with ``finetune_steps`` > 0, the same of the personalised model (the global model after
#: ``finetune_steps`` local SGD steps on the client's training data)
PERSONAL_ACCURACY = "personal-accuracy"
PERSONAL_LOSS = "personal-loss"


def evaluation_keys(finetune_steps: int) -> tuple[str, ...]:
    """The metrics an evaluation reply must hold (besides ``partition-id`` and ``num-examples``) when
    the run's ``finetune_steps`` is as given: a reply without one of them is a failed reply."""
    return (EVAL_ACCURACY, EVAL_LOSS) + ((PERSONAL_ACCURACY, PERSONAL_LOSS) if finetune_steps > 0 else ())


@dataclass
class ClientReply:
    """A validated training reply."""

    partition_id: int
    arrays: NDArrays
    num_examples: int
    metrics: dict[str, float]
    extras: dict[str, NDArrays]


def to_ndarrays(record: ArrayRecord) -> NDArrays:
    return {k: v.numpy() for k, v in record.items()}


def to_record(arrays: Mapping[str, np.ndarray | torch.Tensor]) -> ArrayRecord:
    """An ArrayRecord of numpy arrays or tensors (tensors are detached and copied to the host)."""
    return ArrayRecord({k: Array(np.require(_numpy(v), requirements="C")) for k, v in arrays.items()})


def _numpy(value: np.ndarray | torch.Tensor) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value


def record_nbytes(content: RecordDict) -> int:
    return sum(len(arr.data) for rec in content.array_records.values() for arr in rec.values())


def record_checksum(record: ArrayRecord) -> int:
    """CRC-32 of an ArrayRecord's serialised arrays in record order (the bytes on the wire). The
    ClientApp reports it for what it received as metric ``received-checksum``, so a server rule that
    sends each client a different model can check who trained from what (strategies/pool.py)."""
    crc = 0
    for arr in record.values():
        crc = zlib.crc32(arr.data, crc)
    return crc


def decode_records(content: RecordDict) -> dict[str, NDArrays]:
    """Every ArrayRecord of ``content`` as numpy arrays, by record name (each array decoded once)."""
    return {name: to_ndarrays(rec) for name, rec in content.array_records.items()}


def nonfinite_values(records: Mapping[str, NDArrays]) -> str | None:
    """The first floating-point array of decoded ``records`` holding NaN or ±inf, named; None if none."""
    for name, arrays in records.items():
        for key, value in arrays.items():
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                return f"non-finite values in {name}[{key!r}]"
    return None
