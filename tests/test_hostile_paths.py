"""Hostile inputs: credentials checked as a set, and one check of paths, names and typed values.

* ``fedsuite certs`` refuses a folder whose files do not belong together (a ``ca.key`` of another
  CA, a ``server.pem`` another CA signed) in one line, exit 2, and leaves every file byte for byte
  as it was; a host that is neither an IP address nor a DNS name (``999.1.1.1``) is refused; the
  gateway's ``--superlink-name`` must be a name of the SuperLink's certificate.
* Every command answers a path it cannot follow (a symlink loop), a name that would leave its
  folder (``--name ../x``) and a config value of the wrong type (``dataset_options={path=1}``) in
  one line, exit 2, before anything is written; the Python API raises fedsuite's own errors.
* An image folder whose splits disagree on their classes, or with a class folder without images,
  is refused in one line.

The commands run as real ``fedsuite`` processes (``conftest.fedsuite_run``); every case is a
refusal before any training, so the file is quick.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import fedsuite_run

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def fedsuite(*args: str) -> subprocess.CompletedProcess:
    return fedsuite_run(list(args), env=ENV, timeout=300)


def assert_one_line(out: subprocess.CompletedProcess, fragment: str) -> None:
    """Exit 2, one ``error:`` line holding ``fragment`` (whitespace as printed), no traceback."""
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text and "──" not in text, text
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    assert fragment in lines[0], text


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def openssl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", *args], capture_output=True, text=True)


# ------------------------------------------------------------------------------------------------
# credentials: checked as a set
# ------------------------------------------------------------------------------------------------


def test_certs_refuses_another_cas_key_and_leaves_every_file_as_it_was(tmp_path):
    """A ``ca.key`` of another CA (made by openssl itself) beside ``ca.crt``: ``--force-server``
    wrote a ``server.pem`` that ``openssl verify`` rejects, over the working one, rc 0."""
    creds = tmp_path / "k5"
    assert fedsuite("certs", str(creds), "--host", "superlink", "--supernode", "n0").returncode == 0
    verify = openssl("verify", "-CAfile", str(creds / "ca.crt"), str(creds / "server.pem"))
    assert verify.returncode == 0 and "OK" in verify.stdout, verify.stderr
    other = tmp_path / "other"
    other.mkdir()
    made = openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:secp384r1", "-nodes",
                   "-keyout", str(other / "ca.key"), "-out", str(other / "ca.crt"), "-days", "2", "-subj", "/CN=other")
    assert made.returncode == 0, made.stderr
    shutil.copy(other / "ca.key", creds / "ca.key")
    before = snapshot(creds)
    for args in (["--force-server"], ["--force-server", "--host", "new.example"], ["--supernode", "n1"], []):
        out = fedsuite("certs", str(creds), *args)
        assert_one_line(out, f"{creds / 'ca.key'} is not the private key of {creds / 'ca.crt'}")
        assert snapshot(creds) == before  # byte for byte, and no file added (no NAME.new left)
    verify = openssl("verify", "-CAfile", str(creds / "ca.crt"), str(creds / "server.pem"))
    assert verify.returncode == 0, verify.stderr


def test_certs_refuses_a_server_certificate_of_another_ca_until_it_is_reissued(tmp_path):
    """A kept ``server.pem`` signed by another CA (a folder put together from two) is named; the
    re-issued one verifies with openssl and leaves no ``.new`` file."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for folder in (mine, theirs):
        assert fedsuite("certs", str(folder)).returncode == 0
    shutil.copy(theirs / "server.pem", mine / "server.pem")
    shutil.copy(theirs / "server.key", mine / "server.key")
    before = snapshot(mine)
    out = fedsuite("certs", str(mine), "--supernode", "n0")
    assert_one_line(out, "the certificate was not signed by this ca.crt")
    assert "--force-server" in out.stderr and snapshot(mine) == before
    out = fedsuite("gateway", str(mine), "--print-config")  # the gateway reads the same three files
    assert_one_line(out, "the certificate was not signed by this ca.crt")
    # server.key of another pair beside a server.pem this CA signed
    assert fedsuite("certs", str(mine), "--force-server").returncode == 0
    shutil.copy(theirs / "server.key", mine / "server.key")
    assert_one_line(fedsuite("certs", str(mine)), "server.key is not the private key of server.pem")
    out = fedsuite("certs", str(mine), "--force-server")
    assert out.returncode == 0, out.stderr
    verify = openssl("verify", "-CAfile", str(mine / "ca.crt"), str(mine / "server.pem"))
    assert verify.returncode == 0, verify.stderr
    assert not list(mine.glob("*.new"))


@pytest.mark.parametrize("host", ["999.1.1.1", "10.1.2", "256.0.0.1", "host.123"])
def test_certs_refuses_a_host_that_is_no_ip_address_and_no_dns_name(tmp_path, host):
    out = fedsuite("certs", str(tmp_path / "c"), "--host", host)
    assert_one_line(out, f"--host {host!r} is not a valid IP address")
    assert not (tmp_path / "c").exists()


def test_gateway_refuses_a_superlink_name_its_certificate_does_not_hold(tmp_path):
    creds = tmp_path / "c"
    assert fedsuite("certs", str(creds), "--host", "superlink").returncode == 0
    out = fedsuite("gateway", str(creds), "--superlink-name", "elsewhere", "--print-config")
    assert_one_line(out, "--superlink-name 'elsewhere' is not a name of the SuperLink's certificate")
    assert "localhost, superlink" in out.stderr
    out = fedsuite("gateway", str(creds), "--superlink-name", "127.0.0.1", "--print-config")
    assert_one_line(out, "nginx checks DNS names, not IP addresses")
    out = fedsuite("gateway", str(creds), "--superlink", "other.example:9092", "--print-config")
    assert_one_line(out, "the name 'other.example' (--superlink's host)")
    out = fedsuite("gateway", str(creds), "--superlink", "superlink:9092", "--print-config")
    assert out.returncode == 0 and "proxy_ssl_name superlink;" in out.stdout, out.stderr


# ------------------------------------------------------------------------------------------------
# paths and names: one check for every command
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def loop(tmp_path) -> Path:
    """``a`` -> ``b`` -> ``a``: a path through it cannot be followed."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return tmp_path / "a"


def test_a_symlink_loop_is_one_line_for_every_command(tmp_path, loop):
    """sweep, sweep --search and partition --out ended in 104-523-line tracebacks."""
    base = ["--set", f"data_root={tmp_path / 'data'}", "--engine", "inprocess"]
    out = fedsuite("sweep", "--grid", "lr=0.1,0.2", "--output-dir", str(loop / "x"), *base)
    assert_one_line(out, "--output-dir: ")
    assert "cannot be followed" in out.stderr
    out = fedsuite("sweep", "--search", "random", "--space", "lr=log:0.01:0.1", "--output-dir", str(loop / "x"),
                   *base)
    assert_one_line(out, "--output-dir: ")
    assert "cannot be followed" in out.stderr
    out = fedsuite("partition", "--out", str(loop / "p.png"), "--num-clients", "2", "--set",
                   f"data_root={tmp_path / 'data'}")
    assert_one_line(out, "--out: ")
    assert "cannot be followed" in out.stderr
    assert_one_line(fedsuite("simulate", "--config", str(loop / "c.toml")), "config file: ")
    assert_one_line(fedsuite("certs", str(loop / "creds")), "credentials folder: ")
    assert_one_line(fedsuite("gateway", str(loop / "creds"), "--print-config"), "CREDENTIALS: ")
    assert_one_line(fedsuite("connection", str(loop / "home"), "127.0.0.1:9092"), "FLWR_HOME: ")
    assert_one_line(fedsuite("connection", str(tmp_path / "home"), "127.0.0.1:9092", "--root-certificates",
                             str(loop / "ca.crt")), "--root-certificates: ")
    assert_one_line(fedsuite("submit", str(loop / "app"), "fedsuite"), "APP_DIR: ")
    # a folder where a file is meant
    out = fedsuite("partition", "--out", str(tmp_path), "--num-clients", "2")
    assert_one_line(out, "is a folder (or another non-file), not a file that can be written")
    assert not Path(f"{tmp_path}.png").exists()
    assert_one_line(fedsuite("simulate", "--config", str(tmp_path)), "is a folder (or another non-file), not a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ""])
def test_a_name_that_leaves_its_folder_is_refused_everywhere(tmp_path, name):
    """``fedsuite sweep --name ../escape`` wrote outside --output-dir; simulate refused the same name."""
    out_dir = tmp_path / "out"
    common = ["--output-dir", str(out_dir), "--set", f"data_root={tmp_path / 'data'}", "--engine", "inprocess",
              "--set", "rounds=1", "--set", "num_clients=2"]
    assert_one_line(fedsuite("sweep", "--grid", "lr=0.1", "--name", name, *common),
                    "--name must be a plain folder name")
    assert_one_line(fedsuite("sweep", "--search", "random", "--space", "lr=log:0.01:0.1", "--samples", "1", "--name",
                             name, *common),
                    "--name must be a plain folder name")
    assert_one_line(fedsuite("simulate", "--run-name", name, *common), "run_name must be a plain folder name")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, fragment", [
    (["--grid", "run_name=a,b"], "--grid run_name: a sweep or search puts each run in its own folder"),
    (["--grid", "output_dir=x,y"], "--grid output_dir: "),
    (["--grid", "lr=0.1", "--set", "run_name=mine"], "--set run_name: "),
    (["--search", "random", "--space", "output_dir=choice:x,y"], "--space output_dir: "),
    (["--search", "random", "--space", "lr=log:0.01:0.1", "--set", "output_dir=x"], "--set output_dir: "),
])
def test_a_sweep_over_a_runs_folder_is_refused(tmp_path, args, fragment):
    """A grid over run_name or output_dir was accepted, and every run put where the sweep puts it."""
    # a run of one round of two clients, in process: quick even where the sweep is not refused
    out = fedsuite("sweep", *args, "--output-dir", str(tmp_path / "out"), "--set", f"data_root={tmp_path / 'data'}",
                   "--set", "rounds=1", "--set", "num_clients=2", "--engine", "inprocess",
                   *(["--samples", "1"] if "--search" in args else []))
    assert_one_line(out, fragment)
    assert not (tmp_path / "out").exists()


def test_a_grid_value_given_as_an_inline_table_is_that_table(tmp_path):
    """``--grid 'dataset_options={alpha=1}'`` ran as ``dataset_options=1``; a section given whole
    (``fedprox={mu=0.1}``) likewise."""
    from fedsuite.queues.study import setting_label
    from fedsuite.queues.sweep import parse_grid, plan

    grid = parse_grid(["dataset_options={alpha=1.0},{alpha=2.0}", "fedprox={mu=0.1}"])
    runs = plan(None, ["strategy=fedprox", f"data_root={tmp_path}"], grid, [0], tmp_path / "sweep")
    assert [run.cfg.dataset_options for run in runs] == [{"alpha": 1.0}, {"alpha": 2.0}]
    assert {run.cfg.fedprox.mu for run in runs} == {0.1}
    assert setting_label(runs[0].setting) == 'dataset_options={"alpha" = 1.0} fedprox={"mu" = 0.1}'


# ------------------------------------------------------------------------------------------------
# typed values: the CLI's one line, the API's own errors
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset, options, fragment", [
    ("npz", "{path=1}", "dataset_options.path: Input should be a valid string (got 1)"),
    ("imagefolder", "{path=1}", "dataset_options.path: Input should be a valid string (got 1)"),
    ("hf", "{path=true}", "dataset_options.path: Input should be a valid string (got True)"),
    ("npz", '{path="x.npz", num_classes="3"}', "dataset_options.num_classes: Input should be a valid integer"),
])
def test_a_dataset_option_of_the_wrong_type_is_one_line(tmp_path, dataset, options, fragment):
    """``dataset_options={path=1}`` was a 1683-line TypeError; an hf path of ``true`` was looked up
    on the hub as 'True'."""
    for command in ("simulate", "partition"):
        extra = ["--output-dir", str(tmp_path / "runs"), "--engine", "inprocess"] if command == "simulate" else \
            ["--out", str(tmp_path / "p.png")]
        out = fedsuite(command, "--dataset", dataset, "--set", f"dataset_options={options}", "--set",
                       f"data_root={tmp_path / 'data'}", *extra)
        assert_one_line(out, fragment)
        assert "'True'" not in out.stderr and "hub" not in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_python_api_raises_fedsuites_errors_for_values_of_the_wrong_type(tmp_path, loop):
    """``fedsuite.simulate(config=123)`` was a bare TypeError."""
    import fedsuite

    cases = [
        (lambda: fedsuite.simulate(config=123), fedsuite.ConfigError, "config: expected a path"),
        (lambda: fedsuite.simulate(resume="yes"), fedsuite.ConfigError, "resume: expected True or False"),
        (lambda: fedsuite.simulate(dataset="npz", dataset_options={"path": 1}, output_dir=str(tmp_path / "r")),
         fedsuite.ConfigError, "dataset_options.path: Input should be a valid string"),
        (lambda: fedsuite.simulate(run_name="../x", output_dir=str(tmp_path / "r")), fedsuite.ConfigError,
         "run_name must be a plain folder name"),
        (lambda: fedsuite.simulate(config=loop / "c.toml"), fedsuite.ConfigError, "cannot be followed"),
        (lambda: fedsuite.load_run(123), fedsuite.ResultsError, "path: expected a path"),
        (lambda: fedsuite.load_runs(loop), fedsuite.ResultsError, "cannot be followed"),
        (lambda: fedsuite.load_run(loop / "run"), fedsuite.ResultsError, "cannot be followed"),
    ]
    for call, error, fragment in cases:
        with pytest.raises(error, match=fragment) as info:
            call()
        assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


# ------------------------------------------------------------------------------------------------
# image folders: every class in every split, with images
# ------------------------------------------------------------------------------------------------


def _image_folder(root: Path, layout: dict[str, dict[str, int]]) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, classes in layout.items():
        for label, count in classes.items():
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


@pytest.mark.parametrize("layout, fragment", [
    ({"train": {"a": 3, "b": 0}, "test": {"a": 2, "b": 2}}, "train/b holds no image"),
    ({"train": {"a": 3, "b": 0}, "test": {"a": 2, "b": 0}}, "train/b holds no image"),
    ({"train": {"a": 3, "b": 3}, "test": {"a": 2, "b": 0}}, "test/b holds no image"),
    ({"train": {"a": 3, "b": 3}, "test": {"a": 2}}, "lacks the class folder(s) b of the training split"),
    ({"train": {"a": 3}, "test": {"a": 2, "c": 2}}, "test/c has no counterpart in the training split"),
])
def test_an_image_folder_whose_classes_disagree_or_lack_images_is_one_line(tmp_path, layout, fragment):
    """A class with test images but no training images trained a head that could never learn it
    (rc 0); a class empty in both splits was dropped without a word."""
    imgs = _image_folder(tmp_path / "imgs", layout)
    out = fedsuite("simulate", "--dataset", "imagefolder", "--model", "mlp", "--num-clients", "2", "--engine",
                   "inprocess", "--set", f'dataset_options={{path="{imgs}"}}', "--set",
                   f"data_root={tmp_path / 'data'}", "--output-dir", str(tmp_path / "runs"))
    assert_one_line(out, fragment)
    assert not (tmp_path / "runs").exists()
