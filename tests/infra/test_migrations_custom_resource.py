"""The migrations custom resource against a real PostgreSQL and a real HTTP endpoint standing
in for CloudFormation's presigned response URL.

What CloudFormation needs from it: exactly one answer per request on every path, the same
PhysicalResourceId on Update and Delete, and a Delete that never drops data. What the queue
needs from it: the schema migrated as its owner, and a runtime login role that can run the
queue functions and nothing else.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import psycopg
import pytest
from leaseq.db import connect
from leaseq.migrate import MIGRATION_LOCK_KEY, load_migrations, migrate
from moto import mock_aws
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import Database
from tests.infra.conftest import ResponseEndpoint
from tests.support import postgres
from tests.support.postgres import Cluster

LATEST = max(m.version for m in load_migrations())


@dataclass
class FakeContext:
    """Remaining time computed the way the Lambda runtime does: deadline minus wall clock."""

    deadline_ms: float

    @classmethod
    def with_remaining(cls, seconds: float) -> FakeContext:
        return cls(time.time() * 1000 + seconds * 1000)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self.deadline_ms - time.time() * 1000))


def request(
    request_type: str,
    endpoint: ResponseEndpoint,
    *,
    role: str,
    physical_id: str | None = None,
    **properties: str,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "RequestType": request_type,
        "ResponseURL": endpoint.url(),
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/leaseq-dev/0f1e2d3c",
        "RequestId": str(uuid.uuid4()),
        "ResourceType": "Custom::LeaseqMigrations",
        "LogicalResourceId": "Migrations",
        "ResourceProperties": {
            "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:migrations",
            "LayerVersionArn": "arn:aws:lambda:us-east-1:123456789012:layer:leaseq:7",
            "RuntimeDbUser": role,
            "RuntimeIamAuth": "true",
            "RuntimeSecretArn": "",
            "RuntimeStatementTimeout": "15s",
            **properties,
        },
    }
    if physical_id is not None:
        event["PhysicalResourceId"] = physical_id
    return event


@pytest.fixture
def runtime_role(cluster: Cluster) -> Iterator[str]:
    """A role name unique to the test (roles are cluster-wide), dropped afterwards."""
    name = f"leaseq_rt_{uuid.uuid4().hex[:10]}"
    yield name
    with cluster.connect() as conn:
        conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))


@pytest.fixture
def database(fresh_database: Callable[[], Database]) -> Database:
    return fresh_database()


def memberships(db: Database, role: str) -> set[str]:
    with db.connect(None) as conn:
        rows = conn.execute(
            "select g.rolname from pg_auth_members m join pg_roles g on g.oid = m.roleid"
            " join pg_roles r on r.oid = m.member where r.rolname = %s",
            (role,),
        ).fetchall()
    return {row["rolname"] for row in rows}


def applied_versions(db: Database) -> list[int]:
    with db.connect(postgres.OWNER) as conn:
        rows = conn.execute("select version from app.schema_migrations order by 1").fetchall()
    return [row["version"] for row in rows]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_create_migrates_as_owner_creates_a_service_role_only_runtime_login_and_answers_success(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    event = request("Create", response_endpoint, role=runtime_role)

    status = migrations_app.handle(event, FakeContext.with_remaining(60),
                                   owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert status == "SUCCESS"
    assert answer.body["Status"] == "SUCCESS"
    assert answer.body["PhysicalResourceId"] == "leaseq-dev-Migrations"
    assert answer.body["RequestId"] == event["RequestId"]
    assert answer.body["StackId"] == event["StackId"]
    assert answer.body["LogicalResourceId"] == "Migrations"
    assert answer.body["Data"]["SchemaVersion"] == str(LATEST)
    assert answer.body["Data"]["AppliedVersions"] == ",".join(
        str(v) for v in range(1, LATEST + 1))
    # S3 presigned URLs are signed without a content type; urllib's default would break them.
    assert answer.headers.get("content-type") == ""
    assert applied_versions(database) == list(range(1, LATEST + 1))
    with database.connect(postgres.OWNER) as conn:
        row = conn.execute("select nspowner::regrole::text as owner from pg_namespace"
                           " where nspname = 'app'").fetchone()
    assert row is not None
    assert row["owner"] == postgres.OWNER
    assert memberships(database, runtime_role) == {"service_role"}

    with database.connect(runtime_role) as conn:
        conn.execute("select * from app.ready_tenants(10)").fetchall()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select * from app.jobs").fetchall()
        timeout = conn.execute("show statement_timeout").fetchone()
    assert timeout is not None
    assert timeout["statement_timeout"] == "15s"


def test_update_keeps_the_physical_id_and_applies_only_the_migrations_added_since(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    with connect(database.owner_dsn) as conn:
        # Without the function files: this release's need its migrations (a changed
        # return type is dropped by one).
        migrate(conn, load_migrations()[:-1], [])
    assert applied_versions(database) == list(range(1, LATEST))

    event = request("Update", response_endpoint, role=runtime_role,
                    physical_id="leaseq-dev-Migrations-original")
    status = migrations_app.handle(event, FakeContext.with_remaining(60),
                                   owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert status == "SUCCESS"
    assert answer.body["PhysicalResourceId"] == "leaseq-dev-Migrations-original"
    assert answer.body["Data"]["AppliedVersions"] == str(LATEST)
    assert applied_versions(database) == list(range(1, LATEST + 1))


def test_update_on_a_current_schema_applies_nothing_and_still_answers_success(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    create = request("Create", response_endpoint, role=runtime_role)
    migrations_app.handle(create, None, owner_dsn=lambda: database.owner_dsn)
    update = request("Update", response_endpoint, role=runtime_role,
                     physical_id=response_endpoint.puts[0].body["PhysicalResourceId"])

    migrations_app.handle(update, None, owner_dsn=lambda: database.owner_dsn)

    first, second = response_endpoint.puts
    assert second.body["Status"] == "SUCCESS"
    assert second.body["PhysicalResourceId"] == first.body["PhysicalResourceId"]
    assert second.body["Data"]["AppliedVersions"] == ""
    assert memberships(database, runtime_role) == {"service_role"}


def test_delete_answers_success_with_the_same_id_and_keeps_schema_jobs_and_role(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    migrations_app.handle(request("Create", response_endpoint, role=runtime_role), None,
                          owner_dsn=lambda: database.owner_dsn)
    with database.connect(runtime_role) as conn:
        conn.execute(
            "select * from app.enqueue_job(%s, 'op-1', 'email', '{}'::jsonb, now(), 3)",
            (uuid.uuid4(),),
        ).fetchall()

    def no_database() -> str:
        raise AssertionError("Delete must not touch the database")

    delete = request("Delete", response_endpoint, role=runtime_role, physical_id="pid-7")
    status = migrations_app.handle(delete, None, owner_dsn=no_database)

    assert status == "SUCCESS"
    answer = response_endpoint.puts[-1]
    assert answer.body["Status"] == "SUCCESS"
    assert answer.body["PhysicalResourceId"] == "pid-7"
    with database.connect(postgres.OWNER) as conn:
        row = conn.execute("select count(*) as n from app.jobs").fetchone()
    assert row is not None
    assert row["n"] == 1
    assert memberships(database, runtime_role) == {"service_role"}


def test_unreachable_database_is_answered_failed_and_the_handler_does_not_raise(
    migrations_app: Any, response_endpoint: ResponseEndpoint, runtime_role: str,
) -> None:
    dsn = f"host=127.0.0.1 port={closed_port()} dbname=leaseq user=owner connect_timeout=2"
    event = request("Create", response_endpoint, role=runtime_role)

    status = migrations_app.handle(event, FakeContext.with_remaining(60),
                                   owner_dsn=lambda: dsn, retry_delays=(0.05,))

    answer = response_endpoint.only_put()
    assert status == "FAILED"
    assert answer.body["Status"] == "FAILED"
    assert answer.body["Reason"].startswith("DatabaseUnavailableError: database unavailable")
    assert answer.body["PhysicalResourceId"] == "leaseq-dev-Migrations"


def test_a_blocked_migration_is_answered_failed_by_the_watchdog_before_the_timeout_once(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    event = request("Create", response_endpoint, role=runtime_role)
    result: list[str | None] = []
    with database.connect(None) as blocker:
        # Another deploy holding the migration lock.
        blocker.execute("select pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        started = time.monotonic()
        worker = threading.Thread(target=lambda: result.append(migrations_app.handle(
            event, FakeContext.with_remaining(2.5), owner_dsn=lambda: database.owner_dsn,
            watchdog_margin=2.0)))
        worker.start()
        assert response_endpoint.received.wait(10), "the watchdog never answered"
        answered_after = time.monotonic() - started
        blocker.execute("select pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    worker.join(30)

    assert not worker.is_alive()
    assert answered_after < 2.5
    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "before the function timeout" in answer.body["Reason"]
    assert result == ["FAILED"]


def test_a_runtime_user_that_is_the_schema_owner_is_refused(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
) -> None:
    event = request("Create", response_endpoint, role=postgres.OWNER)

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "is the schema owner" in answer.body["Reason"]


def test_an_existing_runtime_role_with_another_membership_is_refused_not_rewritten(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    with database.connect(None) as admin:
        admin.execute(sql.SQL("create role {} login").format(sql.Identifier(runtime_role)))
        admin.execute(sql.SQL("grant {} to {}").format(
            sql.Identifier(postgres.OWNER), sql.Identifier(runtime_role)))

    migrations_app.handle(request("Create", response_endpoint, role=runtime_role), None,
                          owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert f"also a member of {postgres.OWNER}" in answer.body["Reason"]
    assert memberships(database, runtime_role) == {postgres.OWNER}


def test_malformed_runtime_user_is_answered_failed_naming_the_accepted_form(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
) -> None:
    event = request("Create", response_endpoint, role="worker; drop schema app")

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "1-63 characters of a-z, 0-9 and _" in answer.body["Reason"]


@pytest.fixture
def rds_iam_role(database: Database) -> Iterator[str]:
    """An rds_iam group as RDS has one, which the master user (here: the owner) may grant."""
    with database.connect(None) as admin:
        if admin.execute("select 1 from pg_roles where rolname = 'rds_iam'").fetchone():
            pytest.skip("this server already has an rds_iam role; not touching it")
        admin.execute("create role rds_iam nologin")
        admin.execute(sql.SQL("grant rds_iam to {} with admin option").format(
            sql.Identifier(postgres.OWNER)))
    try:
        yield "rds_iam"
    finally:
        with database.connect(None) as admin:
            admin.execute("drop role if exists rds_iam")


def test_without_an_rds_iam_role_iam_auth_is_skipped_and_reported_absent(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    with database.connect(None) as admin:
        if admin.execute("select 1 from pg_roles where rolname = 'rds_iam'").fetchone():
            pytest.skip("this server has an rds_iam role")

    migrations_app.handle(request("Create", response_endpoint, role=runtime_role), None,
                          owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "SUCCESS"
    assert answer.body["Data"]["RdsIam"] == "absent"


def test_iam_auth_grants_rds_iam_and_switching_to_a_password_revokes_it(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str, rds_iam_role: str,
) -> None:
    migrations_app.handle(request("Create", response_endpoint, role=runtime_role), None,
                          owner_dsn=lambda: database.owner_dsn)
    assert response_endpoint.puts[-1].body["Data"]["RdsIam"] == "granted"
    assert memberships(database, runtime_role) == {"service_role", rds_iam_role}

    secrets = {"arn:runtime": {"username": runtime_role, "password": "s3cret-Runtime"}}
    update = request("Update", response_endpoint, role=runtime_role, physical_id="pid",
                     RuntimeIamAuth="false", RuntimeSecretArn="arn:runtime")
    migrations_app.handle(update, None, owner_dsn=lambda: database.owner_dsn,
                          read_secret=secrets.__getitem__)

    assert response_endpoint.puts[-1].body["Status"] == "SUCCESS"
    assert response_endpoint.puts[-1].body["Data"]["RdsIam"] == "revoked"
    assert memberships(database, runtime_role) == {"service_role"}


def test_a_runtime_secret_sets_the_runtime_role_password(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    secrets = {"arn:runtime": {"username": runtime_role, "password": "s3cret-Runtime"}}
    event = request("Create", response_endpoint, role=runtime_role,
                    RuntimeIamAuth="false", RuntimeSecretArn="arn:runtime")

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn,
                          read_secret=secrets.__getitem__)

    assert response_endpoint.only_put().body["Status"] == "SUCCESS"
    with database.connect(None) as admin:
        row = admin.execute("select rolpassword from pg_authid where rolname = %s",
                            (runtime_role,)).fetchone()
    assert row is not None
    assert row["rolpassword"] is not None


def test_a_runtime_secret_for_another_user_is_refused(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    secrets = {"arn:runtime": {"username": "someone_else", "password": "x"}}
    event = request("Create", response_endpoint, role=runtime_role,
                    RuntimeIamAuth="false", RuntimeSecretArn="arn:runtime")

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn,
                          read_secret=secrets.__getitem__)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "must hold username" in answer.body["Reason"]


@mock_aws
def test_lambda_handler_reads_the_owner_secret_from_secrets_manager_and_env(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    params = conninfo_to_dict(database.owner_dsn)
    client = boto3.client("secretsmanager", region_name="us-east-1")
    # Shaped like the RDS-managed master secret: username and password only.
    arn = client.create_secret(
        Name="rds!db-leaseq",
        SecretString=json.dumps({"username": postgres.OWNER, "password": "unused-locally"}),
    )["ARN"]
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("LEASEQ_DATABASE_SECRET_ARN", arn)
    monkeypatch.setenv("LEASEQ_DB_HOST", str(params.get("host") or "localhost"))
    monkeypatch.setenv("LEASEQ_DB_PORT", str(params.get("port") or 5432))
    monkeypatch.setenv("LEASEQ_DB_NAME", database.name)
    monkeypatch.setenv("LEASEQ_DB_SSLMODE", "disable")

    migrations_app.lambda_handler(request("Create", response_endpoint, role=runtime_role),
                                  FakeContext.with_remaining(60))

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "SUCCESS", answer.body["Reason"]
    assert applied_versions(database) == list(range(1, LATEST + 1))


@mock_aws
def test_lambda_handler_without_credentials_answers_failed_naming_the_variables(
    migrations_app: Any, response_endpoint: ResponseEndpoint, runtime_role: str,
) -> None:
    migrations_app.lambda_handler(request("Create", response_endpoint, role=runtime_role), None)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "LEASEQ_DATABASE_SECRET_ARN" in answer.body["Reason"]


def test_an_unreachable_response_url_is_retried_then_given_up_without_raising(
    migrations_app: Any,
) -> None:
    event = request("Delete", ResponseEndpoint(f"http://127.0.0.1:{closed_port()}"),
                    role="leaseq_worker", physical_id="pid")

    started = time.monotonic()
    status = migrations_app.handle(event, None)

    assert status == "SUCCESS"  # the status it tried to send
    assert time.monotonic() - started < 10


def test_an_overlong_failure_reason_is_cut_to_cloudformations_size_limit(
    response_endpoint: ResponseEndpoint, migrations_app: Any,
) -> None:
    import cfn_response

    event = request("Create", response_endpoint, role="leaseq_worker")
    body = cfn_response.response_body(event, "FAILED", reason="x" * 10_000,
                                      physical_resource_id="pid")

    assert len(body) <= cfn_response.MAX_BODY_BYTES
    assert json.loads(body)["Reason"].endswith("[truncated]")
