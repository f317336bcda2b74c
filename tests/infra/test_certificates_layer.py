"""certificates/Makefile: the certificates layer holds a checked RDS CA bundle, or is not built.

The template's default DbSslRootCert is /opt/rds/global-bundle.pem, so a layer without it
would deploy migrations that refuse to connect. Each test runs the real Makefile (and
build_layer.py with this interpreter) on a copy of certificates/, so a bundle a developer
keeps in the folder changes nothing here. The RDS bundle itself cannot be downloaded on
this machine: stand-ins named like the RDS CAs are made by the tests, and the download is
served by an HTTPS server on the loopback address with a certificate of a test CA.
"""

from __future__ import annotations

import http.server
import os
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.infra.template_support import ROOT
from tests.support.tls_server import write_https_identity, write_rds_like_bundle

SOURCE = ROOT / "certificates"
BUNDLE = Path("rds") / "global-bundle.pem"


@dataclass(frozen=True)
class Build:
    returncode: int
    stdout: str
    stderr: str
    artifacts: Path

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.artifacts)) for p in self.artifacts.rglob("*")
                      if p.is_file())


def folder(tmp_path: Path, bundle: bytes | None = None) -> Path:
    """A copy of certificates/ as the repository has it, with ``bundle`` in rds/ if given."""
    copy = tmp_path / "certificates"
    shutil.copytree(SOURCE, copy, ignore=shutil.ignore_patterns("*.pem", "__pycache__"))
    if bundle is not None:
        (copy / BUNDLE).write_bytes(bundle)
    return copy


def make(source: Path, tmp_path: Path, **env: str) -> Build:
    """``make build-CertificatesLayer`` as sam build runs it, in ``source``."""
    artifacts = tmp_path / "artifacts"
    environ = {k: v for k, v in os.environ.items()
               if k not in ("LEASEQ_RDS_CA_BUNDLE", "LEASEQ_RDS_CA_BUNDLE_URL")}
    # Never the real URL: a machine with internet access must not make these tests pass.
    environ["LEASEQ_RDS_CA_BUNDLE_URL"] = f"https://127.0.0.1:{closed_port()}/bundle.pem"
    environ.update(env, ARTIFACTS_DIR=str(artifacts), PYTHON=sys.executable)
    done = subprocess.run(["make", "--no-print-directory", "-C", str(source),
                           "build-CertificatesLayer"],
                          capture_output=True, text=True, env=environ, timeout=120)
    return Build(done.returncode, done.stdout, done.stderr, artifacts)


def closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(frozen=True)
class HttpsServer:
    url: str
    ca_file: Path


@pytest.fixture
def https_bundle(tmp_path: Path) -> Iterator[HttpsServer]:
    """An HTTPS server on the loopback address serving an RDS-like bundle."""
    keys = tmp_path / "https"
    keys.mkdir()
    ca_file, cert_file, key_file = write_https_identity(keys)
    served = write_rds_like_bundle(keys / "served.pem", 3).read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/global/global-bundle.pem"
            self.send_response(200 if found else 404)
            self.end_headers()
            if found:
                self.wfile.write(served)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield HttpsServer(f"https://localhost:{server.server_address[1]}"
                          "/global/global-bundle.pem", ca_file)
    finally:
        server.shutdown()
        server.server_close()


def test_the_layer_holds_the_bundle_given_and_none_of_the_build_files(tmp_path: Path) -> None:
    bundle = write_rds_like_bundle(tmp_path / "given.pem", 3)

    built = make(folder(tmp_path), tmp_path, LEASEQ_RDS_CA_BUNDLE=str(bundle))

    assert built.returncode == 0, built.stderr
    assert built.files() == ["README.md", "rds/global-bundle.pem"]
    assert (built.artifacts / BUNDLE).read_bytes() == bundle.read_bytes()
    assert "3 certificates, 3 Amazon RDS CAs valid now" in built.stdout
    assert f"LEASEQ_RDS_CA_BUNDLE={bundle}" in built.stdout


def test_a_bundle_kept_in_the_folder_is_used_when_none_is_given(tmp_path: Path) -> None:
    kept = write_rds_like_bundle(tmp_path / "kept.pem").read_bytes()

    built = make(folder(tmp_path, kept), tmp_path)

    assert built.returncode == 0, built.stderr
    assert (built.artifacts / BUNDLE).read_bytes() == kept
    assert "from certificates/rds/global-bundle.pem" in built.stdout


def test_other_ca_files_of_the_folder_reach_the_layer_as_they_are(tmp_path: Path) -> None:
    source = folder(tmp_path)
    (source / "internal").mkdir()
    own_ca = write_rds_like_bundle(source / "internal" / "ca.pem", 1).read_bytes()
    bundle = write_rds_like_bundle(tmp_path / "given.pem")

    built = make(source, tmp_path, LEASEQ_RDS_CA_BUNDLE=str(bundle))

    assert built.returncode == 0, built.stderr
    assert (built.artifacts / "internal" / "ca.pem").read_bytes() == own_ca


def test_without_a_bundle_the_build_downloads_it_over_verified_https(
    tmp_path: Path, https_bundle: HttpsServer,
) -> None:
    built = make(folder(tmp_path), tmp_path, LEASEQ_RDS_CA_BUNDLE_URL=https_bundle.url,
                 SSL_CERT_FILE=str(https_bundle.ca_file))

    assert built.returncode == 0, built.stderr
    assert built.files() == ["README.md", "rds/global-bundle.pem"]
    assert f"from {https_bundle.url}" in built.stdout
    assert "3 certificates" in built.stdout


def test_a_download_from_a_server_the_build_machine_does_not_trust_fails_the_build(
    tmp_path: Path, https_bundle: HttpsServer,
) -> None:
    other_ca, _, _ = write_https_identity(tmp_path)  # a CA that did not sign the server's

    built = make(folder(tmp_path), tmp_path, LEASEQ_RDS_CA_BUNDLE_URL=https_bundle.url,
                 SSL_CERT_FILE=str(other_ca))

    assert built.returncode != 0
    assert f"could not download {https_bundle.url}" in built.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in built.stderr
    assert not (built.artifacts / BUNDLE).exists()


def test_with_no_bundle_and_no_way_to_download_it_the_build_fails_saying_how_to_get_it(
    tmp_path: Path,
) -> None:
    built = make(folder(tmp_path), tmp_path)

    assert built.returncode != 0
    assert not (built.artifacts / BUNDLE).exists()
    message = built.stderr
    assert "CertificatesLayer: no usable RDS CA bundle: could not download" in message
    assert "as the RDS master user" in message  # why it matters
    for fix in ("certificates/rds/global-bundle.pem", "LEASEQ_RDS_CA_BUNDLE",
                "certificates/README.md", "LEASEQ_RDS_CA_BUNDLE=none",
                "DbSslMode=require-unverified"):
        assert fix in message, fix


def test_the_bundle_is_never_taken_over_plain_http(tmp_path: Path) -> None:
    built = make(folder(tmp_path), tmp_path,
                 LEASEQ_RDS_CA_BUNDLE_URL="http://truststore.example/global-bundle.pem")

    assert built.returncode != 0
    assert "only https:// is accepted" in built.stderr


def not_pem(path: Path) -> None:
    path.write_text("<html><body>Sign in to the hotel Wi-Fi</body></html>\n")


def truncated(path: Path) -> None:
    # Whole 64-character lines taken out of the middle: still base64, no longer DER.
    write_rds_like_bundle(path, 1)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:2], *lines[5:]]) + "\n")


def pem_and_junk(path: Path) -> None:
    write_rds_like_bundle(path, 1)
    with path.open("a") as file:
        file.write("<html>oops</html>\n")


def another_ca(path: Path) -> None:
    ca_file, _, _ = write_https_identity(path.parent)
    shutil.copyfile(ca_file, path)


def expired(path: Path) -> None:
    write_rds_like_bundle(path, 2, expired=True)


@pytest.mark.parametrize(("make_file", "problem"), [
    (not_pem, "holds no PEM certificate"),
    (lambda path: path.write_text(""), "holds no PEM certificate"),
    (truncated, "OpenSSL cannot load it"),
    (pem_and_junk, "holds something besides PEM certificates"),
    (another_ca, "is an Amazon RDS CA: not the RDS bundle"),
    (expired, "every Amazon RDS CA in it has expired"),
])
def test_a_file_that_is_not_a_current_rds_bundle_fails_the_build(
    tmp_path: Path, make_file: object, problem: str,
) -> None:
    given = tmp_path / "given" / "global-bundle.pem"
    given.parent.mkdir()
    make_file(given)  # type: ignore[operator]

    built = make(folder(tmp_path), tmp_path, LEASEQ_RDS_CA_BUNDLE=str(given))

    assert built.returncode != 0
    assert problem in built.stderr
    assert f"LEASEQ_RDS_CA_BUNDLE={given}" in built.stderr
    assert not (built.artifacts / BUNDLE).exists()


def test_none_builds_without_the_bundle_on_purpose_and_says_what_that_means(
    tmp_path: Path,
) -> None:
    kept = write_rds_like_bundle(tmp_path / "kept.pem").read_bytes()

    built = make(folder(tmp_path, kept), tmp_path, LEASEQ_RDS_CA_BUNDLE="none")

    assert built.returncode == 0, built.stderr
    assert built.files() == ["README.md"]
    assert "WITHOUT /opt/rds/global-bundle.pem" in built.stdout
    assert "the migrations refuse to connect" in built.stdout
