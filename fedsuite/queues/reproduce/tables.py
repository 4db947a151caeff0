"""A paper's tables as data: the targets of ``experiments/<paper>/tables.toml``.

A *target* is one table of a paper, read from ``experiments/<paper>/tables.toml`` (or a file given
with ``--tables``, :func:`load_targets`): its grid (rows = settings, columns = methods; a row with
``methods = [...]`` runs only those), the config each cell runs (a ``RunConfig`` TOML plus
``--set``-style overrides, see ``fedsuite.queues.reproduce.planning.cell_overrides``) and the
published numbers (optional: a study has none). :func:`parse_tables` validates a file (a missing or
malformed key is one line naming the file and the key); ``fedsuite.queues.reproduce.planning.plan``
turns a selection of rows x methods x seeds into one ``RunSpec`` (a ``fedsuite simulate`` run)
each, every cell's config validated.

A ``<paper>-claims`` target holds a paper's headline orderings as rows with ``claims``. Every
claimed ordering needs the paper's own difference for its cell (the verdict weighs the runs'
difference against it: :func:`fedsuite.queues.reproduce.verdicts.paired_verdict`): both methods ``published`` in the row, or,
where the paper has no such cell, an entry of the row's ``paper_differences`` naming the nearest
cell of the paper's tables it comes from::

    paper_differences = { "fedmr-2stage>fedavg" = { value = 3.97, source = "Table 1, CNN / CIFAR-10 / ..." } }

(``value``: > 0, in the paper's direction: points gained, or rounds saved for a rounds table.)

A claims row may name the component that distinguishes an ordering, the better method's own part
that the worse method lacks (``fedsuite.method.activity``; the names are ``fedsuite.method.registry.components``:
``fedmrur.hyperbolic``, ``relaxed_init``, ``neuron_lr``)::

    components = { "fedmrur>fedmrur-n" = "fedmrur.hyperbolic" }

The key is one of the row's claims; the better method's runs must use the component (checked when
the runs are planned: ``fedsuite.queues.reproduce.planning``). Where those runs recorded it acting below its threshold, the ordering's
verdict is **inert here** (:mod:`fedsuite.queues.reproduce.verdicts`).

A row whose runs train another model than the one the paper's numbers were measured with says so::

    model_deviation = "FedMR's CNN; the paper's numbers are VGG-9's"

and its report compares orderings only: each cell's difference from the published number is
"n/a (other model)", with the sentence under the row's table, as at the cpu scale.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from fedsuite.method import registry
from fedsuite.queues.reproduce.queue import ReproduceError
from fedsuite.queues.reproduce.verdicts import paper_difference

#: the tables files that ship with fedsuite: experiments/<paper>/tables.toml
EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"  # fedsuite/queues/reproduce/tables.py
SCALES = ("paper", "cpu")
METRICS = ("accuracy", "rounds")


@dataclass
class Row:
    """One row of a target's grid: a setting, and the published value of each method in it."""

    name: str
    label: str
    setting: str
    config: Path | None
    set: list[str]
    cpu_set: list[str]
    method_set: dict[str, list[str]]
    published: dict[str, tuple[float, float | None]]
    target_accuracy: float | None = None
    cpu_target_accuracy: float | None = None
    note: str = ""
    methods: list[str] | None = None  # the columns this row runs (None: every method of the target)
    cpu_method_set: dict[str, list[str]] = field(default_factory=dict)  # method_set at cpu scale only
    # the orderings the paper claims in this row, (better, worse) each; None: read them off the
    # published numbers (ours against every other method, and the target's ``compare`` pairs)
    claims: list[tuple[str, str]] | None = None
    # the paper's difference of a claim whose cell the paper does not publish: (better, worse) ->
    # (difference, the nearest cell of the paper's tables it is read from); see the module docstring
    paper_differences: dict[tuple[str, str], tuple[float, str]] = field(default_factory=dict)
    # the component that distinguishes a claimed ordering: (better, worse) -> its name
    # (``fedsuite.method.registry.components``); see the module docstring
    components: dict[tuple[str, str], str] = field(default_factory=dict)
    # the model these runs train where the paper's numbers are another model's ("" : the paper's
    # model): the report then compares orderings only (see the module docstring)
    model_deviation: str = ""


@dataclass
class Target:
    """One table of a paper (see the module docstring and experiments/*/tables.toml)."""

    name: str
    file: Path
    paper: str
    title: str
    source: str
    ours: str
    metric: str
    reading: str
    last: int
    spread: str
    seeds: list[int]
    set: list[str]
    note: str
    compare: list[tuple[str, str]]
    cpu_set: list[str]
    cpu_seeds: list[int]
    cpu_note: str
    methods: dict[str, tuple[str, list[str]]]  # name -> (label, overrides)
    rows: list[Row]
    has_cpu_scale: bool = True  # a [targets.X.cpu] section: the target's CPU-sized variant

    @property
    def paper_key(self) -> str:
        """The folder name of the tables file (``fedmr`` for experiments/fedmr/tables.toml)."""
        return self.file.parent.name


def _published(value: Any, where: str) -> tuple[float, float | None]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return float(value[0]), float(value[1])
    raise ReproduceError(f"{where}: a published value is a number or [mean, std], got {value!r}")


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        raise ReproduceError(f"{where}: expected a list of 'key=value' strings, got {value!r}")
    return list(value)


def _pairs(value: Any, where: str) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not value or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(m, str) for m in p) and p[0] != p[1]
            for p in value):
        raise ReproduceError(f"{where}: expected a list of [better, worse] method pairs, got {value!r}")
    return [(p[0], p[1]) for p in value]


def _paper_differences(value: Any, where: str) -> dict[tuple[str, str], tuple[float, str]]:
    """A row's ``paper_differences``: ``{ "better>worse" = { value = number > 0, source = "..." } }``."""
    if not isinstance(value, dict):
        raise ReproduceError(f'{where}: expected a table of "better>worse" = {{ value = ..., source = ... }}, '
                             f"got {value!r}")
    out = {}
    for key, entry in value.items():
        pair = _claim_key(key, where)
        number = entry.get("value") if isinstance(entry, dict) else None
        source = entry.get("source") if isinstance(entry, dict) else None
        if (not isinstance(entry, dict) or set(entry) != {"value", "source"}
                or not isinstance(number, (int, float)) or isinstance(number, bool) or not number > 0
                or not isinstance(source, str) or not source.strip()):
            raise ReproduceError(f'{where}."{key}": expected {{ value = a number > 0 (the paper\'s direction), '
                                 f'source = "the table and cell it comes from" }}, got {entry!r}')
        out[(pair[0], pair[1])] = (float(number), source.strip())
    return out


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ReproduceError(f"{where}: expected a string, got {value!r}")
    return value.strip()


def _claim_key(key: str, where: str) -> tuple[str, str]:
    """A ``"better>worse"`` key of a row's table field: two different method names."""
    pair = [m.strip() for m in key.split(">")]
    if len(pair) != 2 or not all(pair) or pair[0] == pair[1]:
        raise ReproduceError(f'{where}: key {key!r} is not "better>worse" (two different methods)')
    return pair[0], pair[1]


def _components(value: Any, where: str) -> dict[tuple[str, str], str]:
    """A row's ``components``: ``{ "better>worse" = "component name" }``, each name a known component."""
    if not isinstance(value, dict):
        raise ReproduceError(f'{where}: expected a table of "better>worse" = "component", got {value!r}')
    known = registry.components()
    out = {}
    for key, name in value.items():
        pair = _claim_key(key, where)
        if not isinstance(name, str) or name not in known:
            raise ReproduceError(f'{where}."{key}": {name!r} is not a component; allowed: {", ".join(known)}')
        out[pair] = name
    return out


def _check_paper_differences(target: Target, where: str) -> None:
    """Every claimed ordering of a row has the paper's difference, exactly once: both methods
    published (and in the claimed order), or a ``paper_differences`` entry for a claim whose cell
    is not published; an entry names one of the row's claims."""
    higher = target.metric == "accuracy"
    for i, r in enumerate(target.rows):
        rw = f"{where}.rows[{i}]"
        published = {m: v[0] for m, v in r.published.items()}
        for better, worse in r.paper_differences:
            key = f'{rw}.paper_differences."{better}>{worse}"'
            if (better, worse) not in (r.claims or []):
                raise ReproduceError(f"{key}: not one of the row's claims (its `claims` list), so nothing would read it")
            if paper_difference(published, better, worse, higher) is not None:
                raise ReproduceError(f"{key}: both methods are published in this row, so their difference is "
                                     "the paper's: remove the entry")
        for better, worse in r.components:
            if (better, worse) not in (r.claims or []):
                raise ReproduceError(f'{rw}.components."{better}>{worse}": not one of the row\'s claims (its `claims` '
                                     "list), so nothing would read it")
        for better, worse in r.claims or []:
            paper = paper_difference(published, better, worse, higher)
            if paper is None and (better, worse) not in r.paper_differences:
                raise ReproduceError(f"{rw}: the claim {better} > {worse} has no paper's difference: publish both "
                                     f'methods or give paper_differences."{better}>{worse}" (the nearest cell of '
                                     "the paper's tables)")
            if paper is not None and not paper > 0:
                raise ReproduceError(f"{rw}: the claim {better} > {worse} is not the order of its published numbers "
                                     f"({better} {published[better]:g}, {worse} {published[worse]:g}, metric "
                                     f"{target.metric})")


def read_tables(path: Path) -> dict[str, Any]:
    """One tables file as TOML gives it; an unreadable file or one that is not TOML raises
    :class:`ReproduceError` naming the file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ReproduceError(f"tables file {path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ReproduceError(f"tables file {path}: not UTF-8 text (TOML is UTF-8): byte {exc.start} "
                             "cannot be decoded") from None
    return data


def parse_tables(path: Path) -> dict[str, Target]:
    """The targets of one tables file; a missing or malformed key raises :class:`ReproduceError`
    naming the file and the key. Config paths are relative to the file's folder."""
    data = read_tables(path)
    out: dict[str, Target] = {}
    for name, t in (data.get("targets") or {}).items():
        where = f"{path}: targets.{name}"
        try:
            cpu = t.get("cpu", {})
            methods = {m: (spec.get("label", m), _strings(spec.get("set", []), f"{where}.methods.{m}"))
                       for m, spec in t["methods"].items()}
            rows = []
            for i, r in enumerate(t["rows"]):
                rw = f"{where}.rows[{i}]"
                config = r.get("config", t.get("config"))
                rows.append(Row(
                    name=r["name"], label=r.get("label", r["name"]), setting=r.get("setting", r["name"]),
                    config=(path.parent / config) if config else None,
                    set=_strings(r.get("set", []), rw + ".set"), cpu_set=_strings(r.get("cpu_set", []), rw + ".cpu_set"),
                    method_set={m: _strings(v, f"{rw}.method_set.{m}") for m, v in r.get("method_set", {}).items()},
                    published={m: _published(v, f"{rw}.published.{m}") for m, v in r.get("published", {}).items()},
                    target_accuracy=r.get("target_accuracy"), cpu_target_accuracy=r.get("cpu_target_accuracy"),
                    note=r.get("note", ""), methods=r.get("methods"),
                    cpu_method_set={m: _strings(v, f"{rw}.cpu_method_set.{m}")
                                    for m, v in r.get("cpu_method_set", {}).items()},
                    claims=_pairs(r["claims"], rw + ".claims") if "claims" in r else None,
                    paper_differences=_paper_differences(r.get("paper_differences", {}), rw + ".paper_differences"),
                    components=_components(r.get("components", {}), rw + ".components"),
                    model_deviation=_text(r.get("model_deviation", ""), rw + ".model_deviation"),
                ))
            target = Target(
                name=name, file=path, paper=data.get("paper", path.parent.name), title=t.get("title", name),
                source=t.get("source", ""), ours=t["ours"], metric=t.get("metric", "accuracy"),
                reading=t.get("reading", "last"), last=int(t.get("last", 1)), spread=t.get("spread", "seeds"),
                seeds=[int(s) for s in t.get("seeds", [0])], set=_strings(t.get("set", []), where + ".set"),
                note=t.get("note", ""), compare=[tuple(p) for p in t.get("compare", [])],
                cpu_set=_strings(cpu.get("set", []), where + ".cpu.set"),
                cpu_seeds=[int(s) for s in cpu.get("seeds", [0])], cpu_note=cpu.get("note", ""),
                methods=methods, rows=rows, has_cpu_scale="cpu" in t,
            )
        except KeyError as exc:
            raise ReproduceError(f"{where}: missing key {exc.args[0]!r}") from None
        if target.metric not in METRICS:
            raise ReproduceError(f"{where}.metric: {target.metric!r}; allowed: {', '.join(METRICS)}")
        if target.spread not in ("seeds", "pooled"):
            raise ReproduceError(f"{where}.spread: {target.spread!r}; allowed: seeds, pooled")
        unknown = {target.ours, *(m for p in target.compare for m in p)} - set(methods)
        unknown |= {m for r in rows for m in (*r.published, *r.method_set, *r.cpu_method_set, *(r.methods or ()),
                                              *(m for p in r.claims or () for m in p),
                                              *(m for p in r.paper_differences for m in p),
                                              *(m for p in r.components for m in p)) if m not in methods}
        if unknown:
            raise ReproduceError(f"{where}: methods {', '.join(sorted(unknown))} are not in its [methods]")
        unrun = [f"{r.name}: {m}" for r in rows if r.methods is not None
                 for m in {m for p in r.claims or () for m in p} if m not in r.methods]
        if unrun:
            raise ReproduceError(f"{where}: a claim names a method its row does not run ({', '.join(sorted(unrun))})")
        if target.metric == "rounds" and any(r.target_accuracy is None for r in rows):
            raise ReproduceError(f"{where}: metric 'rounds' needs target_accuracy on every row")
        _check_paper_differences(target, where)
        out[name] = target
    return out


def target_names() -> list[str]:
    """The names of experiments/*/tables.toml's targets, sorted, read without building the targets:
    what ``fedsuite reproduce --help`` lists. (Building one checks its methods and components
    against the registry, which imports every method and torch: 3-4 s of a help that needs none.)"""
    return sorted({name for path in EXPERIMENTS.glob("*/tables.toml")
                   for name in read_tables(path).get("targets") or {}})


def load_targets(extra: Sequence[Path] = ()) -> dict[str, Target]:
    """Every target of experiments/*/tables.toml, then of the ``extra`` files (which may add or
    replace targets)."""
    targets: dict[str, Target] = {}
    for path in [*sorted(EXPERIMENTS.glob("*/tables.toml")), *(Path(p) for p in extra)]:
        if not path.is_file():
            raise ReproduceError(f"tables file not found: {path}")
        targets.update(parse_tables(path.resolve()))
    return targets
