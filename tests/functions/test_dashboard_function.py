"""The dashboard function (leaseq_dashboard.function) invoked with a function URL event,
as Lambda invokes it, and with the events a direct Invoke could send instead."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from leaseq_dashboard import runtime as dashboard_runtime

from tests.conftest import Database
from tests.dashboard.readers import tenant_reader_logins
from tests.dashboard.seed import seed
from tests.functions.conftest import load_app, load_event
from tests.sql.calls import job
from tests.support import postgres
from tests.support.fakes import FakeLambdaContext
from tests.support.postgres import Conn

OPERATOR = "arn:aws:sts::123456789012:assumed-role/OnCall/ada"
TOKEN = "forged-token-chosen-by-the-caller-0123456789"


@pytest.fixture
def dashboard_app(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("DATABASE_URL", db.dsn(postgres.DASHBOARD))
    monkeypatch.setenv("LEASEQ_DASHBOARD_OPERATORS",
                       "arn:aws:sts::123456789012:assumed-role/OnCall/*")
    dashboard_runtime.reset()
    yield load_app("dashboard")
    dashboard_runtime.reset()


def _event(**changes: Any) -> dict[str, Any]:
    event = copy.deepcopy(load_event("dashboard"))
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = event
        for key in parents:
            target = target[key]
        target[last] = value
    return event


def _cancel(event: dict[str, Any], job_id: object) -> dict[str, Any]:
    """A confirmed cancel with a cookie and a token the caller chose itself."""
    event["rawPath"] = event["requestContext"]["http"]["path"] = "/actions/cancel"
    event["requestContext"]["http"]["method"] = "POST"
    event["rawQueryString"], event["queryStringParameters"] = "", None
    event["cookies"] = [f"leaseq_csrf={TOKEN}"]
    event["body"] = f"csrf={TOKEN}&job={job_id}&confirmed=yes&back=/jobs"
    return event


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
    event = _event(requestContext__authorizer__iam__userArn=(
        "arn:aws:iam::123456789012:user/intern"))
    response = dashboard_app.lambda_handler(event, FakeLambdaContext())
    assert response["statusCode"] == 403
    assert "user/intern may not use this dashboard" in response["body"]


def test_an_event_without_iam_auth_is_refused(dashboard_app: ModuleType) -> None:
    response = dashboard_app.lambda_handler(_event(requestContext__authorizer=None),
                                            FakeLambdaContext())
    assert response["statusCode"] == 403
    assert "AWS_IAM" in response["body"]


def _schedule_event() -> dict[str, Any]:
    return {"kind": "worker-tick", "scheduled_time": "2026-12-01T09:00:00Z"}


def _minimal_forgery() -> dict[str, Any]:
    """What a hand-written direct Invoke usually carries: just enough for the router."""
    return {"version": "2.0", "rawPath": "/jobs", "requestContext": {
        "http": {"method": "GET", "path": "/jobs"},
        "authorizer": {"iam": {"userArn": OPERATOR}}}}


@pytest.mark.parametrize(("name", "make", "reason"), [
    ("a schedule's event", _schedule_event, "not a function URL event"),
    ("a hand-written forgery", _minimal_forgery, "not a function URL event"),
    ("another region's URL", lambda: _event(
        requestContext__domainName="abcdefghij.lambda-url.eu-west-1.on.aws"),
     "not for a function URL of us-east-1"),
    ("an API Gateway host", lambda: _event(
        requestContext__domainName="abcdefghij.execute-api.us-east-1.amazonaws.com"),
     "not for a function URL of us-east-1"),
    ("a Host header of another site", lambda: _event(headers__host="attacker.example"),
     "Host header"),
    ("an identity of two accounts", lambda: _event(
        requestContext__authorizer__iam__accountId="999999999999"),
     "accountId is not the account of its userArn"),
    ("an identity without an access key", lambda: _event(
        requestContext__authorizer__iam__accessKey=None), "no accessKey"),
    ("a JWT authorizer", lambda: _event(requestContext__authorizer={
        "jwt": {"claims": {"sub": OPERATOR}}}), "no IAM identity"),
    ("a path the router would read differently", lambda: _event(rawPath="/jobs"),
     "path (= rawPath)"),
])
def test_an_event_without_the_function_urls_shape_is_refused_before_any_page(
    name: str, make: Callable[[], dict[str, Any]], reason: str, dashboard_app: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defence in depth behind the IAM condition: nothing is read from such an event."""
    opened: list[object] = []
    monkeypatch.setattr(dashboard_runtime.DashboardViewSource, "operator",
                        lambda self: opened.append(self))

    response = dashboard_app.lambda_handler(make(), FakeLambdaContext())

    assert response["statusCode"] == 403, name
    assert response["body"].startswith("refused: ")
    assert reason in response["body"]
    assert opened == []


def test_the_url_id_when_known_must_be_this_functions(
    dashboard_app: ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEASEQ_DASHBOARD_URL_ID", "ourownurlid")
    dashboard_runtime.reset()

    response = dashboard_app.lambda_handler(load_event("dashboard"), FakeLambdaContext())

    assert response["statusCode"] == 403
    assert "function URL abcdefghij, not this one (ourownurlid)" in response["body"]


def test_a_forged_cancel_by_direct_invoke_changes_nothing(
    dashboard_app: ModuleType, worker: Conn, owner: Conn,
) -> None:
    """The issue's attack, sent the way a direct Invoke sends it: a cancel with a
    self-chosen cookie and token under an operator's name, without the URL's shape."""
    seeded = seed(worker, owner)
    victim = seeded.jobs["pending"][-1]
    forged = _cancel(_minimal_forgery(), victim)
    forged["requestContext"]["http"]["method"] = "POST"

    response = dashboard_app.lambda_handler(forged, FakeLambdaContext())

    assert response["statusCode"] == 403
    assert job(owner, victim)["state"] == "pending"


def test_a_perfect_forgery_passes_the_shape_check_so_iam_must_stop_direct_invokes(
    dashboard_app: ModuleType, worker: Conn, owner: Conn,
) -> None:
    """Honest about what the check is worth: an event built exactly like the URL's
    passes it, cookie and token included. Only the invoke permission's condition
    (tests/infra/test_dashboard_invoke_policy.py) keeps such an event from arriving."""
    seeded = seed(worker, owner)
    victim = seeded.jobs["pending"][-1]

    response = dashboard_app.lambda_handler(_cancel(load_event("dashboard"), victim),
                                            FakeLambdaContext())

    assert response["statusCode"] == 303
    assert job(owner, victim)["state"] == "cancelled"


def test_the_dashboard_login_cancels_by_id_and_names_the_principal_in_the_audit(
    dashboard_app: ModuleType, worker: Conn, owner: Conn,
) -> None:
    seeded = seed(worker, owner)
    victim = seeded.jobs["pending"][-1]
    event = _cancel(load_event("dashboard"), victim)

    dashboard_app.lambda_handler(event, FakeLambdaContext())

    actors = owner.execute("select actor from app.job_events where job_id = %s and"
                           " event_type = 'cancelled'", (victim,)).fetchall()
    assert actors == [{"actor": f"dashboard:{OPERATOR}"}]


def test_two_tenant_viewers_read_through_their_own_tenants_logins(
        db: Database, owner: Conn, worker: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    seeded = seed(worker, owner)
    a, c = seeded.tenants[0], seeded.tenants[2]
    dead_a, dead_c = seeded.jobs["dead"]
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("DATABASE_URL", db.dsn(postgres.DASHBOARD))
    monkeypatch.setenv("LEASEQ_DASHBOARD_TENANT_VIEWERS", json.dumps({
        "arn:aws:iam::123456789012:user/acme-*": str(a),
        "arn:aws:iam::123456789012:user/cyberdyne-*": str(c)}))
    dashboard_runtime.reset()
    app = load_app("dashboard")

    def dead_list(user: str) -> str:
        event = _event(requestContext__authorizer__iam__userArn=(
            f"arn:aws:iam::123456789012:user/{user}"))
        event["rawPath"] = event["requestContext"]["http"]["path"] = "/jobs"
        event["rawQueryString"], event["queryStringParameters"] = (
            f"state=dead&tenant={c}", {"state": "dead", "tenant": str(c)})
        return str(app.lambda_handler(event, FakeLambdaContext())["body"])

    with tenant_reader_logins(db, [a, c]):
        try:
            acme, cyberdyne = dead_list("acme-support"), dead_list("cyberdyne-ops")
            kept = dashboard_runtime.get().source.reader_tenants
        finally:
            dashboard_runtime.reset()

    assert str(dead_a) not in acme  # it asked for C's jobs: its own tenant has none of them
    assert str(dead_c) not in acme
    assert str(dead_c) in cyberdyne
    assert kept == (c,)


def test_tenant_viewers_with_a_secret_login_fail_at_cold_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from leaseq import ConfigurationError

    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("LEASEQ_DATABASE_SECRET_ARN",
                       "arn:aws:secretsmanager:us-east-1:123456789012:secret:leaseq/d-AbC")
    monkeypatch.setenv("LEASEQ_DASHBOARD_TENANT_VIEWERS", json.dumps({
        "arn:aws:iam::123456789012:user/a": "7b0c6a7e-5d1f-4a5e-9b7c-2f1d0c3e4a5b"}))
    dashboard_runtime.reset()
    with pytest.raises(ConfigurationError, match="tenant viewers need IAM authentication"):
        dashboard_runtime.build_runtime()


@pytest.mark.parametrize(("variable", "pattern", "reason"), [
    ("LEASEQ_DASHBOARD_OPERATORS", "arn:aws:sts::123456789012:assumed-role/*/ada",
     "never match on the session name alone"),
    ("LEASEQ_DASHBOARD_VIEWERS", "arn:aws:sts::*:assumed-role/OnCall/*",
     "12-digit account id"),
    ("LEASEQ_DASHBOARD_TENANT_VIEWERS",
     '{"*": "7b0c6a7e-5d1f-4a5e-9b7c-2f1d0c3e4a5b"}', "is an IAM ARN"),
])
def test_an_unsafe_principal_pattern_fails_the_cold_start(
        variable: str, pattern: str, reason: str, db: Database,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from leaseq import ConfigurationError

    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("DATABASE_URL", db.dsn(postgres.DASHBOARD))
    monkeypatch.setenv(variable, pattern)
    dashboard_runtime.reset()
    with pytest.raises(ConfigurationError, match=reason):
        dashboard_runtime.build_runtime()


def test_without_a_region_the_dashboard_does_not_start(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    from leaseq import ConfigurationError

    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("DATABASE_URL", db.dsn(postgres.DASHBOARD))
    dashboard_runtime.reset()
    with pytest.raises(ConfigurationError, match="AWS_REGION"):
        dashboard_runtime.build_runtime()
