"""Who the database server is: libpq's ``sslmode`` and ``sslrootcert``, chosen and checked.

Three rules shape this module.

* **"system" is resolved here, not by libpq.** libpq 16+ accepts ``sslrootcert=system``
  and then loads OpenSSL's default trust store. The psycopg-binary wheel bundles its
  own OpenSSL, whose default store is the directory it was built for
  (``/usr/lib/psycopg-openssl``), which exists on no Lambda runtime and no ordinary
  machine; OpenSSL honours ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` instead, when set. So
  ``system`` means "the operating system's bundle of trusted roots" and is turned into
  that file's path before libpq sees it: ``SSL_CERT_FILE`` when set, else the first
  bundle of :data:`SYSTEM_BUNDLES` that exists. Only with ``SSL_CERT_DIR`` alone is the
  literal ``system`` passed on, because that is a directory only OpenSSL can read.
  As libpq does for ``system``, only ``verify-full`` is allowed with it: anybody can get
  a publicly trusted certificate for a name they own, so a chain check alone proves
  nothing.
* **The defaults verify when they can.** A host that is an RDS Proxy endpoint presents
  a certificate from AWS Certificate Manager, which chains to the publicly trusted
  Amazon roots, so with no roots configured (and no mode, or verify-full) such a host
  gets ``verify-full`` with ``system``. A CA file given without a mode gets
  ``verify-full``. Anything else keeps ``require`` (encrypted, identity unchecked): an
  RDS instance's certificate is signed by the RDS CA, which no system bundle holds, so
  verifying it needs the file.
* **A refused certificate is a configuration error, never "unavailable".** libpq
  reports a failed check as a connection failure without a SQLSTATE, which would
  otherwise be retried as an unreachable server. :func:`refusal` recognises libpq's
  messages and says which check failed and which setting to change.

Hand-written because no library does this for libpq: psycopg passes the parameters
through, and the trust store lookup is the OS's convention, not a Python API (Python's
own ``ssl`` module reports only its own OpenSSL's defaults, which we try last).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from leaseq.errors import ConfigurationError, TlsVerificationError

SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]

#: The value of LEASEQ_DB_SSLROOTCERT that means the operating system's trusted roots.
SYSTEM = "system"

#: Where operating systems keep their bundle of trusted roots; the first that exists wins.
SYSTEM_BUNDLES: tuple[str, ...] = (
    "/etc/pki/tls/certs/ca-bundle.crt",    # Amazon Linux (the Lambda runtimes), RHEL, Fedora
    "/etc/pki/tls/cert.pem",               # the same bundle through OpenSSL's own name
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine
    "/etc/ssl/cert.pem",                   # macOS, the BSDs
)

#: An RDS Proxy endpoint (default or custom): ``name[.endpoint].proxy-<id>.<region>.rds...``.
_RDS_PROXY_HOST = re.compile(
    r"^[a-z0-9-]+(\.endpoint)?\.proxy-[a-z0-9]+\.[a-z0-9-]+\.rds\.amazonaws\.com(\.cn)?\.?$",
    re.IGNORECASE)

_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


def is_rds_proxy_host(host: str | None) -> bool:
    """Whether ``host`` is an RDS Proxy endpoint's own name (not an IP or a CNAME)."""
    return bool(host) and _RDS_PROXY_HOST.match(host or "") is not None


@dataclass(frozen=True)
class TlsOptions:
    """The libpq parameters of one connection's TLS, as passed to ``psycopg.connect``."""

    sslmode: SslMode
    #: What libpq gets: a file path, the literal ``system`` (SSL_CERT_DIR only) or None.
    sslrootcert: str | None = None
    #: Where the roots came from, for messages: ``LEASEQ_DB_SSLROOTCERT=...``.
    source: str | None = None

    def params(self) -> dict[str, str]:
        """Keyword arguments for ``psycopg.connect``: ``sslrootcert`` only when set."""
        found: dict[str, str] = {"sslmode": self.sslmode}
        if self.sslrootcert is not None:
            found["sslrootcert"] = self.sslrootcert
        return found


def system_roots(environ: Mapping[str, str]) -> str:
    """The OS trust store as libpq should be told it: a bundle file, or ``system``."""
    cert_file = environ.get("SSL_CERT_FILE")
    if cert_file:
        return check_ca_file(cert_file, "SSL_CERT_FILE")
    if environ.get("SSL_CERT_DIR"):
        return SYSTEM
    candidates = [*SYSTEM_BUNDLES, ssl.get_default_verify_paths().openssl_cafile]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise ConfigurationError(
        "LEASEQ_DB_SSLROOTCERT=system, but this machine has no bundle of trusted roots "
        f"(looked for {', '.join(SYSTEM_BUNDLES)}); set SSL_CERT_FILE to one, or set "
        "LEASEQ_DB_SSLROOTCERT to the path of the CA file that signs the server's certificate")


def check_ca_file(path: str, setting: str) -> str:
    """``path`` if it is a readable file holding at least one PEM certificate."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        problem = "does not exist"
    except IsADirectoryError:
        problem = "is a directory, not a PEM file"
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or exc})"
    else:
        if _PEM_CERTIFICATE in data:
            return path
        problem = "holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    raise ConfigurationError(
        f"{setting}={path}: the file {problem}. Give the path of a PEM bundle of the CAs "
        "that sign the server's certificate (for Amazon RDS: global-bundle.pem, shipped "
        f"with the function or a layer; see docs/deploy.md), or {SYSTEM} for the "
        "operating system's trusted roots")


def choose_tls(*, host: str | None, sslmode: SslMode | None, sslrootcert: str | None,
           environ: Mapping[str, str]) -> TlsOptions:
    """The TLS of a host-based connection from what was configured (None: not set).

    Raises :class:`ConfigurationError` naming the setting when the combination cannot
    work: ``system`` with a mode weaker than verify-full, a verifying mode without roots
    to verify with, or a CA file that is missing or holds no certificate.
    """
    source = f"LEASEQ_DB_SSLROOTCERT={sslrootcert}"
    if (sslrootcert is None and sslmode in (None, "verify-full")
            and is_rds_proxy_host(host)):
        sslrootcert = SYSTEM  # ACM certificates: the public Amazon roots verify them
        source = f"{SYSTEM} (the default for an RDS Proxy host)"
    if sslmode is None:
        sslmode = "verify-full" if sslrootcert is not None else "require"
    if sslrootcert is None:
        if sslmode in ("verify-ca", "verify-full"):
            raise ConfigurationError(
                f"LEASEQ_DB_SSLMODE={sslmode} needs the CAs to verify the server with: set "
                "LEASEQ_DB_SSLROOTCERT to a PEM bundle (for Amazon RDS: global-bundle.pem) "
                f"or to {SYSTEM} (for RDS Proxy, whose certificates are publicly trusted)")
        return TlsOptions(sslmode)
    if sslrootcert == SYSTEM:
        if sslmode != "verify-full":
            raise ConfigurationError(
                f"LEASEQ_DB_SSLROOTCERT={SYSTEM} needs LEASEQ_DB_SSLMODE=verify-full (got "
                f"{sslmode}): publicly trusted roots prove a server's identity only together "
                "with its host name")
        return TlsOptions(sslmode, system_roots(environ), source)
    if sslmode in ("disable", "allow", "prefer", "require"):
        # libpq would silently verify the chain for require and ignore the file for
        # the weaker modes; say what was meant instead of guessing.
        raise ConfigurationError(
            f"LEASEQ_DB_SSLROOTCERT is set but LEASEQ_DB_SSLMODE={sslmode} does not verify "
            "the server: set LEASEQ_DB_SSLMODE to verify-full (or leave it unset)")
    return TlsOptions(sslmode, check_ca_file(sslrootcert, "LEASEQ_DB_SSLROOTCERT"), source)


# Refusals -----------------------------------------------------------------------------------

_ROOTS = ("LEASEQ_DB_SSLROOTCERT (or sslrootcert in DATABASE_URL)")

#: libpq's messages for a failed check -> what failed and what to change.
_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"server certificate for \"[^\"]*\".* does not match host name \"[^\"]*\""
                r"|could not get server's host name from server certificate"),
     "the server's certificate does not name the host connected to: connect with a name "
     "the certificate holds (the endpoint's DNS name, not an IP address or a CNAME) in "
     "LEASEQ_DB_HOST, or set LEASEQ_DB_SSLMODE=verify-ca to check the chain only"),
    (re.compile(r"certificate verify failed|self[- ]signed certificate|unable to get "
                r"(local )?issuer certificate|certificate has expired|"
                r"certificate is not yet valid"),
     "the server's certificate is not signed by a CA in the trusted roots (or has "
     f"expired): set {_ROOTS} to the bundle of the CA that signed it (Amazon RDS: "
     f"global-bundle.pem; RDS Proxy: {SYSTEM})"),
    (re.compile(r"root certificate file \"[^\"]*\" does not exist"
                r"|could not read root certificate file"),
     f"libpq found no trusted roots to verify the server with: set {_ROOTS} to a PEM "
     f"bundle, or to {SYSTEM}"),
    (re.compile(r"server does not support SSL"),
     "the server does not offer TLS: enable ssl on the server, or (only on a private "
     "network you trust) lower LEASEQ_DB_SSLMODE"),
)


def refusal(message: str, roots: str | None = None) -> TlsVerificationError | None:
    """The error to raise when ``message`` (libpq's) reports a failed TLS check.

    ``roots`` is the ``sslrootcert`` the connection was given, named in the message.
    """
    for pattern, advice in _REFUSALS:
        if pattern.search(message):
            detail = " ".join(message.split())
            used = f" Trusted roots: {roots}." if roots else ""
            return TlsVerificationError(
                f"TLS check failed: {advice}.{used} libpq said: {detail}")
    return None
