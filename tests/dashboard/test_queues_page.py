"""The dashboard's queues page: every queue's depth, workers and pause, and for operators
a pause and a resume, CSRF-checked and audited with their identity."""

from __future__ import annotations

from collections.abc import Callable

from tests.dashboard.conftest import OPERATOR, TENANT_VIEWER, VIEWER, Served
from tests.support.postgres import Conn


def queue_row(owner: Conn, name: str) -> dict[str, object] | None:
    return owner.execute("select * from app.queues where name = %s", (name,)).fetchone()


def test_an_operator_pauses_and_resumes_a_queue_from_the_page_audited_as_themself(
        serve: Callable[[str], Served], owner: Conn) -> None:
    served = serve(OPERATOR)
    client = served.client()
    page = client.get("/queues")
    assert page.status == 200
    assert "default" in page.body
    token = page.csrf()
    done = client.post("/queues/default/pause", [("csrf", token), ("reason", "<incident>")])
    assert done.status == 200
    assert "paused queue default" in done.body
    assert "&lt;incident&gt;" in done.body
    row = queue_row(owner, "default")
    assert row is not None
    assert row["paused_by"] == f"dashboard:{OPERATOR}"
    client.post("/queues/default/resume", [("csrf", token)])
    row = queue_row(owner, "default")
    assert row is not None
    assert row["paused_at"] is None
    events = owner.execute("select event_type, actor from app.queue_events"
                           " order by created_at").fetchall()
    assert [e["event_type"] for e in events] == ["paused", "resumed"]


def test_a_pause_without_the_csrf_token_or_by_a_viewer_changes_nothing(
        serve: Callable[[str], Served], owner: Conn) -> None:
    operator = serve(OPERATOR).client()
    assert operator.post("/queues/default/pause", []).status == 403
    viewer = serve(VIEWER).client()
    page = viewer.get("/queues")
    assert 'action="/queues/default/pause"' not in page.body
    # Even with a valid token (from its own cookie) the pause is refused.
    refused = viewer.post("/queues/default/pause", [("csrf", viewer.cookie("leaseq_csrf"))])
    assert refused.status == 403
    assert "only operators" in refused.body
    row = queue_row(owner, "default")
    assert row is not None
    assert row["paused_at"] is None


def test_a_tenant_viewer_is_shown_no_queues(serve: Callable[[str], Served]) -> None:
    page = serve(TENANT_VIEWER).client().get("/queues")
    assert page.status == 200
    assert "shown to operators" in page.body
