"""The run configuration's model: :class:`BaseRunConfig` (the settings every method shares, their
bounds and the validator that checks them together), :func:`config_model` (``RunConfig``: the base
plus one section per registered method and plug-in) and :func:`validate` (a nested dict to a
``RunConfig``, pydantic's report turned into one :class:`ConfigError` line per problem)."""

from __future__ import annotations

import difflib
import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from fedsuite.method import registry
from fedsuite.method.activity import Component
from fedsuite.errors import ConfigError  # defined there (no imports: fedsuite exports it); raised and caught as ours
from fedsuite.method.params import Params
from fedsuite.records.paths import name_problem, path_length_problem, unresolvable

#: the largest run seed: every random draw takes the seed modulo 2^32 (fedsuite.method.seeding), so larger
#: seeds would repeat smaller ones
SEED_MAX = 2**32 - 1

#: ``max_failed_fraction`` when unset, on the Deployment Engine (real clients drop out)
DEPLOYMENT_MAX_FAILED_FRACTION = 0.5


def on_simulation_engine() -> bool:
    """Whether this process runs the ServerApp beside Flower's Simulation Engine (the Ray-backed
    virtual clients): fedsuite's simulation process (``fedsuite.launch.simulation``), or Flower's own
    ``flwr-simulation`` under ``flwr run``. The Deployment Engine runs ``flwr-serverapp``."""
    started_as = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)
    return started_as == "fedsuite.launch.simulation" or Path(sys.argv[0]).name == "flwr-simulation"


class FaultsConfig(Params):
    """Fault injection (section ``[faults]``): client tasks that fail on demand, for robustness
    studies and tests. Applied inside the ClientApp (``fedsuite.engine.faults``); every draw is seeded from
    (seed, partition id, round), so a run with faults is as reproducible as one without."""

    model_config = ConfigDict(validate_assignment=True)

    client_error: float = Field(0.0, ge=0, le=1, description="probability that a client's training task raises")
    nan: float = Field(0.0, ge=0, le=1, description="probability that a reply carries non-finite arrays")
    wrong_shape: float = Field(0.0, ge=0, le=1, description="probability that a reply has an array of the wrong shape")
    delay_s: float = Field(0.0, ge=0, description="seconds a straggler sleeps before training")
    delay_prob: float = Field(1.0, ge=0, le=1, description="probability that a task is a straggler (when delay_s > 0)")


class BaseRunConfig(Params):
    """Settings shared by every method. Method sections are added by :func:`config_model`."""

    model_config = ConfigDict(validate_assignment=True)

    # --- what to run --------------------------------------------------------------------------
    strategy: str = Field("fedavg", description="federated method (fedsuite list)")
    model: str = Field("mlp", description="model architecture (fedsuite list)")
    dataset: str = Field("synthetic", description="dataset (fedsuite list)")
    data_root: str = Field("~/.cache/fedsuite/data", description="where datasets live / are downloaded")
    dataset_options: dict[str, Any] = Field(
        default_factory=dict, description="loader options, e.g. {label_mode='coarse'} for cifar100, {path=...} for npz"
    )
    # --- partition ----------------------------------------------------------------------------
    partitioner: str = Field("dirichlet", description="how training data is split over clients")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (dirichlet, dirichlet-equal)")
    classes_per_client: int = Field(2, ge=1, description="classes per client (pathological)")
    shards_per_client: int = Field(2, ge=1, description="shards per client (shards)")
    min_partition_size: int = Field(10, ge=0, description="minimum samples per client (dirichlet; natural drops "
                                    "smaller groups)")
    partition_by: str | None = Field(
        None, min_length=1, description="natural: the dataset column whose distinct values are the clients (dataset "
        "hf, e.g. writer_id); num_clients must equal their number",
    )
    num_clients: int = Field(100, ge=1, description="number of clients (virtual SuperNodes)")
    clients_per_round: int | None = Field(None, ge=1, description="cohort size K; default max(1, floor(fraction*N))")
    fraction: float = Field(0.1, gt=0, le=1, description="cohort fraction, used when clients_per_round is unset")
    # --- local training -----------------------------------------------------------------------
    rounds: int = Field(20, ge=1, description="federated rounds")
    local_epochs: int = Field(1, ge=1, description="local epochs per round")
    batch_size: int = Field(50, ge=1, description="local batch size")
    lr: float = Field(0.05, ge=0, description="local learning rate (round 1)")
    lr_decay: float = Field(1.0, gt=0, le=1, description="local lr multiplied by this after every round")
    momentum: float = Field(0.0, ge=0, lt=1, description="local SGD momentum (fresh each round)")
    weight_decay: float = Field(0.0, ge=0, description="local L2 weight decay")
    grad_clip: float | None = Field(None, gt=0, description="clip the local gradient to this global L2 norm")
    augment: bool | None = Field(None, description="batch augmentation; default: the dataset's default")
    # --- run ----------------------------------------------------------------------------------
    seed: int = Field(0, ge=0, le=SEED_MAX, description="fixes partitions, cohorts, initial weights and local "
                      "shuffling (0 to 2^32 - 1: every draw takes it modulo 2^32, fedsuite.method.seeding)")
    eval_every: int = Field(1, ge=1, description="central evaluation of the global model every k rounds")
    eval_batch_size: int = Field(256, ge=1, description=(
        "batch size of central and federated evaluation: memory and speed only (a test loss's last bits "
        "follow it); 256 keeps a small model's activations in a CPU's cache, 40% faster than 1000"))
    federated_eval: Literal["off", "cohort", "all"] = Field(
        "off", description="federated evaluation: every eval_every rounds (and at the last) the round's cohort "
        "(cohort) or every client (all) evaluates the global model on its own held-out data (per-round client-mean, "
        "weighted and worst-10% accuracy; clients.jsonl). off (default): clients train on their whole partition, "
        "as runs without it always have; on, each trains on its partition less the held-out share",
    )
    local_test_fraction: float = Field(
        0.2, gt=0, lt=1, description="federated evaluation: the seeded share of each client's partition held out "
        "as its own test data (not trained on), where the client has no test data of its own (a natural "
        "partition of synthetic or femnist keeps each client's own test split)",
    )
    finetune_steps: int = Field(
        0, ge=0, description="federated evaluation: also evaluate each client's personalised model, the global "
        "model after this many local SGD steps on the client's training data (0: no personalised evaluation)",
    )
    output_dir: str = Field("runs", description="parent folder of run directories")
    run_name: str | None = Field(None, description="run directory name; default <strategy>-<dataset>-s<seed>-<time>")
    num_cpus: int = Field(1, ge=1, description="CPU cores per simulated client (Ray actor)")
    num_gpus: float = Field(0.0, ge=0, description="GPU share per simulated client, e.g. 0.25")
    device: str = Field("auto", description="training device: auto (cuda if visible), cpu or cuda")
    engine: Literal["flower", "inprocess"] = Field(
        "flower", description="what runs the clients: flower (Flower's Simulation Engine: Ray-backed virtual "
        "clients, one machine, a Ray cluster or GPUs) or inprocess (every client called in the fedsuite "
        "process, a round's clients on parallel threads (inprocess_threads): no Ray, starts in about a second; for "
        "tests, debugging and quick runs). "
        "The same config and seed give the same numbers through both",
    )
    inprocess_threads: int | None = Field(
        None, ge=1, description="engine=inprocess: how many of a round's clients train at once, each on its own "
        "thread with num_cpus intra-op threads, as Flower's engine runs one actor per num_cpus cores; default: the "
        "cores the run may use divided by num_cpus. It never changes a run's numbers",
    )
    stall_timeout_s: float = Field(
        1800.0, ge=0,
        description="watchdog of fedsuite simulate: fail the run when no round (or the start-up) has finished "
        "for this many seconds; 0 turns it off",
    )
    round_timeout_s: float = Field(
        3600.0, gt=0,
        description="seconds a round waits for its clients' replies (Flower's default, 3600); a client that has "
        "not answered by then is dropped for the round (reason: no reply within round_timeout_s)",
    )
    min_replies: int = Field(
        1, ge=1, description="fewest accepted client replies a round needs; a round with fewer fails the run",
    )
    ray_address: str | None = Field(
        None, description="run the virtual clients on this existing Ray cluster ('auto', 'host:port' or "
        "'ray://host:port'); default: a private single-machine Ray started for the run",
    )
    max_failed_fraction: float | None = Field(
        None, ge=0, le=1,
        description="largest share of a round's cohort whose replies may fail or be rejected before the run "
        "stops as failed; a round with no accepted reply always does. Default: 0 on the Simulation Engine "
        f"(any failure stops the run), {DEPLOYMENT_MAX_FAILED_FRACTION} on the Deployment Engine (dropouts are normal)",
    )
    faults: FaultsConfig = Field(default_factory=FaultsConfig, description="fault injection ([faults])")
    tensorboard: bool | None = Field(
        None, description="write TensorBoard event files into the run directory (every metric of metrics.jsonl "
        "per round, the config as hparams); default: on where the tensorboard package is installed",
    )

    @model_validator(mode="after")
    def _check_names(self) -> "BaseRunConfig":
        _check_choice("strategy", self.strategy, registry.methods())
        _check_choice("dataset", self.dataset, registry.datasets())
        _check_choice("partitioner", self.partitioner, registry.partitioners())
        _check_choice("model", self.model, registry.models())
        problem = None if self.run_name is None else name_problem(self.run_name)
        if problem is not None:  # the one name check (fedsuite.records.paths), as sweep --name's
            raise ValueError(f"run_name {problem}")
        problem = path_length_problem(Path(self.output_dir) / (self.run_name or "r" * 64))
        if problem is not None:
            raise ValueError(f"output_dir: {problem}")
        problem = unresolvable(self.data_root)
        if problem is not None:
            raise ValueError(f"data_root: {problem}")
        from fedsuite.data.loading import options_problem

        problem = options_problem(self.dataset, self.dataset_options)  # typed before use, as every field
        if problem is not None:
            raise ValueError(problem)
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ValueError("tensorboard=true needs the tensorboard package: pip install tensorboard")
        if self.partition_by is not None and self.partitioner != "natural":
            raise ValueError(f"partition_by applies to the natural partitioner only (partitioner is "
                             f"{self.partitioner!r}); use --partitioner natural or drop partition_by")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError("device must be one of: auto, cpu, cuda")
        if self.engine == "inprocess" and self.ray_address:
            raise ValueError("engine=inprocess runs every client in the fedsuite process, without Ray; "
                             "drop ray_address, or use engine=flower to run the clients on that cluster")
        if self.cohort_size > self.num_clients:
            raise ValueError(
                f"clients_per_round ({self.cohort_size}) cannot exceed num_clients ({self.num_clients})"
            )
        if self.finetune_steps and self.federated_eval == "off":
            raise ValueError(f"finetune_steps={self.finetune_steps} is a step of federated evaluation, which is off; "
                             "set federated_eval to cohort or all, or drop finetune_steps")
        if all(hasattr(self, name) for name in registry.plugins()):  # the full model, with its sections
            registry.plugin_params(self)  # a plug-in the method refuses is an error on every path
        return self

    @property
    def cohort_size(self) -> int:
        """K = clients_per_round, else max(1, floor(fraction * num_clients))."""
        if self.clients_per_round is not None:
            return self.clients_per_round
        return max(1, int(self.fraction * self.num_clients + 1e-9))

    def evaluates(self, server_round: int) -> bool:
        """Whether the global model of ``server_round`` is evaluated centrally: every ``eval_every``
        rounds and at the last round (the ServerApp also evaluates w^0 and the model a resumed run
        starts from)."""
        return server_round % self.eval_every == 0 or server_round == self.rounds

    @property
    def resolved_max_failed_fraction(self) -> float:
        """``max_failed_fraction``, or the engine's default when unset (see the field)."""
        if self.max_failed_fraction is not None:
            return self.max_failed_fraction
        return 0.0 if self.engine == "inprocess" or on_simulation_engine() else DEPLOYMENT_MAX_FAILED_FRACTION

    @property
    def method(self) -> registry.MethodSpec:
        return registry.methods()[self.strategy]

    @property
    def plugin_settings(self) -> dict[str, BaseModel]:
        """The plug-ins this run uses and their settings (its sections plus what its method enables)."""
        return registry.plugin_params(self)

    @property
    def components(self) -> list[Component]:
        """The distinguishing components this run uses, each with its activity measure
        (``fedsuite.method.activity``): its method's own, then its plug-ins'."""
        return registry.run_components(self)

    @property
    def method_params(self) -> BaseModel:
        """The active method's own hyperparameters (section ``[<strategy>]``)."""
        return getattr(self, self.strategy)

    def active_dump(self) -> dict[str, Any]:
        """The resolved config with only the sections that apply to this run (for config.json)."""
        sections = set(registry.methods()) | set(registry.plugins())
        keep = {self.strategy, *registry.plugins()}
        return {k: v for k, v in self.model_dump(mode="json").items() if k not in sections or k in keep}


def _check_choice(field: str, value: str, allowed: dict) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {field} {value!r}; allowed: {', '.join(sorted(allowed))}")


@functools.cache
def config_model() -> type[BaseRunConfig]:
    """``RunConfig``: the base fields plus one section per registered method and plug-in."""
    sections: dict[str, Any] = {}
    for name, spec in registry.methods().items():
        sections[name] = (spec.params, Field(default_factory=spec.params))
    for name, params in registry.plugins().items():
        sections[name] = (params, Field(default_factory=params))
    return create_model("RunConfig", __base__=BaseRunConfig, **sections)


def validate(data: dict[str, Any]) -> BaseRunConfig:
    """Validate a nested dict, turning pydantic's report into one line per problem."""
    model = config_model()
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, model)) from None


def _format_errors(exc: ValidationError, model: type[BaseModel]) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            parent = _section_model(model, err["loc"][:-1])
            fields = sorted(parent.model_fields) if parent else []
            msg = f"unknown key;{did_you_mean(str(err['loc'][-1]), fields)} allowed keys here: {', '.join(fields)}"
        elif "input" in err and err["type"] not in ("value_error", "missing"):
            msg = f"{msg} (got {err['input']!r})"
        # "config: ...": the CLI prints it after its one prefix, "error: "
        lines.append(f"config: {loc}: {msg}" if loc else f"config: {msg}")
    return "\n".join(lines)


def did_you_mean(key: str, known: list[str]) -> str:
    """`` did you mean 'rounds'?`` for the known key closest to ``key`` (``difflib``'s close matches:
    ``round`` -> ``rounds``, ``mue`` -> ``mu``), "" where none is close."""
    close = difflib.get_close_matches(key, known, n=1)
    return f" did you mean {close[0]!r}?" if close else ""


def _section_model(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model
