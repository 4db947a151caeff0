"""The run configuration: one pydantic v2 model, TOML files and ``--set key=value`` overrides.

One set of names end to end: a field ``local_epochs`` is the TOML key ``local_epochs``, the CLI
option ``--local-epochs`` and the Flower run-config key ``local_epochs``. A method's own
hyperparameters live in the section named after the method (``[fedprox] mu = 0.01``,
``--set fedprox.mu=0.01``); the plug-ins have sections ``[relaxed_init]`` and ``[neuron_lr]``. A
config file may hold the sections of several methods (the defaults of whichever runs); a setting
given for one run (``--set``, an option, a keyword) must be one that run uses
(:func:`check_settings_used`), and a queue passes each of its runs only its own (:func:`own_settings`).

Bad input raises :class:`ConfigError` (defined in ``fedsuite.errors``) whose message is one line
naming the field and what is allowed; the CLI prints it and exits with code 2 before anything is
written, the Python API (``fedsuite.simulate``) raises it.

The modules: :mod:`fedsuite.config.schema` (the pydantic model, its validators, :func:`validate`),
:mod:`fedsuite.config.build` (TOML files, options and overrides; the settings a run uses),
:mod:`fedsuite.config.resume` (what ``--resume`` may change; the record-to-config comparison) and
:mod:`fedsuite.config.flower` (Flower's flat run-config form). This package's face re-exports the
names the rest of fedsuite imports from ``fedsuite.config``.
"""

from fedsuite.config.build import (apply_override, build_config, check_settings_used, flat_config, load_toml,
                                   own_settings, parse_value, setting_keys, unused_setting)
from fedsuite.config.flower import from_run_config, to_run_config
from fedsuite.config.resume import RESUME_MUTABLE, check_resume, config_differences, resume_changes
from fedsuite.config.schema import BaseRunConfig, FaultsConfig, config_model, validate
from fedsuite.errors import ConfigError  # defined there (no imports: fedsuite exports it); raised and caught as ours

__all__ = [
    "BaseRunConfig", "ConfigError", "FaultsConfig", "RESUME_MUTABLE", "apply_override", "build_config",
    "check_resume", "check_settings_used", "config_differences", "config_model", "flat_config", "from_run_config",
    "load_toml", "own_settings", "parse_value", "resume_changes", "setting_keys", "to_run_config", "unused_setting",
    "validate",
]
