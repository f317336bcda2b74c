"""The migrations' owner login (the RDS master user) against a real PostgreSQL that speaks
only TLS, with a server certificate for an RDS-instance-shaped name signed by a test CA.

The connection string is the one ``owner_connection`` builds from the function's
environment and an owner secret in the RDS shape; the tests add only libpq's ``hostaddr``,
so that the instance's name (what the certificate is checked against) reaches the test
server on the loopback address. verify-full with the right CA connects; a name the
certificate does not hold and a CA that did not sign it are refused; plain ``require``,
or no CA at all, is refused before anything is sent, naming the stack's parameters; the
opt-out by name connects without the check and says so in a warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from leaseq import ConfigurationError, TlsVerificationError, connect
from moto import mock_aws
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.infra.conftest import ResponseEndpoint
from tests.support.tls_server import INSTANCE_HOST, OTHER_INSTANCE_HOST, TlsServer, tls_server


@pytest.fixture(scope="module")
def server() -> Iterator[TlsServer]:
    with tls_server() as running:
        yield running


def owner_dsn(server: TlsServer, host: str = INSTANCE_HOST, **variables: str) -> str:
    """The DSN the migrations function builds, pointed at the test server's address."""
    from leaseq_deploy import owner_connection

    environ = {"LEASEQ_DATABASE_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:1:secret:rds!db-1",
               "LEASEQ_DB_HOST": host, "LEASEQ_DB_PORT": str(server.port),
               "LEASEQ_DB_NAME": "postgres", **variables}
    secret = {"username": server.user, "password": server.password}  # the RDS shape
    dsn: str = owner_connection.owner_dsn_from_environment(environ, lambda _arn: secret)
    return make_conninfo(dsn, hostaddr="127.0.0.1")


def ssl_in_use(conn: Any) -> bool:
    row = conn.execute("select ssl from pg_stat_ssl where pid = pg_backend_pid()").fetchone()
    return bool(row["ssl"])


def test_the_owner_verifies_the_instance_against_the_bundle_and_connects(
    migrations_app: Any, server: TlsServer,
) -> None:
    dsn = owner_dsn(server, LEASEQ_DB_SSLROOTCERT=str(server.ca_file))

    assert conninfo_to_dict(dsn)["sslmode"] == "verify-full"
    with connect(dsn, application_name="leaseq-migrations") as conn:
        assert ssl_in_use(conn)
        assert conn.info.get_parameters()["sslmode"] == "verify-full"


def test_the_owner_refuses_a_server_whose_certificate_names_another_host(
    migrations_app: Any, server: TlsServer,
) -> None:
    dsn = owner_dsn(server, OTHER_INSTANCE_HOST, LEASEQ_DB_SSLROOTCERT=str(server.ca_file))

    with pytest.raises(TlsVerificationError) as caught:
        connect(dsn, application_name="leaseq-migrations")
    assert "does not name the host connected to" in caught.value.message
    assert f'does not match host name "{OTHER_INSTANCE_HOST}"' in caught.value.message


def test_the_owner_refuses_a_server_signed_by_a_ca_it_does_not_trust(
    migrations_app: Any, server: TlsServer,
) -> None:
    dsn = owner_dsn(server, LEASEQ_DB_SSLROOTCERT=str(server.unknown_ca_file))

    with pytest.raises(TlsVerificationError, match="not signed by a CA in the trusted roots"):
        connect(dsn, application_name="leaseq-migrations")


@pytest.mark.parametrize("variables", [
    {},  # the template's empty DbSslRootCert and DbSslMode
    {"LEASEQ_DB_SSLMODE": "", "LEASEQ_DB_SSLROOTCERT": ""},
    {"LEASEQ_DB_SSLMODE": "require"},
    {"LEASEQ_DB_SSLMODE": "prefer"},
    {"LEASEQ_DB_SSLMODE": "disable"},
])
def test_the_owner_refuses_plain_require_or_no_ca_before_sending_anything(
    migrations_app: Any, server: TlsServer, variables: dict[str, str],
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        owner_dsn(server, **variables)

    message = caught.value.message
    assert not isinstance(caught.value, TlsVerificationError)  # nothing was connected
    assert f"refusing an unverified connection to {INSTANCE_HOST}" in message
    for named in ("DbSslRootCert", "/opt/rds/global-bundle.pem",
                  "DbSslMode (LEASEQ_DB_SSLMODE; require-unverified"):
        assert named in message, named


def test_the_owner_opts_out_by_name_connects_without_the_check_and_warns(
    migrations_app: Any, server: TlsServer, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="leaseq.tls"):
        # A name the certificate does not hold: only an unchecked connection gets through.
        dsn = owner_dsn(server, OTHER_INSTANCE_HOST, LEASEQ_DB_SSLMODE="require-unverified")

    assert conninfo_to_dict(dsn)["sslmode"] == "require"
    assert "sslrootcert" not in conninfo_to_dict(dsn)
    with connect(dsn, application_name="leaseq-migrations") as conn:
        assert ssl_in_use(conn)  # encrypted, but to whoever answered
    (warning,) = [r for r in caplog.records if r.name == "leaseq.tls"]
    assert warning.levelno == logging.WARNING
    assert OTHER_INSTANCE_HOST in warning.getMessage()
    assert "identity is not checked" in warning.getMessage()


@mock_aws
def test_the_custom_resource_answers_failed_naming_the_fix_when_nothing_verifies_the_server(
    migrations_app: Any, response_endpoint: ResponseEndpoint, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.infra.test_migrations_custom_resource import GROUP_OF, request

    client = boto3.client("secretsmanager", region_name="eu-west-1")
    arn = client.create_secret(Name="rds!db-0123", SecretString=json.dumps(
        {"username": "postgres", "password": "unused"}))["ARN"]
    for name, value in {"AWS_DEFAULT_REGION": "eu-west-1", "LEASEQ_DATABASE_SECRET_ARN": arn,
                        "LEASEQ_DB_HOST": INSTANCE_HOST, "LEASEQ_DB_NAME": "leaseq",
                        "LEASEQ_DB_SSLMODE": "require", "LEASEQ_DB_SSLROOTCERT": ""}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DATABASE_URL", raising=False)

    migrations_app.lambda_handler(
        request("Create", response_endpoint,
                logins={prop: f"leaseq_{prop.lower()}" for prop in GROUP_OF}), None)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    reason = answer.body["Reason"]
    assert "refusing an unverified connection" in reason
    assert "DbSslRootCert" in reason
    assert "require-unverified" in reason
