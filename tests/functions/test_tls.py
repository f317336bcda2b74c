"""Verified TLS against a real PostgreSQL that speaks only TLS, with a CA made here.

The right CA and host name connect; a host name the certificate does not hold, or a CA
that did not sign it, is refused with a TlsVerificationError that says which check
failed and which setting to change, and is never retried as an unavailable server.
The settings choose verify-full wherever there are roots to verify with.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest
from leaseq import (
    ConfigurationError,
    DatabaseUnavailableError,
    LeaseqSettings,
    QueueClient,
    TlsVerificationError,
    connect,
)
from leaseq.store import tls
from leaseq_lambda import runtime
from moto import mock_aws

from tests.support.fakes import FakeLambdaContext
from tests.support.tls_server import INSTANCE_HOST, TlsServer, tls_server
from tests.support.tls_server import PROXY_HOST as CERTIFIED_PROXY_HOST

PROXY_HOST = "leaseq.proxy-c1a2b3c4d5e6.eu-west-1.rds.amazonaws.com"


@pytest.fixture(scope="module")
def server() -> Iterator[TlsServer]:
    with tls_server() as running:
        yield running


def _connect(server: TlsServer, host: str, sslrootcert: Path | str) -> Any:
    return connect("", sslmode="verify-full", sslrootcert=str(sslrootcert),
                   **server.params(host))  # type: ignore[arg-type]


def _ssl_in_use(conn: Any) -> bool:
    row = conn.execute("select ssl from pg_stat_ssl where pid = pg_backend_pid()").fetchone()
    return bool(row["ssl"])


# The library's connect -----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_the_right_ca_and_a_host_name_the_certificate_holds_connect(
        server: TlsServer, host: str) -> None:
    with _connect(server, host, server.ca_file) as conn:
        assert _ssl_in_use(conn)


def test_a_host_name_the_certificate_does_not_hold_is_refused_naming_the_check(
        server: TlsServer) -> None:
    with pytest.raises(TlsVerificationError) as caught:
        _connect(server, "127.0.0.2", server.ca_file)
    message = caught.value.message
    assert "does not name the host connected to" in message
    assert "LEASEQ_DB_HOST" in message
    assert str(server.ca_file) in message  # which roots were used
    assert 'does not match host name "127.0.0.2"' in message  # libpq's own words
    assert isinstance(caught.value, ConfigurationError)
    assert not isinstance(caught.value, DatabaseUnavailableError)


def test_a_certificate_from_an_unknown_ca_is_refused_naming_the_roots_setting(
        server: TlsServer) -> None:
    with pytest.raises(TlsVerificationError) as caught:
        _connect(server, "localhost", server.unknown_ca_file)
    message = caught.value.message
    assert "not signed by a CA in the trusted roots" in message
    assert "LEASEQ_DB_SSLROOTCERT" in message
    assert "certificate verify failed" in message


def test_a_refused_certificate_is_not_retried_as_an_unavailable_server(
        server: TlsServer) -> None:
    attempts: list[int] = []

    def open_connection() -> Any:
        attempts.append(1)
        return _connect(server, "localhost", server.unknown_ca_file)

    client = QueueClient(open_connection)
    with pytest.raises(TlsVerificationError):
        client.check()
    with pytest.raises(TlsVerificationError):
        client.ready_tenants()
    assert len(attempts) == 2  # one per call: no reconnect-and-retry


def test_without_a_ca_libpq_would_look_in_the_home_directory_which_is_refused_clearly(
        server: TlsServer) -> None:
    with pytest.raises(TlsVerificationError, match="found no trusted roots"):
        connect("", sslmode="verify-full", **server.params("localhost"))  # type: ignore[arg-type]


# Settings: the defaults and "system" ----------------------------------------------------------


def _host_settings(**env: str) -> LeaseqSettings:
    return LeaseqSettings.from_env({"LEASEQ_DB_HOST": "db.internal", "LEASEQ_DB_USER": "u",
                                    "LEASEQ_DB_NAME": "d", "LEASEQ_DB_IAM_AUTH": "true",
                                    **env})


def test_an_rds_proxy_host_defaults_to_verify_full_against_the_system_roots(
        tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    settings = _host_settings(LEASEQ_DB_HOST=PROXY_HOST, SSL_CERT_FILE=str(bundle))
    assert settings.database.sslmode == "verify-full"
    assert settings.database.tls.params() == {"sslmode": "verify-full",
                                              "sslrootcert": str(bundle)}
    for host in (PROXY_HOST, "leaseq-ro.endpoint.proxy-c1a2b3c4d5e6.eu-west-1.rds.amazonaws.com",
                 "p.proxy-abc.cn-north-1.rds.amazonaws.com.cn"):
        assert tls.is_rds_proxy_host(host), host
    for host in ("leaseq.c1a2b3c4d5e6.eu-west-1.rds.amazonaws.com", "10.0.0.5", "db.internal",
                 "proxy-abc.example.com"):
        assert not tls.is_rds_proxy_host(host), host


def test_roots_given_mean_verify_full_and_verify_ca_only_when_asked_for(
        server: TlsServer) -> None:
    direct = _host_settings(LEASEQ_DB_SSLROOTCERT=str(server.ca_file))
    assert direct.database.tls.params() == {"sslmode": "verify-full",
                                            "sslrootcert": str(server.ca_file)}
    chain_only = _host_settings(LEASEQ_DB_SSLROOTCERT=str(server.ca_file),
                                LEASEQ_DB_SSLMODE="verify-ca")
    assert chain_only.database.sslmode == "verify-ca"
    full = _host_settings(LEASEQ_DB_HOST=PROXY_HOST, LEASEQ_DB_SSLMODE="verify-full",
                          SSL_CERT_FILE=str(server.ca_file))
    assert full.database.tls.sslrootcert == str(server.ca_file)  # the "system" roots


@pytest.mark.parametrize(("host", "mode"), [
    ("db.internal", None),  # nothing to verify with
    (INSTANCE_HOST, None),  # an RDS instance: its CA is in no system bundle
    (INSTANCE_HOST, "require"),  # encrypted, but anybody at the address is "the server"
    (INSTANCE_HOST, "prefer"),
    (INSTANCE_HOST, "allow"),
    ("10.0.3.7", "disable"),
    (PROXY_HOST, "require"),  # a proxy is verified by default; require would undo that
])
def test_a_host_across_a_network_is_never_connected_unverified_by_default_or_by_require(
        host: str, mode: str | None) -> None:
    env = {"LEASEQ_DB_HOST": host, "LEASEQ_DB_USER": "u", "LEASEQ_DB_NAME": "d",
           "LEASEQ_DATABASE_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:1:secret:x"}
    if mode is not None:
        env["LEASEQ_DB_SSLMODE"] = mode
    with pytest.raises(ConfigurationError) as caught:
        LeaseqSettings.from_env(env)
    message = caught.value.message
    assert f"refusing an unverified connection to {host}" in message
    # The fix and the opt-out are both named.
    assert "LEASEQ_DB_SSLROOTCERT" in message
    assert "/opt/rds/global-bundle.pem" in message
    assert "LEASEQ_DB_SSLMODE=require-unverified" in message


@pytest.mark.parametrize("host", ["/run/postgresql", "@leaseq", "localhost", "127.0.0.1",
                                  "::1", "localhost,127.0.0.2"])
def test_a_unix_socket_or_loopback_host_crosses_no_network_and_keeps_libpqs_modes(
        host: str) -> None:
    env = {"LEASEQ_DB_HOST": host, "LEASEQ_DB_USER": "u", "LEASEQ_DB_NAME": "d",
           "LEASEQ_DATABASE_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:1:secret:x"}
    assert tls.is_local_host(host)
    assert LeaseqSettings.from_env(env).database.tls.params() == {"sslmode": "require"}
    plain = LeaseqSettings.from_env({**env, "LEASEQ_DB_SSLMODE": "disable"})
    assert plain.database.tls.params() == {"sslmode": "disable"}
    for remote in ("db.internal", "10.0.0.5", "localhost.example.com", "127.0.0.1,db"):
        assert not tls.is_local_host(remote), remote


def test_require_unverified_is_the_opt_out_by_name_and_warns_every_time_it_is_chosen(
        caplog: pytest.LogCaptureFixture, server: TlsServer) -> None:
    with caplog.at_level(logging.WARNING, logger="leaseq.tls"):
        opted = _host_settings(LEASEQ_DB_HOST=INSTANCE_HOST,
                               LEASEQ_DB_SSLMODE="require-unverified")
    assert opted.database.tls.params() == {"sslmode": "require"}  # libpq's require
    assert opted.database.sslmode == "require-unverified"
    (warning,) = [r for r in caplog.records if r.name == "leaseq.tls"]
    assert warning.levelno == logging.WARNING
    assert INSTANCE_HOST in warning.getMessage()
    assert "identity is not checked" in warning.getMessage()
    # Opting out and giving roots at once is a contradiction, refused by name.
    with pytest.raises(ConfigurationError, match="require-unverified checks no certificate"):
        _host_settings(LEASEQ_DB_SSLMODE="require-unverified",
                       LEASEQ_DB_SSLROOTCERT=str(server.ca_file))


def test_require_unverified_connects_to_a_server_the_certificate_does_not_name(
        server: TlsServer, caplog: pytest.LogCaptureFixture) -> None:
    # 127.0.0.2 is not in the certificate: verify-full refuses it (above); the opt-out
    # connects anyway, encrypted, which is exactly what it gives up.
    with caplog.at_level(logging.WARNING, logger="leaseq.tls"):
        options = tls.choose_tls(host="127.0.0.2", sslmode="require-unverified",
                                 sslrootcert=None, environ={})
    with connect("", **options.params(), **server.params("127.0.0.2")) as conn:  # type: ignore[arg-type]
        assert _ssl_in_use(conn)
    assert any("require-unverified" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("env", "problem"), [
    ({"LEASEQ_DB_SSLROOTCERT": "/nonexistent/global-bundle.pem"},
     "LEASEQ_DB_SSLROOTCERT=/nonexistent/global-bundle.pem: the file does not exist"),
    ({"LEASEQ_DB_SSLROOTCERT": "/"}, "is a directory"),
    ({"LEASEQ_DB_SSLMODE": "verify-full"}, "LEASEQ_DB_SSLMODE=verify-full needs the CAs"),
    ({"LEASEQ_DB_SSLROOTCERT": "system", "LEASEQ_DB_SSLMODE": "verify-ca"},
     "LEASEQ_DB_SSLROOTCERT=system needs LEASEQ_DB_SSLMODE=verify-full"),
    ({"LEASEQ_DB_SSLROOTCERT": "system", "SSL_CERT_FILE": "/nonexistent.pem"},
     "SSL_CERT_FILE=/nonexistent.pem: the file does not exist"),
])
def test_tls_settings_that_cannot_work_fail_at_cold_start_naming_the_setting(
        env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        _host_settings(**env)


def test_a_file_without_a_certificate_and_a_weak_mode_with_a_file_are_refused(
        tmp_path: Path, server: TlsServer) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("not a certificate\n")
    with pytest.raises(ConfigurationError, match="holds no PEM certificate"):
        _host_settings(LEASEQ_DB_SSLROOTCERT=str(empty))
    with pytest.raises(ConfigurationError, match="does not verify the server"):
        _host_settings(LEASEQ_DB_SSLROOTCERT=str(server.ca_file), LEASEQ_DB_SSLMODE="require")
    with pytest.raises(ConfigurationError, match="not used with DATABASE_URL"):
        LeaseqSettings.from_env({"DATABASE_URL": "postgresql://h/d",
                                 "LEASEQ_DB_SSLROOTCERT": str(server.ca_file)})


def test_system_means_the_os_bundle_and_ssl_cert_file_overrides_it(
        server: TlsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # SSL_CERT_FILE (OpenSSL's own override) names the bundle: the test CA verifies.
    trusted = tls.choose_tls(host="localhost", sslmode=None, sslrootcert="system",
                             environ={"SSL_CERT_FILE": str(server.ca_file)})
    with connect("", **trusted.params(), **server.params("localhost")) as conn:  # type: ignore[arg-type]
        assert _ssl_in_use(conn)
    # Otherwise the first OS bundle that exists; one without the test CA refuses it.
    monkeypatch.setattr(tls, "SYSTEM_BUNDLES", ("/nonexistent.pem", str(server.unknown_ca_file)))
    os_roots = tls.choose_tls(host="localhost", sslmode=None, sslrootcert="system", environ={})
    assert os_roots.sslrootcert == str(server.unknown_ca_file)
    with pytest.raises(TlsVerificationError, match="not signed by a CA"):
        connect("", **os_roots.params(), **server.params("localhost"))  # type: ignore[arg-type]
    # SSL_CERT_DIR alone is a hashed directory only OpenSSL reads: libpq gets "system".
    by_dir = tls.choose_tls(host="localhost", sslmode=None, sslrootcert="system",
                            environ={"SSL_CERT_DIR": "/etc/ssl/certs"})
    assert by_dir.sslrootcert == "system"


# The functions ---------------------------------------------------------------------------------


@pytest.fixture
def tls_secret(lambda_env: pytest.MonkeyPatch, server: TlsServer) -> Iterator[pytest.MonkeyPatch]:
    """The functions log in with a secret in the RDS shape to the TLS-only server."""
    with mock_aws():
        arn = boto3.client("secretsmanager").create_secret(
            Name="leaseq/tls", SecretString=json.dumps({
                "username": server.user, "password": server.password, "host": "localhost",
                "port": server.port, "dbname": "postgres"}))["ARN"]
        lambda_env.delenv("DATABASE_URL")
        lambda_env.setenv("LEASEQ_DATABASE_SECRET_ARN", arn)
        yield lambda_env


def test_the_runtime_connects_with_verify_full_by_default_once_a_ca_file_is_given(
        tls_secret: pytest.MonkeyPatch, server: TlsServer) -> None:
    tls_secret.setenv("LEASEQ_DB_SSLROOTCERT", str(server.ca_file))
    runtime.reset()

    rt = runtime.get()
    rt.check()

    conn = rt.client.connection
    assert (conn.info.get_parameters()["sslmode"], _ssl_in_use(conn)) == ("verify-full", True)


def test_an_invocation_against_an_unknown_ca_fails_once_with_the_setting_named(
        tls_secret: pytest.MonkeyPatch, server: TlsServer, reaper_app: ModuleType,
        capsys: pytest.CaptureFixture[str]) -> None:
    tls_secret.setenv("LEASEQ_DB_SSLROOTCERT", str(server.unknown_ca_file))
    runtime.reset()

    with pytest.raises(TlsVerificationError, match="LEASEQ_DB_SSLROOTCERT"):
        reaper_app.lambda_handler({}, FakeLambdaContext())

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (failed,) = [line for line in lines if line.get("message") == "reaper pass failed"]
    assert "TLS check failed" in failed["error"]
    assert runtime.get().client.reconnects == 0  # refused on the first connect, not retried


def test_a_secret_naming_a_host_across_the_network_is_refused_without_roots_before_connecting(
        tls_secret: pytest.MonkeyPatch, reaper_app: ModuleType) -> None:
    # LEASEQ_DB_HOST is unset: only the secret says where the database is, so the rule
    # is applied to the secret's host when the runtime reads it.
    arn = boto3.client("secretsmanager").create_secret(
        Name="leaseq/remote", SecretString=json.dumps({
            "username": "u", "password": "p", "host": INSTANCE_HOST, "dbname": "leaseq"}))["ARN"]
    tls_secret.setenv("LEASEQ_DATABASE_SECRET_ARN", arn)
    runtime.reset()

    with pytest.raises(ConfigurationError) as caught:
        reaper_app.lambda_handler({}, FakeLambdaContext())

    assert not isinstance(caught.value, TlsVerificationError | DatabaseUnavailableError)
    assert f"refusing an unverified connection to {INSTANCE_HOST}" in caught.value.message
    assert "LEASEQ_DB_SSLMODE=require-unverified" in caught.value.message


def test_the_runtime_reaches_a_proxy_name_through_a_hostaddr_and_still_verifies_it(
        tls_secret: pytest.MonkeyPatch, server: TlsServer) -> None:
    # A port forward on the loopback address into the VPC: libpq connects to the address,
    # and checks the certificate against the proxy's name (the test CA plays the public
    # roots, through SSL_CERT_FILE, as "system" for an RDS Proxy host means).
    for key, value in {"LEASEQ_DB_HOST": CERTIFIED_PROXY_HOST, "LEASEQ_DB_PORT": "5432",
                       "LEASEQ_DB_HOSTADDR": "127.0.0.2",
                       "LEASEQ_DB_HOSTADDR_PORT": str(server.port),
                       "SSL_CERT_FILE": str(server.ca_file)}.items():
        tls_secret.setenv(key, value)
    runtime.reset()

    rt = runtime.get()
    rt.check()

    conn = rt.client.connection
    assert (conn.info.get_parameters()["sslmode"], _ssl_in_use(conn)) == ("verify-full", True)
    assert conn.info.get_parameters()["hostaddr"] == "127.0.0.2"


def test_a_loopback_hostaddr_does_not_make_a_remote_host_local(
        tls_secret: pytest.MonkeyPatch, reaper_app: ModuleType) -> None:
    # The address is where the bytes go; whether a network is crossed, and so whether the
    # server must be verified, is decided by the name: a tunnel ends in another network.
    for key, value in {"LEASEQ_DB_HOST": INSTANCE_HOST, "LEASEQ_DB_HOSTADDR": "127.0.0.1"
                       }.items():
        tls_secret.setenv(key, value)
    runtime.reset()

    with pytest.raises(ConfigurationError) as caught:
        reaper_app.lambda_handler({}, FakeLambdaContext())

    assert f"refusing an unverified connection to {INSTANCE_HOST}" in caught.value.message
