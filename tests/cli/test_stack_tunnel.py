"""``leaseq ... --stack NAME --tunnel PORT``: a deployed stack's database from a laptop,
through a local port forward, with the server's name still verified.

Session Manager's ``AWS-StartPortForwardingSessionToRemoteHost`` (or SSH) listens on a
local port and carries the connection to the proxy inside the VPC. Here a real TCP forward
on the loopback address (tests/support/port_forward.py) carries it to a PostgreSQL that
speaks only TLS, whose certificate, signed by a test CA, names an RDS Proxy endpoint
(tests/support/tls_server.py). The stack's outputs come from moto's CloudFormation and name
that endpoint; ``SSL_CERT_FILE`` points at the test CA, which plays the public roots that
``system`` means. The login is real: the operators' login gets, just before each
connection, the very IAM token the command line signed as its password.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from leaseq.store.db import connect
from leaseq.store.migrate import migrate
from leaseq_cli import aws
from leaseq_cli.arguments import tunnel_address
from leaseq_cli.commands import _shared
from leaseq_cli.main import build_parser, main
from leaseq_dashboard.local import LocalServer
from moto import mock_aws
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.cli.conftest import Result
from tests.dashboard.client import Client
from tests.support.port_forward import PortForward, port_forward
from tests.support.tls_server import OTHER_PROXY_HOST, PROXY_HOST, TlsServer, tls_server

STACK = "leaseq-tunnel"
OWNER = "leaseq_tunnel_owner"
OPERATOR = "leaseq_operator_login"
DBNAME = "leaseq_tunnel"


@dataclass
class Deployed:
    """The TLS server standing in for the proxy, and the tokens it was given."""

    server: TlsServer
    tokens: list[tuple[str, int, str]] = field(default_factory=list)

    def admin(self, dbname: str = DBNAME) -> psycopg.Connection[Any]:
        return psycopg.connect(**self.server.params("127.0.0.1") | {"dbname": dbname},
                               sslmode="verify-full", sslrootcert=str(self.server.ca_file),
                               autocommit=True)


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployed]:
    with tls_server() as server:
        found = Deployed(server)
        owner_password = "owner-password-for-the-test"
        with found.admin("postgres") as admin:
            admin.execute(sql.SQL("create role {} login createrole password {}").format(
                sql.Identifier(OWNER), sql.Literal(owner_password)))
            admin.execute(sql.SQL("create database {} owner {}").format(
                sql.Identifier(DBNAME), sql.Identifier(OWNER)))
        with connect(psycopg.conninfo.make_conninfo(
                host="127.0.0.1", port=server.port, user=OWNER, password=owner_password,
                dbname=DBNAME, sslmode="verify-full", sslrootcert=str(server.ca_file))) as owner:
            migrate(owner)
            owner.execute(sql.SQL("create role {} login in role leaseq_operator").format(
                sql.Identifier(OPERATOR)))
        yield found


def deploy_outputs(host: str, stack: str = STACK) -> None:
    """A stack in moto's CloudFormation whose outputs name ``host`` as the proxy."""
    outputs = {"OperatorDbHost": host, "OperatorDbPort": "5432", "DbName": DBNAME,
               "OperatorDbUser": OPERATOR,
               "OperatorDbConnectResource": "arn:aws:rds-db:eu-west-1:123456789012:dbuser:"
                                            f"prx-0123abcd/{OPERATOR}"}
    template = {"Resources": {"Nothing": {"Type": "AWS::SQS::Queue"}},
                "Outputs": {key: {"Value": value} for key, value in outputs.items()}}
    boto3.client("cloudformation").create_stack(StackName=stack,
                                                TemplateBody=json.dumps(template))


def sign_in_to(deployed: Deployed, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's AWS clients, where each IAM token it signs becomes the
    operators' password on the TLS server (as if the proxy had checked its signature),
    with the environment of an operator's laptop whose trusted roots are the test CA."""
    for key, value in {"AWS_DEFAULT_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing",
                       # The test CA plays the public roots that "system" means.
                       "SSL_CERT_FILE": str(deployed.server.ca_file)}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "DATABASE_URL", "SSL_CERT_DIR"):
        monkeypatch.delenv(key, raising=False)

    class Rds:
        """boto3's RDS client, except that each token is also made the login's password."""

        def __init__(self) -> None:
            self._real = boto3.client("rds")

        def generate_db_auth_token(self, **kwargs: Any) -> str:
            token: str = self._real.generate_db_auth_token(**kwargs)
            deployed.tokens.append((kwargs["DBHostname"], kwargs["Port"], token))
            with deployed.admin() as admin:
                admin.execute(sql.SQL("alter role {} password {}").format(
                    sql.Identifier(OPERATOR), sql.Literal(token)))
            return token

    def factory(region: str | None) -> aws.AwsClients:
        def make(service: str, **options: Any) -> Any:
            return Rds() if service == "rds" else boto3.client(service, **options)  # type: ignore[call-overload]

        return aws.AwsClients(region, factory=make)

    monkeypatch.setattr(_shared, "AWS_CLIENTS", factory)
    deployed.tokens.clear()


@pytest.fixture
def stack(deployed: Deployed, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployed]:
    """The stack's outputs name the proxy; each token becomes the operators' password."""
    sign_in_to(deployed, monkeypatch)
    with mock_aws():
        deploy_outputs(PROXY_HOST)
        yield deployed


@pytest.fixture
def tunnel(deployed: Deployed) -> Iterator[PortForward]:
    # 127.0.0.2: the server listens there too, so only the forward's port reaches it.
    with port_forward("127.0.0.2", deployed.server.port) as forward:
        yield forward


def run(capsys: pytest.CaptureFixture[str], *args: str) -> Result:
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def test_status_through_a_tunnel_verifies_the_proxys_name_and_signs_for_the_proxy(
    stack: Deployed, tunnel: PortForward, capsys: pytest.CaptureFixture[str],
) -> None:
    result = run(capsys, "status", "--stack", STACK, "--tunnel", str(tunnel.port), "--json")

    assert result.code == 0, result.err
    assert json.loads(result.out) is not None
    assert tunnel.carried, "the connection did not go through the local port forward"
    # The token is signed for the proxy's own name and port, as RDS checks it, never for
    # the tunnel's address or port.
    assert stack.tokens
    for host, port, token in stack.tokens:
        assert (host, port) == (PROXY_HOST, 5432)
        assert token.startswith(f"{PROXY_HOST}:5432/?")
        assert urllib.parse.parse_qs(token.split("?", 1)[1])["Action"] == ["connect"]


def test_the_tunnels_connection_string_keeps_the_name_and_verify_full_and_is_encrypted(
    stack: Deployed, tunnel: PortForward,
) -> None:
    database = aws.stack_database(STACK, _shared.aws_clients(build_parser().parse_args(
        ["status"])), tunnel=("127.0.0.1", tunnel.port))

    params = conninfo_to_dict(database.dsn())
    assert {k: params[k] for k in ("host", "hostaddr", "port", "sslmode", "sslrootcert")} == {
        "host": PROXY_HOST, "hostaddr": "127.0.0.1", "port": str(tunnel.port),
        "sslmode": "verify-full", "sslrootcert": str(stack.server.ca_file)}
    with connect(database.dsn(), application_name="leaseq-cli") as conn:
        row = conn.execute("select ssl from pg_stat_ssl where pid = pg_backend_pid()"
                           ).fetchone()
        assert row is not None
        assert row["ssl"] is True
        assert conn.info.get_parameters()["sslmode"] == "verify-full"
    assert "through 127.0.0.1:" in database.description


def test_a_tunnel_to_a_server_whose_certificate_names_another_host_is_refused(
    stack: Deployed, tunnel: PortForward, capsys: pytest.CaptureFixture[str],
) -> None:
    # The stack names a proxy the certificate does not hold: whoever answers at the end of
    # the tunnel must prove it is that proxy, and this server cannot.
    boto3.client("cloudformation").delete_stack(StackName=STACK)
    deploy_outputs(OTHER_PROXY_HOST)

    result = run(capsys, "status", "--stack", STACK, "--tunnel", str(tunnel.port))

    assert result.code == 3, result.err
    assert "does not name the host connected to" in result.err
    assert f'does not match host name "{OTHER_PROXY_HOST}"' in result.err
    assert len(result.error_lines) == 1


def test_a_tunnel_to_a_server_signed_by_an_untrusted_ca_is_refused(
    stack: Deployed, tunnel: PortForward, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(stack.server.unknown_ca_file))

    result = run(capsys, "status", "--stack", STACK, "--tunnel", str(tunnel.port))

    assert result.code == 3, result.err
    assert "not signed by a CA in the trusted roots" in result.err


def test_the_dashboard_through_a_tunnel_serves_the_stacks_database(
    stack: Deployed, tunnel: PortForward, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    def serve_a_few(server: LocalServer) -> None:
        server.start()
        try:
            seen["page"] = Client(server.url).enter(server.login_url).get("/jobs?state=dead")
        finally:
            server.httpd.shutdown()

    monkeypatch.setattr(LocalServer, "serve_forever", serve_a_few)
    result = run(capsys, "dashboard", "--stack", STACK, "--tunnel", str(tunnel.port),
                 "--port", "0")

    assert result.code == 0, result.err
    assert seen["page"].status == 200
    assert f"through 127.0.0.1:{tunnel.port}" in result.out
    assert tunnel.carried
    assert stack.tokens


@pytest.mark.parametrize(("given", "expected"), [
    ("15432", ("127.0.0.1", 15432)),
    ("127.0.0.1:15432", ("127.0.0.1", 15432)),
    ("127.0.0.5:5432", ("127.0.0.5", 5432)),
    ("[::1]:15432", ("::1", 15432)),
])
def test_a_tunnel_is_a_port_or_an_ip_address_and_a_port(
    given: str, expected: tuple[str, int],
) -> None:
    assert tunnel_address(given) == expected
    args = build_parser().parse_args(["status", "--stack", STACK, "--tunnel", given])
    assert args.tunnel == expected


@pytest.mark.parametrize("given", ["localhost:15432", "abc", "127.0.0.1:", "15432x", "0",
                                   "70000"])
def test_a_tunnel_that_is_not_an_ip_address_and_port_is_a_usage_error(
    given: str, capsys: pytest.CaptureFixture[str],
) -> None:
    result = run(capsys, "status", "--stack", STACK, "--tunnel", given)

    assert result.code == 2
    assert "--tunnel" in result.err
    assert len(result.error_lines) == 1


def test_a_tunnel_without_a_stack_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")

    result = run(capsys, "status", "--tunnel", "15432")

    assert result.code == 2
    assert "give --stack NAME too" in result.err
