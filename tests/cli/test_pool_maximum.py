"""``--max-workers`` of ``leaseq lambda serve`` and ``leaseq demo --fan-out``: the number
becomes the database's own maximum (``app.settings.max_workers``), written as the schema
owner the way a deploy writes ``MaxWorkers``, since the functions' ``LEASEQ_MAX_WORKERS``
can only narrow it."""

from __future__ import annotations

from leaseq_cli.commands.lambda_service import set_pool_maximum
from leaseq_cli.target import Target

from tests.conftest import Database
from tests.support import postgres


def _maximum(db: Database) -> int:
    with db.connect(postgres.OWNER) as conn:
        row = conn.execute("select max_workers from app.settings").fetchone()
    assert row is not None
    return int(row["max_workers"])


def test_max_workers_becomes_the_databases_own_maximum_written_as_its_owner(db: Database) -> None:
    assert set_pool_maximum(Target(db.worker_dsn, db.owner_dsn, None), 9) is None

    assert _maximum(db) == 9


def test_a_login_that_is_not_the_owner_leaves_the_databases_maximum_and_says_so(
    db: Database,
) -> None:
    note = set_pool_maximum(Target(db.worker_dsn, db.worker_dsn, None), 9)

    assert note is not None
    assert note.startswith("the worker pool's maximum stays the database's own")
    assert "--max-workers 9 can only narrow it" in note
    assert _maximum(db) == 4
