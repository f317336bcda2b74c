"""The migration runner, against real databases owned by a non-superuser role."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from leaseq.base.errors import (
    DatabaseError,
    MigrationBlockedError,
    PermissionDeniedError,
    SchemaVersionError,
)
from leaseq.store.db import connect
from leaseq.store.migrate import (
    MIGRATION_LOCK_KEY,
    FunctionFile,
    Migration,
    MigrationReport,
    load_functions,
    load_migrations,
    migrate,
    pending,
)
from psycopg import sql

from tests.conftest import Database
from tests.support import postgres
from tests.support.postgres import Cluster, Conn

ALL = load_migrations()
VERSIONS = tuple(m.version for m in ALL)
FUNCTIONS = load_functions()
FUNCTION_FILES = tuple(f.file for f in FUNCTIONS)


def _recorded(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(
        "select version, name, checksum, applied_at, applied_by from app.schema_migrations"
        " order by version"
    ).fetchall()


def _catalog(conn: Conn) -> dict[str, Any]:
    """What a migration can change: functions, relations, privileges, policies."""
    functions = conn.execute(
        "select oid::regprocedure::text as f, md5(prosrc) as src, proacl::text as acl"
        " from pg_proc where pronamespace = 'app'::regnamespace order by 1"
    ).fetchall()
    relations = conn.execute(
        "select relname, relkind, relacl::text as acl, relrowsecurity, relforcerowsecurity"
        " from pg_class where relnamespace = 'app'::regnamespace order by relname"
    ).fetchall()
    policies = conn.execute(
        "select tablename, policyname, qual from pg_policies where schemaname = 'app' order by 1, 2"
    ).fetchall()
    return {"functions": functions, "relations": relations, "policies": policies}


@pytest.fixture
def fresh(fresh_database: Callable[[], Database], migrated_database: Database) -> Database:
    """An empty database owned by the owner role; the group roles already exist."""
    return fresh_database()


def test_fresh_database_gets_every_migration_in_order_with_its_checksum(fresh: Database) -> None:
    with connect(fresh.owner_dsn) as conn:
        report = migrate(conn)
        rows = _recorded(conn)

    assert report == MigrationReport(
        applied=VERSIONS, current_version=VERSIONS[-1], functions_applied=FUNCTION_FILES
    )
    assert [(r["version"], r["name"], r["checksum"]) for r in rows] == [
        (m.version, m.name, m.checksum) for m in ALL
    ]
    assert {r["applied_by"] for r in rows} == {postgres.OWNER}
    applied_at = [r["applied_at"] for r in rows]
    assert applied_at == sorted(applied_at)


def test_migrations_are_numbered_without_gaps_and_named_like_their_files() -> None:
    assert tuple(range(1, len(ALL) + 1)) == VERSIONS
    assert len(ALL) >= 4
    assert [m.name for m in ALL[:4]] == [
        "baseline_schema", "integrity_fixes", "queue_functions", "roles_and_privileges"
    ]


def test_rerun_is_a_no_op(fresh: Database) -> None:
    """Reference defect 19: the script could not be re-run ("job_state" already exists)."""
    with connect(fresh.owner_dsn) as conn:
        migrate(conn)
        before = (_recorded(conn), _catalog(conn))

        report = migrate(conn)

        assert report == MigrationReport(applied=(), current_version=VERSIONS[-1])
        assert (_recorded(conn), _catalog(conn)) == before
        assert pending(conn) == []


def test_only_pending_migrations_are_applied(fresh: Database) -> None:
    with connect(fresh.owner_dsn) as conn:
        assert migrate(conn, ALL[:2], []).applied == (1, 2)
        todo = pending(conn)
        assert [m.version for m in todo if isinstance(m, Migration)] == list(VERSIONS[2:])
        assert [f.file for f in todo if isinstance(f, FunctionFile)] == list(FUNCTION_FILES)
        assert migrate(conn).applied == VERSIONS[2:]


def test_changed_file_of_an_applied_migration_is_refused(fresh: Database) -> None:
    with connect(fresh.owner_dsn) as conn:
        # Without the function files: this release's need its migrations (a changed
        # return type is dropped by one).
        migrate(conn, ALL[:3], [])
        edited = [replace(m, sql=m.sql + "\n-- edited\n") if m.version == 2 else m for m in ALL]

        with pytest.raises(SchemaVersionError, match=r"0002_integrity_fixes\.sql changed after"):
            migrate(conn, edited)

        assert [r["version"] for r in _recorded(conn)] == [1, 2, 3]


def test_database_newer_than_the_code_is_refused(fresh: Database) -> None:
    with connect(fresh.owner_dsn) as conn:
        migrate(conn)
        before = _recorded(conn)

        with pytest.raises(SchemaVersionError, match=rf"migrations \[{VERSIONS[-1]}\] that this"):
            migrate(conn, ALL[:-1])
        with pytest.raises(SchemaVersionError, match="does not know"):
            pending(conn, ALL[:-1])

        assert _recorded(conn) == before


def test_each_migration_commits_alone_and_a_failing_one_leaves_no_trace(fresh: Database) -> None:
    """Reference defect 1: a failing run left a half-made schema behind."""
    broken = Migration(
        len(ALL) + 1,
        "broken",
        "create table app.half_done (id integer);\nselect 1 / 0;\n",
    )
    with connect(fresh.owner_dsn) as conn:
        with pytest.raises(DatabaseError, match="division by zero"):
            migrate(conn, [*ALL, broken])

        assert [r["version"] for r in _recorded(conn)] == list(VERSIONS)
        missing = conn.execute("select to_regclass('app.half_done') is null as gone").fetchone()
        assert missing == {"gone": True}


def test_two_concurrent_deploys_both_succeed_and_apply_each_migration_once(
    fresh: Database,
) -> None:
    barrier = threading.Barrier(2)
    reports: list[MigrationReport] = []
    errors: list[BaseException] = []

    def deploy() -> None:
        try:
            with connect(fresh.owner_dsn) as conn:
                barrier.wait(timeout=10)
                reports.append(migrate(conn))
        except BaseException as exc:  # collected and re-raised by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=deploy) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert errors == []
    assert len(reports) == 2
    applied = [v for r in reports for v in r.applied]
    assert sorted(applied) == list(VERSIONS)
    assert {r.current_version for r in reports} == {VERSIONS[-1]}
    with fresh.connect(postgres.OWNER) as conn:
        assert [r["version"] for r in _recorded(conn)] == list(VERSIONS)


def test_migrate_waits_for_the_lock_held_by_another_deploy(fresh: Database) -> None:
    done = threading.Event()
    failures: list[BaseException] = []

    def deploy() -> None:
        try:
            with connect(fresh.owner_dsn, application_name="leaseq-lock-test") as conn:
                migrate(conn)
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    with fresh.connect(None) as holder, fresh.connect(None) as observer:
        with holder.transaction():
            holder.execute("select pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            thread = threading.Thread(target=deploy)
            thread.start()
            waiting = _wait_for_lock_waiter(observer)
            assert waiting, "migrate() did not queue on the migration lock"
            assert not done.is_set()
            nothing = observer.execute(
                "select to_regclass('app.schema_migrations') is null as none"
            ).fetchone()
            assert nothing == {"none": True}
        thread.join(timeout=60)

    assert failures == []
    with fresh.connect(postgres.OWNER) as conn:
        assert [r["version"] for r in _recorded(conn)] == list(VERSIONS)


def _wait_for_lock_waiter(observer: Conn, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = observer.execute(
            """
            select count(*) as n
            from pg_locks l join pg_stat_activity a on a.pid = l.pid
            where l.locktype = 'advisory' and not l.granted
              and a.application_name = 'leaseq-lock-test'
            """
        ).fetchone()
        if row is not None and row["n"] > 0:
            return True
        time.sleep(0.05)
    return False


def test_load_migrations_refuses_a_gap_and_ignores_other_files(tmp_path: Path) -> None:
    (tmp_path / "0001_first.sql").write_text("select 1;\n")
    (tmp_path / "README.md").write_text("notes\n")
    assert [m.version for m in load_migrations(tmp_path)] == [1]
    (tmp_path / "0003_third.sql").write_text("select 3;\n")
    with pytest.raises(SchemaVersionError, match=r"without gaps; found \[1, 3\]"):
        load_migrations(tmp_path)


# Roles ------------------------------------------------------------------------------------


@pytest.fixture
def plain_owner_dsn(cluster: Cluster, migrated_database: Database) -> Iterator[str]:
    """A database owned by a role without CREATEROLE. The group roles already exist, but
    service_role, which 0004 and 0010 need, is gone from the cluster once a database has
    dropped it: an administrator makes it as sql/README.md says."""
    role = f"leaseq_test_plain_{uuid.uuid4().hex[:8]}"
    name = f"leaseq_plain_{uuid.uuid4().hex[:8]}"
    postgres.drop_service_role(cluster)
    with cluster.connect() as admin:
        admin.execute("create role service_role nologin")
        admin.execute("grant leaseq_producer, leaseq_worker, leaseq_reaper, leaseq_operator"
                      " to service_role")
        admin.execute(
            sql.SQL("create role {} login nosuperuser nocreaterole nobypassrls").format(
                sql.Identifier(role)
            )
        )
    postgres.create_database(cluster, name, owner=role)
    try:
        yield cluster.dsn(user=role, dbname=name)
    finally:
        postgres.drop_database(cluster, name)
        with cluster.connect() as admin:
            admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))
        postgres.drop_service_role(cluster)


def test_owner_without_createrole_migrates_when_the_group_roles_exist(
    plain_owner_dsn: str,
) -> None:
    with connect(plain_owner_dsn) as conn:
        report = migrate(conn)
        me = conn.execute(
            "select rolcreaterole, rolsuper from pg_roles where rolname = current_user"
        ).fetchone()
        # It may not drop service_role (an administrator made it): the role stays for an
        # administrator to drop, and this database grants it nothing.
        legacy = conn.execute(
            "select count(*) as n from pg_roles where rolname = 'service_role'").fetchone()
        grants = conn.execute(
            "select count(*) as n from pg_proc p, aclexplode(p.proacl) a"
            " where p.pronamespace = 'app'::regnamespace"
            " and a.grantee = 'service_role'::regrole").fetchone()
    assert me == {"rolcreaterole": False, "rolsuper": False}
    assert report.applied == VERSIONS
    assert (legacy, grants) == ({"n": 1}, {"n": 0})


@pytest.fixture
def private_cluster() -> Iterator[Cluster]:
    """A throwaway server where the group roles do not exist yet.

    Roles are cluster-wide, so their absence can only be arranged on a server no other
    test shares: an embedded one, started here. Against an external server
    (LEASEQ_TEST_DSN) this path is covered by the embedded run instead.
    """
    if os.environ.get("LEASEQ_TEST_DSN") or os.environ.get("LEASEQ_TEST_PG_IMAGE"):
        pytest.skip("needs a private server to remove the cluster-wide group roles; "
                    "covered by the embedded-server run")
    with postgres.start_cluster() as cluster:
        yield cluster


def test_migrate_creates_the_nologin_group_roles_when_absent(private_cluster: Cluster) -> None:
    """Reference defect 1: the first GRANT failed where the group roles did not exist."""
    with private_cluster.connect() as admin:
        absent = admin.execute(
            "select count(*) as n from pg_roles where rolname in ('service_role', 'authenticated')"
        ).fetchone()
        assert absent == {"n": 0}
        admin.execute(
            sql.SQL("create role {} login nosuperuser createrole nobypassrls").format(
                sql.Identifier(postgres.OWNER)
            )
        )
        admin.execute(
            sql.SQL("create role {} login nosuperuser nocreaterole nobypassrls").format(
                sql.Identifier("leaseq_plain_owner")
            )
        )
    postgres.create_database(private_cluster, "plain", owner="leaseq_plain_owner")
    postgres.create_database(private_cluster, "queue", owner=postgres.OWNER)

    # Without CREATEROLE the roles cannot be made: a clear refusal, and the roles
    # migration is not left half-applied (defect 1 of the reference).
    plain = private_cluster.dsn(user="leaseq_plain_owner", dbname="plain")
    with connect(plain) as conn:
        with pytest.raises(PermissionDeniedError) as refused:
            migrate(conn)
        assert refused.value.sqlstate == "42501"
        assert "cannot create the group roles service_role and authenticated" in str(
            refused.value
        )
        assert "CREATE ROLE service_role NOLOGIN" in str(refused.value)
        recorded = conn.execute("select max(version) as v from app.schema_migrations").fetchone()
        assert recorded == {"v": 3}
        assert conn.execute("select to_regclass('app.tenant_readers') as t").fetchone() == {
            "t": None
        }

    # With the two roles of 0004 made by an administrator, the same owner stops at the
    # duty groups of the roles-by-duty migration, again with the statements to run.
    with private_cluster.connect() as admin:
        admin.execute("create role service_role nologin")
        admin.execute("create role authenticated nologin")
    duty_migration = next(m.version for m in ALL if m.name == "roles_by_duty")
    with connect(plain) as conn:
        with pytest.raises(PermissionDeniedError) as refused:
            migrate(conn)
        assert refused.value.sqlstate == "42501"
        assert "cannot create the duty group roles leaseq_producer" in str(refused.value)
        assert "CREATE ROLE leaseq_worker NOLOGIN" in str(refused.value)
        recorded = conn.execute("select max(version) as v from app.schema_migrations").fetchone()
        assert recorded == {"v": duty_migration - 1}
        assert conn.execute("select to_regclass('app.tenant_producers') as t").fetchone() == {
            "t": None
        }

    # A login under a duty group's name is refused rather than made a group: it would get
    # the rights of every member, and its membership in service_role would be circular.
    queue = private_cluster.dsn(user=postgres.OWNER, dbname="queue")
    with private_cluster.connect() as admin:
        admin.execute("create role leaseq_reaper login")
    with connect(queue) as conn:
        with pytest.raises(DatabaseError) as refused_login:
            migrate(conn)
        assert refused_login.value.sqlstate == "55000"
        assert "leaseq_reaper can log in" in str(refused_login.value)
        recorded = conn.execute("select max(version) as v from app.schema_migrations").fetchone()
        assert recorded == {"v": duty_migration - 1}
    with private_cluster.connect() as admin:
        # As the hint for an owner without CREATEROLE says: a group an administrator
        # made is granted to service_role by the administrator too (from PostgreSQL 16
        # only a role's administrators may grant it).
        admin.execute("alter role leaseq_reaper nologin")
        admin.execute("grant leaseq_reaper to service_role")

    with connect(queue) as conn:
        assert migrate(conn).applied == VERSIONS[duty_migration - 1:]
        roles = conn.execute(
            "select rolname, rolcanlogin, rolsuper, rolinherit from pg_roles"
            " where rolname in ('service_role', 'authenticated', 'leaseq_producer',"
            " 'leaseq_tenant_producer', 'leaseq_worker', 'leaseq_reaper', 'leaseq_operator')"
            " order by rolname"
        ).fetchall()
        legacy = conn.execute(
            "select array_agg(roleid::regrole::text order by roleid::regrole::text) as groups"
            " from pg_auth_members where member = 'service_role'::regrole").fetchone()
    assert roles == [
        {"rolname": name, "rolcanlogin": False, "rolsuper": False, "rolinherit": True}
        for name in ("authenticated", "leaseq_operator", "leaseq_producer", "leaseq_reaper",
                     "leaseq_tenant_producer", "leaseq_worker", "service_role")
    ]
    assert legacy == {"groups": ["leaseq_operator", "leaseq_producer", "leaseq_reaper",
                                 "leaseq_worker"]}

    # Once the roles exist, the owner without CREATEROLE finishes where it stopped.
    with connect(plain) as conn:
        assert migrate(conn).applied == VERSIONS[duty_migration - 1:]


def test_a_changed_function_file_is_applied_with_the_others_and_recorded(fresh: Database) -> None:
    with connect(fresh.owner_dsn) as conn:
        migrate(conn)
        changed = [
            replace(f, sql=f.sql + "\ncomment on function app.check_reason(text) is 'edited';\n")
            if f.file == "checks.sql" else f
            for f in FUNCTIONS
        ]

        report = migrate(conn, functions=changed)

        assert report == MigrationReport((), VERSIONS[-1], FUNCTION_FILES)
        comment = conn.execute(
            "select obj_description('app.check_reason(text)'::regprocedure) as c"
        ).fetchone()
        assert comment == {"c": "edited"}
        recorded = conn.execute("select file, checksum from app.schema_functions").fetchall()
        assert {r["file"]: r["checksum"] for r in recorded} == {
            f.file: f.checksum for f in changed
        }
        assert pending(conn, functions=changed) == []
        assert [f.file for f in pending(conn)] == list(FUNCTION_FILES)


def test_a_failing_function_file_leaves_every_definition_as_it_was(fresh: Database) -> None:
    with connect(fresh.owner_dsn) as conn:
        migrate(conn)
        before = _catalog(conn)
        broken = [*FUNCTIONS, FunctionFile("zz_broken.sql", "select 1 / 0;\n")]

        with pytest.raises(DatabaseError, match="division by zero"):
            migrate(conn, functions=broken)

        assert _catalog(conn) == before
        assert pending(conn) == []


_ADD_COLUMN = Migration(len(ALL) + 1, "add_probe_column",
                        "alter table app.jobs add column probe integer;\n")


def _claim_durations(database: Database, until: threading.Event) -> list[float]:
    durations = []
    with database.connect(postgres.WORKER) as worker:
        while not until.is_set():
            started = time.monotonic()
            worker.execute("select * from app.claim_ready_jobs('w1', 10)").fetchall()
            durations.append(time.monotonic() - started)
            time.sleep(0.02)
    return durations


def test_a_migration_behind_an_idle_reader_gives_up_in_time_and_claims_keep_flowing(
    fresh: Database,
) -> None:
    """A claim waits behind a migration's DDL at most the migration's lock_timeout."""
    with connect(fresh.owner_dsn) as conn:
        migrate(conn)
    postgres.grant_group_roles(fresh.cluster)
    failures: list[BaseException] = []
    stop = threading.Event()

    def deploy() -> None:
        try:
            with connect(fresh.owner_dsn) as conn:
                migrate(conn, [*ALL, _ADD_COLUMN], lock_timeout=timedelta(milliseconds=300),
                        lock_attempts=3, sleep=lambda _: time.sleep(0.2))
        except BaseException as exc:
            failures.append(exc)
        finally:
            stop.set()

    with fresh.connect(postgres.READER) as reader:
        reader.execute("begin")
        reader.execute("select count(*) from app.jobs").fetchone()
        thread = threading.Thread(target=deploy)
        thread.start()
        durations = _claim_durations(fresh, stop)
        thread.join(timeout=30)
        reader.execute("rollback")

    assert len(failures) == 1
    assert isinstance(failures[0], MigrationBlockedError)
    assert "idle in transaction" in str(failures[0])
    assert failures[0].sqlstate == "55P03"
    assert durations
    assert max(durations) < 2.0
    with fresh.connect(postgres.OWNER) as conn:
        assert [r["version"] for r in _recorded(conn)] == list(VERSIONS)
        column = conn.execute(
            "select count(*) as n from pg_attribute"
            " where attrelid = 'app.jobs'::regclass and attname = 'probe'"
        ).fetchone()
        assert column == {"n": 0}


def test_a_blocked_migration_is_applied_once_the_reader_lets_go(fresh: Database) -> None:
    with connect(fresh.owner_dsn) as conn:
        migrate(conn)
    postgres.grant_group_roles(fresh.cluster)
    with fresh.connect(postgres.READER) as reader, connect(fresh.owner_dsn) as conn:
        reader.execute("begin")
        reader.execute("select count(*) from app.jobs").fetchone()
        pauses: list[float] = []

        def end_reader(seconds: float) -> None:
            pauses.append(seconds)
            reader.execute("rollback")

        report = migrate(conn, [*ALL, _ADD_COLUMN], lock_timeout=timedelta(milliseconds=200),
                         lock_attempts=3, sleep=end_reader)

    assert report.applied == (_ADD_COLUMN.version,)
    assert len(pauses) == 1


def test_a_reader_session_gets_an_idle_in_transaction_timeout_unless_it_chose_a_shorter_one(
    db: Database,
) -> None:
    tenant = uuid.uuid4()
    with db.connect(postgres.OWNER) as owner:
        owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                      (postgres.READER, tenant))
        owner.execute("select app.enqueue_job(%s, 'k', 'echo', '{}')", (tenant,))
    for chosen, expected in (("0", "1min"), ("5s", "5s")):
        with db.connect(postgres.READER) as reader:
            reader.execute("select set_config('idle_in_transaction_session_timeout', %s, false)",
                           (chosen,))
            reader.execute("select set_config('app.tenant_id', %s, false)", (str(tenant),))
            assert reader.execute("select count(*) as n from app.jobs").fetchone() == {"n": 1}
            assert reader.execute("show idle_in_transaction_session_timeout").fetchone() == {
                "idle_in_transaction_session_timeout": expected
            }
