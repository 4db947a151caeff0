"""Credentials for a Deployment Engine federation: a CA, the SuperLink's TLS certificate and the
SuperNodes' authentication key pairs (``fedsuite certs``).

What Flower 1.42 expects, and where each file goes (Flower docs: "Enable TLS connections",
https://flower.ai/docs/framework/how-to-enable-tls-connections.html, and "Authenticate SuperNodes",
https://flower.ai/docs/framework/how-to-authenticate-supernodes.html):

* ``ca.crt``: the CA certificate. The SuperLink gets it as ``--ssl-ca-certfile``; every SuperNode
  verifies the SuperLink with it (``--root-certificates``), and so does the ``flwr`` CLI
  (``root-certificates`` in its connection). ``ca.key`` signs; keep it off the federation's machines.
* ``server.pem`` / ``server.key``: the SuperLink's certificate (``--ssl-certfile`` /
  ``--ssl-keyfile``). Its subject alternative names must hold every name or IP address SuperNodes and
  the CLI use to reach the SuperLink (TLS checks the host name); ``localhost`` and ``127.0.0.1`` are
  always included, since the SuperLink's own SuperExec connects through them.
* ``supernodes/<name>.key`` / ``supernodes/<name>.pub``: a SuperNode's EC P-384 key pair in OpenSSH
  format. The private key goes to that SuperNode only (``--auth-supernode-private-key``); the public
  key is registered with a SuperLink started with ``--enable-supernode-auth``
  (``flwr supernode register supernodes/<name>.pub <connection>``). In 1.41 and 1.42 that registration, kept in
  the SuperLink's database, is the list of allowed SuperNodes (the earlier ``--auth-list-public-keys``
  CSV is refused by ``flower-superlink``); a SuperNode whose key is not registered is refused.

Running it again keeps what exists (the CA, the server certificate, existing keys) and adds the
SuperNode keys that are missing, so ``fedsuite certs DIR --supernode laptop`` adds one node to a
federation. ``--force-server`` re-issues the server certificate (new host names) from the same CA.

The files are checked as a set before anything is signed or written (:func:`check_set`): ``ca.key``
is the private key of ``ca.crt``, and a kept ``server.pem`` was signed by that CA and is the
certificate of ``server.key``; a folder whose files do not belong together is refused in one line
and left as it was. A new file is written beside the one it replaces (``NAME.new``) and moved over
it only once it verifies against the CA (:func:`_replace_verified`).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedsuite.errors import FedsuiteError
from fedsuite.records.paths import path_problem

ALWAYS_HOSTS = ("localhost", "127.0.0.1")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class CertError(FedsuiteError, ValueError):
    """Credentials cannot be made or read (bad name, unreadable or missing file, files that do not
    belong together); the message is one line."""


@dataclass
class Credentials:
    """Paths of one federation's credentials folder (what ``make_credentials`` wrote or found)."""

    root: Path
    created: list[Path] = field(default_factory=list)

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "server.key"

    def supernode_key(self, name: str) -> Path:
        return self.root / "supernodes" / f"{name}.key"

    def supernode_pub(self, name: str) -> Path:
        return self.root / "supernodes" / f"{name}.pub"

    def supernode_names(self) -> list[str]:
        folder = self.root / "supernodes"
        return sorted(p.stem for p in folder.glob("*.pub")) if folder.is_dir() else []

    def superlink_tls_args(self) -> list[str]:
        """``flower-superlink`` options serving TLS with these files (each checked to exist)."""
        require(self.ca_cert, self.server_cert, self.server_key)
        return ["--ssl-ca-certfile", str(self.ca_cert), "--ssl-certfile", str(self.server_cert),
                "--ssl-keyfile", str(self.server_key)]

    def supernode_args(self, name: str | None) -> list[str]:
        """``flower-supernode`` options verifying the SuperLink with the CA and, with ``name``,
        authenticating with that SuperNode's private key (each file checked to exist)."""
        require(self.ca_cert)
        args = ["--root-certificates", str(self.ca_cert)]
        if name is not None:
            require(self.supernode_key(name))
            args += ["--auth-supernode-private-key", str(self.supernode_key(name))]
        return args


def require(*paths: Path) -> None:
    """Fail loudly, naming every missing file, before a Flower process is started without it."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise CertError(f"missing credential file(s): {', '.join(missing)} (missing or not a file; make them "
                        "with `fedsuite certs`)")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _write_new(path: Path, data: bytes, private: bool) -> Path:
    """``data`` written beside ``path`` as ``NAME.new`` (mode 0600 for a private key, else 0644)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = path.with_name(path.name + ".new")
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return new


def _write(path: Path, data: bytes, private: bool) -> None:
    os.replace(_write_new(path, data, private), path)


def _replace_verified(creds: Credentials, ca_cert: x509.Certificate, cert_pem: bytes, key_pem: bytes) -> None:
    """The server certificate and key written beside ``server.pem`` and ``server.key`` and moved
    over them only once they verify against the CA as written (:func:`verify_server`, reading the
    new files back); else the new files are removed, the old ones are kept and :class:`CertError`."""
    new_cert = _write_new(creds.server_cert, cert_pem, private=False)
    new_key = _write_new(creds.server_key, key_pem, private=True)
    problem = verify_server(ca_cert, new_cert.read_bytes(), new_key.read_bytes(), f"{new_cert}")
    if problem is not None:
        new_cert.unlink()
        new_key.unlink()
        raise CertError(f"the new server certificate does not verify, the old one is kept: {problem}")
    os.replace(new_key, creds.server_key)
    os.replace(new_cert, creds.server_cert)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


#: a DNS name: dot-separated labels of 1-63 letters, digits and hyphens (a leading "*." allowed),
#: 253 characters at most (RFC 1035)
DNS_NAME_RE = re.compile(r"^(\*\.)?(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?$")


def host_name(host: str) -> x509.GeneralName:
    """``host`` as a certificate names it: an IP address, else a DNS name; :class:`CertError` (one
    line) for neither. A name whose last label is all digits (``999.1.1.1``, ``10.1.2``) is meant as
    an IPv4 address, and no DNS name ends so (RFC 1123, 2.1): one that is not a valid address is
    refused rather than certified as a name nobody can resolve."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if re.fullmatch(r"[0-9.]+", host) or re.search(r"(^|\.)[0-9]+\.?$", host):
        raise CertError(f"--host {host!r} is not a valid IP address (an IPv4 address is four numbers 0-255: "
                        "10.1.2.3), and a DNS name's last label is not all digits")
    if len(host) > 253 or not DNS_NAME_RE.match(host):
        raise CertError(f"--host {host!r} is neither an IP address nor a DNS name (labels of 1-63 "
                        "letters, digits or '-', 253 characters in all)")
    return x509.DNSName(host)


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    return x509.SubjectAlternativeName([host_name(h) for h in dict.fromkeys([*ALWAYS_HOSTS, *hosts])])


def _make_ca(days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsuite federation CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(minutes=5)).not_valid_after(_now() + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA384()))
    return cert, key


def _load_ca(creds: Credentials) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    require(creds.ca_cert, creds.ca_key)
    try:
        cert = x509.load_pem_x509_certificate(creds.ca_cert.read_bytes())
        key = serialization.load_pem_private_key(creds.ca_key.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise CertError(f"cannot read the CA in {creds.root}: {exc}") from None
    if not _same_key(cert.public_key(), key):
        raise CertError(f"{creds.ca_key} is not the private key of {creds.ca_cert} (another CA's?): nothing was "
                        "signed or changed; restore the ca.key made with this ca.crt")
    return cert, key  # type: ignore[return-value]


def _public_bytes(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _same_key(public, private) -> bool:
    """Whether ``private`` (a private key of any kind) is the private half of ``public``."""
    return hasattr(private, "public_key") and _public_bytes(public) == _public_bytes(private.public_key())


def verify_server(ca_cert: x509.Certificate, cert_pem: bytes, key_pem: bytes, where: str) -> str | None:
    """Why a server certificate and key (PEM bytes) do not belong to the CA ``ca_cert``, or None:
    a certificate that is not readable, that the CA did not sign (its issuer, its signature), or
    whose public key is not the key's. ``where`` names the files in the message."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as exc:
        return f"{where} cannot be read ({exc})"
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return f"{where}: the certificate was not signed by this ca.crt"
    if not _same_key(cert.public_key(), key):
        return f"{where}: server.key is not the private key of server.pem"
    return None


def _make_server(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: list[str],
                 days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP384R1())
    # the subject's common name is at most 64 characters (RFC 5280); TLS checks the SAN, not the CN
    first = next((h for h in hosts if len(h) <= 64), "localhost")
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, first)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(minutes=5)).not_valid_after(_now() + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_san(hosts), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA384()))
    return cert, key


def make_supernode_key(creds: Credentials, name: str) -> None:
    """An EC P-384 key pair in OpenSSH format, the kind ``flwr supernode register`` accepts."""
    if not NAME_RE.match(name):
        raise CertError(f"SuperNode name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    _write(creds.supernode_key(name), private, private=True)
    _write(creds.supernode_pub(name), public + f" fedsuite-{name}\n".encode(), private=False)
    creds.created += [creds.supernode_key(name), creds.supernode_pub(name)]


def server_hosts(creds: Credentials) -> list[str]:
    """The names and addresses the existing server certificate is valid for."""
    try:
        cert = x509.load_pem_x509_certificate(creds.server_cert.read_bytes())
    except (OSError, ValueError) as exc:
        raise CertError(f"cannot read {creds.server_cert}: {exc}") from None
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(v) for v in san.get_values_for_type(x509.DNSName)] + \
        [str(v) for v in san.get_values_for_type(x509.IPAddress)]


def make_credentials(root: Path, hosts: list[str] = (), supernodes: list[str] = (), days: int = 825,
                     force_server: bool = False) -> Credentials:
    """Create what is missing under ``root``: the CA, the server certificate for ``hosts`` (plus
    localhost and 127.0.0.1), and a key pair per SuperNode name. Existing files are kept; a server
    certificate that lacks a requested host is an error unless ``force_server`` re-issues it.

    All or nothing: every input is checked, the files kept are checked as a set (:func:`check_set`)
    and every new certificate made in memory before the first file is written, so a refused call
    leaves the folder as it was. Calls on one folder take turns
    (an exclusive lock on ``root/.certs.lock``), so two at once cannot leave a server certificate
    signed by a CA that was replaced under it."""
    problem = path_problem(root)
    if problem is not None:
        raise CertError(f"credentials folder: {problem}")
    creds = Credentials(Path(root).expanduser().resolve())
    hosts = list(hosts)
    _san(hosts)  # every host is an IP address or a DNS name, checked before anything is written
    bad = [n for n in supernodes if not NAME_RE.match(n)]
    if bad:
        raise CertError(f"SuperNode name {bad[0]!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    try:
        creds.root.mkdir(parents=True, exist_ok=True)
        lock = os.open(creds.root / ".certs.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise CertError(f"cannot use {creds.root} as the credentials folder: {exc.strerror or exc}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _make_missing(creds, hosts, supernodes, days, force_server)
    finally:
        os.close(lock)
    return creds


def _make_missing(creds: Credentials, hosts: list[str], supernodes: list[str], days: int,
                  force_server: bool) -> None:
    if creds.ca_cert.exists() != creds.ca_key.exists():
        raise CertError(f"{creds.root} holds only one of ca.crt and ca.key; remove it or restore the other")
    new_ca = not creds.ca_cert.exists()
    ca_cert, ca_key = _make_ca(days) if new_ca else _load_ca(creds)
    server = None
    if new_ca or force_server or not creds.server_cert.exists() or not creds.server_key.exists():
        server = _make_server(ca_cert, ca_key, hosts, days)
    else:
        check_set(creds, ca_cert)
        lacking = [h for h in hosts if h not in server_hosts(creds)]
        if lacking:
            raise CertError(f"{creds.server_cert} is not valid for {', '.join(lacking)}; pass --force-server "
                            "to re-issue it from the same CA (then restart the SuperLink)")
    try:
        if new_ca:
            _write(creds.ca_key, _key_pem(ca_key), private=True)
            _write(creds.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
            creds.created += [creds.ca_cert, creds.ca_key]
        if server is not None:
            _replace_verified(creds, ca_cert, server[0].public_bytes(serialization.Encoding.PEM), _key_pem(server[1]))
            creds.created += [creds.server_cert, creds.server_key]
        for name in supernodes:
            if not creds.supernode_key(name).exists():
                make_supernode_key(creds, name)
    except OSError as exc:
        raise CertError(f"cannot write the credentials in {creds.root}: {exc}") from None


def check_set(creds: Credentials, ca_cert: x509.Certificate | None = None) -> None:
    """The kept server certificate and key belong to the folder's CA (:func:`verify_server`), else
    :class:`CertError` (one line) saying how to re-issue them. ``ca_cert``: the CA, read already."""
    if ca_cert is None:
        require(creds.ca_cert)
        try:
            ca_cert = x509.load_pem_x509_certificate(creds.ca_cert.read_bytes())
        except (OSError, ValueError) as exc:
            raise CertError(f"cannot read {creds.ca_cert}: {exc}") from None
    require(creds.server_cert, creds.server_key)
    try:
        cert_pem, key_pem = creds.server_cert.read_bytes(), creds.server_key.read_bytes()
    except OSError as exc:
        raise CertError(f"cannot read the server certificate in {creds.root}: {exc.strerror or exc}") from None
    problem = verify_server(ca_cert, cert_pem, key_pem, str(creds.server_cert))
    if problem is not None:
        raise CertError(f"{problem}: the credentials do not belong together; re-issue the server certificate from "
                        "this CA with --force-server (then restart the SuperLink)")
