"""Bad input ends as one line naming the fix, a documented exit code, never a traceback.

Each case runs the installed ``leaseq`` script in a process of its own, so what is
checked is exactly what a terminal (or a script reading the exit code) gets.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from psycopg.conninfo import make_conninfo

from tests.cli.conftest import Result, clean_environment, run_process
from tests.conftest import Database
from tests.sql.calls import enqueue
from tests.support.postgres import Conn


def _assert_one_line_error(result: Result, code: int, *fragments: str) -> None:
    assert result.code == code, (result.code, result.out, result.err)
    assert "Traceback" not in result.err
    assert len(result.error_lines) == 1, result.err
    (line,) = result.error_lines
    assert line.startswith("leaseq: error: ")
    for fragment in fragments:
        assert fragment in line, line
    assert result.out == ""


@pytest.fixture
def leaseq(db: Database) -> Callable[..., Result]:
    def run(*args: str, database_url: str | None = None) -> Result:
        env = clean_environment(DATABASE_URL=database_url or db.worker_dsn)
        return run_process(*args, env=env)

    return run


def test_a_malformed_uuid_is_refused_with_the_expected_form(
    leaseq: Callable[..., Result]
) -> None:
    _assert_one_line_error(leaseq("jobs", "show", "1234-not-a-uuid"), 2,
                           "'1234-not-a-uuid' is not a UUID", "36-character form")


def test_a_payload_that_is_not_a_json_object_is_refused(leaseq: Callable[..., Result]) -> None:
    tenant = str(uuid.uuid4())
    _assert_one_line_error(
        leaseq("enqueue", "--tenant", tenant, "--kind", "k", "--payload", '["a", "b"]'), 2,
        "--payload must be a JSON object", "(got a JSON array)")
    _assert_one_line_error(
        leaseq("enqueue", "--tenant", tenant, "--kind", "k", "--payload", "{to: 1}"), 2,
        "--payload is not valid JSON", "quote it for the shell")


def test_an_unknown_job_id_exits_4(leaseq: Callable[..., Result]) -> None:
    missing = str(uuid.uuid4())
    _assert_one_line_error(leaseq("jobs", "show", missing), 4, f"no job has id {missing}")
    _assert_one_line_error(leaseq("dead", "retry", missing), 4, f"no job has id {missing}")


def test_an_unreachable_database_exits_3_and_names_what_to_check(
    leaseq: Callable[..., Result]
) -> None:
    unreachable = "postgresql://leaseq_cli:secret@127.0.0.1:1/leaseq?connect_timeout=2"
    _assert_one_line_error(leaseq("status", database_url=unreachable), 3,
                           "database unavailable", "Check the host, port, credentials")


def test_a_server_certificate_that_fails_verification_exits_3_naming_the_check() -> None:
    from tests.support.tls_server import tls_server

    with tls_server() as server:
        url = make_conninfo("", sslmode="verify-full", sslrootcert=str(server.unknown_ca_file),
                            **server.params("localhost"))  # type: ignore[arg-type]
        result = run_process("status", env=clean_environment(DATABASE_URL=url))
    _assert_one_line_error(result, 3, "TLS check failed",
                           "not signed by a CA in the trusted roots", "sslrootcert")


def test_a_malformed_database_url_exits_2(leaseq: Callable[..., Result]) -> None:
    _assert_one_line_error(leaseq("status", database_url="postgres at localhost"), 2,
                           "DATABASE_URL is not a valid connection string")


def test_a_database_without_the_schema_says_to_migrate(
    leaseq: Callable[..., Result], fresh_database: Callable[[], Database]
) -> None:
    empty = fresh_database()
    _assert_one_line_error(leaseq("status", database_url=empty.owner_dsn), 3,
                           "leaseq migrate")


def test_a_handlers_module_that_cannot_be_imported_exits_2(
    leaseq: Callable[..., Result], worker: Conn
) -> None:
    enqueue(worker, uuid.uuid4(), "a")
    _assert_one_line_error(
        leaseq("drain", "--handlers", "no_such_handlers_module", "--budget", "20",
               "--job-timeout", "5"), 2,
        "LEASEQ_HANDLERS='no_such_handlers_module' cannot be imported")


def test_an_unknown_command_or_option_is_a_usage_error(leaseq: Callable[..., Result]) -> None:
    _assert_one_line_error(leaseq("frobnicate"), 2, "invalid choice: 'frobnicate'")
    _assert_one_line_error(leaseq("drain", "--budget", "-3"), 2, "must be more than 0 seconds")


def test_a_wrong_password_exits_3_with_the_fix(embedded_home: object) -> None:
    """The embedded server checks passwords (scram-sha-256) for every role, its
    bootstrap superuser included, so a wrong password is refused as on a real server."""
    from pathlib import Path

    home = Path(str(embedded_home))
    env = clean_environment(LEASEQ_HOME=str(home))
    url = run_process("db", "url", "--json", env=env)
    assert url.code == 0, url.err
    good = url.json()["url"]
    ok = run_process("status", "--json", env={**env, "DATABASE_URL": good})
    assert ok.code == 0, ok.err
    wrong = make_conninfo(good, password="not-the-password")
    _assert_one_line_error(run_process("status", env={**env, "DATABASE_URL": wrong}), 3,
                           "refused the login (wrong user or password)",
                           "check the credentials in DATABASE_URL")


def test_python_dash_m_leaseq_migrate_prints_what_leaseq_migrate_prints(
    fresh_database: Callable[[], Database],
) -> None:
    import subprocess
    import sys

    by_module, by_script = fresh_database(), fresh_database()

    def module(db: Database, *flags: str) -> Result:
        done = subprocess.run([sys.executable, "-m", "leaseq", "migrate", *flags],
                              capture_output=True, text=True, timeout=120, check=False,
                              env=clean_environment(DATABASE_URL=db.owner_dsn))
        return Result(done.returncode, done.stdout, done.stderr)

    def script(db: Database, *flags: str) -> Result:
        return run_process("migrate", *flags, env=clean_environment(DATABASE_URL=db.owner_dsn))

    first = (module(by_module, "--json"), script(by_script, "--json"))
    again = (module(by_module), script(by_script))

    assert [r.code for r in (*first, *again)] == [0, 0, 0, 0], [r.err for r in first + again]
    documents = [r.json() for r in first]
    assert documents[0]["applied"] == documents[1]["applied"] != []
    assert documents[0]["version"] == documents[1]["version"]
    for document, db in zip(documents, (by_module, by_script), strict=True):
        assert document["database"].endswith(f"/{db.name})")
    assert again[0].out.replace(by_module.name, "DB") == again[1].out.replace(by_script.name, "DB")
    assert again[1].out.startswith("schema is up to date at version ")
