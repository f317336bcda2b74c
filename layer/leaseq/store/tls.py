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
* **Over a network, the defaults verify or refuse.** A host that is an RDS Proxy
  endpoint presents a certificate from AWS Certificate Manager, which chains to the
  publicly trusted Amazon roots, so with no roots configured (and no mode, or
  verify-full) such a host gets ``verify-full`` with ``system``. A CA file given without
  a mode gets ``verify-full``. Any other host reached over a network, with nothing to
  verify it with, is refused at cold start: an RDS instance's certificate is signed by
  the RDS CA, which no system bundle holds, and ``require`` would accept whoever answers
  at that address, the schema owner's login (the RDS master user) included. So are the
  modes that check nothing (``require``, ``prefer``, ``allow``, ``disable``). Connecting
  without the check is a choice made by name, ``LEASEQ_DB_SSLMODE=require-unverified``
  (libpq's ``require``), and it is logged as a warning every time it is chosen. A Unix
  socket or a loopback address crosses no network, so there the modes keep libpq's
  meaning and the default stays ``require``.
* **A refused certificate is a configuration error, never "unavailable".** libpq
  reports a failed check as a connection failure without a SQLSTATE, which would
  otherwise be retried as an unreachable server. :func:`refusal` recognises libpq's
  messages and says which check failed and which setting to change.

Hand-written because no library does this for libpq: psycopg passes the parameters
through, and the trust store lookup is the OS's convention, not a Python API (Python's
own ``ssl`` module reports only its own OpenSSL's defaults, which we try last).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, get_args

from leaseq.base.errors import ConfigurationError, TlsVerificationError

#: libpq's ``sslmode`` values.
SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
#: What ``LEASEQ_DB_SSLMODE`` accepts: libpq's modes and the opt-out by name.
SslSetting = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full",
                     "require-unverified"]

#: The value of LEASEQ_DB_SSLROOTCERT that means the operating system's trusted roots.
SYSTEM = "system"
#: The value of LEASEQ_DB_SSLMODE that connects encrypted but without checking who the
#: server is: libpq's ``require``, chosen by a name that says what it gives up.
UNVERIFIED: Final = "require-unverified"
#: The modes that do not check the server's identity (libpq's ``require`` and weaker).
_UNCHECKED: tuple[SslMode, ...] = ("disable", "allow", "prefer", "require")
_LIBPQ_MODES: dict[str, SslMode] = {mode: mode for mode in get_args(SslMode)}

logger = logging.getLogger("leaseq.tls")


def libpq_mode(setting: SslSetting) -> SslMode:
    """The libpq ``sslmode`` of a LEASEQ_DB_SSLMODE value (``require-unverified`` is
    libpq's ``require``)."""
    return "require" if setting == UNVERIFIED else _LIBPQ_MODES[setting]


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


def is_local_host(host: str) -> bool:
    """Whether every host of libpq's ``host`` list is reached without a network: a Unix
    socket directory (``/...``, or ``@...`` for an abstract socket), ``localhost`` or a
    loopback address. Nobody can stand between the client and such a server."""
    return all(_is_local(one.strip()) for one in host.split(","))


def _is_local(host: str) -> bool:
    if host.startswith(("/", "@")) or host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TlsOptions:
    """The libpq parameters of one connection's TLS, as passed to ``psycopg.connect``."""

    sslmode: SslMode
    #: What libpq gets: a file path, the literal ``system`` (SSL_CERT_DIR only) or None.
    sslrootcert: str | None = None
    #: Where the roots came from, for messages: ``LEASEQ_DB_SSLROOTCERT=...``.
    source: str | None = None
    #: The operator chose LEASEQ_DB_SSLMODE=require-unverified: encrypted, identity unchecked.
    unverified_by_choice: bool = False

    @property
    def setting(self) -> SslSetting:
        """The mode as LEASEQ_DB_SSLMODE names it (``require-unverified`` if so chosen)."""
        return UNVERIFIED if self.unverified_by_choice else self.sslmode

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
        "that sign the server's certificate (for Amazon RDS: /opt/rds/global-bundle.pem, "
        "which the certificates layer holds when it was built with the RDS bundle; see "
        f"certificates/README.md), or {SYSTEM} for the operating system's trusted roots")


def choose_tls(*, host: str | None, sslmode: SslSetting | None, sslrootcert: str | None,
               environ: Mapping[str, str]) -> TlsOptions:
    """The TLS of a host-based connection from what was configured (None: not set).

    ``host`` None means the host is not known yet (a secret will name it): only the
    combination of settings is checked, and the choice is made again for the host once
    it is known (:meth:`leaseq.settings.DatabaseSettings.tls_for`).

    Raises :class:`ConfigurationError` naming the setting when the combination cannot
    work, or would connect over a network without checking who the server is: ``system``
    with a mode weaker than verify-full, a verifying mode without roots to verify with, a
    CA file that is missing or holds no certificate, no roots at all for a host that is
    not an RDS Proxy endpoint, or a mode that checks nothing. ``require-unverified`` is
    the one way past the check, and it is logged as a warning.
    """
    if sslmode == UNVERIFIED:
        if sslrootcert is not None:
            raise ConfigurationError(
                f"LEASEQ_DB_SSLMODE={UNVERIFIED} checks no certificate, but "
                f"LEASEQ_DB_SSLROOTCERT={sslrootcert} is set: unset LEASEQ_DB_SSLROOTCERT, "
                "or (better) leave LEASEQ_DB_SSLMODE unset to verify the server with it")
        logger.warning(
            "LEASEQ_DB_SSLMODE=%s: the connection to %s is encrypted but the server's "
            "identity is not checked, so whoever can answer at that address can pose as "
            "the database and read what this login sends. Set LEASEQ_DB_SSLROOTCERT (for "
            "Amazon RDS: /opt/rds/global-bundle.pem from the certificates layer) and unset "
            "LEASEQ_DB_SSLMODE to verify it", UNVERIFIED, host or "the database")
        return TlsOptions("require", unverified_by_choice=True)
    mode = None if sslmode is None else libpq_mode(sslmode)
    source = f"LEASEQ_DB_SSLROOTCERT={sslrootcert}"
    if (sslrootcert is None and mode in (None, "verify-full")
            and is_rds_proxy_host(host)):
        sslrootcert = SYSTEM  # ACM certificates: the public Amazon roots verify them
        source = f"{SYSTEM} (the default for an RDS Proxy host)"
    if sslrootcert is None:
        if mode in ("verify-ca", "verify-full"):
            raise ConfigurationError(
                f"LEASEQ_DB_SSLMODE={mode} needs the CAs to verify the server with: set "
                "LEASEQ_DB_SSLROOTCERT to a PEM bundle (for Amazon RDS: global-bundle.pem) "
                f"or to {SYSTEM} (for RDS Proxy, whose certificates are publicly trusted)")
        if host is None or is_local_host(host):
            return TlsOptions(mode or "require")
        raise ConfigurationError(_unverified_refusal(host, mode))
    if sslrootcert == SYSTEM:
        if mode not in (None, "verify-full"):
            raise ConfigurationError(
                f"LEASEQ_DB_SSLROOTCERT={SYSTEM} needs LEASEQ_DB_SSLMODE=verify-full (got "
                f"{mode}): publicly trusted roots prove a server's identity only together "
                "with its host name")
        return TlsOptions("verify-full", system_roots(environ), source)
    if mode in _UNCHECKED:
        # libpq would silently verify the chain for require and ignore the file for
        # the weaker modes; say what was meant instead of guessing.
        raise ConfigurationError(
            f"LEASEQ_DB_SSLROOTCERT is set but LEASEQ_DB_SSLMODE={mode} does not verify "
            "the server: set LEASEQ_DB_SSLMODE to verify-full (or leave it unset)")
    return TlsOptions(mode or "verify-full",
                      check_ca_file(sslrootcert, "LEASEQ_DB_SSLROOTCERT"), source)


def _unverified_refusal(host: str, sslmode: SslMode | None) -> str:
    """Why a connection over a network that checks nothing is refused, and the fixes."""
    if sslmode is None:
        what = ("nothing to verify its certificate with (LEASEQ_DB_SSLROOTCERT is unset, "
                "and it is not an RDS Proxy endpoint, whose certificate the system roots "
                "verify)")
    else:
        what = (f"LEASEQ_DB_SSLMODE={sslmode}, which does not check who the server is: "
                "whoever can answer at that address could pose as the database and read "
                "this login's credentials and data")
    return (f"refusing an unverified connection to {host} over the network: {what}. Set "
            "LEASEQ_DB_SSLROOTCERT to the CA bundle that signs the server's certificate "
            "(Amazon RDS: /opt/rds/global-bundle.pem, which the certificates layer ships; "
            f"see certificates/README.md) or to {SYSTEM}, and leave LEASEQ_DB_SSLMODE unset "
            f"(verify-full). To connect without the check on purpose, set "
            f"LEASEQ_DB_SSLMODE={UNVERIFIED}")


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
