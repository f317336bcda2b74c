"""Build the certificates layer: this folder's CA files plus a checked RDS CA bundle.

The migrations function logs in to an RDS instance directly, as the master user, and the
runtime functions do too when there is no RDS Proxy. Their certificates are signed by the
RDS CA, which no operating system trusts, so the functions verify them against
``/opt/rds/global-bundle.pem`` (the template's ``DbSslRootCert``). This script puts that
file in the layer, or fails the build saying how to get it; it never builds a layer that
silently lacks it.

Where the bundle comes from, first match wins:

1. ``LEASEQ_RDS_CA_BUNDLE=PATH``: that file (a bundle fetched by your pipeline or kept
   in an internal store); ``LEASEQ_RDS_CA_BUNDLE=none`` builds without it, on purpose,
   for a database whose CA you ship yourself or ``DbSslMode=require-unverified``;
2. ``rds/global-bundle.pem`` in this folder (kept out of git, see README.md);
3. a download over verified HTTPS from ``LEASEQ_RDS_CA_BUNDLE_URL``, by default AWS's
   bundle for all Regions.

Whatever its source, the bundle must be PEM certificates only, all of which OpenSSL
(Python's ``ssl`` module) can load, with at least one CA certificate named ``Amazon RDS``
that is valid today; anything else (an HTML error page, a truncated download, an
expired bundle) fails the build. Standard library only, because it runs on the build
machine's Python before any dependency is installed.

Usage (``sam build`` runs it through the Makefile): ``python3 build_layer.py ARTIFACTS_DIR``
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import os
import re
import shutil
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Where the functions find the bundle: /opt/ + this path inside the layer.
BUNDLE_PATH = Path("rds") / "global-bundle.pem"
#: AWS's bundle of the RDS CAs of every commercial Region.
DEFAULT_URL = "https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem"
#: Far more than the real bundle (about 200 KB); anything larger is not it.
MAX_BYTES = 4 * 1024 * 1024
#: What the build itself is made of, never copied into the layer.
BUILD_FILES = frozenset({"Makefile", "build_layer.py", ".gitkeep"})

_PEM_BLOCK = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*(?P<body>[A-Za-z0-9+/=\s]+?)\s*-----END CERTIFICATE-----")


class BundleError(Exception):
    """The RDS CA bundle is missing or is not one; the message says how to get it."""


def how_to_fix(url: str) -> str:
    """The ways out of a failed build, for every message."""
    return (
        f"Download the bundle on a machine that can reach {url} into "
        f"certificates/{BUNDLE_PATH} (or point LEASEQ_RDS_CA_BUNDLE at it) and build "
        "again; see certificates/README.md. Only if no function verifies an RDS instance "
        "with it (your own CA in this folder, or DbSslMode=require-unverified, which is "
        "not recommended) build with LEASEQ_RDS_CA_BUNDLE=none")


def check_bundle(data: bytes, source: str, today: dt.datetime | None = None) -> str:
    """A summary of the bundle if it is a usable RDS CA bundle, else BundleError."""
    blocks = list(_PEM_BLOCK.finditer(data))
    leftover = _PEM_BLOCK.sub(b"", data).strip()
    if not blocks:
        raise BundleError(f"{source} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    if leftover:
        raise BundleError(f"{source} holds something besides PEM certificates "
                          f"(starting {leftover[:40]!r}): not a CA bundle")
    for number, block in enumerate(blocks, start=1):
        try:
            base64.b64decode(re.sub(rb"\s", b"", block["body"]), validate=True)
        except binascii.Error as exc:
            raise BundleError(f"{source}: certificate {number} is not valid base64: "
                              f"{exc}") from exc
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"{source}: OpenSSL cannot load it as CA certificates: "
                          f"{exc}") from exc
    authorities = context.get_ca_certs()  # those OpenSSL takes as CA certificates
    now = today or dt.datetime.now(dt.UTC)
    rds = [cert for cert in authorities if "Amazon RDS" in _names(cert.get("subject", ()))]
    valid = [cert for cert in rds if _not_after(cert) > now]
    if not rds:
        raise BundleError(f"{source}: none of its {len(blocks)} certificates is an Amazon "
                          "RDS CA: not the RDS bundle")
    if not valid:
        raise BundleError(f"{source}: every Amazon RDS CA in it has expired: an old bundle")
    return (f"{len(blocks)} certificates, {len(valid)} Amazon RDS CAs valid now, the "
            f"last until {max(_not_after(cert) for cert in valid):%Y-%m-%d}")


def _names(subject: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    return " ".join(value for rdn in subject for _, value in rdn)


def _not_after(cert: Mapping[str, object]) -> dt.datetime:
    seconds = ssl.cert_time_to_seconds(str(cert["notAfter"]))
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def fetch_bundle(url: str, timeout: float = 30.0) -> bytes:
    """The bundle at ``url``, over HTTPS verified against the machine's trusted roots."""
    if not url.startswith("https://"):
        raise BundleError(f"LEASEQ_RDS_CA_BUNDLE_URL={url}: only https:// is accepted, "
                          "because whoever answers a plain request could choose the CAs "
                          "the functions trust")
    context = ssl.create_default_context()
    try:
        # https:// only (checked above), so S310's file:// and custom schemes cannot occur.
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:  # noqa: S310
            data: bytes = response.read(MAX_BYTES + 1)
    except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BundleError(f"could not download {url}: {reason}") from exc
    if len(data) > MAX_BYTES:
        raise BundleError(f"{url} sent more than {MAX_BYTES} bytes: not the RDS bundle")
    return data


def bundle(environ: Mapping[str, str], here: Path = HERE) -> tuple[bytes, str] | None:
    """The bundle's bytes and where they came from, or None when told to build without."""
    given = environ.get("LEASEQ_RDS_CA_BUNDLE", "")
    if given.lower() == "none":
        return None
    if given:
        try:
            return Path(given).read_bytes(), f"LEASEQ_RDS_CA_BUNDLE={given}"
        except OSError as exc:
            raise BundleError(f"LEASEQ_RDS_CA_BUNDLE={given}: cannot read it "
                              f"({exc.strerror or exc})") from exc
    local = here / BUNDLE_PATH
    if local.is_file():
        return local.read_bytes(), f"certificates/{BUNDLE_PATH}"
    url = environ.get("LEASEQ_RDS_CA_BUNDLE_URL") or DEFAULT_URL
    return fetch_bundle(url), url


def build(artifacts: Path, environ: Mapping[str, str], here: Path = HERE) -> str:
    """Fill ``artifacts`` (the layer's root, /opt) and say what it holds."""
    url = environ.get("LEASEQ_RDS_CA_BUNDLE_URL") or DEFAULT_URL
    try:
        found = bundle(environ, here)
        summary = None if found is None else check_bundle(found[0], found[1])
    except BundleError as exc:
        raise BundleError(
            f"CertificatesLayer: no usable RDS CA bundle: {exc}. The migrations function "
            "logs in to the database as the RDS master user and verifies the server with "
            f"/opt/{BUNDLE_PATH}, so the layer is not built without it. "
            f"{how_to_fix(url)}") from exc
    if artifacts.exists():
        shutil.rmtree(artifacts)
    shutil.copytree(here, artifacts, ignore=_not_in_layer)
    if found is None:
        (artifacts / BUNDLE_PATH).unlink(missing_ok=True)
        return (f"CertificatesLayer built WITHOUT /opt/{BUNDLE_PATH} "
                "(LEASEQ_RDS_CA_BUNDLE=none): deploy with a DbSslRootCert this layer holds, "
                "or the migrations refuse to connect")
    target = artifacts / BUNDLE_PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(found[0])
    return f"CertificatesLayer: /opt/{BUNDLE_PATH} from {found[1]}: {summary}"


def _not_in_layer(directory: str, names: list[str]) -> set[str]:
    return {name for name in names if name in BUILD_FILES or name == "__pycache__"}


def main(argv: list[str]) -> int:
    """``build_layer.py ARTIFACTS_DIR``: 0 when built, 1 with the reason on stderr."""
    if len(argv) != 2:
        print("usage: build_layer.py ARTIFACTS_DIR", file=sys.stderr)
        return 2
    try:
        print(build(Path(argv[1]), os.environ))
    except BundleError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
