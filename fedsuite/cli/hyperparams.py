"""Every method's and plug-in's hyperparameters, read from the one place that declares them: the
typed section each registers (``register_method(params=...)``, ``ClientPlugin.params``; both
:class:`fedsuite.method.params.Params` models). ``fedsuite list strategies [NAME]`` prints them and
``docs/methods/parameters.md`` is this module's :func:`markdown` (``python -m fedsuite.cli.hyperparams``
writes it; tests/test_docs.py regenerates it and compares), so the help, the page and the
validation cannot disagree.

One parameter (:class:`Param`) is its dotted key (``fedprox.mu``, as ``--set`` takes it), its type
with the range the model enforces (``float, ≥ 0``), its default as TOML writes it, its meaning (the
field's ``description``) and, where a paper's value differs from the default, that value and where
it comes from: declared on the field as ``Field(..., json_schema_extra={"paper": "0.1 (the FedInit
paper, Table 7)"})`` (:data:`PAPER_KEY`).
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt, MultipleOf
from pydantic import BaseModel
from pydantic.fields import FieldInfo

#: the key of a field's ``json_schema_extra`` holding a paper's value where it differs from the default
PAPER_KEY = "paper"


@dataclass(frozen=True)
class Param:
    """One hyperparameter as ``fedsuite list`` and the docs show it."""

    key: str  # dotted: section.field
    type: str
    default: str
    meaning: str
    paper: str  # "" where no paper's value differs from the default


def type_text(annotation: Any) -> str:
    """A field's type in words: ``float``, ``int or unset``, ``one of "tensor", "module"``, ``list of float``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        text = " or ".join(type_text(a) for a in inner)
        return f"{text} or unset" if len(inner) < len(args) else text
    if origin in (list, tuple):
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        return "table"
    if isinstance(annotation, type):
        return "str" if annotation is str else annotation.__name__
    return str(annotation).replace("typing.", "")


#: the bounds a field's metadata may hold, as the type column writes them
BOUNDS = ((Ge, "ge", "≥"), (Gt, "gt", ">"), (Le, "le", "≤"), (Lt, "lt", "<"), (MultipleOf, "multiple_of", "multiple of"))


def range_text(field: FieldInfo) -> str:
    """The bounds pydantic enforces on a field (``≥ 0, < 1``), "" if none."""
    parts = []
    for item in field.metadata:
        for cls, attr, sign in BOUNDS:
            if isinstance(item, cls):
                parts.append(f"{sign} {getattr(item, attr):g}")
    return ", ".join(parts)


def value_text(value: Any) -> str:
    """A value as a TOML file or ``--set`` writes it (``0.01``, ``true``, ``"tensor"``); None is ``unset``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value)


def paper_value(field: FieldInfo) -> str:
    """The paper's value a field declares (:data:`PAPER_KEY`), "" if none."""
    extra = field.json_schema_extra
    return str(extra.get(PAPER_KEY, "")) if isinstance(extra, dict) else ""


def section_params(section: str, model: type[BaseModel], defaults: dict[str, Any] | None = None) -> list[Param]:
    """The parameters of one config section (``[fedprox]``), in declaration order. ``defaults``:
    values that replace the model's own defaults (a plug-in's settings as a method switches it on)."""
    out = []
    for name, field in model.model_fields.items():
        kind = type_text(field.annotation)
        bounds = range_text(field)
        default = (defaults or {}).get(name, field.get_default(call_default_factory=True))
        out.append(Param(f"{section}.{name}", f"{kind}, {bounds}" if bounds else kind, value_text(default),
                         field.description or "", paper_value(field)))
    return out


@dataclass(frozen=True)
class Section:
    """A config section a method uses: its own, or a plug-in's it switches on (``switched_on``:
    the settings it gives the plug-in, shown as the section's defaults)."""

    name: str
    params: list[Param]
    plugin: bool = False
    switched_on: dict[str, Any] | None = None


def method_sections(name: str) -> list[Section]:
    """The sections a method ``name`` uses by itself: its own (if it has parameters), then each
    plug-in it switches on (``register_method(enables=...)``), with the settings it gives it under
    the default config."""
    from fedsuite.method import registry

    spec = registry.methods()[name]
    sections = []
    own = section_params(name, spec.params)
    if own:
        sections.append(Section(name, own))
    if spec.enables:
        from fedsuite.config import config_model

        cfg = config_model()(strategy=name)
        for plugin, settings in spec.enables.items():
            given = settings(cfg)
            sections.append(Section(plugin, section_params(plugin, registry.plugins()[plugin], given), plugin=True,
                                    switched_on=given))
    return sections


def plugin_sections() -> list[Section]:
    """The plug-ins' sections (any method may switch them on), by name."""
    from fedsuite.method import registry

    return [Section(name, section_params(name, model), plugin=True) for name, model in sorted(registry.plugins().items())]


def cell(text: str) -> str:
    """Text for a Markdown table cell: ``|`` escaped."""
    return text.replace("|", "\\|")


def markdown_table(params: list[Param]) -> list[str]:
    lines = ["| key | type | default | meaning | paper's value |", "|---|---|---|---|---|"]
    for p in params:
        lines.append(f"| `{p.key}` | {cell(p.type)} | `{p.default}` | {cell(p.meaning)} | {cell(p.paper)} |")
    return lines


def markdown() -> str:
    """docs/methods/parameters.md: every method's section, then the plug-ins' (see the module docstring)."""
    from fedsuite.method import registry

    lines = [
        "# Methods' parameters",
        "",
        "<!-- written by `python -m fedsuite.cli.hyperparams > docs/methods/parameters.md` from the methods' and",
        "plug-ins' typed sections; tests/test_docs.py checks that it is current -->",
        "",
        "Each method's own hyperparameters, the section `[NAME]` of a config file and `--set NAME.KEY=VALUE`",
        "on the command line (`fedsuite list strategies NAME` prints the same). \"paper's value\" is given",
        "where a paper's value differs from the default. The plug-ins at the end combine with any method",
        "([configuration](../configuration.md)).",
        "",
    ]
    bare = []
    for name, spec in registry.methods().items():
        every = method_sections(name)
        sections, switched = [s for s in every if not s.plugin], [s for s in every if s.plugin]
        if not sections and not switched:
            bare.append(f"`{name}`")
            continue
        lines += [f"## {name}", "", f"{spec.summary} ({spec.paper})." if spec.paper else f"{spec.summary}.", ""]
        if sections:
            lines += [*markdown_table(sections[0].params), ""]
        for s in switched:
            given = ", ".join(f"`{s.name}.{k} = {value_text(v)}`" for k, v in (s.switched_on or {}).items())
            lines += [f"Switches on the `{s.name}` plug-in ({given}; its other keys as below).", ""]
    lines += ["## Methods without parameters of their own", "", ", ".join(bare) + ".", ""]
    for s in plugin_sections():
        lines += [f"## Plug-in `{s.name}`", "", *markdown_table(s.params), ""]
    return "\n".join(lines).rstrip() + "\n"


def method_lines(name: str) -> list[str]:
    """What ``fedsuite list strategies NAME`` prints for one method: its line, then each section it
    uses (:func:`method_sections`) and under it each parameter: its key, type and default, its
    meaning and, where it differs, the paper's value."""
    from fedsuite.method import registry

    spec = registry.methods()[name]
    lines = [f"{name}: {spec.summary}" + (f" ({spec.paper})" if spec.paper else "")]
    sections = method_sections(name)
    if not sections:
        lines.append("  no parameters of its own")
    for s in sections:
        if s.switched_on is not None:
            given = ", ".join(f"{k} = {value_text(v)}" for k, v in s.switched_on.items())
            lines.append(f"  [{s.name}] the plug-in {name} switches on ({given}): --set {s.name}.KEY=VALUE")
        else:
            lines.append(f"  [{name}] --set {name}.KEY=VALUE")
        for p in s.params:
            lines.append(f"    {p.key.partition('.')[2]}: {p.type}; default {p.default}")
            if p.meaning:
                lines.append(f"        {p.meaning}")
            if p.paper:
                lines.append(f"        the paper's value: {p.paper}")
    return lines


if __name__ == "__main__":  # pragma: no cover
    print(markdown(), end="")
