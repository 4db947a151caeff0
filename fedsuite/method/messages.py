"""The types of declared message records (``fedsuite.method.wire``'s "Declared records"): a :class:`Record`
(one record a method's halves exchange) and a method's :class:`Records`. Kept apart from the wire
format's conversions so that the registry, which carries each method's declaration, imports neither
torch nor Flower (``fedsuite.method.wire`` re-exports these; a method imports them from there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

#: the kinds of a declared record (:class:`Record`) and the layouts an arrays record can follow
ARRAYS_KIND, METRICS_KIND, CONFIG_KIND = "arrays", "metrics", "config"
#: an arrays record with every entry of the model's state_dict, each of its shape
MODEL_LAYOUT = "model"
#: an arrays record with the model's trainable parameters (``fedsuite.method.arrays.trainable_keys``), each of its shape
TRAINABLE_LAYOUT = "trainable"


@dataclass(frozen=True)
class Record:
    """One record a method's halves exchange, declared once (module docstring).

    ``kind``: ``"arrays"`` (an ArrayRecord named ``name``), ``"metrics"`` (the number ``name`` in the
    reply's ``"metrics"``) or ``"config"`` (the value ``name`` in the message's ``"config"``).
    ``layout`` (arrays only): :data:`MODEL_LAYOUT` or :data:`TRAINABLE_LAYOUT` (names and shapes are
    the model's), or None (a layout of its own, whose ``entries`` must be present).
    ``optional``: the record may be absent (its presence means something, e.g. FedDyn's
    ``start-offset`` only when the start point moved); it is checked when present.
    ``when``: ``cfg -> bool``; the record is declared only for runs where it is true (FedMRUR's
    regulariser metrics with the regulariser on). Otherwise a declared record must be there."""

    name: str
    kind: Literal["arrays", "metrics", "config"]
    layout: Literal["model", "trainable"] | None = None
    entries: tuple[str, ...] = ()
    optional: bool = False
    when: Callable[[Any], bool] | None = None

    def __post_init__(self) -> None:
        if self.kind not in (ARRAYS_KIND, METRICS_KIND, CONFIG_KIND):
            raise ValueError(f"record {self.name!r}: kind {self.kind!r} is not arrays, metrics or config")
        if (self.layout is not None or self.entries) and self.kind != ARRAYS_KIND:
            raise ValueError(f"record {self.name!r}: only an arrays record has a layout or entries")
        if self.layout not in (None, MODEL_LAYOUT, TRAINABLE_LAYOUT):
            raise ValueError(f"record {self.name!r}: layout {self.layout!r} is not model, trainable or None")

    def applies(self, cfg: Any) -> bool:
        """Whether the run with config ``cfg`` declares this record (``when``)."""
        return self.when is None or bool(self.when(cfg))


@dataclass(frozen=True)
class Records:
    """What a method's halves exchange beyond the engine's own (``fedsuite.method.wire.TRAIN_MESSAGE``,
    ``TRAIN_REPLY``): ``message`` (server -> client, training message), ``reply`` (each
    training reply), ``statistics`` (each statistics reply's record, ``STATISTICS_QUERY``)."""

    message: tuple[Record, ...] = ()
    reply: tuple[Record, ...] = ()
    statistics: tuple[Record, ...] = ()

    def __post_init__(self) -> None:
        if any(r.layout is not None for r in self.statistics):
            raise ValueError("a statistics record has a layout of its own (its entries), not the model's")

    def __add__(self, other: "Records") -> "Records":
        """Both declarations (a family's records plus a method's own); a name declared twice is an error."""
        out = Records(self.message + other.message, self.reply + other.reply, self.statistics + other.statistics)
        for side in (out.message, out.reply, out.statistics):
            names = [r.name for r in side]
            if len(names) != len(set(names)):
                raise ValueError(f"a record is declared twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        return out


