"""Each duty's face (leaseq.store.duties) offers exactly the client's calls that its SQL group may
execute, checked by connecting as a login of that group only, and each face works over
its own login."""

from __future__ import annotations

import inspect
import re
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from leaseq import QueueClient, connect
from leaseq.store import queries
from leaseq.store.duties import (
    DUTY_GROUPS,
    DutyClient,
    OperatorClient,
    ProducerClient,
    ReaderClient,
    ReaperClient,
    WorkerClient,
)

from tests.conftest import Database
from tests.library.support import requests
from tests.support import postgres
from tests.support.postgres import Conn

#: Each face and the logins (each a member of one of the face's groups only) it is for.
FACES: dict[type[DutyClient], tuple[str, ...]] = {
    ProducerClient: (postgres.PRODUCER, postgres.TENANT_PRODUCER),
    WorkerClient: (postgres.DUTY_WORKER,),
    ReaperClient: (postgres.REAPER,),
    OperatorClient: (postgres.OPERATOR,),
    ReaderClient: (postgres.READER,),
}
#: Calls of the connection itself, on every face.
CONNECTION_CALLS = {"close", "check"}


def calls_of(face: type[DutyClient]) -> set[str]:
    return {name for name in dir(face) if not name.startswith("_") and callable(
        getattr(face, name))} - CONNECTION_CALLS


def client_calls() -> set[str]:
    return {name for name, value in vars(QueueClient).items()
            if not name.startswith("_") and inspect.isfunction(value)} - CONNECTION_CALLS


def sql_functions(func: Callable[..., Any], seen: set[Callable[..., Any]] | None = None
                  ) -> set[str]:
    """The app functions a call of the client executes: the statements it sends
    (leaseq.store.queries), and those of the client's methods and the library's functions it
    calls, read from their source."""
    seen = set() if seen is None else seen
    if func in seen:
        return set()
    seen.add(func)
    source = textwrap.dedent(inspect.getsource(func))
    found: set[str] = set()
    for name in re.findall(r"\bqueries\.([A-Z_]+)", source):
        found |= set(re.findall(r"\bapp\.(\w+)\(", getattr(queries, name)))
    for name in re.findall(r"\bself\.(\w+)\(", source):
        method = vars(QueueClient).get(name)
        if inspect.isfunction(method):
            found |= sql_functions(method, seen)
    module = sys.modules[func.__module__]
    for name in re.findall(r"(?<![.\w])(\w+)\(", source):
        other = vars(module).get(name)
        if inspect.isfunction(other) and other.__module__.startswith("leaseq"):
            found |= sql_functions(other, seen)
    return found


def executable(db: Database, login: str, functions: set[str]) -> dict[str, bool]:
    """Whether ``login`` may execute each app function (any of its overloads), asked
    over a connection of that login."""
    with db.connect(login) as conn:
        rows = conn.execute(
            "select p.proname, bool_or(has_function_privilege(p.oid, 'EXECUTE')) as may"
            " from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
            " where n.nspname = 'app' and p.proname = any(%s) group by p.proname",
            [sorted(functions)]).fetchall()
    return {row["proname"]: row["may"] for row in rows}


def test_every_call_of_the_client_resolves_to_the_sql_functions_it_executes(
        db: Database) -> None:
    for name in sorted(client_calls()):
        functions = sql_functions(vars(QueueClient)[name])
        assert functions, f"{name} executes no app function that the test can see"
        with db.connect(postgres.OWNER) as conn:
            known = {row["proname"] for row in conn.execute(
                "select p.proname from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
                " where n.nspname = 'app' and p.proname = any(%s)", [sorted(functions)])}
        assert known == functions, name


def test_every_call_of_the_client_is_on_the_face_of_a_duty() -> None:
    on_faces = set().union(*(calls_of(face) for face in FACES))
    assert on_faces == client_calls()


@pytest.mark.parametrize("face", list(FACES), ids=lambda face: face.__name__)
def test_a_face_offers_exactly_the_calls_its_group_may_execute(
        db: Database, face: type[DutyClient]) -> None:
    needed = {name: sql_functions(vars(QueueClient)[name]) for name in client_calls()}
    every_function = set().union(*needed.values())
    for login in FACES[face]:
        assert set(postgres.GROUPS[login]) <= set(face.groups)
        may = executable(db, login, every_function)
        allowed = {name for name, functions in needed.items()
                   if all(may[function] for function in functions)}
        assert calls_of(face) == allowed, login


def test_the_duty_groups_are_the_groups_the_migrations_create(db: Database) -> None:
    with db.connect(postgres.OWNER) as conn:
        rows = conn.execute("select rolname from pg_roles where rolname = any(%s)"
                            " and not rolcanlogin", [list(DUTY_GROUPS)]).fetchall()
    assert {row["rolname"] for row in rows} == set(DUTY_GROUPS)
    faces_groups = set().union(*(face.groups for face in FACES))
    assert faces_groups - set(DUTY_GROUPS) == {"authenticated"}


@pytest.fixture
def clients(db: Database) -> Iterator[dict[str, QueueClient]]:
    made = {login: QueueClient(lambda login=login: connect(db.dsn(login)))
            for login in (postgres.PRODUCER, postgres.DUTY_WORKER, postgres.REAPER,
                          postgres.OPERATOR, postgres.READER)}
    yield made
    for client in made.values():
        client.close()


def test_each_face_drives_its_duty_over_a_login_of_its_group_only(
        clients: dict[str, QueueClient], owner: Conn) -> None:
    producer = ProducerClient(clients[postgres.PRODUCER])
    worker = WorkerClient(clients[postgres.DUTY_WORKER])
    reaper = ReaperClient(clients[postgres.REAPER])
    operator = OperatorClient(clients[postgres.OPERATOR])
    reader = ReaderClient(clients[postgres.READER])
    tenant = uuid.uuid4()
    owner.execute("insert into app.tenant_readers (role_name, tenant_id) values (%s, %s)",
                  (postgres.READER, tenant))

    created = producer.enqueue_jobs(requests(tenant, 2))
    claimed = worker.claim_ready_jobs("face-worker", 10, timedelta(seconds=30))
    given_back = worker.release_jobs("face-worker", claimed)
    released = reaper.release_all_expired_jobs()
    statuses = {row["state"]: row["jobs"] for row in operator.queue_status(tenant)}
    seen = reader.reader_get_job(tenant, created[0].job_id)

    assert {job.id for job in claimed} == {result.job_id for result in created}
    assert given_back == {result.job_id for result in created}
    assert released == 0
    assert statuses == {"pending": 2}
    assert seen is not None
    assert seen["id"] == created[0].job_id
    assert producer.job_result(tenant, job_id=created[0].job_id) is not None
    assert not hasattr(worker, "redrive_jobs")
    assert not hasattr(producer, "claim_ready_jobs")
