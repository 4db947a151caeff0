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
evaluates it on its own test data (``fedsuite.engine.runtime.client_split``) and replies with ``"metrics"``:
``partition-id``, ``num-examples`` (its test samples) and :func:`evaluation_keys`.

A statistics query (message type :data:`STATISTICS_QUERY`, server → client) holds ``"arrays"`` (the
model w to describe) and ``"config"`` (``server-round``); the client trains nothing and replies with
the ArrayRecord :data:`STATISTICS` (whatever its rule's ``statistics`` computes, e.g. CCVR's per-class
feature moments) and ``"metrics"`` (``partition-id``, ``num-examples``).

**Declared records.** Every record a method's two halves exchange is a :class:`Record` (its name,
its kind: ``arrays`` (an ArrayRecord of its own), ``metrics`` (a key of the reply's ``"metrics"``)
or ``config`` (a key of the message's ``"config"``), and for arrays whether they follow the model's
layout), declared once in the method's client module, which its strategy imports; a method's
:class:`Records` list what its server sends (``message``), what each training reply holds
(``reply``) and what a statistics reply holds (``statistics``), and its registration carries them
(``register_method(..., records=...)``). The engine's own are :data:`TRAIN_MESSAGE` and
:data:`TRAIN_REPLY`. The server validates every reply against them (``fedsuite.method.replies.check_reply``:
a missing or misshapen record is a failed reply with its reason, as a NaN is), the ClientApp every
message (:func:`message_problem`: a message without a declared config key or record fails the reply
with the reason); both halves then read a declared record by indexing, never with a fallback.
"""

from __future__ import annotations

import re
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict

from fedsuite.method.arrays import NDArrays
from fedsuite.method.messages import (  # noqa: F401  (the declaration types, re-exported: a method imports them from here)
    ARRAYS_KIND, CONFIG_KIND, METRICS_KIND, MODEL_LAYOUT, TRAINABLE_LAYOUT, Record, Records,
)

#: record names used by more than one side or method
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
#: the MetricRecord of a node's answer to the partition query (``fedsuite.engine.nodes``), holding :data:`PARTITION_ID`
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


#: the engine's own records of a training message: the round and the local learning rate η_l^t
TRAIN_MESSAGE = (Record(SERVER_ROUND, CONFIG_KIND), Record(LR, CONFIG_KIND))
#: the engine's own metrics of a training reply: n_i (the aggregation weight) and the mean local loss;
#: the local steps, the training seconds and the partition id describe the reply (``clients.jsonl``)
#: and may be absent from another ClientApp's reply; a method that needs the steps declares them
#: required (:data:`NUM_STEPS_RECORD`)
TRAIN_REPLY = (
    Record(NUM_EXAMPLES, METRICS_KIND), Record(TRAIN_LOSS, METRICS_KIND), Record(NUM_STEPS, METRICS_KIND, optional=True),
    Record(TRAIN_SECONDS, METRICS_KIND, optional=True), Record(PARTITION_ID, METRICS_KIND, optional=True),
)
#: the local steps K_i as a required metric (FedNova, the FedCM family's momentum)
NUM_STEPS_RECORD = Record(NUM_STEPS, METRICS_KIND)
#: the checksum of what the client received, required where the server asked (strategies/pool.py)
RECEIVED_CHECKSUM_RECORD = Record(RECEIVED_CHECKSUM, METRICS_KIND)


def reply_records(records: Records, cfg: Any) -> tuple[Record, ...]:
    """The records a training reply of the run with config ``cfg`` is checked for: the engine's
    (:data:`TRAIN_REPLY`), where the method declares one again its declaration, then the method's."""
    own = {r.name for r in records.reply}
    return tuple(r for r in TRAIN_REPLY if r.name not in own) + tuple(r for r in records.reply if r.applies(cfg))


def message_problem(content: Any, records: Iterable[Record], cfg: Any) -> str | None:
    """What a training message (a RecordDict) lacks of the declared ``records`` (the engine's
    :data:`TRAIN_MESSAGE` and the method's ``message``), or None: every required config key in
    ``"config"``, every required arrays record present with its ``entries``."""
    config = content[CONFIG] if CONFIG in content.config_records else {}
    for record in records:
        if not record.applies(cfg):
            continue
        if record.kind == CONFIG_KIND:
            if record.name not in config and not record.optional:
                return f"message config lacks {record.name!r}"
        elif record.kind == ARRAYS_KIND:
            if record.name not in content.array_records:
                if not record.optional:
                    return f"message lacks record {record.name!r}"
                continue
            missing = [e for e in record.entries if e not in content[record.name]]
            if missing:
                return f"message record {record.name!r} lacks {missing[0]!r}"
    return None


def evaluation_keys(finetune_steps: int) -> tuple[str, ...]:
    """The metrics an evaluation reply must hold (besides ``partition-id`` and ``num-examples``) when
    the run's ``finetune_steps`` is as given: a reply without one of them is a failed reply."""
    return (EVAL_ACCURACY, EVAL_LOSS) + ((PERSONAL_ACCURACY, PERSONAL_LOSS) if finetune_steps > 0 else ())


@dataclass
class ClientReply:
    """An accepted training reply, what a server rule aggregates: the checked and decoded form of a
    channel's ``fedsuite.method.replies.Reply`` (``FedSuiteStrategy.parse_replies``): the partition id,
    the model ``arrays``, n_i (``num_examples``), the scalar ``metrics`` and the method's extra
    ArrayRecords (``extras``, by record name), all decoded."""

    partition_id: int
    arrays: NDArrays
    num_examples: int
    metrics: dict[str, float]
    extras: dict[str, NDArrays]


def to_ndarrays(record: ArrayRecord) -> NDArrays:
    """The record's arrays as numpy arrays (:func:`ndarray` each)."""
    return {k: ndarray(v) for k, v in record.items()}


def to_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """The record's arrays as CPU tensors, in the record's order (a state_dict for ``"arrays"``)."""
    return {k: torch.from_numpy(ndarray(v)) for k, v in record.items()}


#: the header ``np.save`` writes (``numpy.lib.format``: the dict's keys sorted, each value's repr):
#: ``{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }``, then spaces and a newline
_NPY_HEADER = re.compile(r"\{'descr': '([^']+)', 'fortran_order': (True|False), 'shape': \((\d+(?:, \d+)*,?)?\), \}")
_NPY_MAGIC = b"\x93NUMPY"
#: the .npy readers that parse their header as Python (``np.load``), one at a time
_NPY_PARSE_LOCK = threading.Lock()


def ndarray(array: Array) -> np.ndarray:
    """The numpy array an ``Array`` holds, equal to Flower's ``Array.numpy()`` (``np.load`` of its
    .npy bytes: the same dtype, shape and memory order, a writable copy), read without parsing Python.

    ``np.load`` reads a .npy header with ``ast.literal_eval``, and CPython 3.11's builder of AST
    objects counts its recursion depth in one counter per process, not per thread (cpython
    gh-106905): two of the in-process engine's client threads decoding their messages at once then
    fail now and then with ``SystemError: AST constructor recursion depth mismatch``. The header
    ``np.save`` writes (every Array Flower makes from an ndarray) is matched by :data:`_NPY_HEADER`
    instead; any other header (another writer's, a structured dtype) is read by ``np.load`` under
    :data:`_NPY_PARSE_LOCK`, which also raises numpy's own error for bytes that are not an array."""
    data = array.data
    if array.stype == "numpy.ndarray" and data[:6] == _NPY_MAGIC and data[6] in (1, 2, 3):
        size_bytes = 2 if data[6] == 1 else 4
        start = 8 + size_bytes
        end = start + int.from_bytes(data[8:start], "little")
        match = _NPY_HEADER.fullmatch(data[start:end].decode("latin-1").rstrip(" \n"))
        if match:
            dtype = np.dtype(match[1])
            shape = tuple(int(n) for n in (match[3] or "").split(",") if n.strip())
            count = int(np.prod(shape, dtype=np.int64))
            if not dtype.hasobject and dtype.itemsize > 0 and len(data) == end + count * dtype.itemsize:
                flat = np.frombuffer(data, dtype=dtype, count=count, offset=end)
                if match[2] == "True":  # np.save wrote the transpose's C order
                    return flat.reshape(shape[::-1]).transpose().copy(order="K")
                return flat.reshape(shape).copy()
    with _NPY_PARSE_LOCK:
        return array.numpy()


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
