"""The base of every configuration model: the run's settings and each section of them.

Every method's and plug-in's hyperparameters (``[fedprox]``, ``[relaxed_init]``, ...) and the run's
own fields derive from :class:`Params`, which holds the rules every value obeys wherever it comes
from (a TOML file, ``--set``, Flower's run config, a recorded ``config.json``):

* unknown keys are refused (``extra="forbid"``);
* a float is finite: ``inf``, ``-inf``, ``nan`` and TOML's ``1e999`` are refused
  (``allow_inf_nan=False``), so a field that means "unlimited" says so with its own value (0 or None);
* a boolean is a boolean: ``true`` given to a number field (or inside a list of numbers) is
  refused, where pydantic's lax mode would read it as 1 (``--set rounds=true`` ran one round).
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def admits_bool(annotation: Any) -> bool:
    """Whether a field typed ``annotation`` takes a boolean (``bool``, ``bool | None``, ``Any``)."""
    if annotation is bool or annotation is Any:
        return True
    return any(admits_bool(arg) for arg in typing.get_args(annotation) if not isinstance(arg, (str, int)))


def holds_bool(value: Any) -> bool:
    """Whether ``value`` is a boolean or a list or tuple that holds one."""
    if isinstance(value, (list, tuple)):
        return any(holds_bool(v) for v in value)
    return isinstance(value, bool)


class Params(BaseModel):
    """A configuration model (see the module docstring for the rules it enforces)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        if holds_bool(value) and not admits_bool(annotation):
            expected = annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
            raise ValueError(f"expected {expected}, got a boolean")
        return value
