"""A federation across machines, with TLS and SuperNode authentication on.

``test_federation_across_network_namespaces``: four Linux network namespaces made by the test (one
per "machine": the SuperLink's, two SuperNodes', and the user's, where the ``flwr`` CLI runs),
joined by veth pairs on a bridge in the SuperLink's namespace; each sees the others only through
that network (10.15.0.0/24), on plain processes. One SuperLink serves TLS with
``--enable-supernode-auth`` (``fedsuite certs`` made the CA, its certificate and the key pairs); the
two SuperNodes' public keys are registered with ``flwr supernode register``; 2 rounds complete. On the
same federation: a SuperNode whose key was never registered is refused, and a CLI and a SuperNode
without the CA certificate cannot connect. Needs root (``ip netns``); skipped, with the reason,
elsewhere. Every process is stopped by PID and the namespaces are deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fedsuite import processes, superlink
from fedsuite.certs import make_credentials
from fedsuite.results import read_metrics
from tests.conftest import deployment_app

SUBNET = "10.15.0"
LINK_IP = f"{SUBNET}.1"
PORT = 9093


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); CI runs as root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"fs-probe-{os.getpid()}"
    out = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if out.returncode != 0:
        return f"ip netns add failed here: {out.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Network:
    """Namespaces ``link`` (with bridge br0, 10.15.0.1), ``node0`` (.2), ``node1`` (.3), ``user`` (.4)."""

    ROLES = ("link", "node0", "node1", "user")

    def __init__(self) -> None:
        tag = f"fs{os.getpid()}"
        self.ns = {role: f"{tag}-{role}" for role in self.ROLES}
        self.ip = {role: f"{SUBNET}.{i + 1}" for i, role in enumerate(self.ROLES)}

    def sh(self, *args: str) -> None:
        out = subprocess.run(["ip", *args], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")

    def up(self) -> None:
        for name in self.ns.values():
            self.sh("netns", "add", name)
            self.sh("-n", name, "link", "set", "lo", "up")
        link = self.ns["link"]
        self.sh("-n", link, "link", "add", "br0", "type", "bridge")
        self.sh("-n", link, "addr", "add", f"{self.ip['link']}/24", "dev", "br0")
        self.sh("-n", link, "link", "set", "br0", "up")
        for role in self.ROLES[1:]:
            peer = self.ns[role]
            self.sh("-n", link, "link", "add", f"v-{role}", "type", "veth", "peer", "name", "eth0", "netns", peer)
            self.sh("-n", link, "link", "set", f"v-{role}", "master", "br0")
            self.sh("-n", link, "link", "set", f"v-{role}", "up")
            self.sh("-n", peer, "addr", "add", f"{self.ip[role]}/24", "dev", "eth0")
            self.sh("-n", peer, "link", "set", "eth0", "up")

    def down(self) -> None:
        for name in self.ns.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def wrap(self, role: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[role]]


def start(net: Network, role: str, cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    """``cmd`` inside ``role``'s namespace (``ip netns exec`` execs it: the PID is the command's)."""
    with log.open("ab") as fh:
        return subprocess.Popen([*net.wrap(role), *cmd], env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def wait_for_log(proc: subprocess.Popen, log: Path, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"{log.name}: exited with {proc.returncode} before '{text}':\n{log.read_text()}")
        time.sleep(0.3)
    raise AssertionError(f"{log.name}: no '{text}' within {timeout:.0f} s:\n{log.read_text()}")


def wait_exit(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        processes.stop_tree(proc)
        raise AssertionError(f"process {proc.args} still running after {timeout:.0f} s") from None


def stop_all(procs: list[tuple[subprocess.Popen, Path | None]], timeout: float = 10.0) -> None:
    """Stop every process of ``procs`` and what each started (its descendants and the detached
    processes carrying its FLWR_HOME), all at once: SIGTERM, then SIGKILL after ``timeout``."""
    alive = {p.pid: p for proc, home in procs
             for p in processes.process_tree(proc, ("FLWR_HOME", str(home)) if home else None)}
    processes.terminate_all(list(alive.values()), timeout)
    for proc, _ in procs:
        proc.poll()


@pytest.fixture
def network():
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    net = Network()
    try:
        net.up()
        yield net
    finally:
        net.down()


def test_federation_across_network_namespaces(tmp_path, data_root, network):
    net = network
    creds = make_credentials(tmp_path / "creds", hosts=[LINK_IP], supernodes=["node0", "node1", "rogue"])
    _, run_dir, app_dir = deployment_app(tmp_path, data_root, rounds=2)
    address = f"{LINK_IP}:{PORT}"
    procs: list[tuple[subprocess.Popen, Path | None]] = []  # with the FLWR_HOME that marks its detached children
    homes = {name: tmp_path / f"home-{name}" for name in ("link", "node0", "node1", "rogue", "noca", "user", "user-noca")}
    env = {name: processes.flower_env(home) for name, home in homes.items()}
    superlink.write_connection(homes["user"], address, root_certificates=creds.ca_cert, name="fed")
    # the same connection without the CA certificate: TLS must then fail to verify the SuperLink
    homes["user-noca"].mkdir()
    (homes["user-noca"] / "config.toml").write_text(
        f'[superlink]\ndefault = "fed"\n\n[superlink.fed]\naddress = "{address}"\n')
    t0 = time.monotonic()
    try:
        log = run_dir / "superlink.log"
        link = start(net, "link", [processes.bin_path("flower-superlink"), *creds.superlink_tls_args(),
                                   "--enable-supernode-auth", "--host", "0.0.0.0", "--port", str(PORT),
                                   "--database", str(homes["link"] / "state.db"),
                                   "--disable-runtime-dependency-installation"],
                     env["link"], log, run_dir)
        procs.append((link, homes["link"]))
        wait_for_log(link, log, "Uvicorn running on")

        # the allowed SuperNodes: node0 and node1 are registered (both at once), "rogue" never is
        register = {name: subprocess.Popen([*net.wrap("user"), processes.bin_path("flwr"), "supernode", "register",
                                            str(creds.supernode_pub(name)), "fed", "--format", "json"],
                                           env=env["user"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True, cwd=run_dir)
                    for name in ("node0", "node1")}
        for name, proc in register.items():
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"flwr supernode register {name}: {out}"
            assert json.loads(out[out.index("{"):])["success"], out

        def supernode(role: str, name: str, key: str | None, pid: int, ca: bool = True) -> subprocess.Popen:
            args = creds.supernode_args(key) if ca else ["--auth-supernode-private-key", str(creds.supernode_key(key))]
            cmd = [processes.bin_path("flower-supernode"), *args, "--superlink", address,
                   "--node-config", f"partition-id={pid} num-partitions=2 state-dir='{run_dir / f'state-{name}'}'"]
            if name in ("rogue", "noca"):  # both in the user's namespace: their own Runtime API ports
                cmd += ["--max-retries", "1", "--max-wait-time", "20", "--port", "9095" if name == "rogue" else "9096"]
            p = start(net, role, cmd, env[name], run_dir / f"supernode-{name}.log", run_dir)
            procs.append((p, homes[name]))
            return p

        supernode("node0", "node0", "node0", 0)
        supernode("node1", "node1", "node1", 1)
        # refused on the same federation, while it trains: an unregistered key, and no CA certificate
        rogue = supernode("user", "rogue", "rogue", 0)
        noca = supernode("user", "noca", "node0", 1, ca=False)
        cli_noca = subprocess.Popen([*net.wrap("user"), processes.bin_path("flwr"), "ls", "fed", "--format", "json"],
                                    env=env["user-noca"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, cwd=run_dir)
        procs.append((cli_noca, None))

        wrap = net.wrap("user")
        run_id = superlink.submit(app_dir, env["user"], "fed", wrap=wrap)
        rogue_code, noca_code = wait_exit(rogue, 60), wait_exit(noca, 60)
        cli_noca_out, _ = cli_noca.communicate(timeout=60)
        # a refused SuperNode leaves its detached SuperExec retrying: stop it now, by its FLWR_HOME
        for name, proc in (("rogue", rogue), ("noca", noca)):
            processes.stop_tree(proc, ("FLWR_HOME", str(homes[name])))
        superlink.follow(run_id, env["user"], "fed", run_dir, wrap=wrap)
        status, details = superlink.final_status(run_id, env["user"], "fed", run_dir, wrap=wrap)
    finally:
        stop_all(procs)
    elapsed = time.monotonic() - t0
    error = (run_dir / "error.txt").read_text() if (run_dir / "error.txt").exists() else details
    assert status == "finished:completed", error
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(sorted(r["cohort"]) == [0, 1] and r["dropped"] == [] for r in rows[1:]), rows
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    # an unregistered SuperNode is refused: it exits with Flower's connection error, never gets a node id
    rogue_log = (run_dir / "supernode-rogue.log").read_text()
    assert rogue_code != 0 and "Failed to initialize the connection to the SuperLink" in rogue_log, rogue_log
    # without the CA certificate, TLS cannot verify the SuperLink: neither a SuperNode nor the CLI connects
    noca_log = (run_dir / "supernode-noca.log").read_text()
    assert noca_code != 0 and "CERTIFICATE_VERIFY_FAILED" in noca_log, noca_log
    # (flwr reports it as JSON, exit code 0, "success": false; the same command with the CA submitted the run)
    reply = json.loads(cli_noca_out[cli_noca_out.index("{"):])
    assert reply["success"] is False and "Connection to the SuperLink is unavailable" in reply["error-message"], reply
    for p, _ in procs:
        assert not psutil.pid_exists(p.pid) or psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE
    print(f"netns federation: {elapsed:.1f} s from SuperLink start to stop")


# --------------------------------------------------------------------------------------------------
# The Docker deployment: docker/Dockerfile + docker/compose.yaml, with real containers.
# --------------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
IMAGE = os.environ.get("FEDSUITE_DOCKER_IMAGE", "fedsuite:test")


def compose_command() -> list[str] | None:
    """Compose v2 (``docker compose``) or v1 (``docker-compose``); both read docker/compose.yaml."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def docker_unavailable() -> str | None:
    if os.environ.get("FEDSUITE_DOCKER_TESTS") != "1":
        return ("the Docker test builds the fedsuite image (torch and its wheels: minutes) and runs a federation "
                "in containers; set FEDSUITE_DOCKER_TESTS=1 to run it (.ci/run: FEDSUITE_CI_DOCKER=1)")
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if info.returncode != 0:
        return f"no Docker engine reachable (DOCKER_HOST={os.environ.get('DOCKER_HOST', 'default')}): " \
               f"{info.stderr.strip().splitlines()[-1] if info.stderr.strip() else info.stdout.strip()}"
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    return None


def build_image(tmp_path: Path) -> float:
    """``docker build`` of docker/Dockerfile as ``IMAGE``; returns the seconds it took. Build args come
    from FEDSUITE_DOCKER_BASE_IMAGE, FEDSUITE_DOCKER_TORCH_INDEX_URL and FEDSUITE_DOCKER_PIP_ARGS; with
    FEDSUITE_DOCKER_WHEELHOUSE (a folder of wheels, e.g. from ``pip download``) the build installs
    from it alone, served over HTTP on the host's loopback (the build runs with ``--network host``)."""
    args: list[str] = []
    for env_key, arg in (("FEDSUITE_DOCKER_BASE_IMAGE", "BASE_IMAGE"),
                         ("FEDSUITE_DOCKER_TORCH_INDEX_URL", "TORCH_INDEX_URL"),
                         ("FEDSUITE_DOCKER_PIP_ARGS", "PIP_ARGS")):
        if env_key in os.environ:
            args += ["--build-arg", f"{arg}={os.environ[env_key]}"]
    server = None
    wheelhouse = os.environ.get("FEDSUITE_DOCKER_WHEELHOUSE")
    try:
        if wheelhouse:
            if not Path(wheelhouse).is_dir():
                raise AssertionError(f"FEDSUITE_DOCKER_WHEELHOUSE={wheelhouse} is not a folder")
            port = superlink.free_port()
            server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                       "--directory", wheelhouse], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            args += ["--build-arg", "TORCH_INDEX_URL=",
                     "--build-arg", f"PIP_ARGS=--no-index --find-links http://127.0.0.1:{port}/"]
        env = dict(os.environ)
        if subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode != 0:
            env["DOCKER_BUILDKIT"] = "0"  # the classic builder, where the buildx plugin is not installed
        t0 = time.monotonic()
        log = tmp_path / "docker-build.log"
        with log.open("wb") as fh:
            code = subprocess.run(["docker", "build", "--network", "host", "-f", "docker/Dockerfile", "-t", IMAGE,
                                   *args, "."], cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
        assert code == 0, f"docker build failed:\n{log.read_text()[-6000:]}"
        return time.monotonic() - t0
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)


@pytest.mark.docker
def test_compose_federation_with_tls_and_authentication(tmp_path):
    """docker/compose.yaml as a user runs it: the SuperLink (TLS, --enable-supernode-auth, the keys it
    made registered), two SuperNodes, the run service; 2 rounds, the run directory on the host, and
    ``down``. Before the run, a SuperNode container with a key the SuperLink never registered is refused."""
    reason = docker_unavailable()
    if reason:
        pytest.skip(reason)
    build_s = build_image(tmp_path) if "FEDSUITE_DOCKER_IMAGE" not in os.environ else 0.0
    compose = [*compose_command(), "-f", str(REPO / "docker" / "compose.yaml"), "-p", f"fs{os.getpid()}"]
    folders = {key: tmp_path / key for key in ("credentials", "runs", "data", "intruder")}
    for folder in folders.values():
        folder.mkdir()
    env = {**os.environ, "FEDSUITE_IMAGE": IMAGE, "FEDSUITE_PORT": str(superlink.free_port()),
           "FEDSUITE_CREDENTIALS": str(folders["credentials"]), "FEDSUITE_RUNS": str(folders["runs"]),
           "FEDSUITE_DATA": str(folders["data"])}

    def dc(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([*compose, *args], env=env, capture_output=True, text=True, timeout=timeout)

    t0 = time.monotonic()
    try:
        up = dc("up", "-d", "supernode-0", "supernode-1")
        assert up.returncode == 0, up.stdout + up.stderr + dc("logs").stdout
        # an intruder: a well-formed key pair the SuperLink never registered (made outside its folder)
        from fedsuite.certs import Credentials, make_supernode_key

        make_supernode_key(Credentials(folders["intruder"]), "intruder")
        intruder = dc("run", "--rm", "--no-deps", "-v", f"{folders['intruder'] / 'supernodes'}:/intruder:ro",
                      "supernode-0", "flower-supernode", "--superlink", "superlink:9093",
                      "--root-certificates", "/credentials/ca.crt",
                      "--auth-supernode-private-key", "/intruder/intruder.key",
                      "--node-config", "partition-id=0 num-partitions=2", "--max-retries", "1",
                      "--max-wait-time", "30", timeout=300)
        run = dc("up", "--exit-code-from", "run")
        logs = dc("logs", "--no-color").stdout
        (tmp_path / "compose-up.log").write_text(run.stdout + run.stderr)
        (tmp_path / "compose-logs.log").write_text(logs)
    finally:
        down = dc("down", "-v", "--remove-orphans", timeout=300)
    elapsed = time.monotonic() - t0
    assert intruder.returncode != 0, intruder.stdout + intruder.stderr
    assert "Failed to activate SuperNode" in intruder.stdout + intruder.stderr, intruder.stdout + intruder.stderr
    assert run.returncode == 0, f"compose up: exit {run.returncode}; see {tmp_path}/compose-up.log and compose-logs.log:\n" + \
        "\n".join(line for line in logs.splitlines() if line.startswith(("run_", "superlink_")))[-6000:]
    assert "finished:completed" in run.stdout, run.stdout[-4000:]
    assert "2 SuperNode key(s) allowed" in logs, logs[-4000:]
    run_dirs = [p.parent for p in folders["runs"].glob("*/summary.json")]
    assert len(run_dirs) == 1, list(folders["runs"].iterdir())
    rows = read_metrics(run_dirs[0])
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(sorted(r["cohort"]) == [0, 1] and r["dropped"] == [] for r in rows[1:]), rows
    assert json.loads((run_dirs[0] / "summary.json").read_text())["status"] == "completed"
    assert (run_dirs[0] / "checkpoint.pt").is_file()
    assert down.returncode == 0, down.stdout + down.stderr
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project=fs{os.getpid()}"],
                          capture_output=True, text=True)
    assert left.stdout.strip() == "", f"containers left after down: {left.stdout}"
    print(f"docker: image build {build_s:.1f} s, federation (up, intruder, 2 rounds, down) {elapsed:.1f} s")


# --------------------------------------------------------------------------------------------------
# `fedsuite certs` and the loud failures on missing credentials (no Flower process: fast).
# --------------------------------------------------------------------------------------------------


def test_certs_are_valid_kept_and_extended(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

    from fedsuite.certs import CertError, make_credentials, server_hosts

    creds = make_credentials(tmp_path / "c", hosts=["superlink", "10.1.2.3"], supernodes=["n0"])
    ca = x509.load_pem_x509_certificate(creds.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(creds.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    assert sorted(server_hosts(creds)) == sorted(["localhost", "superlink", "127.0.0.1", "10.1.2.3"])
    assert creds.ca_key.stat().st_mode & 0o077 == 0 and creds.supernode_key("n0").stat().st_mode & 0o077 == 0
    private = load_ssh_private_key(creds.supernode_key("n0").read_bytes(), None)
    public = load_ssh_public_key(creds.supernode_pub("n0").read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert public.public_numbers() == private.public_key().public_numbers()
    # again: everything kept, one key added
    before = {p: p.read_bytes() for p in creds.root.rglob("*") if p.is_file()}
    again = make_credentials(tmp_path / "c", hosts=["superlink"], supernodes=["n0", "n1"])
    assert again.created == [again.supernode_key("n1"), again.supernode_pub("n1")]
    assert all(p.read_bytes() == data for p, data in before.items())
    # a host the certificate lacks: refused unless re-issued from the same CA
    with pytest.raises(CertError, match="not valid for other.example"):
        make_credentials(tmp_path / "c", hosts=["other.example"])
    reissued = make_credentials(tmp_path / "c", hosts=["other.example"], force_server=True)
    assert "other.example" in server_hosts(reissued) and reissued.ca_cert.read_bytes() == before[creds.ca_cert]
    with pytest.raises(CertError, match="SuperNode name"):
        make_credentials(tmp_path / "c", supernodes=["../escape"])


def test_missing_credentials_fail_loudly(tmp_path):
    from fedsuite.certs import CertError, Credentials

    creds = Credentials(tmp_path / "none")
    with pytest.raises(CertError, match=r"ca\.crt.*server\.pem.*server\.key"):
        creds.superlink_tls_args()
    with pytest.raises(CertError, match="ca.crt"):
        creds.supernode_args("n0")
    # the containers' entrypoint: a TLS connection without its CA file stops with the path, exit 2
    out = subprocess.run(["sh", str(REPO / "docker" / "entrypoint.sh"), "true"], capture_output=True, text=True,
                         env={**os.environ, "FEDSUITE_SUPERLINK": "superlink:9093", "FLWR_HOME": str(tmp_path / "h"),
                              "FEDSUITE_CA": str(tmp_path / "none" / "ca.crt")})
    assert out.returncode == 2 and f"{tmp_path / 'none' / 'ca.crt'} is missing" in out.stderr, out.stderr
    # it writes the connection with fedsuite's `python3 -m fedsuite.superlink connection`: the image puts
    # its environment's python3 first on PATH (docker/Dockerfile), and so does this test
    image_path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    out = subprocess.run(["sh", str(REPO / "docker" / "entrypoint.sh"), "cat", str(tmp_path / "h" / "config.toml")],
                         capture_output=True, text=True,
                         env={**os.environ, "FEDSUITE_SUPERLINK": "127.0.0.1:9093", "FLWR_HOME": str(tmp_path / "h"),
                              "FEDSUITE_INSECURE": "1", "PATH": image_path})
    assert out.returncode == 0 and "insecure = true" in out.stdout and "not encrypted" in out.stderr


def test_certs_command(tmp_path):
    """``fedsuite certs`` as users (and docker/superlink.sh) call it; a bad host is one line, exit 2."""
    from typer.testing import CliRunner

    from fedsuite.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["certs", str(tmp_path / "c"), "--host", "superlink", "--supernode", "a"])
    assert result.exit_code == 0, result.output
    assert "SuperLink certificate valid for: localhost, superlink, 127.0.0.1" in " ".join(result.output.split())
    assert sorted(p.name for p in (tmp_path / "c" / "supernodes").iterdir()) == ["a.key", "a.pub"]
    result = runner.invoke(app, ["certs", str(tmp_path / "c"), "--host", "bad host!"])
    assert result.exit_code == 2 and "neither an IP address nor a DNS name" in " ".join(result.output.split())
