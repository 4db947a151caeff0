"""A config built from its sources (:func:`build_config`: defaults, a run's recorded config, a TOML
file, typed options, ``--set key=value`` overrides), and which of the settings given for one run
that run uses (:func:`setting_keys`, :func:`check_settings_used`, :func:`own_settings`)."""

from __future__ import annotations

import copy
import functools
import json
import tomllib
from pathlib import Path
from typing import Any

from fedsuite.config.schema import BaseRunConfig, validate
from fedsuite.errors import ConfigError
from fedsuite.method import registry
from fedsuite.records.paths import input_problem, unresolvable


def parse_value(text: str) -> Any:
    """Parse an override's value as TOML (numbers, booleans, quoted strings, lists, inline tables);
    anything that is not valid TOML is taken as a bare string (``--set dataset=fmnist``). A copy of
    the value parsed once per text (:func:`_parse_toml`), so a caller may change it."""
    try:
        return copy.deepcopy(_parse_toml(f"v = {text}")["v"])
    except tomllib.TOMLDecodeError:
        return text


@functools.lru_cache(maxsize=4096)
def _parse_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``, once per text: planning a reproduce target's cells parses the same
    few config files and override values thousands of times (every cell of every target: 3227
    configs, half their time in TOML parsing before this). Callers copy what they return."""
    return tomllib.loads(text)


def apply_override(data: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted ``key`` (``fedprox.mu``) in the nested dict ``data``."""
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config: {key!r}: {part!r} is a value, not a section")
    node[leaf] = value


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file() and not unresolvable(path) and not path.exists():
        raise ConfigError(f"config file not found: {path}")
    problem = input_problem(path, "file")  # a folder, a loop, unreadable: the one check (fedsuite.records.paths)
    if problem is not None:
        raise ConfigError(f"config file: {problem}")
    try:
        return copy.deepcopy(_parse_toml(path.read_text(encoding="utf-8")))  # the file's text is the key
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 text (TOML is UTF-8): byte {exc.start} "
                          f"cannot be decoded") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc.strerror})") from None


def build_config(
    file: str | Path | None = None,
    overrides: list[str] | None = None,
    values: dict[str, Any] | None = None,
    base: dict[str, Any] | None = None,
) -> BaseRunConfig:
    """Defaults < ``base`` (a run's recorded config, on ``--resume``) < TOML ``file`` < ``values``
    (typed CLI options) < ``overrides`` (``key=value``)."""
    data: dict[str, Any] = json.loads(json.dumps(base)) if base else {}
    _merge(data, load_toml(file) if file else {})
    for key, value in (values or {}).items():
        apply_override(data, key, value)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        apply_override(data, key.strip(), parse_value(text.strip()))
    return validate(data)


def setting_keys(overrides: list[str] | tuple[str, ...] = (), values: dict[str, Any] | None = None) -> list[str]:
    """The dotted keys that ``--set`` items (``fedprox.mu=0.1``; a section given whole,
    ``fedprox={mu=0.1}``, as each key it holds) and ``values`` (typed options, ``fedsuite.simulate``'s
    keywords: ``{"fedprox": {"mu": 0.1}}`` or ``{"fedprox.mu": 0.1}``) set, in order."""
    keys: list[str] = []
    for item in overrides:
        key, _, text = item.partition("=")
        keys += flat_config({key.strip(): parse_value(text.strip())})
    return keys + list(flat_config(dict(values or {})))


def unused_setting(cfg: BaseRunConfig, key: str) -> str | None:
    """Why the run ``cfg`` does not use the setting ``key`` (dotted), or None where it does: a key of
    another method's section than the run's strategy, or of a plug-in the run does not switch on
    (``registry.plugin_params``: by its own section, or by its method, as fedinit switches on
    relaxed_init). Keys outside the methods' and plug-ins' sections are always used."""
    section = key.split(".", 1)[0]
    if section in registry.methods() and section != cfg.strategy:
        return f"{key} is a setting of {section}; this run's strategy is {cfg.strategy}"
    if section in registry.plugins() and section not in cfg.plugin_settings:
        return (f"{key} is a setting of the {section} plug-in, which this run (strategy {cfg.strategy}) does not "
                "switch on")
    return None


def check_settings_used(cfg: BaseRunConfig, keys: list[str]) -> None:
    """:class:`ConfigError` (one line, :func:`unused_setting`'s) for the first of ``keys``, the settings
    given for this run (``--set``, options, keywords: :func:`setting_keys`), that the run does not use:
    it would be dropped without a word. A config file's sections are not given for one run: a file
    may hold the sections of several methods (docs/configuration.md)."""
    for key in keys:
        problem = unused_setting(cfg, key)
        if problem is not None:
            raise ConfigError(problem)


def own_settings(cfg: BaseRunConfig, overrides: list[str]) -> list[str]:
    """The ``--set`` items of a queued run (a sweep's, a search trial's, a reproduce target's cell)
    that the run ``cfg`` uses: the base settings of a queue may name several methods' sections (a
    target's row sets ``fedsam.rho`` and ``mofedsam.rho`` for every method of the row), and each
    run's ``fedsuite simulate`` accepts only its own (:func:`check_settings_used`). ``cfg``: the
    run's config built from all of ``overrides``; the items kept build the same run."""
    return [item for item in overrides
            if all(unused_setting(cfg, key) is None for key in setting_keys([item]))]


def _merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value)
        else:
            dst[key] = value


def flat_config(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config dict with nested sections as dotted keys (``fedmr.r1``); ``dataset_options`` stays whole."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict) and key != "dataset_options":
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
