"""The dashboard over HTTP, as the local command serves it: who sees what, escaping,
CSRF, the operator role, and actions that change jobs and write their events."""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.dashboard.client import Client
from tests.dashboard.conftest import OPERATOR, TENANT_VIEWER, VIEWER, Served
from tests.dashboard.seed import HOSTILE_ERROR, HOSTILE_KIND
from tests.sql.calls import enqueue, events, job
from tests.support.postgres import Conn

Serve = Callable[[str], Served]


def _all_pages(client: Client, served: Served) -> list[str]:
    bodies = [client.get("/").body]
    for state in ("pending", "running", "retry_wait", "succeeded", "dead", "cancelled"):
        bodies.append(client.get(f"/jobs?state={state}").body)
    for ids in served.seeded.jobs.values():
        bodies.extend(client.get(f"/jobs/{i}").body for i in ids)
    return bodies


def test_every_page_renders_for_an_operator_with_the_counts(serve: Serve) -> None:
    served = serve(OPERATOR)
    client = served.client()
    page = client.get("/")
    assert page.status == 200
    assert "dead" in page.body
    assert "oldest ready job waiting" in page.body
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert "<svg" in page.body
    assert "<script" not in page.body.lower()
    for state, ids in served.seeded.jobs.items():
        listed = client.get(f"/jobs?state={state}")
        assert listed.status == 200
        for job_id in ids:
            assert str(job_id) in listed.body, (state, job_id)


def test_hostile_kinds_payloads_and_errors_are_escaped_everywhere(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    client = served.client()
    bodies = _all_pages(client, served)
    joined = "\n".join(bodies)
    assert "<script" not in joined.lower()
    assert "&lt;script&gt;alert(&#39;kind&#39;)&lt;/script&gt;" in joined
    assert "&lt;/td&gt;&lt;script&gt;alert(&#39;error&#39;)" in joined
    assert "ünïcødé 💥" in joined
    assert "日本語" in joined
    assert HOSTILE_KIND not in joined
    assert HOSTILE_ERROR not in joined


def test_no_page_ever_shows_a_lease_token(serve: Serve, owner: Conn) -> None:
    served = serve(OPERATOR)
    tokens = [str(r["lease_token"]) for r in owner.execute(
        "select lease_token from app.leases union"
        " select lease_token from app.job_events where lease_token is not null").fetchall()]
    assert tokens
    joined = "\n".join(_all_pages(served.client(), served))
    assert [t for t in tokens if t in joined] == []


def test_a_tenant_viewer_sees_only_its_tenant(serve: Serve) -> None:
    served = serve(TENANT_VIEWER)
    mine, _, other = served.seeded.tenants
    client = served.client()
    dead = client.get("/jobs?state=dead").body
    own_dead, other_dead = served.seeded.jobs["dead"]
    assert str(own_dead) in dead
    assert str(other_dead) not in dead
    # Asking for another tenant by filter shows nothing: RLS filters, not the page.
    assert str(other_dead) not in client.get(f"/jobs?state=dead&tenant={other}").body
    assert client.get(f"/jobs/{other_dead}").status == 404
    overview = client.get("/").body
    assert str(mine) in overview
    assert str(other) not in overview


def test_an_unknown_principal_is_refused_and_told_how_to_get_access(serve: Serve) -> None:
    served = serve("arn:aws:iam::999999999999:user/mallory")
    page = served.client().get("/")
    assert page.status == 403
    assert "DashboardOperators" in page.body
    assert "mallory" in page.body


def test_a_redrive_needs_confirmation_then_changes_the_job_and_audits_the_operator(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    client = served.client()
    dead = served.seeded.jobs["dead"][0]
    token = client.get(f"/jobs/{dead}").csrf()
    fields = [("csrf", token), ("job", str(dead)), ("back", f"/jobs/{dead}"),
              ("reason", "fixed the <template>")]

    confirm = client.post("/actions/redrive", fields)
    assert confirm.status == 200
    assert "Yes, redrive 1 job" in confirm.body
    assert job(owner, dead)["state"] == "dead"

    done = client.post("/actions/redrive", [*fields, ("confirmed", "yes")])
    assert done.status == 200
    assert "redrive: 1 job(s)" in done.body
    assert job(owner, dead)["state"] == "pending"
    (event,) = [e for e in events(owner, dead) if e["event_type"] == "redriven"]
    assert event["actor"] == f"dashboard:{OPERATOR}"
    assert event["details"]["reason"] == "fixed the <template>"


def test_a_cancel_from_the_list_cancels_only_the_selected_pending_jobs(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    client = served.client()
    first, second, *_ = served.seeded.jobs["pending"]
    token = client.get("/jobs?state=pending").csrf()
    fields = [("csrf", token), ("job", str(first)), ("back", "/jobs?state=pending"),
              ("confirmed", "yes")]
    assert client.post("/actions/cancel", fields).status == 200
    assert job(owner, first)["state"] == "cancelled"
    assert job(owner, second)["state"] == "pending"
    (event,) = [e for e in events(owner, first) if e["event_type"] == "cancelled"]
    assert event["actor"] == f"dashboard:{OPERATOR}"


def test_actions_without_the_csrf_token_or_from_another_origin_change_nothing(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    client = served.client()
    dead = served.seeded.jobs["dead"][0]
    token = client.get(f"/jobs/{dead}").csrf()
    base = [("job", str(dead)), ("confirmed", "yes")]

    assert client.post("/actions/redrive", base).status == 403
    assert client.post("/actions/redrive", [*base, ("csrf", "x" * 43)]).status == 403
    fresh = served.client()  # another browser: no cookie, a stolen token
    assert fresh.post("/actions/redrive", [*base, ("csrf", token)]).status == 403
    cross = client.post("/actions/redrive", [*base, ("csrf", token)],
                        headers={"Origin": "http://evil.example"})
    assert cross.status == 403
    assert "cross-origin" in cross.body
    site = client.post("/actions/redrive", [*base, ("csrf", token)],
                       headers={"Sec-Fetch-Site": "cross-site"})
    assert site.status == 403
    assert job(owner, dead)["state"] == "dead"
    assert "redriven" not in [e["event_type"] for e in events(owner, dead)]


def test_viewers_and_tenant_viewers_may_not_act(serve: Serve, owner: Conn) -> None:
    dead = None
    for principal in (VIEWER, TENANT_VIEWER):
        served = serve(principal)
        dead = served.seeded.jobs["dead"][0]
        client = served.client()
        page = client.get(f"/jobs/{dead}")
        assert "Redrive this job" not in page.body
        assert 'name="csrf"' not in page.body
        # Even with a valid token (from its own cookie) the action is refused.
        refused = client.post("/actions/redrive", [
            ("csrf", client.cookie("leaseq_csrf")), ("job", str(dead)), ("confirmed", "yes")])
        assert refused.status == 403
        assert "only operators" in refused.body
    assert dead is not None
    assert job(owner, dead)["state"] == "dead"


def test_bad_filters_are_answered_with_400_and_the_reason(serve: Serve) -> None:
    client = serve(OPERATOR).client()
    for path, message in [
        ("/jobs?state=lost", "state must be one of"),
        ("/jobs?state=dead&tenant=nope", "tenant must be a UUID"),
        ("/jobs?state=dead&since=yesterday", "since must be a time"),
        ("/jobs?state=dead&kind=" + "k" * 200, "p_kind must be"),
        ("/?window=1y", "window must be one of"),
    ]:
        page = client.get(path)
        assert page.status == 400, path
        assert message in page.body, path


def test_keyset_pages_walk_a_long_list_without_repeats(
    serve: Serve, worker: Conn, owner: Conn
) -> None:
    served = serve(OPERATOR)
    tenant = served.seeded.tenants[1]
    worker.execute("select * from app.enqueue_jobs(%s, %s, %s, %s)", (
        [tenant] * 120, [f"bulk-{i}" for i in range(120)], ["bulk"] * 120,
        [__import__("psycopg").types.json.Jsonb({"i": i}) for i in range(120)]))
    client = served.client()
    seen: list[str] = []
    path: str | None = "/jobs?state=pending&kind=bulk"
    while path:
        body = client.get(path).body
        seen += re.findall(r'<td class="mono"><a href="/jobs/([0-9a-f-]{36})">', body)
        found = re.search(r'href="([^"]+)" rel="next"', body)
        path = found.group(1).replace("&amp;", "&") if found else None
    assert len(seen) == 120 == len(set(seen))


def test_the_job_page_shows_the_priority_and_why_a_pending_job_waits(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    tenant = served.seeded.tenants[0]
    urgent = enqueue(owner, tenant, "page-urgent")["id"]
    owner.execute("update app.jobs set priority = 9 where id = %s", (urgent,))
    normal = enqueue(owner, tenant, "page-normal")["id"]
    client = served.client()

    page = " ".join(client.get(f"/jobs/{normal}").body.split())
    assert '<dd class="priority">5 ' in page
    assert 'data-reason="behind_priority"' in page
    assert "behind higher-priority work:" in page
    assert "of higher priority" in page
    assert '<dd class="priority">9 ' in client.get(f"/jobs/{urgent}").body
    dead = served.seeded.jobs["dead"][0]
    assert 'class="wait"' not in client.get(f"/jobs/{dead}").body


def test_a_tenant_viewer_sees_why_its_own_job_waits(serve: Serve, owner: Conn) -> None:
    served = serve(TENANT_VIEWER)
    mine = served.seeded.tenants[0]
    later = owner.execute("select clock_timestamp() + interval '2 hours' as t").fetchone()
    assert later is not None
    scheduled = enqueue(owner, mine, "viewer-later", available_at=later["t"])["id"]

    page = served.client().get(f"/jobs/{scheduled}").body

    assert 'data-reason="scheduled"' in page
    assert "not yet due, until" in page


def _schedule(owner: Conn, tenant: str, name: str, expression: str) -> None:
    owner.execute("select * from app.put_schedule(%s, %s, 'report.build', %s, 'Europe/Berlin')",
                  (tenant, name, expression))


def test_the_schedules_page_shows_next_slots_the_last_slot_and_its_job(
    serve: Serve, owner: Conn, reaper_tick: Callable[[], None]
) -> None:
    served = serve(OPERATOR)
    tenant = str(served.seeded.tenants[0])
    _schedule(owner, tenant, "<b>nightly</b>", "30 2 * * *")
    _schedule(owner, tenant, "minutely", "* * * * *")
    owner.execute("update app.schedules set next_slot = date_trunc('minute', now())"
                  " where name = 'minutely'")
    reaper_tick()
    (last_job,) = [r["last_job_id"] for r in owner.execute(
        "select last_job_id from app.schedules where name = 'minutely'").fetchall()]
    page = served.client().get("/schedules")
    assert page.status == 200
    assert "&lt;b&gt;nightly&lt;/b&gt;" in page.body
    assert "<b>nightly</b>" not in page.body
    assert "30 2 * * *" in page.body
    assert f'href="/jobs/{last_job}"' in page.body
    assert page.body.count("next-slots") == 2
    assert 'href="/schedules"' in served.client().get("/").body


def test_a_tenant_viewer_is_shown_no_schedules(serve: Serve, owner: Conn) -> None:
    served = serve(TENANT_VIEWER)
    _schedule(owner, str(served.seeded.tenants[0]), "nightly", "30 2 * * *")
    page = served.client().get("/schedules")
    assert page.status == 200
    assert "nightly" not in page.body
    assert "Schedules are shown to operators" in page.body


def test_the_overview_shows_each_limit_in_use_and_a_held_jobs_page_names_its_limit(
        serve: Serve, owner: Conn, worker: Conn) -> None:
    served = serve(OPERATOR)
    tenant = served.seeded.tenants[1]
    owner.execute("select app.set_limit('ops', 'kind_tenant', 'report.build', null, null, 1)")
    first = enqueue(worker, tenant, "limited-1", kind="report.build")
    held = enqueue(worker, tenant, "limited-2", kind="report.build")
    assert first["available_at"] <= held["available_at"]
    page = served.client().get("/")
    assert page.status == 200
    assert "Limits" in page.body
    assert f"kind:report.build/tenant:{tenant}" in page.body
    shown = served.client().get(f"/jobs/{held['id']}")
    assert shown.status == 200
    assert f"held by a limit kind:report.build/tenant:{tenant}" in shown.body
    viewer = serve(TENANT_VIEWER).client().get("/")
    assert "kind:report.build" not in viewer.body
