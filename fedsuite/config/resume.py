"""What ``--resume`` may change of a run's recorded config, and the one comparison of a record with
a config asked of it (:func:`config_differences`), which every queue's reuse of a run shares."""

from __future__ import annotations

from typing import Any

from fedsuite.config.build import flat_config
from fedsuite.config.schema import BaseRunConfig, validate
from fedsuite.errors import ConfigError

#: The only config fields ``--resume`` may change (top-level names; a section name covers its keys).
#: ``rounds`` continues a run for more rounds (never fewer than it has done); the rest are
#: operational: where things live and what hardware runs them. Everything else (method, data,
#: partition, model, local training, seed, evaluation schedule, fault injection, ...) would make
#: the resumed rounds a different experiment from the recorded ones, so it is refused.
RESUME_MUTABLE: tuple[str, ...] = (
    "rounds", "output_dir", "run_name", "data_root", "num_cpus", "num_gpus", "device", "engine", "inprocess_threads",
    "eval_batch_size", "stall_timeout_s", "ray_address", "tensorboard",
)


def config_differences(recorded: dict[str, Any], cfg: BaseRunConfig) -> list[tuple[str, Any, Any]]:
    """Where ``cfg`` differs from a run's recorded ``config.json``, as ``(field, recorded, asked)``
    with dotted field names (``fedprox.mu``), the :data:`RESUME_MUTABLE` fields left out.

    The one comparison of a run's record with a config asked of it: ``--resume`` refuses a
    difference (:func:`check_resume`), and every queue (``fedsuite sweep``, ``sweep --search``,
    ``reproduce``) reuses a run only without one (``fedsuite.records.rundir.config_mismatch``). The same
    fields are left out for both because a queue continues a run with ``--resume``: a difference
    the queue let pass would fail in the run it starts, and one it refused would be a run
    ``--resume`` continues. They are the fields that do not make a run another experiment:
    ``rounds`` (a run asked for more rounds is continued, one asked for fewer is named as longer:
    ``fedsuite.records.rundir.state``), where it lives (``output_dir``, ``run_name``: a folder moved or
    copied, as ``experiments/claims.sh`` copies committed records into a fresh ``--output-dir``;
    ``data_root``: the data moved) and what runs it (``num_cpus``, ``num_gpus``, ``device``,
    ``ray_address``: a queue's ``--num-gpus`` and ``--ray-address`` may change between two of its
    starts; ``engine``, ``inprocess_threads``: the same numbers either way; ``eval_batch_size``: the evaluation's
    batching, which moves no more than the last bits of a test loss; ``stall_timeout_s``, ``tensorboard``).

    Both sides are validated and dumped as the ServerApp writes ``config.json`` (``active_dump``), so
    a field the record lacks (an older fedsuite wrote it) counts at its default. A method's section
    that only one side has is not compared: ``strategy`` differs then, and comes first.
    :class:`ConfigError` if the record does not validate."""
    old = flat_config(validate(recorded).active_dump())
    new = flat_config(cfg.active_dump())
    changed = [(key, old[key], new[key]) for key in sorted(set(old) & set(new))
               if key.split(".", 1)[0] not in RESUME_MUTABLE and old[key] != new[key]]
    return sorted(changed, key=lambda change: change[0] != "strategy")  # stable: the rest stay sorted


def resume_changes(recorded: dict[str, Any], cfg: BaseRunConfig) -> list[str]:
    """The fields where ``cfg`` differs from a run's recorded ``config.json`` and that
    :data:`RESUME_MUTABLE` does not allow to change (:func:`config_differences`), as
    ``"name (recorded R, given G)"``."""
    try:
        changed = config_differences(recorded, cfg)
    except ConfigError as exc:
        raise ConfigError(f"--resume: the run's config.json no longer validates: {exc}") from None
    return [f"{key} (recorded {old!r}, given {new!r})" for key, old, new in changed]


def check_resume(recorded: dict[str, Any], cfg: BaseRunConfig, rounds_done: int) -> None:
    """Raise :class:`ConfigError` (one line) unless ``cfg`` may continue the recorded run."""
    changed = resume_changes(recorded, cfg)
    if changed:
        raise ConfigError(
            f"--resume cannot change {', '.join(changed)}; a resumed run keeps its recorded config except "
            f"{', '.join(RESUME_MUTABLE)} (start a new run, with another --run-name, to change the rest)")
    if cfg.rounds < rounds_done:
        raise ConfigError(f"--resume: rounds={cfg.rounds} is fewer than the {rounds_done} rounds this run has done")
