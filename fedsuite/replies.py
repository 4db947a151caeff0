"""What the server reads from a client's reply: one validator for every message type, the reason of
an error reply, and the example-weighted mean of the clients' metrics. A :class:`Reply` is what a
transport (``fedsuite.transport``) hands back for one partition: the content, or an error.

:func:`check_reply` serves training replies (``"arrays"`` + ``"metrics"``, checked against the
model's names and shapes) and statistics replies (``"statistics"``) alike. It reads the records'
names and shapes before it decodes any array, and returns either what is wrong (the reason the
strategy logs and records in the round's ``drop_reasons``) or the decoded ArrayRecords.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from flwr.app import ArrayRecord, RecordDict

from fedsuite.arrays import NDArrays
from fedsuite.wire import NUM_EXAMPLES, ClientReply, decode_records, nonfinite_values


@dataclass(frozen=True)
class Reply:
    """A client's answer: its ``content``, or ``error`` (why it failed: the informative part of the
    reason, ``fedsuite.replies.failure_reason``)."""

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
                template: NDArrays | None = None, keys: Iterable[str] = ()) -> tuple[str | None, dict[str, NDArrays]]:
    """Validate a reply that must hold the ArrayRecord ``arrays`` (when given: an evaluation reply
    has none) and the MetricRecord ``metrics`` with :data:`~fedsuite.wire.NUM_EXAMPLES` and every one
    of ``keys`` (when given), each a number (a loss may be NaN: a diverged model's). With a
    ``template``, ``arrays`` must have its names and shapes. Returns ``(problem, {})`` for an error
    reply, a missing record or metric, a layout that differs from the template or non-finite array
    values; else ``(None, every ArrayRecord decoded)``."""
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
    records = decode_records(content)
    problem = nonfinite_values(records)
    return (problem, {}) if problem else (None, records)


def layout_problem(record: ArrayRecord, template: NDArrays) -> str | None:
    """How an ArrayRecord's names or shapes differ from ``template``'s (read before decoding); None if not."""
    if set(record.keys()) != set(template):
        return "array names differ from the model's"
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
