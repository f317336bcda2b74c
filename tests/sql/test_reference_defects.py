"""Defects of the reference schema that no thematic file owns, and the index of all 19.

Each of the 19 defects listed with the reference schema has a test whose docstring
starts "Reference defect N"; most live with the function they concern
(``grep -rn "Reference defect" tests/``). The owner here is an ordinary role, as on
RDS: no SUPERUSER, no BYPASSRLS.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from psycopg.types.json import Jsonb

from tests.sql.calls import (
    WORKER_NAME,
    claim_one,
    enqueue,
    event_types,
    expire_lease,
    job,
    new_tenant,
)
from tests.support.postgres import Conn

TESTS = Path(__file__).resolve().parent.parent


def test_functions_run_by_a_non_superuser_owner_see_and_change_rows(
    worker: Conn, owner: Conn
) -> None:
    """Reference defect 2: under forced RLS the owner's functions saw and changed nothing."""
    tenant = new_tenant()
    enqueue(worker, tenant, "a")
    enqueue(worker, tenant, "b")

    lease = claim_one(worker, tenant)
    renewed = worker.execute(
        "select app.renew_job_lease(%s, %s, %s, %s) as ok",
        (tenant, lease["id"], WORKER_NAME, lease["lease_token"]),
    ).fetchone()
    completed = worker.execute(
        "select app.complete_job(%s, %s, %s, %s, %s) as ok",
        (tenant, lease["id"], WORKER_NAME, lease["lease_token"], Jsonb({})),
    ).fetchone()
    other = claim_one(worker, tenant)
    expire_lease(owner, other["id"])
    released = worker.execute(
        "select app.release_expired_jobs(%s) as n", (tenant,)
    ).fetchone()

    assert renewed == {"ok": True}
    assert completed == {"ok": True}
    assert released == {"n": 1}
    assert job(owner, lease["id"])["state"] == "succeeded"
    assert job(owner, other["id"])["state"] == "retry_wait"


def test_every_transition_writes_its_audit_row_as_a_non_superuser_owner(
    worker: Conn, owner: Conn
) -> None:
    """Reference defect 3: event INSERTs were rejected by RLS."""
    tenant = new_tenant()
    created = enqueue(worker, tenant, "a", max_attempts=2)
    first = claim_one(worker, tenant)
    worker.execute(
        "select app.fail_job(%s, %s, %s, %s, %s, %s)",
        (tenant, first["id"], WORKER_NAME, first["lease_token"], Jsonb({}), timedelta(0)),
    )
    second = claim_one(worker, tenant)
    expire_lease(owner, second["id"])
    worker.execute("select app.release_all_expired_jobs()")

    assert event_types(owner, created["id"]) == [
        "created", "claimed", "retry_scheduled", "claimed", "dead"
    ]


def test_every_reference_defect_has_a_test_named_after_it() -> None:
    """The list of 19 stays covered: each number appears in some test's docstring."""
    text = "\n".join(
        path.read_text(encoding="utf-8")
        for folder in ("sql", "migrations")
        for path in (TESTS / folder).glob("test_*.py")
    )
    found = {int(n) for n in re.findall(r"Reference defect (\d+)\b", text)}
    assert found == set(range(1, 20))
