"""The dashboard in a real headless Chromium, against a real database with jobs in every
state: pages render, filters narrow the lists, a redrive from the page changes the job
and writes its event, hostile text shows as text and runs nothing.

Set LEASEQ_TEST_SCREENSHOTS=DIR to keep the screenshots (docs/ holds the ones the
README shows); they are always taken, into the test's temporary directory otherwise.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard import browser
from tests.dashboard.conftest import OPERATOR, TENANT_VIEWER, Served
from tests.dashboard.seed import HOSTILE_ERROR, HOSTILE_KIND, seed_history
from tests.sql.calls import events, job
from tests.support.postgres import Conn

Serve = Callable[[str], Served]


#: The attacker's name resolves to this machine, as after a DNS rebinding.
REBOUND = "attacker.example"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    yield from browser.launch([
        f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",
        # Chromium's own guard against public pages reaching loopback (local network
        # access) is off: the rebinding test measures the dashboard's, which every
        # browser gets, whatever it guards itself.
        "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests,"
        "PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults"])


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1360, "height": 900})
    opened = context.new_page()
    dialogs: list[str] = []
    opened.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    opened.dialogs = dialogs
    yield opened
    context.close()


@pytest.fixture
def shots(tmp_path: Path) -> Callable[[Any, str], Path]:
    target = Path(os.environ.get("LEASEQ_TEST_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)

    def take(page: Any, name: str) -> Path:
        path = target / f"dashboard-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000
        return path

    return take


def test_the_overview_draws_depth_tiles_tables_and_charts(
    serve: Serve, page: Any, worker: Conn, owner: Conn, shots: Callable[[Any, str], Path]
) -> None:
    served = serve(OPERATOR)
    browser.enter(page, served)
    seed_history(worker, owner, [uuid.UUID(int=0xB0B << 96 | i) for i in range(1, 6)])
    page.goto(served.url + "/")
    assert page.title() == "Overview · leaseq"
    row = owner.execute("select count(*) filter (where state = 'dead') as dead,"
                        " count(*) filter (where state = 'running') as running"
                        " from app.jobs").fetchone()
    assert row is not None
    tiles = page.locator(".tile").all_inner_texts()
    assert f"{row['dead']}\ndead" in tiles
    assert any(t.startswith(f"{row['running']}\nrunning") for t in tiles)
    assert any("ready now" in t for t in tiles)
    assert page.locator("figure.chart").count() == 3
    assert page.locator("figure.chart rect.bar.succeeded").count() > 5
    assert page.locator("figure.chart polyline.line.p95").count() == 1
    kinds = page.locator("table.depth-table").first.inner_text()
    assert HOSTILE_KIND in kinds
    assert "report.build" in kinds
    assert page.dialogs == []
    shots(page, "overview")
    page.goto(served.url + "/jobs?state=dead")
    assert page.locator("table.jobs tbody tr").count() > 10
    shots(page, "dead")


def test_the_dead_list_filters_by_tenant_and_kind(serve: Serve, page: Any) -> None:
    served = serve(OPERATOR)
    browser.enter(page, served)
    third = served.seeded.tenants[2]
    page.goto(served.url + "/jobs?state=dead")
    rows = page.locator("table.jobs tbody tr")
    assert rows.count() == 2
    assert HOSTILE_ERROR in page.locator("table.jobs").inner_text()

    page.fill("input[name=tenant]", str(third))
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/jobs?state=dead&tenant=*")
    assert rows.count() == 1
    assert "report source missing" in rows.first.inner_text()

    page.fill("input[name=tenant]", "")
    page.fill("input[name=kind]", HOSTILE_KIND)
    page.click("form.filters button[type=submit]")
    assert rows.count() == 1
    assert HOSTILE_KIND in rows.first.inner_text()
    assert page.dialogs == []


def test_the_running_list_shows_lease_owner_and_the_expired_lease(
    serve: Serve, page: Any
) -> None:
    served = serve(OPERATOR)
    browser.enter(page, served)
    page.goto(served.url + "/jobs?state=running")
    text = page.locator("table.jobs").inner_text()
    assert text.count("seed-worker") == 2
    assert "expired" in text


def test_a_redrive_from_the_job_page_is_confirmed_changes_the_job_and_is_audited(
    serve: Serve, page: Any, owner: Conn, shots: Callable[[Any, str], Path]
) -> None:
    served = serve(OPERATOR)
    browser.enter(page, served)
    dead = served.seeded.jobs["dead"][0]
    page.goto(f"{served.url}/jobs/{dead}")
    assert page.locator("h1 .badge").inner_text() == "dead"
    # The error document is shown as JSON: the hostile message, quotes escaped JSON's way.
    assert json.dumps(HOSTILE_ERROR, ensure_ascii=False) in page.locator("pre.error").inner_text()
    assert "</pre><script>" in page.locator("pre").nth(1).inner_text()
    assert page.locator("dd.priority").inner_text().startswith("5 ")
    assert page.locator("dd.wait").count() == 0  # a dead job waits for nothing
    shots(page, "job")

    page.fill("form.act input[name=reason]", "fixed the template")
    page.click("text=Redrive this job…")
    assert page.locator("h1").inner_text() == "Redrive 1 job?", page.content()
    assert job(owner, dead)["state"] == "dead"  # nothing happens before the confirmation
    shots(page, "confirm")
    page.click("#confirm")

    page.wait_for_url(f"**/jobs/{dead}?done=*")
    assert "redrive: 1 job(s)" in page.locator(".notice").inner_text()
    assert page.locator("h1 .badge").inner_text() == "pending"
    # Pending again and due now: the page says where it stands in its tenant's order.
    assert page.locator("dd.wait").get_attribute("data-reason") in (
        "ready", "queued", "behind_priority")
    timeline = page.locator("table.timeline").inner_text()
    assert "redriven" in timeline
    assert f"dashboard:{OPERATOR}" in timeline
    assert job(owner, dead)["state"] == "pending"
    (event,) = [e for e in events(owner, dead) if e["event_type"] == "redriven"]
    assert event["actor"] == f"dashboard:{OPERATOR}"
    assert event["details"]["reason"] == "fixed the template"
    assert page.dialogs == []


def test_cancel_selected_jobs_from_the_ready_list(
    serve: Serve, page: Any, owner: Conn
) -> None:
    served = serve(OPERATOR)
    browser.enter(page, served)
    chosen, kept, *_ = served.seeded.jobs["pending"]
    page.goto(served.url + "/jobs?state=pending")
    page.check(f"input[name=job][value='{chosen}']")
    page.click("text=Cancel selected…")
    page.click("#confirm")
    page.wait_for_url("**/jobs?state=pending*done=*")
    assert "cancel: 1 job(s)" in page.locator(".notice").inner_text()
    assert str(chosen) not in page.locator("table.jobs").inner_text()
    assert job(owner, chosen)["state"] == "cancelled"
    assert job(owner, kept)["state"] == "pending"


def test_a_tenant_viewer_sees_its_tenant_and_no_action(serve: Serve, page: Any) -> None:
    served = serve(TENANT_VIEWER)
    browser.enter(page, served)
    own_dead, other_dead = served.seeded.jobs["dead"]
    page.goto(served.url + "/jobs?state=dead")
    text = page.locator("table.jobs").inner_text()
    assert str(own_dead) in text
    assert str(other_dead) not in text
    assert page.locator("input[name=job]").count() == 0
    page.goto(f"{served.url}/jobs/{own_dead}")
    assert page.locator("text=Redrive this job…").count() == 0
    assert "tenant" in page.locator(".who").inner_text()


def test_the_key_url_lets_the_browser_in_and_leaves_no_key_in_the_address_or_a_referer(
    serve: Serve, page: Any
) -> None:
    served = serve(OPERATOR)
    key = served.server.door.key
    page.goto(served.url + "/jobs?state=dead")
    assert page.title() == "Locked · leaseq"
    assert "printed in its terminal" in page.locator("body").inner_text()
    assert page.locator("table.jobs").count() == 0

    page.goto(f"{served.url}/jobs?state=dead&key={key}")
    assert page.url == served.url + "/jobs?state=dead"
    assert page.locator("table.jobs tbody tr").count() == 2
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies[served.server.door.cookie_name]
    assert (session["httpOnly"], session["sameSite"], session["path"]) == (True, "Strict", "/")
    assert key not in session["value"]
    sent: list[dict[str, str]] = []
    page.on("request", lambda request: sent.append(request.headers))
    page.locator("table.jobs tbody a").first.click()
    page.wait_for_url("**/jobs/*")
    assert sent
    assert all(key not in value for headers in sent for value in headers.values())
    assert sent[0].get("referer") == served.url + "/jobs?state=dead"


def test_a_dns_rebinding_page_in_the_operators_browser_reads_and_changes_nothing(
    serve: Serve, chromium: Any, owner: Conn
) -> None:
    # The attack as a browser runs it: the attacker's page is served from its own name,
    # which then resolves to 127.0.0.1 (here a resolver rule of Chromium's), so the
    # page's own-origin fetches reach the dashboard, in a browser that has entered it.
    served = serve(OPERATOR)
    port, victim = served.server.door.port, served.seeded.jobs["dead"][1]
    evil = f"http://{REBOUND}:{port}"
    script = f"""
      window.onerror = (m) => {{ document.title = 'error ' + m; }};
      window.onunhandledrejection = (e) => {{ document.title = 'error ' + e.reason; }};
      const out = [];
      for (const url of ['/jobs/{victim}', '/?key={served.server.door.key}']) {{
        const r = await fetch(url);
        out.push(r.status, (await r.text()).includes('{victim}'));
      }}
      const form = new URLSearchParams({{csrf: 'x'.repeat(43), job: '{victim}',
                                        confirmed: 'yes'}});
      document.cookie = 'leaseq_csrf=' + 'x'.repeat(43);
      const p = await fetch('/actions/redrive', {{method: 'POST', body: form}});
      out.push(p.status);
      document.title = JSON.stringify(out);
    """
    context = chromium.new_context()
    try:
        opened = context.new_page()
        browser.enter(opened, served)  # the operator is logged in, in this browser
        opened.route(evil + "/", lambda route: route.fulfill(
            status=200, content_type="text/html",
            body=f"<title>x</title><script type=module>{script}</script>"))
        opened.goto(evil + "/")
        opened.wait_for_function("document.title.startsWith('[') || "
                                 "document.title.startsWith('error')", timeout=20_000)
        assert opened.title().startswith("["), opened.title()
        assert json.loads(opened.title()) == [421, False, 421, False, 421]
    finally:
        context.close()
    assert job(owner, victim)["state"] == "dead"
    assert "redriven" not in [e["event_type"] for e in events(owner, victim)]


def test_the_schedules_page_lists_next_slots_and_opens_the_last_job(
    serve: Serve, page: Any, owner: Conn, reaper_tick: Callable[[], None],
    shots: Callable[[Any, str], Path],
) -> None:
    served = serve(OPERATOR)
    tenant = served.seeded.tenants[0]
    for name, expression in (("nightly-report", "30 2 * * *"), ("minutely", "* * * * *")):
        owner.execute("select * from app.put_schedule(%s, %s, 'report.build', %s,"
                      " 'Europe/Berlin')", (tenant, name, expression))
    owner.execute("update app.schedules set next_slot = date_trunc('minute', now())"
                  " where name = 'minutely'")
    reaper_tick()
    owner.execute("select * from app.pause_schedule(%s, 'nightly-report')", (tenant,))
    browser.enter(page, served)
    page.click("header nav >> text=Schedules")
    assert page.title() == "Schedules · leaseq"
    rows = page.locator("table.schedules tbody tr")
    assert rows.count() == 2
    texts = rows.all_inner_texts()
    minutely = next(t for t in texts if "minutely" in t)
    assert "* * * * *" in minutely
    assert "Europe/Berlin" in minutely
    assert "pending" in minutely
    assert "paused" in next(t for t in texts if "nightly-report" in t)
    assert page.locator("table.schedules tr.active td.next-slots span").count() == 3
    shots(page, "schedules")
    page.locator("table.schedules tr.active td.last-job a").click()
    assert page.locator("text=report.build").count() >= 1
    assert "/jobs/" in page.url
    assert page.dialogs == []
