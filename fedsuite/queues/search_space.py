"""A search's space and its trials' settings (:mod:`fedsuite.queues.search`): ``--space`` read into
ranges (:func:`parse_space`: ``log:LOW:HIGH``, ``uniform:LOW:HIGH``, ``int:LOW:HIGH``,
``choice:V1,V2,...``), both ends of every range and every choice validated as run settings on the
base (:func:`check_space`), and a sampled setting made into its trial's run (:func:`trial_run`: the
``--set`` overrides and config its ``fedsuite simulate`` run gets).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from fedsuite.config import (BaseRunConfig, ConfigError, build_config, check_settings_used, own_settings, parse_value,
                             setting_keys, unused_setting)
from fedsuite.queues.study import SweepError, refuse_folder_keys, setting_text, split_values, toml_value


@dataclass(frozen=True)
class Range:
    """One key's range: ``kind`` is log, uniform, int or choice; ``values`` the ends or the choices."""

    key: str
    kind: str
    values: tuple[Any, ...]

    def domain(self):
        from ray import tune

        if self.kind == "log":
            return tune.loguniform(*self.values)
        if self.kind == "uniform":
            return tune.uniform(*self.values)
        if self.kind == "int":
            return tune.randint(self.values[0], self.values[1] + 1)  # Tune's upper end is excluded
        return tune.choice(list(self.values))


def parse_space(items: Sequence[str]) -> list[Range]:
    """``["lr=log:0.001:0.3", "strategy=choice:fedavg,fedprox"]`` -> ranges; one line for a bad one."""
    ranges: dict[str, Range] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, (kind, _, spec) = key.strip(), text.partition(":")
        usage = (f"--space expects key=log:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH or choice:V1,V2,..., "
                 f"got {item!r}")
        if not key or not sep or kind not in ("log", "uniform", "int", "choice") or not spec.strip():
            raise SweepError(usage)
        if key in ranges:
            raise SweepError(f"--space names {key!r} twice")
        if key == "seed":
            raise SweepError("seed is not a search key: --seeds names the trials' seed")
        refuse_folder_keys([key], "--space")
        if kind == "choice":
            values = split_values(spec)
            if any(v == "" for v in values):
                raise SweepError(usage)
            ranges[key] = Range(key, kind, tuple(parse_value(v) for v in values))
            continue
        ends = spec.split(":")
        try:
            low, high = (int(e) for e in ends) if kind == "int" else (float(e) for e in ends)
        except ValueError:
            raise SweepError(usage) from None
        if not (math.isfinite(low) and math.isfinite(high) and low < high) or (kind == "log" and low <= 0):
            raise SweepError(f"--space {key}: the range needs LOW < HIGH{' and LOW > 0' if kind == 'log' else ''}, "
                             f"got {spec!r}")
        ranges[key] = Range(key, kind, (low, high))
    return list(ranges.values())


def space_configs(space: Sequence[Range], base_set: Sequence[str],
                  config: Path | None) -> list[tuple[str, BaseRunConfig]]:
    """``("--space key=value", its run's config)`` for both ends of every range and every choice, each
    validated as a run setting on the base (:class:`SweepError` naming the key and the field). A key
    of a method's or plug-in's section must be one that the base's strategy, or a strategy of the
    space's ``strategy`` choice, uses (``fedsuite.config.unused_setting``): else no trial's run
    would use it (a trial that draws a strategy that does not use it runs without it:
    :func:`trial_run`); its config is then the one with such a strategy."""
    if not space:
        raise SweepError("the search space is empty: give at least one --space key=log:LOW:HIGH (or uniform, int, "
                         "choice)")
    strategies = next((r.values for r in space if r.key == "strategy"), ())
    cfgs = []
    for rng in space:
        for value in rng.values:
            item = f"{rng.key}={toml_value(value)}"
            try:
                cfg = build_config(config, [*base_set, item])
                for strategy in strategies:  # the base's strategy may not use it where one of these does
                    if any(unused_setting(cfg, key) for key in setting_keys([item])):
                        cfg = build_config(config, [*base_set, f"strategy={toml_value(strategy)}", item])
                check_settings_used(cfg, setting_keys([item]))
            except ConfigError as exc:
                raise SweepError(f"--space {rng.key}={setting_text(value)}: {str(exc).splitlines()[0]}") from None
            cfgs.append((f"--space {rng.key}={setting_text(value)}", cfg))
    return cfgs


def check_space(space: Sequence[Range], base_set: Sequence[str], config: Path | None) -> int:
    """Validate the space (:func:`space_configs`) and that every base ``--set`` of a method's or
    plug-in's section is used by some trial (else it would change nothing, without a word);
    :class:`SweepError` naming what is wrong. Returns the runs' number of rounds."""
    cfgs = [cfg for _, cfg in space_configs(space, base_set, config)]
    for item in base_set:
        if not any(own_settings(cfg, [item]) for cfg in cfgs):
            why = next(filter(None, (unused_setting(cfgs[0], k) for k in setting_keys([item]))))
            raise SweepError(f"--set {item}: no trial of the search would use it ({why})")
    return int(cfgs[-1].rounds)


def trial_overrides(base_set: Sequence[str], setting: dict[str, Any], seed: int, run_dir: Path) -> list[str]:
    """The ``--set`` overrides of a trial's setting: the base, the trial's setting, the seed and where it lives."""
    return [*base_set, *(f"{k}={toml_value(v)}" for k, v in setting.items()), f"seed={seed}",
            f"output_dir={json.dumps(str(run_dir.parent))}", f"run_name={json.dumps(run_dir.name)}"]


def trial_run(config: Path | None, base_set: Sequence[str], setting: dict[str, Any], seed: int,
              run_dir: Path) -> tuple[dict[str, Any], list[str], BaseRunConfig]:
    """A trial's run as it runs: (the setting its run uses, its ``--set`` overrides, its config). A
    sampled key or base setting of a section the run does not use (``fedprox.mu`` in a trial that
    drew ``strategy=fedavg``) is left out of both, as a queue leaves it out of its runs
    (``fedsuite.config.own_settings``): ``fedsuite simulate`` refuses it."""
    items = trial_overrides(base_set, setting, seed, run_dir)
    cfg = build_config(config, items)
    used = {k: v for k, v in setting.items()
            if all(unused_setting(cfg, key) is None for key in setting_keys([f"{k}={toml_value(v)}"]))}
    own = own_settings(cfg, items)
    return used, own, (cfg if own == items else build_config(config, own))
