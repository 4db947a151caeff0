"""The federation's gateway: the one port a federation opens to other machines (``fedsuite gateway``).

Flower 1.42's SuperLink serves three APIs on one HTTP port:

* ``/v1/fleet/``: the **Fleet API**. SuperNodes register, pull work and push results; with
  ``--enable-supernode-auth`` each request is signed by the SuperNode's private key, and only
  registered public keys are served.
* ``/v1/control/``: the **Control API** of the ``flwr`` CLI: ``flwr run`` (submit an app, whose
  ServerApp code then runs on the SuperLink's machine), ``flwr supernode register`` (allow a key),
  ``flwr ls``, ``flwr stop``. Open-source Flower authenticates nobody here (account login is an
  Enterprise feature): whoever reaches it with the CA certificate, which every SuperNode holds, can
  register a SuperNode key of their own and run code on the server.
* ``/v1/runtime/``: the **Runtime API**, between the SuperLink and its own ServerApp process.

So the SuperLink listens only where the admin is (its host's loopback, or a private compose network),
and this gateway publishes the Fleet API alone. It is nginx (Debian: ``apt-get install nginx-light``),
a well-kept proxy, configured by :func:`nginx_config`:

* TLS is terminated with the SuperLink's own certificate (``server.pem``, so SuperNodes verify the
  same name with the same ``ca.crt``), and the request is passed on over TLS to the SuperLink,
  whose certificate nginx verifies against ``ca.crt``: the SuperLink keeps TLS, which Flower's
  SuperNode authentication requires, and the signed headers reach it untouched.
* Only ``POST /v1/fleet/<endpoint>`` is passed, matched on the request line exactly as the client
  sent it (``$request_uri``: no dot segments, no percent-encoding, no query), so no spelling of a
  path reaches another API. Everything else gets 403 and one line saying why.
* Request bodies of any size are streamed (a model's arrays travel in ``push-object``), and long
  rounds do not time out the connection (``proxy_read_timeout``).

``fedsuite gateway CREDENTIALS --listen HOST:PORT --superlink HOST:PORT`` writes the configuration
into a folder (``--dir``) and runs nginx in the foreground (``exec``: its PID is the command's, so
it is stopped like any process); ``--print-config`` prints the configuration for an nginx of your
own. The files it reads are ``ca.crt``, ``server.pem`` and ``server.key``: never ``ca.key`` or a
SuperNode's private key.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from pathlib import Path

from fedsuite.certs import Credentials, require

#: the Fleet API's endpoints are ``/v1/fleet/<lower-case words joined by ->``; nothing else passes
FLEET_PATH_RE = r"^/v1/fleet/[a-z]+(-[a-z]+)*$"
#: how to get nginx where it is missing (the one-line error names it)
NGINX_HINT = "install nginx (Debian/Ubuntu: apt-get install nginx-light)"


class GatewayError(ValueError):
    """The gateway cannot be configured or started (bad address, missing nginx or credential)."""


def split_address(address: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port), or one-line :class:`GatewayError`."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise GatewayError(f"{what}: expected HOST:PORT (e.g. 127.0.0.1:9092), got {address!r}")
    if any(c.isspace() or c in ';{}"\'$#' for c in host):
        raise GatewayError(f"{what}: {host!r} is not a host name or IP address")
    return host, int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _nginx_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def nginx_config(creds: Credentials, listen: str, superlink: str, workdir: Path,
                 superlink_name: str | None = None) -> str:
    """nginx's whole configuration for a gateway on ``listen`` in front of the SuperLink at
    ``superlink`` (both ``HOST:PORT``), with its pid file, logs and buffers under ``workdir``.

    ``superlink_name`` is the name nginx checks the SuperLink's certificate against: by default the
    host of ``superlink``, or ``localhost`` when that is an IP address (nginx verifies names, not IP
    addresses; ``fedsuite certs`` always puts ``localhost`` in the certificate)."""
    require(creds.ca_cert, creds.server_cert, creds.server_key)
    listen_host, listen_port = split_address(listen, "--listen")
    up_host, up_port = split_address(superlink, "--superlink")
    name = superlink_name or ("localhost" if _is_ip(up_host) else up_host)
    work = workdir.resolve()
    return f"""# fedsuite gateway (fedsuite/gateway.py): publishes the SuperLink's Fleet API alone, over TLS.
# SuperNodes connect here; the Control API (flwr run, flwr supernode register) and the Runtime API
# stay on the SuperLink's side ({_nginx_address(up_host, up_port)}), which only the admin reaches.
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log stderr notice;

events {{
    worker_connections 1024;
}}

http {{
    access_log {work}/access.log;
    client_body_temp_path {work}/tmp/body;
    proxy_temp_path {work}/tmp/proxy;
    fastcgi_temp_path {work}/tmp/fastcgi;
    uwsgi_temp_path {work}/tmp/uwsgi;
    scgi_temp_path {work}/tmp/scgi;
    server_tokens off;

    upstream superlink {{
        server {_nginx_address(up_host, up_port)};
        keepalive 16;
    }}

    server {{
        listen {_nginx_address(listen_host, listen_port)} ssl;
        ssl_certificate {creds.server_cert.resolve()};
        ssl_certificate_key {creds.server_key.resolve()};
        ssl_protocols TLSv1.2 TLSv1.3;
        default_type text/plain;

        # the Fleet API: POST /v1/fleet/<endpoint>, as the client wrote it (no "..", "%", "?")
        location /v1/fleet/ {{
            if ($request_uri !~ "{FLEET_PATH_RE}") {{
                return 403 "fedsuite gateway: refused: not a Fleet API endpoint\\n";
            }}
            limit_except POST {{
                deny all;
            }}
            proxy_pass https://superlink;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {creds.ca_cert.resolve()};
            proxy_ssl_name {name};
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;
            client_max_body_size 0;
            proxy_request_buffering off;
            proxy_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }}

        # the Control API and the Runtime API (and anything else) are not served to the network
        location / {{
            return 403 "fedsuite gateway: refused: only the Fleet API (/v1/fleet/) is served here; the Control API is reached on the SuperLink's machine\\n";
        }}
    }}
}}
"""


def nginx_binary() -> str:
    """The nginx executable, or one-line :class:`GatewayError` saying how to get it."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if os.access(p, os.X_OK)), None)
    if found is None:
        raise GatewayError(f"nginx is not installed: {NGINX_HINT}")
    return found


def prepare(creds: Credentials, listen: str, superlink: str, workdir: Path,
            superlink_name: str | None = None) -> list[str]:
    """Write ``workdir/nginx.conf`` (and the folders nginx writes into) and return the command that
    runs the gateway in the foreground: ``nginx -p WORKDIR -c WORKDIR/nginx.conf -e stderr``."""
    config = nginx_config(creds, listen, superlink, workdir, superlink_name)
    binary = nginx_binary()
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        folder = workdir / "tmp" / sub
        folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # nginx started as root serves from workers running as `nobody`
            import pwd

            nobody = pwd.getpwnam("nobody")
            os.chown(folder, nobody.pw_uid, nobody.pw_gid)
    conf = workdir / "nginx.conf"
    conf.write_text(config)
    return [binary, "-p", str(workdir.resolve()), "-c", str(conf.resolve()), "-e", "stderr"]
