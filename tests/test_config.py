"""Config validation, error messages, TOML + --set layering, and the CLI's user-error contract."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from fedsuite.config import ConfigError, build_config, config_model, from_run_config, to_run_config
from tests.conftest import fedsuite_run

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_are_the_offline_quickstart():
    cfg = build_config()
    assert (cfg.strategy, cfg.dataset, cfg.model) == ("fedavg", "synthetic", "mlp")
    assert cfg.cohort_size == 10  # floor(0.1 * 100)


def test_toml_then_values_then_set_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('rounds = 7\nlr = 0.1\ndataset = "mnist"\n')
    cfg = build_config(f, ["lr=0.2", "dataset=fmnist"], {"rounds": 9, "lr": 0.3})
    assert cfg.rounds == 9  # typed CLI option beats the file
    assert cfg.lr == 0.2  # --set beats everything
    assert cfg.dataset == "fmnist"  # bare strings need no quotes


def test_a_parsed_file_or_value_is_the_callers_own_and_an_edited_file_is_read_again(tmp_path):
    """TOML is parsed once per text (planning a target builds thousands of configs): each caller
    gets a copy it may change, and a file's new text is parsed anew."""
    from fedsuite.config import load_toml, parse_value

    path = tmp_path / "c.toml"
    path.write_text('rounds = 3\n[fedprox]\nmu = 0.1\n')
    first = load_toml(path)
    first["fedprox"]["mu"] = 9.0
    assert load_toml(path) == {"rounds": 3, "fedprox": {"mu": 0.1}}
    path.write_text('rounds = 4\n')
    assert load_toml(path) == {"rounds": 4}
    value = parse_value("[1, 2]")
    value.append(3)
    assert parse_value("[1, 2]") == [1, 2] and parse_value("fmnist") == "fmnist"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["roundz=3"], "roundz: unknown key; did you mean 'rounds'? allowed keys here:"),
        (["round=3"], "round: unknown key; did you mean 'rounds'? allowed keys here: alpha, "),
        (["fedprox.mue=0.1"], "fedprox.mue: unknown key; did you mean 'mu'? allowed keys here: mu"),
        (["zzzz=1"], "zzzz: unknown key; allowed keys here: alpha, "),
        (["rounds=abc"], "rounds: Input should be a valid integer"),
        (["rounds=0"], "rounds: Input should be greater than or equal to 1"),
        (["fraction=1.5"], "fraction: Input should be less than or equal to 1"),
        (["strategy=fedfoo"], "unknown strategy 'fedfoo'; allowed: "),
        (["dataset=imagenet"], "unknown dataset 'imagenet'; allowed: "),
        (["model=gpt"], "unknown model 'gpt'; allowed: "),
        (["partitioner=random"], "unknown partitioner 'random'; allowed: "),
        (["clients_per_round=50", "num_clients=10"], "clients_per_round (50) cannot exceed num_clients (10)"),
        (["rounds"], "--set expects key=value"),
    ],
)
def test_bad_values_give_one_clear_line(overrides, fragment):
    with pytest.raises(ConfigError) as exc:
        build_config(None, overrides)
    message = str(exc.value)
    assert fragment in message
    assert "Traceback" not in message and "pydantic" not in message.lower()


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(ConfigError) as exc:
        build_config(None, ["local_epoch=2"])
    assert "local_epochs" in str(exc.value)


def test_method_sections_are_validated():
    from fedsuite.method import registry

    model = config_model()
    assert set(registry.methods()) <= set(model.model_fields)
    assert set(registry.plugins()) <= set(model.model_fields)
    with pytest.raises(ConfigError) as exc:
        build_config(None, ["fedavg.nonsense=1"])
    assert "fedavg.nonsense: unknown key" in str(exc.value)


def test_missing_config_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        build_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3")
    with pytest.raises(ConfigError, match="invalid TOML"):
        build_config(bad)


def test_run_config_round_trip():
    cfg = build_config(None, ["rounds=3", "clients_per_round=4", "dataset_options={label_mode='coarse'}",
                              "dataset=cifar100", "grad_clip=10"])
    flat = to_run_config(cfg)
    assert all(not isinstance(v, dict) for v in flat.values())
    assert from_run_config(flat) == cfg


def test_pyproject_flower_config_matches_defaults():
    """`flwr run .` from the repo uses [tool.flwr.app.config]: it must equal RunConfig's defaults."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    app_config = data["tool"]["flwr"]["app"]["config"]
    defaults = {k: v for k, v in to_run_config(build_config()).items() if "." not in k}
    assert app_config == defaults


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return fedsuite_run(list(args), cwd=cwd)


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--strategy", "nope"],
        ["simulate", "--rounds", "0"],
        ["simulate", "--set", "bogus=1"],
        ["simulate", "--dataset", "cifar10", "--set", "data_root=/nonexistent/fedsuite-data"],
    ],
)
def test_cli_user_errors_exit_2_without_traceback_or_run_dir(tmp_path, args):
    proc = run_cli(*args, "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error:" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["nope"], "No such command 'nope'"),
        (["simulat"], "No such command 'simulat'. Did you mean 'simulate'?"),
        (["--bogus"], "No such option '--bogus'"),
        (["simulate", "--rounds", "abc"], "'abc' is not a valid integer"),
        (["simulate", "--out", "x"], "--out is now --output-dir"),
        (["list", "--bogus"], "No such option '--bogus'"),
        (["partition", "--num-clients"], "'--num-clients' requires an argument"),
        (["report"], "Missing argument 'RUN_DIRS...'"),
        (["certs", "--bogus"], "No such option '--bogus'"),
        (["sweep", "--bogus"], "No such option '--bogus'"),
        (["sweep", "--samples", "x"], "'x' is not a valid integer"),
        (["reproduce", "--bogus"], "No such option '--bogus'"),
    ],
)
def test_every_commands_usage_error_is_one_line_and_exit_2(args, words):
    """click's usage errors (unknown command or option, a value of the wrong type, a missing
    argument) are said as every other user error: one ``error:`` line, exit code 2, no boxed usage."""
    from typer.testing import CliRunner

    from fedsuite.cli.main import app

    result = CliRunner().invoke(app, args)
    text = result.stdout + (result.stderr or "")
    assert result.exit_code == 2, text
    assert text.startswith("error: ") and words in text and len(text.strip().splitlines()) == 1, text
    assert text.count("Did you mean") <= 1, text  # once (typer repeated click's suggestion)


def test_cli_missing_dataset_names_files_and_layout(tmp_path):
    proc = run_cli("simulate", "--dataset", "cifar10", "--set", f"data_root={tmp_path / 'data'}",
                   "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "cifar-10" in proc.stderr.lower()


def test_cli_list_shows_every_registry():
    from fedsuite.method import registry

    proc = run_cli("list", cwd=ROOT)
    assert proc.returncode == 0
    out = proc.stdout
    for names in (registry.methods(), registry.datasets(), registry.partitioners(), registry.models()):
        for name in names:
            assert name in out


def test_cli_partition_writes_table_and_plot(tmp_path):
    out = tmp_path / "p.png"
    proc = run_cli("partition", "--num-clients", "8", "--partitioner", "pathological", "--classes-per-client", "2",
                   "--set", f"data_root={tmp_path}", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 1000
    assert "samples per class" in proc.stdout


def test_cli_partition_takes_data_root(tmp_path):
    """``fedsuite partition`` had no ``--data-root`` (simulate, sweep and reproduce have it): the data
    is looked for where it says, and missing data names that folder."""
    proc = run_cli("partition", "--dataset", "fmnist", "--data-root", str(tmp_path / "mydata"),
                   "--out", str(tmp_path / "p.png"), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert str(tmp_path / "mydata") in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    out = tmp_path / "s.png"
    proc = run_cli("partition", "--num-clients", "6", "--data-root", str(tmp_path / "mydata"), "--out", str(out),
                   cwd=tmp_path)
    assert proc.returncode == 0 and out.stat().st_size > 1000, proc.stderr


def test_the_docs_list_every_registered_name():
    """The README's methods table names every method; docs/datasets.md every dataset, partitioner
    and model (``fedsuite list --markdown`` writes those tables)."""
    from fedsuite.method import registry

    readme = (ROOT / "README.md").read_text()
    datasets_page = (ROOT / "docs" / "datasets.md").read_text()
    for name in registry.methods():
        assert f"| `{name}` |" in readme, f"README does not list `{name}`"
    for names in (registry.datasets(), registry.partitioners(), registry.models()):
        for name in names:
            assert f"| `{name}` |" in datasets_page, f"docs/datasets.md does not list `{name}`"


def test_config_json_is_written_by_runs(tmp_path):
    # the resolved config is JSON-serialisable and keeps only the active sections
    cfg = build_config(None, ["strategy=fedavg"])
    dump = cfg.active_dump()
    json.dumps(dump)
    assert dump["strategy"] == "fedavg"


# ------------------------------------------------------------------------------------------------
# a setting given for a run that its method and plug-ins do not use (issue 42, sweeps and search 5)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "error"), [
    (["--strategy", "fedavg", "--set", "fedprox.mu=0.1"], "fedprox.mu is a setting of fedprox; this run's strategy "
                                                          "is fedavg"),
    (["--set", "fedprox={mu=0.1}"], "fedprox.mu is a setting of fedprox; this run's strategy is fedavg"),
    (["--strategy", "scaffold", "--set", "relaxed_init.storage=server-state"],
     "relaxed_init.storage is a setting of the relaxed_init plug-in, which this run (strategy scaffold) does not "
     "switch on"),
])
def test_simulate_refuses_a_setting_its_method_does_not_use_before_the_run_folder(tmp_path, args, error):
    """``--set fedprox.mu=0.1`` with ``--strategy fedavg`` ran FedAvg and dropped the setting without a
    word: one line, exit 2, and no run folder."""
    proc = run_cli("simulate", *args, "--output-dir", str(tmp_path / "runs"), "--run-name", "r", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == f"error: {error}\n", proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_rule_a_config_file_holds_defaults_a_setting_is_the_runs_own(tmp_path):
    """docs/configuration.md's rule. A config file may hold the sections of several methods and
    plug-ins (experiments/baselines/cpu_fmnist.toml: one file for every baseline); a run uses its
    method's and those of the plug-ins it switches on. A setting given for the run (``--set``, an
    option, a keyword of ``fedsuite.simulate``: ``values``) must be one the run uses, on every path
    that runs simulate's code."""
    from fedsuite.launch.runner import resolve_config

    baselines = ROOT / "experiments" / "baselines" / "cpu_fmnist.toml"
    assert {"fedprox", "scaffold", "feddyn"} <= set(tomllib.loads(baselines.read_text()))
    for strategy in ("fedavg", "fedprox", "scaffold"):
        assert resolve_config(baselines, [f"strategy={strategy}"], {}).strategy == strategy
    assert resolve_config(None, ["strategy=fedprox", "fedprox.mu=0.1"], {}).fedprox.mu == 0.1
    assert resolve_config(None, [], {"strategy": "fedprox", "fedprox": {"mu": 0.1}}).fedprox.mu == 0.1
    # a plug-in the run switches on, by its own setting (--relaxed-init) or by its method (fedinit)
    on = resolve_config(None, ["relaxed_init.storage=server-state"], {"relaxed_init.beta": 0.1})
    assert on.relaxed_init.beta == 0.1
    assert resolve_config(None, ["strategy=fedinit", "relaxed_init.storage=server-state"], {}).strategy == "fedinit"
    assert resolve_config(None, ["strategy=fednlr", "neuron_lr.stats_batch_size=100"], {}).strategy == "fednlr"
    for overrides, values, error in (
            (["fedprox.mu=0.1"], {}, "fedprox.mu is a setting of fedprox; this run's strategy is fedavg"),
            ([], {"fedprox": {"mu": 0.1}}, "fedprox.mu is a setting of fedprox; this run's strategy is fedavg"),
            (["strategy=fedmr"], {"scaffold.server_lr": 1.0}, "scaffold.server_lr is a setting of scaffold; this run's "
                                                           "strategy is fedmr"),
            (["neuron_lr.log_base=2"], {}, "neuron_lr.log_base is a setting of the neuron_lr plug-in, which this run "
                                           "(strategy fedavg) does not switch on")):
        with pytest.raises(ConfigError) as exc:
            resolve_config(baselines, overrides, values)
        assert str(exc.value) == error


def test_every_reproduce_cell_passes_simulates_setting_check(tmp_path):
    """A target's rows set the sections of several methods for all of them (fedmrur's rows:
    fedmrur.rho, mofedsam.rho, fedsam.rho): each run's command line must carry only its own, or
    its simulate would refuse it."""
    from fedsuite.queues.reproduce.planning import plan
    from fedsuite.queues.reproduce.tables import SCALES, load_targets
    from fedsuite.launch.runner import resolve_config

    for target in load_targets().values():
        for scale in SCALES if target.has_cpu_scale else ("paper",):
            for spec in plan(target, scale, tmp_path):
                cfg = resolve_config(spec.config, spec.overrides, {})
                assert cfg.active_dump() == spec.cfg.active_dump(), (target.name, spec.label)
