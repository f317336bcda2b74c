"""Two tenant viewers, each served over their own tenant's reader login: the database
keeps them apart, whatever the page asks for.

The deployed dashboard's view source (:class:`leaseq_dashboard.sources.DashboardViewSource`)
opens one reader login per tenant. These tests ask it, and the logins themselves, for the
other tenant on purpose, the way a page bug or a hostile request would.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit
from uuid import UUID

import pytest
from leaseq import connect
from leaseq.read.views import JobFilter, TenantViews
from leaseq_dashboard import AccessPolicy, build, handle
from leaseq_dashboard.origin import FunctionUrlOrigin
from leaseq_dashboard.sources import DashboardViewSource, reader_login

from tests.conftest import Database
from tests.dashboard.readers import tenant_reader_logins
from tests.dashboard.seed import Seeded, seed
from tests.infra.template_support import ROOT
from tests.support import postgres
from tests.support.postgres import Conn

VIEWER_A = "arn:aws:iam::123456789012:user/acme"
VIEWER_C = "arn:aws:iam::123456789012:user/cyberdyne"


@pytest.fixture
def seeded(db: Database, worker: Conn, owner: Conn) -> Seeded:
    return seed(worker, owner)


@pytest.fixture
def logins(db: Database, seeded: Seeded) -> Iterator[dict[UUID, str]]:
    """Reader logins of the first and the third tenant (each has one dead job)."""
    with tenant_reader_logins(db, [seeded.tenants[0], seeded.tenants[2]]) as made:
        yield made


@pytest.fixture
def source(db: Database, logins: dict[UUID, str]) -> Iterator[DashboardViewSource]:
    made = DashboardViewSource(lambda: connect(db.dsn(postgres.DASHBOARD)),
                               lambda tenant: connect(db.dsn(reader_login(tenant))),
                               max_readers=1)
    yield made
    made.close()


def _request(target: str, principal: str) -> dict[str, Any]:
    """A GET through the function URL, as Lambda delivers it (events/dashboard.json)."""
    event: dict[str, Any] = copy.deepcopy(json.loads(
        (ROOT / "events" / "dashboard.json").read_text(encoding="utf-8")))
    parts = urlsplit(target)
    query = dict(parse_qsl(parts.query))
    event["rawPath"] = event["requestContext"]["http"]["path"] = parts.path
    event["rawQueryString"], event["queryStringParameters"] = parts.query, query or None
    event["requestContext"]["authorizer"]["iam"]["userArn"] = principal
    return event


def _dead(views: TenantViews) -> set[UUID]:
    return {row["id"] for row in views.list_jobs(JobFilter("dead"))}


def test_each_tenant_viewer_reads_only_its_own_tenant_through_its_own_login(
    source: DashboardViewSource, seeded: Seeded,
) -> None:
    a, c = seeded.tenants[0], seeded.tenants[2]
    dead_a, dead_c = seeded.jobs["dead"]

    assert _dead(source.tenant(a)) == {dead_a}
    assert _dead(source.tenant(c)) == {dead_c}
    depth = source.tenant(a).queue_depth()
    assert {r["tenant_id"] for r in depth if r["dimension"] == "tenant"} == {a}


def test_a_view_asked_for_tenant_c_over_tenant_as_connection_gets_nothing(
    source: DashboardViewSource, seeded: Seeded,
) -> None:
    """A page bug that pairs A's reader connection with C's tenant id."""
    a, c = seeded.tenants[0], seeded.tenants[2]
    dead_c = seeded.jobs["dead"][1]
    a_connection = source.tenant(a).client

    confused = TenantViews(a_connection, c)

    assert _dead(confused) == set()
    assert confused.get_job(dead_c) is None
    assert confused.job_timeline(dead_c) == []
    assert [r for r in confused.queue_depth() if r["dimension"] == "tenant"] == []
    assert confused.list_jobs(JobFilter("dead", tenant_id=c)) == []


def test_setting_app_tenant_id_to_another_tenant_on_a_readers_login_yields_no_rows(
    db: Database, logins: dict[UUID, str], seeded: Seeded,
) -> None:
    a, c = seeded.tenants[0], seeded.tenants[2]
    with db.connect(logins[a]) as conn:
        conn.execute("select set_config('app.tenant_id', %s, false)", (str(c),))
        jobs = conn.execute("select id from app.jobs").fetchall()
        events = conn.execute("select job_id from app.job_events").fetchall()
        listed = conn.execute("select id from app.reader_list_jobs('dead', null, null, null,"
                              " null, null, null, 50)").fetchall()
        bindings = conn.execute("select tenant_id from app.tenant_readers").fetchall()
        # The same login, set to its own tenant, does read: the rows are there.
        conn.execute("select set_config('app.tenant_id', %s, false)", (str(a),))
        own = conn.execute("select count(*) as n from app.jobs").fetchone()

    assert (jobs, events, listed) == ([], [], [])
    assert bindings == [{"tenant_id": a}]
    assert own is not None
    assert own["n"] > 0


def test_one_environment_keeps_at_most_its_reader_connections_open(
    db: Database, source: DashboardViewSource, seeded: Seeded, owner: Conn,
) -> None:
    a, c = seeded.tenants[0], seeded.tenants[2]

    source.tenant(a).queue_depth()
    source.tenant(c).queue_depth()
    open_readers = owner.execute(
        "select usename from pg_stat_activity where datname = current_database()"
        " and usename like %s", ("leaseq\\_tenant\\_reader\\_%",)).fetchall()

    assert source.reader_tenants == (c,)
    assert [r["usename"] for r in open_readers] == [reader_login(c)]
    assert _dead(source.tenant(a)) == {seeded.jobs["dead"][0]}  # reopened on demand
    assert source.reader_tenants == (a,)


def test_a_tenant_viewer_asking_the_pages_for_another_tenant_sees_nothing_of_it(
    source: DashboardViewSource, seeded: Seeded,
) -> None:
    a, c = seeded.tenants[0], seeded.tenants[2]
    dead_a, dead_c = seeded.jobs["dead"]
    policy = AccessPolicy(tenant_viewers={VIEWER_A: a, VIEWER_C: c})
    app = build(source, policy, identify=FunctionUrlOrigin("us-east-1").principal)

    def page(target: str) -> dict[str, Any]:
        return handle(app, _request(target, VIEWER_A), None)

    own, asked_for_c, overview_of_c, page_of_c = (
        page("/jobs?state=dead"), page(f"/jobs?state=dead&tenant={c}"), page(f"/?tenant={c}"),
        page(f"/jobs/{dead_c}"))

    assert str(dead_a) in own["body"]
    for answer in (own, asked_for_c, overview_of_c):
        assert answer["statusCode"] == 200
        assert str(dead_c) not in answer["body"]
        assert "report.build" not in answer["body"]  # the kind only C's jobs have
    assert page_of_c["statusCode"] == 404
    assert "report source missing" not in page_of_c["body"]


def test_the_dashboards_views_are_handed_the_operators_and_the_readers_faces_only(
    source: DashboardViewSource, seeded: Seeded,
) -> None:
    """A view that held the all-duties client could reach calls its login is not granted
    (a reaper's prune, a worker's claim); a face offers only its duty's."""
    operator, reader = source.operator().client, source.tenant(seeded.tenants[0]).client

    assert (type(operator).__name__, type(reader).__name__) == ("OperatorClient", "ReaderClient")
    assert not hasattr(operator, "prune_retained_jobs")
    assert not hasattr(operator, "claim_jobs")
    assert not hasattr(reader, "list_jobs")
