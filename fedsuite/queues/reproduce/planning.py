"""A target's runs: one ``fedsuite simulate`` run per (row, method, seed) of a selection.

:func:`plan` turns a selection of a target's rows x methods x seeds (``fedsuite.queues.reproduce.tables``)
into one :class:`RunSpec` each, every cell's config built from its overrides
(:func:`cell_overrides`) and validated. Runs live at
``<output-dir>/<paper>/<scale>/<setting>/<method>-s<seed>`` (``<paper>`` is the tables file's folder
name, ``<setting>`` the row's ``setting``, default its name), so rows of different tables that name
the same setting share their runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from fedsuite.config import ConfigError, build_config, own_settings
from fedsuite.queues.reproduce.queue import QueuedRun, ReproduceError
from fedsuite.queues.reproduce.tables import SCALES, Row, Target


@dataclass
class RunSpec(QueuedRun):
    """One ``fedsuite simulate`` run of the grid (a run of :mod:`fedsuite.queues.reproduce.queue`)."""

    row: Row
    method: str
    seed: int

    @property
    def label(self) -> str:
        return f"{self.row.setting} {self.method} s{self.seed}"


def cell_overrides(target: Target, row: Row, method: str, scale: str) -> list[str]:
    """The ``--set`` overrides of one cell, later ones winning: target.set, row.set, the method's
    set, row.method_set[method]; at ``cpu`` scale then target.cpu.set, row.cpu_set and
    row.cpu_method_set[method]."""
    items = [*target.set, *row.set, *target.methods[method][1], *row.method_set.get(method, [])]
    if scale == "cpu":
        items += [*target.cpu_set, *row.cpu_set, *row.cpu_method_set.get(method, [])]
    return items


def _pick(kind: str, asked: Sequence[str] | None, known: Sequence[str], target: str) -> list[str]:
    if not asked:
        return list(known)
    unknown = [a for a in asked if a not in known]
    if unknown:
        raise ReproduceError(f"unknown {kind} {', '.join(unknown)} in target {target}; allowed: {', '.join(known)}")
    return [k for k in known if k in asked]


def _check_components_used(target: Target, row: Row, method: str, cfg: Any) -> None:
    """A component a row names for an ordering ``method`` is the better side of is one this method's
    runs use (``cfg.components``): else its activity would never be recorded, and the ordering
    never found inert whatever happened."""
    used = [c.name for c in cfg.components]
    for (better, worse), name in row.components.items():
        if better == method and name not in used:
            raise ReproduceError(f'{target.name}, row {row.name}: components."{better}>{worse}" = {name!r}, but '
                                 f"{method}'s runs do not use it (they use: {', '.join(used) or 'no component'})")


def plan(target: Target, scale: str, out: Path, rows: Sequence[str] | None = None,
         methods: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
         data_root: str | None = None) -> list[RunSpec]:
    """The runs of the selected rows x methods x seeds, each config validated (a bad cell raises
    :class:`ReproduceError` naming it). Rows sharing a setting share runs (listed once). A run's
    overrides are the cell's less the settings of sections its run does not use
    (``fedsuite.config.own_settings``): ``fedsuite simulate`` refuses those."""
    if scale not in SCALES:
        raise ReproduceError(f"unknown scale {scale!r}; allowed: {', '.join(SCALES)}")
    if scale == "cpu" and not target.has_cpu_scale:
        raise ReproduceError(f"target {target.name} has no cpu scale (no [targets.{target.name}.cpu] section); "
                             "run it at --scale paper")
    picked_rows = _pick("row", rows, [r.name for r in target.rows], target.name)
    picked_methods = _pick("method", methods, list(target.methods), target.name)
    seed_list = list(seeds) if seeds else (target.cpu_seeds if scale == "cpu" else target.seeds)
    specs: dict[Path, RunSpec] = {}
    # seed-major: a queue stopped part-way leaves whole seeds (every method of a row), so the paired
    # comparisons of the report (:func:`fedsuite.queues.reproduce.verdicts.claims`) have as many pairs as
    # the time allowed
    for seed in seed_list:
        for row in target.rows:
            if row.name not in picked_rows:
                continue
            folder = (out / target.paper_key / scale / row.setting).resolve()
            for method in picked_methods:
                if row.methods is not None and method not in row.methods:
                    continue
                run_dir = folder / f"{method}-s{seed}"
                if run_dir in specs:
                    continue
                items = cell_overrides(target, row, method, scale) + [
                    f"seed={seed}", f"output_dir={json.dumps(str(folder))}", f"run_name={json.dumps(run_dir.name)}"]
                if data_root is not None:
                    items.append(f"data_root={json.dumps(data_root)}")
                try:
                    cfg = build_config(row.config, items)
                    # a row's or the target's settings may name other methods' sections (fedmrur's
                    # rows set fedsam.rho and mofedsam.rho for every method): each run gets its own
                    own = own_settings(cfg, items)
                    if own != items:
                        items, cfg = own, build_config(row.config, own)
                except ConfigError as exc:
                    raise ReproduceError(f"{target.name}, row {row.name}, method {method}: "
                                         f"{str(exc).splitlines()[0]}") from None
                _check_components_used(target, row, method, cfg)
                dataset = (cfg.dataset, cfg.data_root, json.dumps(cfg.dataset_options, sort_keys=True))
                specs[run_dir] = RunSpec(row, method, seed, run_dir=run_dir, config=row.config, overrides=items,
                                         rounds=cfg.rounds, dataset=dataset, cfg=cfg)
    return list(specs.values())
