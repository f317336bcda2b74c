"""The dashboard's cancel on a running job: confirmed, recorded as a cancel request
naming the on-call operator (the door's identity, never a form field), shown on the
job page, refused to viewers, and working with the deployed dashboard login."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from uuid import UUID

import pytest
from leaseq import connect
from leaseq_dashboard import build
from leaseq_dashboard.local import ConnectionViewSource, LocalServer

from tests.conftest import Database
from tests.dashboard.client import Client, Page
from tests.dashboard.conftest import OPERATOR, TENANT_VIEWER, VIEWER, Served, policy_for
from tests.dashboard.seed import Seeded
from tests.sql.calls import events, job
from tests.support import postgres
from tests.support.postgres import Conn

Serve = Callable[[str], Served]


def _running(served: Served, owner: Conn) -> UUID:
    """A seeded running job whose lease is still live."""
    for job_id in served.seeded.jobs["running"]:
        live = owner.execute("select expires_at > now() as live from app.leases"
                             " where job_id = %s", (job_id,)).fetchone()
        if live == {"live": True}:
            return job_id
    raise AssertionError("the seed has no running job with a live lease")


def _cancel(client: Client, job_id: UUID, *, confirmed: bool = True,
            actor_field: str | None = None) -> Page:
    page = client.get(f"/jobs/{job_id}")
    fields = [("csrf", page.csrf()), ("job", str(job_id)), ("back", f"/jobs/{job_id}"),
              ("reason", "wrong report")]
    if actor_field is not None:
        fields.append(("actor", actor_field))
    if confirmed:
        fields.append(("confirmed", "yes"))
    return client.post("/actions/cancel", fields)


def test_cancel_of_a_running_job_records_a_request_naming_the_operator_and_shows_it(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    client = served.client()
    running = _running(served, owner)
    page = client.get(f"/jobs/{running}")
    assert "Cancel this job" in page.body

    confirm = _cancel(client, running, confirmed=False)
    assert "A running job gets a cancel request" in confirm.body
    assert job(owner, running)["cancel_requested_at"] is None

    done = _cancel(client, running, actor_field="someone-else")
    body = done.body
    assert "cancel requested for 1 running job(s)" in body
    stored = job(owner, running)
    assert stored["state"] == "running"
    assert stored["cancel_requested_by"] == f"dashboard:{OPERATOR}"  # not the form's
    (event,) = [e for e in events(owner, running) if e["event_type"] == "cancel_requested"]
    assert event["actor"] == f"dashboard:{OPERATOR}"
    assert event["details"]["reason"] == "wrong report"

    shown = client.get(f"/jobs/{running}").body
    assert "cancel requested" in shown
    assert f"by <span class=\"mono\">dashboard:{OPERATOR}</span>" in shown
    assert "Cancel this job" not in shown  # asked already


def test_the_running_list_offers_cancel_to_operators_only(serve: Serve) -> None:
    operator = serve(OPERATOR).client().get("/jobs?state=running").body
    viewer = serve(VIEWER).client().get("/jobs?state=running").body
    assert 'action="/actions/cancel"' in operator
    assert 'action="/actions/cancel"' not in viewer


@pytest.mark.parametrize("principal", [VIEWER, TENANT_VIEWER])
def test_viewers_cannot_cancel_a_running_job(
    serve: Serve, owner: Conn, principal: str
) -> None:
    operator = serve(OPERATOR)
    running = _running(operator, owner)
    client = serve(principal).client()
    client.get("/")
    token = client.cookie("leaseq_csrf")  # a valid token of its own, still refused
    refused = client.post("/actions/cancel", [("csrf", token), ("job", str(running)),
                                              ("back", "/"), ("confirmed", "yes")])
    assert refused.status == 403
    assert job(owner, running)["cancel_requested_at"] is None


@pytest.fixture
def deployed(db: Database, seeded: Seeded) -> Iterator[Served]:
    """The dashboard as deployed: its operator views on the leaseq_dashboard login."""
    source = ConnectionViewSource(lambda: connect(db.dsn(postgres.DASHBOARD)),
                                  lambda: connect(db.reader_dsn))
    app = build(source, policy_for(seeded.tenants[0]), secure_cookies=False)
    server = LocalServer(app, principal=OPERATOR).start()
    yield Served(server.url, server.login_url, OPERATOR, seeded, server)
    server.stop()
    source.close()


def test_the_deployed_dashboard_login_may_request_the_cancel(
    deployed: Served, owner: Conn
) -> None:
    running = _running(deployed, owner)
    done = _cancel(deployed.client(), running)
    assert done.status == 200
    assert job(owner, running)["cancel_requested_by"] == f"dashboard:{OPERATOR}"
    (event,) = [e for e in events(owner, running) if e["event_type"] == "cancel_requested"]
    assert event["details"]["login"] == postgres.DASHBOARD
