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
* What reaches the SuperLink is bounded (:class:`Limits`). Flower's SuperLink reads a request's
  whole body into memory (its protobuf middleware) before SuperNode authentication looks at the
  request, so the gateway, not the SuperLink, must refuse what no SuperNode sends:

  - a body larger than ``max_body`` gets 413 at the gateway. A SuperNode's largest body is one
    ``push-object``: Flower 1.42 cuts every ``Array`` into ``ArrayChunk`` objects of at most
    ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`` bytes (5 MiB) and pushes each object in its own request,
    so a model of any size, and a method's extra ArrayRecords, travel in bodies of at most one chunk
    plus its header; the other objects (messages without their content, object trees, Config- and
    MetricRecords, the ArrayRecord's list of its arrays) are kilobytes. The default is that chunk
    plus :data:`BODY_MARGIN` (8 MiB in all);
  - the body is read whole by nginx first (``proxy_request_buffering on``), into memory
    (``client_body_buffer_size`` = ``max_body`` + :data:`BUFFER_MARGIN`: no temporary file, which
    nginx's workers, running as ``nobody`` when the gateway is started as root, could not write under
    a private folder; a buffer of exactly ``max_body`` filled up with a chunked body's first
    ``max_body`` bytes before nginx read the next chunk's size and refused it, and nginx then tried
    to spill it to a file: a 500 instead of the 413), and
    passed on only when complete, so a slow body ties up a gateway connection, never the SuperLink,
    and is cut off after ``body_timeout`` seconds without data (``client_body_timeout``: nginx logs
    408 and closes the connection; the same bound holds for headers and for a client that stops
    reading its response). The gateway holds at most ``conns_per_client`` x ``max_body`` bytes of
    bodies per client address;
  - per client address, at most ``conns_per_client`` requests in progress at once (``limit_conn``)
    and ``rate_per_client`` requests a second, with a burst of twice that (``limit_req``); above
    them the gateway answers 503, which Flower's SuperNode retries with backoff (it retries 502,
    503 and 504). A SuperNode has at most 4 requests in progress (its poll, its heartbeat and 2
    object transfers, Flower's ``FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PUSHES``/``PULLS``) and polls every
    3 s when idle; SuperNodes behind one address (NAT) share its limits.

  Long rounds do not time out the connection to the SuperLink (``proxy_read_timeout``).

``fedsuite gateway CREDENTIALS --listen HOST:PORT --superlink HOST:PORT`` writes the configuration
into a folder (``--dir``) and runs nginx in the foreground (``exec``: its PID is the command's, so
it is stopped like any process), after checking that ``--listen`` can be bound (a busy port is one
line naming it); ``--print-config`` prints the configuration for an nginx of your own.
``--max-body``, ``--max-conns``, ``--max-rate`` and ``--body-timeout`` set :class:`Limits`. The
files it reads are ``ca.crt``, ``server.pem`` and ``server.key``: never ``ca.key`` or a SuperNode's
private key.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from fedsuite.deploy.certs import Credentials, check_set, require, server_hosts

#: the Fleet API's endpoints are ``/v1/fleet/<lower-case words joined by ->``; nothing else passes
FLEET_PATH_RE = r"^/v1/fleet/[a-z]+(-[a-z]+)*$"
#: how to get nginx where it is missing (the one-line error names it)
NGINX_HINT = "install nginx (Debian/Ubuntu: apt-get install nginx-light)"


#: what the gateway's largest-body limit allows above one of Flower's array chunks: the object's
#: header and the request's protobuf fields, and room for the objects that are not chunked
BODY_MARGIN = 3 * 1024 * 1024
_SIZE_RE = re.compile(r"^([0-9]+)([kKmMgG]?)$")
_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


class GatewayError(ValueError):
    """The gateway cannot be configured or started (bad address, missing nginx or credential)."""


#: room in nginx's body buffer beyond ``max_body``: the buffer never fills with a body the size
#: check still lets through, so it never spills to a temporary file (see the module docstring)
BUFFER_MARGIN = 1 << 20


def default_max_body() -> int:
    """The largest request body a SuperNode sends, in bytes: one of Flower's array chunks
    (``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, 5 MiB unless that variable is set) plus
    :data:`BODY_MARGIN`."""
    from fedsuite.upstream import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

    return FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE + BODY_MARGIN


def parse_size(text: str, what: str = "--max-body") -> int:
    """``8388608``, ``512k``, ``8m`` or ``1g`` -> bytes (k, m, g: powers of 1024), or one-line
    :class:`GatewayError`."""
    found = _SIZE_RE.match(text.strip())
    if found is None or int(found.group(1)) == 0:
        raise GatewayError(f"{what}: expected a size in bytes, or with k, m or g (e.g. 8m), above 0; got {text!r}")
    return int(found.group(1)) * _UNITS[found.group(2).lower()]


@dataclass(frozen=True)
class Limits:
    """What the gateway lets through to the SuperLink (see the module's docstring).

    ``max_body``: bytes of one request body (None: :func:`default_max_body`); ``conns_per_client``:
    requests in progress at once per client address; ``rate_per_client``: requests a second per
    client address (burst: twice that); ``body_timeout``: seconds a client may send nothing while
    its headers or body are read, or read nothing of its response."""

    max_body: int | None = None
    conns_per_client: int = 32
    rate_per_client: int = 100
    body_timeout: int = 60

    def __post_init__(self) -> None:
        for name, option in (("conns_per_client", "--max-conns"), ("rate_per_client", "--max-rate"),
                             ("body_timeout", "--body-timeout")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise GatewayError(f"{option}: expected a whole number of at least 1, got {value!r}")
        if self.max_body is not None and (isinstance(self.max_body, bool) or not isinstance(self.max_body, int)
                                          or self.max_body < 1):
            raise GatewayError(f"--max-body: expected a number of bytes of at least 1, got {self.max_body!r}")

    @property
    def body_bytes(self) -> int:
        return self.max_body if self.max_body is not None else default_max_body()


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


def check_listen(host: str, port: int) -> None:
    """One-line :class:`GatewayError` if ``host:port`` cannot be listened on (in use, not an address
    of this machine, a port below 1024 without root), instead of nginx's five retries and a dozen
    ``emerg`` lines. The socket is bound as nginx binds it (``SO_REUSEADDR``; IPv6 only for IPv6),
    then closed: a port taken between the check and nginx's start still fails in nginx."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise GatewayError(f"--listen: cannot resolve {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    where = _nginx_address(host, port)
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(address)
            sock.listen(1)
        except OSError as exc:
            why = {errno.EADDRINUSE: "the port is in use (another process listens there)",
                   errno.EADDRNOTAVAIL: "the address is not one of this machine's",
                   errno.EACCES: "permission denied (ports below 1024 need root)"}.get(exc.errno, exc.strerror)
            raise GatewayError(f"--listen {where}: cannot listen there: {why}") from None


def nginx_config(creds: Credentials, listen: str, superlink: str, workdir: Path,
                 superlink_name: str | None = None, limits: Limits | None = None) -> str:
    """nginx's whole configuration for a gateway on ``listen`` in front of the SuperLink at
    ``superlink`` (both ``HOST:PORT``), with its pid file, logs and buffers under ``workdir``, and
    ``limits`` (default :class:`Limits`).

    ``superlink_name`` is the name nginx checks the SuperLink's certificate against: by default the
    host of ``superlink``, or ``localhost`` when that is an IP address (nginx verifies names, not IP
    addresses; ``fedsuite certs`` always puts ``localhost`` in the certificate). The name must be one
    of the DNS names ``server.pem`` holds, and the three files must belong together
    (``fedsuite.deploy.certs.check_set``): else :class:`GatewayError` or ``CertError``, one line, where
    nginx would start and every SuperNode's request fail its TLS check of the SuperLink."""
    require(creds.ca_cert, creds.server_cert, creds.server_key)
    listen_host, listen_port = split_address(listen, "--listen")
    up_host, up_port = split_address(superlink, "--superlink")
    name = superlink_name or ("localhost" if _is_ip(up_host) else up_host)
    check_set(creds)
    names = [h for h in server_hosts(creds) if not _is_ip(h)]
    if name not in names:
        given = f"--superlink-name {name!r}" if superlink_name else f"the name {name!r} (--superlink's host)"
        why = " (nginx checks DNS names, not IP addresses)" if _is_ip(name) else ""
        raise GatewayError(f"{given} is not a name of the SuperLink's certificate {creds.server_cert}{why}; its "
                           f"names: {', '.join(names)} (add one with fedsuite certs --host NAME --force-server)")
    work = workdir.resolve()
    lim = limits or Limits()
    max_body, timeout = lim.body_bytes, lim.body_timeout
    return f"""# fedsuite gateway (fedsuite/deploy/gateway.py): publishes the SuperLink's Fleet API alone, over TLS.
# SuperNodes connect here; the Control API (flwr run, flwr supernode register) and the Runtime API
# stay on the SuperLink's side ({_nginx_address(up_host, up_port)}), which only the admin reaches.
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log stderr notice;

worker_rlimit_nofile 8192;

events {{
    worker_connections 4096;
}}

http {{
    # the client's address, the request line, the status, what came in (whole request) and went out,
    # and whether the SuperLink was reached (upstream "-": the gateway answered alone)
    log_format fedsuite '$remote_addr [$time_local] "$request" $status in=$request_length out=$bytes_sent '
                        'upstream=$upstream_addr $upstream_status ${{request_time}}s';
    access_log {work}/access.log fedsuite;
    client_body_temp_path {work}/tmp/body;
    proxy_temp_path {work}/tmp/proxy;
    fastcgi_temp_path {work}/tmp/fastcgi;
    uwsgi_temp_path {work}/tmp/uwsgi;
    scgi_temp_path {work}/tmp/scgi;
    server_tokens off;

    # what reaches the SuperLink (fedsuite.deploy.gateway.Limits): bodies of at most {max_body} bytes, read
    # whole into memory here before they are passed on; per client address {lim.conns_per_client} requests
    # in progress and {lim.rate_per_client}/s (burst {2 * lim.rate_per_client}), 503 above (Flower's SuperNode
    # retries it); {timeout} s without data while a request is read, or while a client reads its reply
    client_max_body_size {max_body};
    client_body_buffer_size {max_body + BUFFER_MARGIN};
    client_header_timeout {timeout}s;
    client_body_timeout {timeout}s;
    send_timeout {timeout}s;
    limit_conn_zone $binary_remote_addr zone=per_client_conns:10m;
    limit_req_zone $binary_remote_addr zone=per_client_rate:10m rate={lim.rate_per_client}r/s;
    limit_conn_status 503;
    limit_req_status 503;

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
        limit_conn per_client_conns {lim.conns_per_client};
        limit_req zone=per_client_rate burst={2 * lim.rate_per_client} nodelay;
        error_page 413 @too_large;
        error_page 503 @busy;

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
            proxy_request_buffering on;
            proxy_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }}

        # the gateway's own refusals, one line each (the SuperLink's answers pass as they are)
        location @too_large {{
            return 413 "fedsuite gateway: refused: request body over {max_body} bytes (fedsuite gateway --max-body)\\n";
        }}
        location @busy {{
            return 503 "fedsuite gateway: busy: too many requests from this address (fedsuite gateway --max-conns, --max-rate); retry later\\n";
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
            superlink_name: str | None = None, limits: Limits | None = None, check: bool = True) -> list[str]:
    """Write ``workdir/nginx.conf`` (and the folders nginx writes into) and return the command that
    runs the gateway in the foreground: ``nginx -p WORKDIR -c WORKDIR/nginx.conf -e stderr``.
    ``check``: first make sure ``listen`` can be bound (:func:`check_listen`)."""
    config = nginx_config(creds, listen, superlink, workdir, superlink_name, limits)
    binary = nginx_binary()
    if check:
        check_listen(*split_address(listen, "--listen"))
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
