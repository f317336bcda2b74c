"""What a tenant reader can and cannot learn about other tenants' volume.

Row-level security hides other tenants' rows; PostgreSQL itself also hides the column
statistics of such a table (pg_stats) and the position of a sequence the reader may not
use. It does not hide table-wide totals (pg_class, pg_stat_user_tables, the size of the
table), the planner's row estimates, or the gaps in the event sequence. The schema owner
cannot revoke those catalogs (they belong to the server's superuser), so sql/README.md
("What a reader can infer") documents them as accepted; these tests pin both halves, so
a change in either shows up here and the documentation can follow.
"""

from __future__ import annotations

import re
import uuid

import pytest

from tests.sql.calls import claim_one, enqueue_many, new_tenant
from tests.support import postgres
from tests.support.postgres import Conn


@pytest.fixture
def tenants(owner: Conn, worker: Conn, reader: Conn) -> tuple[uuid.UUID, uuid.UUID]:
    """The reader's tenant with 5 jobs, a busy other tenant with 400, both analysed."""
    mine, busy = new_tenant(), new_tenant()
    enqueue_many(worker, mine, 5, prefix="mine")
    for batch in range(4):
        enqueue_many(worker, busy, 100, prefix=f"busy-{batch}")
    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (postgres.READER, mine))
    owner.execute("analyze app.jobs")
    owner.execute("analyze app.job_events")
    reader.execute("select set_config('app.tenant_id', %s, false)", (str(mine),))
    return mine, busy


def _estimate(conn: Conn, tenant: uuid.UUID) -> int:
    rows = conn.execute(
        "explain select id from app.jobs where tenant_id = %s::uuid", (str(tenant),)
    ).fetchall()
    match = re.search(r"rows=(\d+)", rows[0]["QUERY PLAN"])
    assert match is not None, rows
    return int(match.group(1))


# Hidden by PostgreSQL ------------------------------------------------------------------------


def test_pg_stats_shows_a_reader_nothing_of_the_queue_tables(
    tenants: tuple[uuid.UUID, uuid.UUID], owner: Conn, reader: Conn
) -> None:
    """The most-common-values lists would name other tenants' ids and their shares."""
    query = ("select tablename, attname from pg_stats where schemaname = 'app'"
             " and tablename in ('jobs', 'job_events') and attname = 'tenant_id'")
    assert len(owner.execute(query).fetchall()) == 2
    assert reader.execute(query).fetchall() == []


def test_a_reader_cannot_read_the_event_sequences_position(
    tenants: tuple[uuid.UUID, uuid.UUID], owner: Conn, reader: Conn
) -> None:
    query = "select last_value from pg_sequences where schemaname = 'app'"
    assert owner.execute(query).fetchall() != [{"last_value": None}]
    assert reader.execute(query).fetchall() == [{"last_value": None}]


# Accepted: table-wide totals and estimates ---------------------------------------------------


def test_a_reader_sees_table_wide_totals_of_every_tenant_together(
    tenants: tuple[uuid.UUID, uuid.UUID], reader: Conn
) -> None:
    row = reader.execute(
        "select c.reltuples, s.n_live_tup, pg_relation_size(c.oid) > 0 as has_size"
        " from pg_class c join pg_stat_user_tables s on s.relid = c.oid"
        " where c.oid = 'app.jobs'::regclass").fetchone()
    assert row == {"reltuples": 405.0, "n_live_tup": 405, "has_size": True}
    assert reader.execute("select count(*) as n from app.jobs").fetchone() == {"n": 5}


def test_a_reader_who_knows_another_tenants_id_can_estimate_its_volume_by_explain(
    tenants: tuple[uuid.UUID, uuid.UUID], reader: Conn
) -> None:
    """The planner uses the column statistics for a leakproof operator such as uuid =,
    even under row-level security; it needs the other tenant's id, which no reader is
    shown (pg_stats above hides the values)."""
    _, busy = tenants
    assert _estimate(reader, busy) > 10 * _estimate(reader, uuid.uuid4())


def test_gaps_in_a_readers_event_sequence_count_other_tenants_events(
    tenants: tuple[uuid.UUID, uuid.UUID], worker: Conn, reader: Conn
) -> None:
    """They add nothing to the totals above (pg_stat_user_tables counts the same rows)."""
    mine, busy = tenants
    claim_one(worker, mine)
    for _ in range(3):
        claim_one(worker, busy)
    claim_one(worker, mine)
    rows = reader.execute(
        "select sequence from app.job_events where event_type = 'claimed' order by sequence"
    ).fetchall()
    first, second = (int(r["sequence"]) for r in rows)
    assert second - first - 1 == 3
