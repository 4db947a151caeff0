"""``fedsuite certs``, ``connection``, ``submit`` and ``gateway``: the commands of a Deployment
Engine federation (``fedsuite.deploy``: credentials, the flwr CLI's connection, a run submitted and
followed, the SuperLink's Fleet API behind nginx), registered on ``fedsuite`` by ``fedsuite.cli.main``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fedsuite.cli.support import OneLineUsageCommand, check_readable, check_writable_folder, fail, plain_console

#: the commands of this module (``fedsuite.cli.main`` adds them to the app)
commands = typer.Typer(rich_markup_mode=None)
console = plain_console()


@commands.command(cls=OneLineUsageCommand)
def certs(
    out: Path = typer.Argument(..., help="credentials folder (created; existing files are kept)"),
    host: list[str] = typer.Option([], "--host", help="a name or IP address SuperNodes and the CLI use to "
                                   "reach the SuperLink (repeatable; localhost and 127.0.0.1 are always in)"),
    supernode: list[str] = typer.Option([], "--supernode", help="make an authentication key pair for this "
                                        "SuperNode name (repeatable)"),
    days: int = typer.Option(825, min=1, help="validity of new certificates, in days"),
    force_server: bool = typer.Option(False, "--force-server", help="re-issue the SuperLink certificate "
                                      "(e.g. for new --host values) from the same CA"),
) -> None:
    """Make a CA, the SuperLink's TLS certificate and SuperNode key pairs for a Deployment Engine federation."""
    from fedsuite.deploy.certs import CertError, make_credentials, server_hosts

    try:
        creds = make_credentials(out, host, supernode, days=days, force_server=force_server)
    except CertError as exc:
        fail(str(exc))
    for path in creds.created:
        console.print(f"wrote {path}", highlight=False)
    console.print(f"SuperLink certificate valid for: {', '.join(server_hosts(creds))}", highlight=False)
    names = creds.supernode_names()
    console.print(f"SuperNode keys: {', '.join(names) if names else '(none)'}; register each public key "
                  f"with `flwr supernode register {creds.root / 'supernodes'}/NAME.pub <connection>`",
                  highlight=False)


@commands.command(cls=OneLineUsageCommand)
def connection(
    flwr_home: Path = typer.Argument(..., help="the flwr CLI's home (FLWR_HOME): its config.toml gets the connection"),
    address: str = typer.Argument(..., help="the SuperLink's Control API, HOST:PORT"),
    root_certificates: Optional[Path] = typer.Option(None, "--root-certificates",
                                                     help="the CA certificate (TLS); without it: insecure"),
    name: str = typer.Option("fedsuite", "--name", help="the connection's name"),
) -> None:
    """Write the flwr CLI's connection to a SuperLink (for flwr run, flwr log, fedsuite submit)."""
    from fedsuite.deploy.superlink import write_connection

    check_writable_folder(flwr_home, "FLWR_HOME")
    if root_certificates is not None:
        check_readable(root_certificates, "file", "--root-certificates")
    write_connection(flwr_home, address, root_certificates, name)


@commands.command(cls=OneLineUsageCommand)
def submit(
    app_dir: Path = typer.Argument(..., help="the Flower app folder to run"),
    connection: str = typer.Argument(..., help="the flwr connection's name (fedsuite connection)"),
    run_config: Optional[str] = typer.Option(None, "--run-config", help="as flwr run --run-config takes it "
                                             "(default: the app's own config)"),
) -> None:
    """flwr run + flwr log --stream against a SuperLink; exits 0 only if the run finished completed."""
    from fedsuite.deploy.superlink import submit_and_follow

    check_readable(app_dir, "folder", "APP_DIR")
    raise typer.Exit(submit_and_follow(app_dir, connection, run_config or ""))


@commands.command(cls=OneLineUsageCommand)
def gateway(
    credentials: Path = typer.Argument(..., help="credentials folder (fedsuite certs): reads ca.crt, server.pem, "
                                       "server.key only"),
    listen: str = typer.Option("0.0.0.0:9093", "--listen", help="HOST:PORT the SuperNodes connect to"),
    superlink: str = typer.Option("127.0.0.1:9092", "--superlink", help="HOST:PORT of the SuperLink, which "
                                  "listens there only (flower-superlink --host/--port)"),
    superlink_name: Optional[str] = typer.Option(None, "--superlink-name", help="the name the SuperLink's "
                                                 "certificate is checked against (default: --superlink's host, "
                                                 "or localhost for an IP address)"),
    workdir: Optional[Path] = typer.Option(None, "--dir", help="folder for nginx.conf, its pid file and logs "
                                           "(default: CREDENTIALS/../gateway)"),
    print_config: bool = typer.Option(False, "--print-config", help="print the nginx configuration and exit"),
    max_body: Optional[str] = typer.Option(None, "--max-body", help="largest request body, e.g. 8m (default: "
                                           "one of Flower's 5 MiB array chunks + 3 MiB); larger gets 413"),
    max_conns: int = typer.Option(32, "--max-conns", help="requests in progress at once per client address "
                                  "(more get 503, which SuperNodes retry)"),
    max_rate: int = typer.Option(100, "--max-rate", help="requests a second per client address, burst twice "
                                 "that (more get 503, which SuperNodes retry)"),
    body_timeout: int = typer.Option(60, "--body-timeout", help="seconds a client may send nothing of its "
                                     "request (then 408), or read nothing of its response"),
) -> None:
    """Publish the SuperLink's Fleet API alone, over TLS, through nginx: SuperNodes connect here; the
    Control API (flwr run, flwr supernode register) stays on the SuperLink's machine. Bodies, requests
    per client address and slow clients are bounded before anything reaches the SuperLink."""
    import os

    from fedsuite.deploy import gateway as gw
    from fedsuite.deploy.certs import CertError, Credentials

    from fedsuite.records.paths import path_problem

    problem = path_problem(credentials)  # a loop; a missing file is named by the credentials' own check
    if problem is not None:
        fail(f"CREDENTIALS: {problem}")
    if workdir is not None:
        check_writable_folder(workdir, "--dir")
    creds = Credentials(credentials)
    folder = workdir or credentials.resolve().parent / "gateway"
    try:
        limits = gw.Limits(None if max_body is None else gw.parse_size(max_body), max_conns, max_rate, body_timeout)
        if print_config:
            print(gw.nginx_config(creds, listen, superlink, folder, superlink_name, limits), end="")
            return
        command = gw.prepare(creds, listen, superlink, folder, superlink_name, limits)
    except (gw.GatewayError, CertError, OSError) as exc:
        fail(str(exc))
    print(f"gateway: {listen} -> Fleet API of {superlink} (nginx, {folder / 'nginx.conf'})", flush=True)
    os.execv(command[0], command)
