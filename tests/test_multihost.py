"""A federation across machines, with TLS and SuperNode authentication on, behind the gateway.

The network-namespace federation: five Linux network namespaces made by the test, one per
"machine" (the SuperLink's, two SuperNodes', a user's and a stranger's), joined by veth pairs on a
bridge in the SuperLink's namespace; each sees the others only through that network
(10.15.0.0/24), on plain processes. The layout is the one the README deploys:

* the SuperLink serves TLS with ``--enable-supernode-auth`` on its own loopback only
  (127.0.0.1:9092), so its Control API (``flwr run``, ``flwr supernode register``) and Runtime API
  are reached from its own machine alone: the admin registers the two SuperNodes' keys and submits
  the run from there;
* ``fedsuite gateway`` (nginx) publishes the Fleet API alone on 10.15.0.1:9093, over TLS with the
  SuperLink's certificate, and the SuperNodes connect through it; a round completes.

On that federation, while it trains (one module-scoped fixture runs it once; each test reads what
it recorded): a SuperNode whose key was never registered is refused, a CLI and a SuperNode without
the CA certificate cannot connect, and a stranger holding ``ca.crt`` (every SuperNode has it) can
neither register a key of its own, nor submit a run, nor reach the Runtime API, nor reach the
SuperLink's port directly, nor smuggle a Control API path past the gateway. Needs root
(``ip netns``) and nginx; skipped, with the reason, elsewhere (CI installs nginx: ``.ci/run``).
Every process is stopped by PID and the namespaces are deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from fedsuite.deploy import gateway
from fedsuite.launch import processes
from fedsuite.deploy import superlink
from fedsuite.deploy.certs import Credentials, make_credentials, make_supernode_key
from fedsuite.records.rows import read_metrics
from tests.conftest import deployment_app

SUBNET = "10.15.0"
LINK_IP = f"{SUBNET}.1"
PORT = 9093  # the gateway's, on the network
LINK_PORT = 9092  # the SuperLink's, on its own loopback


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); CI runs as root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    try:
        gateway.nginx_binary()
    except gateway.GatewayError as exc:
        return f"the gateway needs nginx: {exc}"
    probe = f"fs-probe-{os.getpid()}"
    out = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if out.returncode != 0:
        return f"ip netns add failed here: {out.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Network:
    """Namespaces ``link`` (with bridge br0, 10.15.0.1), ``node0`` (.2), ``node1`` (.3), ``user`` (.4),
    ``stranger`` (.5)."""

    ROLES = ("link", "node0", "node1", "user", "stranger")

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


#: what the stranger sends straight to the gateway (HTTPS verified with ca.crt): each request's
#: status code, or the connection error, as one JSON object on stdout
STRANGER_REQUESTS = r"""
import json, sys, httpx
ca, gateway, superlink = sys.argv[1:4]
out = {}
with httpx.Client(verify=ca, timeout=10) as client:
    for path in ("/v1/runtime/acquire-task", "/v1/control/list-runs", "/v1/fleet/../control/list-runs",
                 "/v1/fleet/%2e%2e/control/list-runs", "/v1/fleet//../control/start-run"):
        url = httpx.URL(f"https://{gateway}").copy_with(raw_path=path.encode())
        out[path] = client.post(url, content=b"").status_code
try:  # the SuperLink's own port, from another machine
    with httpx.Client(verify=ca, timeout=5) as client:
        out["direct"] = client.post(f"https://{superlink}/v1/control/list-runs", content=b"").status_code
except httpx.HTTPError as exc:
    out["direct"] = type(exc).__name__
print(json.dumps(out))
"""


@dataclass
class Federation:
    """What the network-namespace federation recorded, for the tests to read."""

    run_dir: Path
    status: str = ""
    details: str = ""
    codes: dict[str, int] = field(default_factory=dict)  # exit codes: rogue, noca
    outputs: dict[str, str] = field(default_factory=dict)  # the CLI's replies
    stranger_requests: dict[str, object] = field(default_factory=dict)
    registered: list[dict] = field(default_factory=list)  # `flwr supernode ls` after the run
    procs: list[subprocess.Popen] = field(default_factory=list)
    elapsed: float = 0.0


@pytest.fixture(scope="module")
def federation(tmp_path_factory, data_root) -> Federation:
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    net = Network()
    try:
        net.up()
        yield run_federation(net, tmp_path_factory.mktemp("netns"), data_root)
    finally:
        net.down()


def run_federation(net: Network, tmp_path: Path, data_root: Path) -> Federation:
    creds = make_credentials(tmp_path / "creds", hosts=[LINK_IP], supernodes=["node0", "node1", "rogue"])
    # the stranger's folder: only ca.crt, which every SuperNode holds, and a key pair of its own
    stranger = Credentials(tmp_path / "stranger-creds")
    (stranger.root / "supernodes").mkdir(parents=True)
    shutil.copy(creds.ca_cert, stranger.ca_cert)
    make_supernode_key(stranger, "stranger")
    _, run_dir, app_dir = deployment_app(tmp_path, data_root, rounds=1)
    fed = Federation(run_dir)
    gateway_address, link_address = f"{LINK_IP}:{PORT}", f"127.0.0.1:{LINK_PORT}"
    procs: list[tuple[subprocess.Popen, Path | None]] = []  # with the FLWR_HOME that marks its detached children
    homes = {name: tmp_path / f"home-{name}"
             for name in ("link", "admin", "node0", "node1", "rogue", "noca", "user-noca", "stranger")}
    env = {name: processes.flower_env(home) for name, home in homes.items()}
    superlink.write_connection(homes["admin"], link_address, root_certificates=creds.ca_cert, name="fed")
    # the stranger's CLI aims at the only port the network offers, with the CA certificate
    superlink.write_connection(homes["stranger"], gateway_address, root_certificates=stranger.ca_cert, name="fed")
    # the user's connection without the CA certificate: TLS must then fail to verify the gateway
    homes["user-noca"].mkdir()
    (homes["user-noca"] / "config.toml").write_text(
        f'[superlink]\ndefault = "fed"\n\n[superlink.fed]\naddress = "{gateway_address}"\n')
    admin = net.wrap("link")

    def cli(role: str, home: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*net.wrap(role), processes.bin_path("flwr"), *args], env=env[home],
                              capture_output=True, text=True, cwd=run_dir, timeout=120)

    t0 = time.monotonic()
    try:
        log = run_dir / "superlink.log"
        link = start(net, "link", [processes.bin_path("flower-superlink"), *creds.superlink_tls_args(),
                                   "--enable-supernode-auth", "--host", "127.0.0.1", "--port", str(LINK_PORT),
                                   "--database", str(homes["link"] / "state.db"),
                                   "--disable-runtime-dependency-installation"],
                     env["link"], log, run_dir)
        procs.append((link, homes["link"]))
        gw_log = run_dir / "gateway.log"
        gw = start(net, "link", [sys.executable, "-m", "fedsuite.cli.main", "gateway", str(creds.root),
                                 "--listen", f"0.0.0.0:{PORT}", "--superlink", link_address,
                                 "--dir", str(tmp_path / "gateway")], env["link"], gw_log, run_dir)
        procs.append((gw, None))
        wait_for_log(link, log, "Uvicorn running on")
        wait_for_log(gw, gw_log, "start worker process")

        # the admin, on the SuperLink's machine, allows node0 and node1 (both at once); "rogue" never is
        register = {name: subprocess.Popen([*admin, processes.bin_path("flwr"), "supernode", "register",
                                            str(creds.supernode_pub(name)), "fed", "--format", "json"],
                                           env=env["admin"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True, cwd=run_dir)
                    for name in ("node0", "node1")}
        for name, proc in register.items():
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"flwr supernode register {name}: {out}"
            assert json.loads(out[out.index("{"):])["success"], out

        def supernode(role: str, name: str, key: str | None, pid: int, ca: bool = True) -> subprocess.Popen:
            args = creds.supernode_args(key) if ca else ["--auth-supernode-private-key", str(creds.supernode_key(key))]
            cmd = [processes.bin_path("flower-supernode"), *args, "--superlink", gateway_address,
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

        run_id = superlink.submit(app_dir, env["admin"], "fed", wrap=admin)
        # the stranger, while the run trains: register a key of its own, submit a run, raw requests
        for what, args in (("register", ("supernode", "register", str(stranger.supernode_pub("stranger")), "fed")),
                           ("run", ("run", str(app_dir), "fed")), ("ls", ("ls", "fed"))):
            reply = cli("stranger", "stranger", *args, "--format", "json")
            fed.outputs[f"stranger-{what}"] = reply.stdout + reply.stderr
            fed.codes[f"stranger-{what}"] = reply.returncode
        raw = subprocess.run([*net.wrap("stranger"), sys.executable, "-c", STRANGER_REQUESTS, str(stranger.ca_cert),
                              gateway_address, f"{LINK_IP}:{LINK_PORT}"], capture_output=True, text=True, timeout=60)
        assert raw.returncode == 0, raw.stderr
        fed.stranger_requests = json.loads(raw.stdout)

        fed.codes["rogue"], fed.codes["noca"] = wait_exit(rogue, 60), wait_exit(noca, 60)
        fed.outputs["cli-noca"], _ = cli_noca.communicate(timeout=60)
        # a refused SuperNode leaves its detached SuperExec retrying: stop it now, by its FLWR_HOME
        for name, proc in (("rogue", rogue), ("noca", noca)):
            processes.stop_tree(proc, ("FLWR_HOME", str(homes[name])))
        superlink.follow(run_id, env["admin"], "fed", run_dir, wrap=admin)
        fed.status, fed.details = superlink.final_status(run_id, env["admin"], "fed", run_dir, wrap=admin)
        listed = cli("link", "admin", "supernode", "ls", "fed", "--format", "json")
        fed.registered = json.loads(listed.stdout[listed.stdout.index("{"):]).get("nodes", [])
    finally:
        stop_all(procs)
    fed.elapsed = time.monotonic() - t0
    fed.procs = [p for p, _ in procs]
    print(f"netns federation: {fed.elapsed:.1f} s from SuperLink start to stop")
    return fed


def test_federation_across_network_namespaces(federation):
    fed, run_dir = federation, federation.run_dir
    error = (run_dir / "error.txt").read_text() if (run_dir / "error.txt").exists() else fed.details
    assert fed.status == "finished:completed", error
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [0, 1]
    assert all(sorted(r["cohort"]) == [0, 1] and r["dropped"] == [] for r in rows[1:]), rows
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    # the SuperNodes reached the SuperLink through the gateway, on the Fleet API only
    fleet = (run_dir.parent / "gateway" / "access.log").read_text()
    assert '"POST /v1/fleet/pull-messages HTTP/1.1" 200' in fleet and '"POST /v1/fleet/push-messages' in fleet
    # ... within the gateway's default limits: nothing refused for size, rate or slowness
    assert not [line for line in fleet.splitlines() if '" 413 ' in line or '" 503 ' in line or '" 408 ' in line], fleet
    # an unregistered SuperNode is refused: it logs Flower's connection error (Exit Code: 305) and,
    # as Flower exits for every error code, exits with status 1; it never gets a node id
    rogue_log = (run_dir / "supernode-rogue.log").read_text()
    assert fed.codes["rogue"] == 1 and "Failed to initialize the connection to the SuperLink" in rogue_log, rogue_log
    assert "Exit Code: 305" in rogue_log and "Failed to activate SuperNode" in rogue_log, rogue_log
    # without the CA certificate, TLS cannot verify the gateway: neither a SuperNode nor the CLI connects
    noca_log = (run_dir / "supernode-noca.log").read_text()
    assert fed.codes["noca"] != 0 and "CERTIFICATE_VERIFY_FAILED" in noca_log, noca_log
    # (flwr reports it as JSON, exit code 0, "success": false; the admin's CLI with the CA submitted the run)
    out = fed.outputs["cli-noca"]
    reply = json.loads(out[out.index("{"):])
    assert reply["success"] is False and "Connection to the SuperLink is unavailable" in reply["error-message"], reply
    for p in fed.procs:
        assert not psutil.pid_exists(p.pid) or psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE


def test_a_stranger_with_the_ca_certificate_cannot_submit_or_register(federation):
    """The hole this layout closes: Flower's Control API authenticates nobody, so a stranger with
    ``ca.crt`` who reaches it can allow a SuperNode key of its own and run code on the server."""
    fed = federation
    for what in ("register", "run", "ls"):  # flwr answers JSON with "success": false (exit code 0 or 1)
        out = fed.outputs[f"stranger-{what}"]
        reply = json.loads(out[out.index("{"):])
        assert reply["success"] is False and "403 Forbidden" in reply["error-message"], (what, reply)
    # no Control or Runtime API path passes the gateway, however it is spelt; the SuperLink's own
    # port is not on the network at all
    assert {path: code for path, code in fed.stranger_requests.items() if path != "direct"} == {
        "/v1/runtime/acquire-task": 403, "/v1/control/list-runs": 403, "/v1/fleet/../control/list-runs": 403,
        "/v1/fleet/%2e%2e/control/list-runs": 403, "/v1/fleet//../control/start-run": 403}
    assert fed.stranger_requests["direct"] == "ConnectError", fed.stranger_requests
    # the SuperLink allows exactly the two keys the admin registered, and ran exactly the admin's run
    assert len(fed.registered) == 2, fed.registered
    assert fed.status == "finished:completed", fed.details


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
    """docker/compose.yaml as a user runs it: the credentials step, the SuperLink (TLS,
    --enable-supernode-auth, the keys it made registered, no published port), the gateway (the Fleet
    API alone), two SuperNodes, the run service; 2 rounds, the run directory on the host, and
    ``down``. Before the run, a SuperNode container with a key the SuperLink never registered is
    refused, and a stranger on the SuperNodes' network holding ``ca.crt`` cannot register its key
    through the gateway."""
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
        from fedsuite.deploy.certs import Credentials, make_supernode_key

        make_supernode_key(Credentials(folders["intruder"]), "intruder")
        mount = ["-v", f"{folders['intruder'] / 'supernodes'}:/intruder:ro"]
        intruder = dc("run", "--rm", "--no-deps", *mount,
                      "supernode-0", "flower-supernode", "--superlink", "gateway:9093",
                      "--root-certificates", "/credentials/ca.crt",
                      "--auth-supernode-private-key", "/intruder/intruder.key",
                      "--node-config", "partition-id=0 num-partitions=2", "--max-retries", "1",
                      "--max-wait-time", "30", timeout=300)
        # a stranger with ca.crt on the SuperNodes' network tries the Control API through the gateway
        stranger = dc("run", "--rm", "--no-deps", "-e", "FEDSUITE_SUPERLINK=gateway:9093", *mount, "supernode-0",
                      "flwr", "supernode", "register", "/intruder/intruder.pub", "fedsuite", "--format", "json",
                      timeout=300)
        published = dc("port", "superlink", "9092")
        run = dc("up", "--exit-code-from", "run", "run")  # as docs/deployment.md has it
        logs = dc("logs", "--no-color").stdout
        (tmp_path / "compose-up.log").write_text(run.stdout + run.stderr)
        (tmp_path / "compose-logs.log").write_text(logs)
    finally:
        down = dc("down", "-v", "--remove-orphans", timeout=300)
    elapsed = time.monotonic() - t0
    assert intruder.returncode != 0, intruder.stdout + intruder.stderr
    assert "Failed to activate SuperNode" in intruder.stdout + intruder.stderr, intruder.stdout + intruder.stderr
    assert '"success": false' in stranger.stdout and "403 Forbidden" in stranger.stdout, stranger.stdout + stranger.stderr
    assert published.returncode != 0 or not published.stdout.strip(), f"the SuperLink publishes {published.stdout}"
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

    from fedsuite.deploy.certs import CertError, make_credentials, server_hosts

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
    from fedsuite.deploy.certs import CertError, Credentials

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
    # it writes the connection with fedsuite's `python3 -m fedsuite.cli.main connection`: the image puts
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

    from fedsuite.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["certs", str(tmp_path / "c"), "--host", "superlink", "--supernode", "a"])
    assert result.exit_code == 0, result.output
    assert "SuperLink certificate valid for: localhost, superlink, 127.0.0.1" in " ".join(result.output.split())
    assert sorted(p.name for p in (tmp_path / "c" / "supernodes").iterdir()) == ["a.key", "a.pub"]
    result = runner.invoke(app, ["certs", str(tmp_path / "c"), "--host", "bad host!"])
    assert result.exit_code == 2 and "neither an IP address nor a DNS name" in " ".join(result.output.split())


# --------------------------------------------------------------------------------------------------
# The gateway's configuration and the credentials hand-out (no Flower process: fast).
# --------------------------------------------------------------------------------------------------


def test_the_gateway_passes_the_fleet_api_alone_and_reads_no_private_key_but_its_own(tmp_path):
    """``fedsuite gateway --print-config``: nginx accepts it (``nginx -t``), it passes only
    ``POST /v1/fleet/<endpoint>`` as sent by the client, and it names ca.crt, server.pem and
    server.key, never ca.key or a SuperNode's key. Bad addresses and missing files are one line."""
    from typer.testing import CliRunner

    from fedsuite.cli.main import app

    creds = make_credentials(tmp_path / "creds", supernodes=["n0"])
    runner = CliRunner()
    result = runner.invoke(app, ["gateway", str(creds.root), "--listen", "127.0.0.1:19093", "--superlink",
                                 "127.0.0.1:19092", "--dir", str(tmp_path / "gw"), "--print-config"])
    assert result.exit_code == 0, result.output
    config = result.output
    assert "proxy_pass https://superlink;" in config and "proxy_ssl_verify on;" in config
    assert f"proxy_ssl_trusted_certificate {creds.ca_cert.resolve()};" in config
    assert "proxy_ssl_name localhost;" in config  # the SuperLink's address is an IP: its certificate names localhost
    assert config.count("proxy_pass") == 1 and "limit_except POST" in config
    assert "ca.key" not in config and "supernodes" not in config
    assert str(creds.server_key.resolve()) in config
    # the one path rule: every Fleet endpoint Flower's SuperNode calls passes, nothing else does
    import re

    import flwr.supernode.fleet_http_client as fleet

    rule = re.compile(gateway.FLEET_PATH_RE)
    endpoints = re.findall(r'path="(/v1/fleet/[^"]+)"', Path(fleet.__file__).read_text())
    assert len(endpoints) >= 10 and all(rule.match(e) for e in endpoints), endpoints
    for path in ("/v1/control/start-run", "/v1/fleet/../control/start-run", "/v1/fleet/%2e%2e/control/x",
                 "/v1/fleet/get-run?x=1", "/v1/fleet//get-run", "/v1/runtime/acquire-task", "/v1/fleet/"):
        assert not rule.match(path), path
    if shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK):
        command = gateway.prepare(creds, "127.0.0.1:19093", "127.0.0.1:19092", tmp_path / "gw", check=False)
        test = subprocess.run([*command, "-t"], capture_output=True, text=True)
        assert test.returncode == 0 and "syntax is ok" in test.stderr, test.stderr
    for args, message in ((["--listen", "nowhere"], "--listen: expected HOST:PORT"),
                          (["--superlink", "a;b:1"], "is not a host name or IP address"),
                          (["--superlink", "h:99999"], "--superlink: expected HOST:PORT")):
        result = runner.invoke(app, ["gateway", str(creds.root), *args, "--print-config"])
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
    result = runner.invoke(app, ["gateway", str(tmp_path / "nothing"), "--print-config"])
    assert result.exit_code == 2 and "missing credential file(s)" in " ".join(result.output.split()), result.output


def test_the_credentials_step_hands_each_service_only_its_own_files(tmp_path):
    """docker/credentials.sh (compose's one-shot ``credentials`` service), run as a script: the
    SuperLink gets the TLS files and the public keys, the gateway the TLS files, the admin ca.crt,
    each SuperNode ca.crt and its own private key; ca.key stays in the credentials folder. A
    certificate made before without the ``gateway`` name is refused in one line."""
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "FEDSUITE_CREDENTIALS_DIR": str(tmp_path / "creds"), "FEDSUITE_HANDOUT_DIR": str(tmp_path / "out"),
           "FEDSUITE_SUPERNODES": "supernode-0 supernode-1", "FEDSUITE_TLS_HOSTS": "203.0.113.7"}
    out = subprocess.run(["sh", str(REPO / "docker" / "credentials.sh")], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    handed = {folder.name: sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
              for folder in (tmp_path / "out").iterdir()}
    assert handed == {
        "superlink": ["ca.crt", "server.key", "server.pem", "supernodes/supernode-0.pub", "supernodes/supernode-1.pub"],
        "gateway": ["ca.crt", "server.key", "server.pem"],
        "admin": ["ca.crt"],
        "supernode-0": ["ca.crt", "supernode-0.key"],
        "supernode-1": ["ca.crt", "supernode-1.key"],
    }
    assert (tmp_path / "creds" / "ca.key").is_file()
    assert oct((tmp_path / "out" / "supernode-0" / "supernode-0.key").stat().st_mode & 0o777) == "0o600"
    # a credentials folder whose certificate predates the gateway: one line saying how to re-issue it
    old = make_credentials(tmp_path / "old", hosts=["superlink"])
    out = subprocess.run(["sh", str(REPO / "docker" / "credentials.sh")], capture_output=True, text=True,
                         env={**env, "FEDSUITE_CREDENTIALS_DIR": str(old.root), "FEDSUITE_TLS_HOSTS": "",
                              "FEDSUITE_HANDOUT_DIR": str(tmp_path / "out2")})
    assert out.returncode == 2 and "not valid for gateway" in out.stderr and "--force-server" in out.stderr, out.stderr
    assert not (tmp_path / "out2").exists()



def test_certs_is_all_or_nothing_and_two_at_once_agree(tmp_path):
    """Found by the hostile test: an unreadable ``ca.key`` ended in a traceback; a ``--host`` longer
    than 64 characters in a traceback and a CA left behind without a server certificate; and two
    ``fedsuite certs`` into one folder at once could leave a ``server.pem`` that its ``ca.crt`` did
    not sign. Every refusal is now one line that leaves the folder as it was, and calls on one
    folder take turns."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from typer.testing import CliRunner

    from fedsuite.deploy.certs import server_hosts
    from fedsuite.cli.main import app

    runner = CliRunner()
    # a host name longer than the 64 characters of a certificate's common name is fine in the SAN
    long_name = "n" * 60 + ".example.org"
    result = runner.invoke(app, ["certs", str(tmp_path / "long"), "--host", long_name])
    assert result.exit_code == 0, result.output
    assert long_name in server_hosts(Credentials(tmp_path / "long"))
    # a name no DNS allows: one line, and nothing written
    for bad in ("x" * 300, "a" * 64 + ".org", "-bad.org", "a..b"):
        result = runner.invoke(app, ["certs", str(tmp_path / "bad"), "--host", bad])
        assert result.exit_code == 2 and "neither an IP address nor a DNS name" in result.output, result.output
        assert "Traceback" not in result.output and not (tmp_path / "bad").exists()
    # an unreadable CA key, re-issuing the server certificate: a folder where the file should be, and
    # a file that is not a key (as root, permissions cannot make a file unreadable)
    creds = make_credentials(tmp_path / "c")
    before = creds.server_cert.read_bytes()
    creds.ca_key.unlink()
    creds.ca_key.mkdir()
    result = runner.invoke(app, ["certs", str(creds.root), "--force-server"])
    flat = " ".join(result.output.split())
    assert result.exit_code == 2 and f"missing credential file(s): {creds.ca_key} (missing or not a file" in flat, flat
    creds.ca_key.rmdir()
    creds.ca_key.write_bytes(b"\xff\xfe not a key")
    result = runner.invoke(app, ["certs", str(creds.root), "--force-server"])
    assert result.exit_code == 2 and "cannot read the CA" in result.output and "Traceback" not in result.output
    assert creds.server_cert.read_bytes() == before
    # two at once into one empty folder, four times: one CA, and a server certificate it signed
    for attempt in range(4):
        folder = tmp_path / f"race{attempt}"
        procs = [subprocess.Popen([sys.executable, "-m", "fedsuite.cli.main", "certs", str(folder), "--supernode", name],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for name in ("a", "b")]
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, out
        ca = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
        server = x509.load_pem_x509_certificate((folder / "server.pem").read_bytes())
        ca.public_key().verify(server.signature, server.tbs_certificate_bytes, ec.ECDSA(server.signature_hash_algorithm))
        assert sorted(p.name for p in (folder / "supernodes").iterdir()) == ["a.key", "a.pub", "b.key", "b.pub"]
