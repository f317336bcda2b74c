"""The migrations custom resource's part for the dashboard: its login in leaseq_dashboard,
one reader login per tenant of its tenant viewers bound to that tenant only, its access
patterns checked before anything changes, and its connections within the operators'
allowance. Against a real PostgreSQL, as in test_migrations_custom_resource.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from leaseq_dashboard.sources import reader_login
from psycopg import sql

from tests.conftest import Database
from tests.infra.conftest import ResponseEndpoint
from tests.infra.test_migrations_custom_resource import (
    applied_versions,
    drop_roles,
    memberships,
    no_connection,
    password_properties,
    request,
    role_exists,
    runtime_secrets,
)
from tests.support import postgres
from tests.support.postgres import Cluster

DASHBOARD_BUDGET = {"DashboardReservedConcurrency": "1", "DashboardReaderConnections": "1"}


@pytest.fixture
def dashboard_login(cluster: Cluster) -> Iterator[str]:
    name = f"leaseq_dash_{uuid.uuid4().hex[:8]}"
    yield name
    drop_roles(cluster, [name])


@pytest.fixture
def tenants(cluster: Cluster) -> Iterator[list[uuid.UUID]]:
    """Three tenants whose reader logins the test may make (dropped afterwards)."""
    made = [uuid.uuid4() for _ in range(3)]
    yield made
    drop_roles(cluster, [reader_login(t) for t in made])


def _viewers(*tenants: uuid.UUID) -> str:
    return json.dumps({f"arn:aws:sts::123456789012:assumed-role/Tenant{i}/*": str(t)
                       for i, t in enumerate(tenants)})


def _bindings(db: Database) -> dict[str, set[uuid.UUID]]:
    with db.connect(postgres.OWNER) as conn:
        rows = conn.execute("select role_name::text as login, tenant_id"
                            " from app.tenant_readers").fetchall()
    found: dict[str, set[uuid.UUID]] = {}
    for row in rows:
        found.setdefault(row["login"], set()).add(row["tenant_id"])
    return found


def _run(migrations_app: Any, endpoint: ResponseEndpoint, database: Database,
         event: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    migrations_app.handle(event, None, owner_dsn=lambda: database.owner_dsn, **kwargs)
    answer: dict[str, Any] = endpoint.puts[-1].body
    return answer


def _create(logins: dict[str, str], endpoint: ResponseEndpoint, dashboard: str,
            viewers: str = "", request_type: str = "Create", **properties: Any
            ) -> dict[str, Any]:
    budget = {**DASHBOARD_BUDGET, **properties.pop("budget", {})}
    return request(request_type, endpoint, logins=logins, budget=budget,
                   physical_id=None if request_type == "Create" else "pid",
                   DashboardDbUser=dashboard, DashboardDbSecretArn="",
                   DashboardTenantViewers=viewers, DashboardOperators=(
                       "arn:aws:sts::123456789012:assumed-role/OnCall/*"),
                   DashboardViewers="", **properties)


def test_the_dashboards_login_joins_leaseq_dashboard_only_and_may_not_prune(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str,
) -> None:
    answer = _run(migrations_app, response_endpoint, database,
                  _create(logins, response_endpoint, dashboard_login))

    assert answer["Status"] == "SUCCESS", answer.get("Reason")
    assert answer["Data"]["DashboardDbUser"] == dashboard_login
    assert memberships(database, dashboard_login) == {"leaseq_dashboard"}
    with database.connect(dashboard_login) as conn:
        conn.execute("select * from app.list_jobs('dead', null, null, null, null, null,"
                     " null, 50)").fetchall()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select * from app.prune_jobs('0 seconds', 1000)")


def test_without_the_dashboard_no_dashboard_login_is_made(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str,
) -> None:
    answer = _run(migrations_app, response_endpoint, database,
                  _create(logins, response_endpoint, "", budget={
                      "DashboardReservedConcurrency": "", "DashboardReaderConnections": ""}))

    assert answer["Status"] == "SUCCESS", answer.get("Reason")
    assert "DashboardDbUser" not in answer["Data"]
    assert answer["Data"]["TenantReaderLogins"] == "0"
    assert not role_exists(database, dashboard_login)


def test_each_tenant_viewers_tenant_gets_a_reader_login_bound_to_it_alone(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str, tenants: list[uuid.UUID],
) -> None:
    a, b, _ = tenants
    # Two patterns for one tenant are one login; a stale binding of A's login to B goes.
    viewers = json.dumps({"arn:aws:sts::123456789012:assumed-role/AcmeSupport/*": str(a),
                          "arn:aws:iam::123456789012:user/acme-admin": str(a),
                          "arn:aws:sts::123456789012:assumed-role/Globex/*": str(b)})
    _run(migrations_app, response_endpoint, database,
         _create(logins, response_endpoint, dashboard_login))
    with database.connect(postgres.OWNER) as owner:  # as an earlier deploy left it
        owner.execute(sql.SQL("create role {} login in role authenticated").format(
            sql.Identifier(reader_login(a))))
        owner.execute("insert into app.tenant_readers values (%s, %s)", (reader_login(a), b))

    answer = _run(migrations_app, response_endpoint, database,
                  _create(logins, response_endpoint, dashboard_login, viewers,
                          request_type="Update"))

    assert answer["Status"] == "SUCCESS", answer.get("Reason")
    assert answer["Data"]["TenantReaderLogins"] == "2"
    assert _bindings(database) == {reader_login(a): {a}, reader_login(b): {b}}
    for tenant in (a, b):
        login = reader_login(tenant)
        assert memberships(database, login) - {"rds_iam"} == {"authenticated"}
        with database.connect(login) as conn:
            idle = conn.execute("show idle_in_transaction_session_timeout").fetchone()
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("select * from app.list_jobs('dead', null, null, null, null,"
                             " null, null, 50)")
        assert idle == {"idle_in_transaction_session_timeout": "15s"}


def test_a_reader_logins_idle_transactions_are_capped_at_a_minute_whatever_the_timeout(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str, tenants: list[uuid.UUID],
) -> None:
    event = _create(logins, response_endpoint, dashboard_login, _viewers(tenants[0]))
    event["ResourceProperties"]["RuntimeStatementTimeout"] = "2min"

    assert _run(migrations_app, response_endpoint, database, event)["Status"] == "SUCCESS"

    with database.connect(reader_login(tenants[0])) as conn:
        timeouts = conn.execute("select current_setting('statement_timeout') as statement,"
                                " current_setting('idle_in_transaction_session_timeout')"
                                " as idle").fetchone()
    with database.connect(dashboard_login) as conn:
        dashboard = conn.execute("show idle_in_transaction_session_timeout").fetchone()
    assert timeouts == {"statement": "2min", "idle": "1min"}
    assert dashboard == {"idle_in_transaction_session_timeout": "2min"}


def test_a_tenant_dropped_from_the_viewers_loses_its_binding_and_so_sees_nothing(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str, tenants: list[uuid.UUID],
) -> None:
    a, b, _ = tenants
    _run(migrations_app, response_endpoint, database,
         _create(logins, response_endpoint, dashboard_login, _viewers(a, b)))

    update = _run(migrations_app, response_endpoint, database,
                  _create(logins, response_endpoint, dashboard_login, _viewers(b),
                          request_type="Update"))
    assert update["Status"] == "SUCCESS", update.get("Reason")
    assert _bindings(database) == {reader_login(b): {b}}

    # The dashboard switched off: no reader login is bound to anything.
    _run(migrations_app, response_endpoint, database,
         _create(logins, response_endpoint, "", "", request_type="Update", budget={
             "DashboardReservedConcurrency": "", "DashboardReaderConnections": ""}))
    assert _bindings(database) == {}


def test_a_request_of_an_earlier_template_leaves_reader_bindings_alone(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str, tenants: list[uuid.UUID],
) -> None:
    a = tenants[0]
    _run(migrations_app, response_endpoint, database,
         _create(logins, response_endpoint, dashboard_login, _viewers(a)))

    earlier = request("Update", response_endpoint, logins=logins, physical_id="pid")
    answer = _run(migrations_app, response_endpoint, database, earlier)

    assert answer["Status"] == "SUCCESS", answer.get("Reason")
    assert _bindings(database) == {reader_login(a): {a}}


def test_tenant_viewers_with_password_authentication_are_refused_before_anything_changes(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str, tenants: list[uuid.UUID],
) -> None:
    every = {**logins, "DashboardDbUser": dashboard_login}
    secrets = runtime_secrets(every)
    event = _create(logins, response_endpoint, dashboard_login, _viewers(tenants[0]),
                    **password_properties(logins))
    event["ResourceProperties"]["DashboardDbSecretArn"] = "arn:DashboardDbUser"

    answer = _run(migrations_app, response_endpoint, database, event,
                  read_secret=secrets.__getitem__)

    assert answer["Status"] == "FAILED"
    assert "DashboardTenantViewers needs IAM authentication" in answer["Reason"]
    assert applied_versions(database) == []


def test_the_dashboards_login_with_password_authentication_gets_its_secrets_password(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str,
) -> None:
    every = {**logins, "DashboardDbUser": dashboard_login}
    event = _create(logins, response_endpoint, dashboard_login, **password_properties(logins))
    event["ResourceProperties"]["DashboardDbSecretArn"] = "arn:DashboardDbUser"

    answer = _run(migrations_app, response_endpoint, database, event,
                  read_secret=runtime_secrets(every).__getitem__)

    assert answer["Status"] == "SUCCESS", answer.get("Reason")
    with database.connect(None) as admin:
        row = admin.execute("select rolpassword from pg_authid where rolname = %s",
                            (dashboard_login,)).fetchone()
    assert row is not None
    assert str(row["rolpassword"]).startswith("SCRAM-SHA-256$")


@pytest.mark.parametrize(("prop", "value", "expected"), [
    ("DashboardOperators", "arn:aws:sts::123456789012:assumed-role/OnCall/*,"
                           "arn:aws:sts::123456789012:assumed-role/*/root",
     "DashboardOperators: principal pattern 'arn:aws:sts::123456789012:assumed-role/*/root'"),
    ("DashboardViewers", "arn:aws:iam::*:user/auditor", "12-digit account id"),
    ("DashboardTenantViewers", '{"*": "7b0c6a7e-5d1f-4a5e-9b7c-2f1d0c3e4a5b"}',
     "DashboardTenantViewers: principal pattern '*'"),
    ("DashboardTenantViewers", '["not", "an", "object"]', "must be a JSON object"),
    ("DashboardTenantViewers", '{"arn:aws:iam::123456789012:user/a": "tenant-one"}',
     "must be a JSON object"),
    ("DashboardDbUser", reader_login(uuid.UUID(int=7)), "belong to the dashboard's tenant"),
    ("DashboardDbUser", "leaseq_dashboard", "is the name of a group role"),
])
def test_unsafe_dashboard_settings_fail_the_deploy_before_connecting(
    migrations_app: Any, response_endpoint: ResponseEndpoint, logins: dict[str, str],
    prop: str, value: str, expected: str,
) -> None:
    event = _create(logins, response_endpoint, "leaseq_dashboard_login")
    event["ResourceProperties"][prop] = value

    migrations_app.handle(event, None, owner_dsn=no_connection)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert expected in answer.body["Reason"]


def test_a_duty_login_may_not_take_a_tenant_reader_name(
    migrations_app: Any, response_endpoint: ResponseEndpoint, logins: dict[str, str],
) -> None:
    """The dashboard may connect as any leaseq_tenant_reader_* login: none may be a duty's."""
    event = request("Create", response_endpoint,
                    logins={**logins, "OperatorDbUser": reader_login(uuid.UUID(int=9))})

    migrations_app.handle(event, None, owner_dsn=no_connection)

    assert "belong to the dashboard's tenant reader logins" in (
        response_endpoint.only_put().body["Reason"])


# ---- the connection budget ------------------------------------------------------------------


def test_the_dashboards_connections_are_reported_within_the_operators_allowance(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str,
) -> None:
    answer = _run(migrations_app, response_endpoint, database,
                  _create(logins, response_endpoint, dashboard_login))

    assert answer["Status"] == "SUCCESS", answer.get("Reason")
    assert ("OperatorConnections 3 (of which DashboardReservedConcurrency 1 x (1 + "
            "DashboardReaderConnections 1) = 2 for the dashboard) = 14") in (
        answer["Data"]["ConnectionBudget"])


@pytest.mark.parametrize(("budget", "expected"), [
    ({"DashboardReservedConcurrency": "2", "DashboardReaderConnections": "1"},
     "DashboardReservedConcurrency 2 x (1 + DashboardReaderConnections 1) = 4 for the "
     "dashboard is more than OperatorConnections 3"),
    ({"DashboardReservedConcurrency": "4", "DashboardReaderConnections": "0"},
     "= 4 for the dashboard is more than OperatorConnections 3"),
    ({"DashboardReservedConcurrency": "0"},
     "ConnectionBudget.DashboardReservedConcurrency must be a whole number from 1 to 1000"),
])
def test_a_dashboard_that_could_open_more_than_the_operators_allowance_is_refused(
    migrations_app: Any, response_endpoint: ResponseEndpoint, logins: dict[str, str],
    budget: dict[str, str], expected: str,
) -> None:
    event = _create(logins, response_endpoint, "leaseq_dashboard_login", budget=budget)

    migrations_app.handle(event, None, owner_dsn=no_connection)

    answer = response_endpoint.only_put()
    assert answer.body["Status"] == "FAILED"
    assert expected in answer.body["Reason"]


def test_raising_the_operators_allowance_makes_room_for_the_dashboard(
    migrations_app: Any, database: Database, response_endpoint: ResponseEndpoint,
    logins: dict[str, str], dashboard_login: str,
) -> None:
    answer = _run(migrations_app, response_endpoint, database, _create(
        logins, response_endpoint, dashboard_login, budget={
            "DashboardReservedConcurrency": "2", "OperatorConnections": "5"}))

    assert answer["Status"] == "SUCCESS", answer.get("Reason")
    assert "= 4 for the dashboard) = 16" in answer["Data"]["ConnectionBudget"]
