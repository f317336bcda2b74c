"""functions/dashboard/app.py invoked with a function URL event, as Lambda invokes it."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from types import ModuleType

import pytest
from leaseq_dashboard import runtime as dashboard_runtime

from tests.conftest import Database
from tests.dashboard.seed import seed
from tests.functions.conftest import load_app, load_event
from tests.support import postgres
from tests.support.fakes import FakeLambdaContext
from tests.support.postgres import Conn

OPERATOR = "arn:aws:sts::123456789012:assumed-role/OnCall/ada"


@pytest.fixture
def dashboard_app(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("DATABASE_URL", db.worker_dsn)
    monkeypatch.setenv("LEASEQ_DASHBOARD_OPERATORS",
                       "arn:aws:sts::123456789012:assumed-role/OnCall/*")
    dashboard_runtime.reset()
    yield load_app("dashboard")
    dashboard_runtime.reset()


def test_the_sample_event_renders_the_overview_for_an_operator(
        dashboard_app: ModuleType, worker: Conn, owner: Conn) -> None:
    seeded = seed(worker, owner)
    response = dashboard_app.lambda_handler(load_event("dashboard"), FakeLambdaContext())
    assert response["statusCode"] == 200
    assert response["headers"]["Content-Type"].startswith("text/html")
    assert "oldest ready job waiting" in response["body"]
    assert any(c.startswith("leaseq_csrf=") and "Secure" in c and "HttpOnly" in c
               for c in response["cookies"])
    assert str(seeded.tenants[1]) in response["body"]


def test_a_principal_outside_the_policy_is_refused(dashboard_app: ModuleType) -> None:
    event = copy.deepcopy(load_event("dashboard"))
    event["requestContext"]["authorizer"]["iam"]["userArn"] = \
        "arn:aws:iam::123456789012:user/intern"
    response = dashboard_app.lambda_handler(event, FakeLambdaContext())
    assert response["statusCode"] == 403
    assert "user/intern may not use this dashboard" in response["body"]


def test_an_event_without_iam_auth_is_refused(dashboard_app: ModuleType) -> None:
    event = copy.deepcopy(load_event("dashboard"))
    event["requestContext"]["authorizer"] = None
    response = dashboard_app.lambda_handler(event, FakeLambdaContext())
    assert response["statusCode"] == 403
    assert "AWS_IAM" in response["body"]


def test_tenant_viewers_read_through_the_reader_login(
        db: Database, owner: Conn, worker: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    seeded = seed(worker, owner)
    mine, other = seeded.tenants[0], seeded.tenants[2]
    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (postgres.READER, mine))
    monkeypatch.setenv("DATABASE_URL", db.worker_dsn)
    monkeypatch.setenv("LEASEQ_DASHBOARD_TENANT_VIEWERS",
                       f'{{"arn:aws:iam::123456789012:user/acme-*": "{mine}"}}')
    monkeypatch.setenv("LEASEQ_DASHBOARD_READER_URL", db.reader_dsn)
    dashboard_runtime.reset()
    app = load_app("dashboard")
    event = copy.deepcopy(load_event("dashboard"))
    event["requestContext"]["authorizer"]["iam"]["userArn"] = \
        "arn:aws:iam::123456789012:user/acme-support"
    event["rawPath"] = event["requestContext"]["http"]["path"] = "/jobs"
    event["rawQueryString"], event["queryStringParameters"] = "state=dead", {"state": "dead"}
    try:
        body = app.lambda_handler(event, FakeLambdaContext())["body"]
    finally:
        dashboard_runtime.reset()
    own_dead, other_dead = seeded.jobs["dead"]
    assert str(own_dead) in body
    assert str(other_dead) not in body
    assert str(other) not in body


def test_tenant_viewers_without_a_reader_login_fail_at_cold_start(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    from leaseq import ConfigurationError

    monkeypatch.setenv("DATABASE_URL", db.worker_dsn)
    monkeypatch.setenv("LEASEQ_DASHBOARD_TENANT_VIEWERS",
                       '{"arn:aws:iam::1:user/a": "7b0c6a7e-5d1f-4a5e-9b7c-2f1d0c3e4a5b"}')
    dashboard_runtime.reset()
    with pytest.raises(ConfigurationError, match="LEASEQ_DASHBOARD_READER_URL"):
        dashboard_runtime.build_runtime()
