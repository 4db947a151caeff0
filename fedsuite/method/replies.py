"""What the server reads from a client's reply: one validator for every message type, the reason of
an error reply, and the example-weighted mean of the clients' metrics.

A reply has two stages, two types: a :class:`Reply` is what the channel (``fedsuite.method.channel``)
hands back for one partition, of any message type: the content as it came (undecoded records), or
an error. A training reply that :func:`check_reply` accepts becomes a ``fedsuite.method.wire.ClientReply``
(``FedSuiteStrategy.parse_replies``): its arrays decoded and checked, its ``num-examples`` and
metrics as numbers, its extra records decoded; that is what a server rule aggregates. A rejected or
error reply never becomes one (its reason goes into the round's log); evaluation and statistics
replies are read straight from their checked :class:`Reply`.

:func:`check_reply` serves training replies (``"arrays"`` + ``"metrics"``, checked against the
model's names and shapes) and statistics replies (``"statistics"``) alike. It reads the records'
names and shapes before it decodes any array, and returns either what is wrong (the reason the
strategy logs and records in the round's ``drop_reasons``) or the decoded ArrayRecords.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterable

from flwr.app import ArrayRecord, RecordDict

from fedsuite.method.arrays import NDArrays
from fedsuite.method.wire import (
    ARRAYS_KIND, METRICS_KIND, MODEL_LAYOUT, NUM_EXAMPLES, TRAINABLE_LAYOUT, ClientReply, Record, decode_records,
    nonfinite_values,
)


@dataclass(frozen=True)
class Reply:
    """A client's answer as the channel hands it back, not yet checked: its ``content``, or ``error``
    (why it failed: the informative part of the reason, :func:`failure_reason`). An accepted training
    reply becomes a ``fedsuite.method.wire.ClientReply`` (see module)."""

    content: RecordDict | None = None
    error: str | None = None

    def has_error(self) -> bool:
        return self.error is not None


def failure_reason(reason: str) -> str:
    """The informative part of an error reply's reason. Flower wraps a ClientApp's exception as
    ``<class '...ClientAppException'>:<'...Exception ClientAppException occurred. Message: MSG'>``;
    this returns ``MSG`` (or the last non-empty line of any other reason)."""
    text = str(reason)
    marker = "occurred. Message: "
    if marker in text:
        text = text.split(marker, 1)[1]
        if text.endswith("'>"):
            text = text[:-2]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"


def check_reply(reply: Reply, arrays: str | None, metrics: str | None = None,
                template: NDArrays | None = None, keys: Iterable[str] = (), records: Iterable[Record] = (),
                trainable: Collection[str] | None = None) -> tuple[str | None, dict[str, NDArrays]]:
    """Validate a reply that must hold the ArrayRecord ``arrays`` (when given: an evaluation reply
    has none) and the MetricRecord ``metrics`` with :data:`~fedsuite.method.wire.NUM_EXAMPLES` and every one
    of ``keys`` (when given), each a number (a loss may be NaN: a diverged model's). With a
    ``template``, ``arrays`` must have its names and shapes. Every declared record of ``records``
    (``fedsuite.method.wire.Record``: the engine's and the method's) must be there unless it is optional: a
    metric in ``metrics``, a number; an ArrayRecord with the model's layout (``template``), the
    trainable parameters' (``trainable``, shapes from ``template``) or its declared ``entries``.
    Returns ``(problem, {})`` for an error reply, a missing record or metric, a misshapen record, a
    layout that differs from the template or non-finite array values; else ``(None, every
    ArrayRecord decoded)``."""
    if reply.has_error():
        return f"client error: {reply.error}", {}
    content = reply.content
    if (arrays is not None and arrays not in content.array_records) or (
            metrics is not None and metrics not in content.metric_records):
        return "reply lacks " + " or ".join(repr(n) for n in (arrays, metrics) if n is not None), {}
    if metrics is not None:
        for key in (NUM_EXAMPLES, *keys):
            if key not in content[metrics]:
                return f"{metrics} lack {key!r}", {}
        for key in keys:
            value = content[metrics][key]
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                return f"{metrics}[{key!r}] is {value!r}, not a number", {}
    if template is not None:
        problem = layout_problem(content[arrays], template)
        if problem:
            return problem, {}
    for record in records:
        problem = record_problem(content, record, metrics, template, trainable)
        if problem:
            return problem, {}
    records = decode_records(content)
    problem = nonfinite_values(records)
    return (problem, {}) if problem else (None, records)


def record_problem(content: RecordDict, record: Record, metrics: str | None, template: NDArrays | None,
                   trainable: Collection[str] | None) -> str | None:
    """What is wrong with declared ``record`` in a reply's ``content`` (read before decoding), or None:
    a missing required record, a metric that is not a number, an arrays record whose names or shapes
    are not its declared layout's or that lacks one of its declared entries."""
    if record.kind == METRICS_KIND and metrics is not None:
        if record.name not in content[metrics]:
            return None if record.optional else f"{metrics} lack {record.name!r}"
        value = content[metrics][record.name]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return f"{metrics}[{record.name!r}] is {value!r}, not a number"
    elif record.kind == ARRAYS_KIND:
        if record.name not in content.array_records:
            return None if record.optional else f"reply lacks record {record.name!r}"
        arrays = content[record.name]
        if record.layout == MODEL_LAYOUT and template is not None:
            problem = layout_problem(arrays, template)
        elif record.layout == TRAINABLE_LAYOUT and template is not None and trainable is not None:
            problem = layout_problem(arrays, {k: template[k] for k in trainable}, "the trainable parameters'")
        else:
            missing = [e for e in record.entries if e not in arrays]
            problem = f"lacks {missing[0]!r}" if missing else None
        if problem:
            return f"record {record.name!r}: {problem}"
    return None


def layout_problem(record: ArrayRecord, template: NDArrays, whose: str = "the model's") -> str | None:
    """How an ArrayRecord's names or shapes differ from ``template``'s (read before decoding); None if not."""
    if set(record.keys()) != set(template):
        return f"array names differ from {whose}"
    for key, arr in record.items():
        if tuple(arr.shape) != tuple(template[key].shape):
            return f"array {key!r} has shape {tuple(arr.shape)}, expected {tuple(template[key].shape)}"
    return None


def metric_means(replies: Iterable[ClientReply], keep: Callable[[str], bool]) -> dict[str, float]:
    """Example-weighted mean, over ``replies``, of each scalar metric every reply reports and ``keep``
    accepts, by metric name in sorted order (the round's training metrics, FedNLR's diagnostics)."""
    replies = list(replies)
    total = sum(r.num_examples for r in replies)
    keys = set.intersection(*(set(r.metrics) for r in replies))
    return {k: sum(r.metrics[k] * r.num_examples for r in replies) / total for k in sorted(keys) if keep(k)}
