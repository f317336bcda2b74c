"""Server-side meters read around a drain: WAL bytes and server CPU time.

Both are cluster-wide quantities on a server that other clients may use at the same
time, so each meter also measures what it can attribute to the benchmark's database
and reports the rest as ``foreign`` instead of silently charging it to the queue.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.pg import Conn, connect

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# CPU ---------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; everything after its ')' is fixed.
    return raw[raw.rindex(")") + 2 :].split()


def _cpu_ticks(fields: list[str]) -> tuple[int, int]:
    """(own utime+stime, reaped children's cutime+cstime) in clock ticks."""
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _database_of(pid: int, cluster_prefix: str) -> str | None:
    """The database a backend serves, from its process title; None for server processes.

    A client backend's title is ``postgres: <cluster> <user> <database> <host> <activity>``.
    """
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    if not title.startswith(cluster_prefix):
        return None
    words = title[len(cluster_prefix) :].split()
    if len(words) >= 3 and ("(" in words[2] or words[2] == "[local]"):
        return words[1]
    return None


@dataclass
class _Process:
    first: int
    last: int
    database: str | None
    seen_at_start: bool


@dataclass
class CpuReading:
    """Server CPU seconds during a window."""

    total_s: float
    foreign_s: float

    @property
    def attributed_s(self) -> float:
        return max(self.total_s - self.foreign_s, 0.0)


class ServerCpuMeter:
    """Sums the CPU time of the postmaster and all its children over a window.

    Children that exit inside the window are charged through the postmaster's
    ``cutime``/``cstime`` (their whole life), minus what they had used before the
    window. Backends of other databases are sampled every ``interval`` seconds and
    reported as foreign. Needs the server on this machine and /proc access to it.
    """

    def __init__(self, postmaster_pid: int, own_database: str, interval: float = 0.02,
                 *, nice: int = 0) -> None:
        self.postmaster_pid = postmaster_pid
        self.own_database = own_database
        self.interval = interval
        self.nice = nice
        self.cluster_prefix = self._cluster_prefix()
        self._processes: dict[int, _Process] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pm_start: tuple[int, int] = (0, 0)

    def _cluster_prefix(self) -> str:
        for child in _children(self.postmaster_pid):
            try:
                title = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if title.startswith("postgres: "):
                # "postgres: 15/main: checkpointer" -> "postgres: 15/main: "
                head, _, _ = title.rpartition(": ")
                return head + ": "
        return "postgres: "

    @staticmethod
    def available(postmaster_pid: int | None) -> bool:
        return postmaster_pid is not None and _stat_fields(postmaster_pid) is not None

    def _sample(self, *, at_start: bool = False) -> None:
        for pid in _children(self.postmaster_pid):
            fields = _stat_fields(pid)
            if fields is None:
                continue
            own, _ = _cpu_ticks(fields)
            known = self._processes.get(pid)
            if known is None:
                known = self._processes[pid] = _Process(
                    first=own if at_start else 0, last=own, database=None,
                    seen_at_start=at_start)
            else:
                known.last = own
            if known.database is None:
                # A new backend names its database only once it has authenticated.
                known.database = _database_of(pid, self.cluster_prefix)
                if known.database == self.own_database and self.nice:
                    renice(pid, self.nice)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._processes.clear()
        fields = _stat_fields(self.postmaster_pid)
        assert fields is not None, "postmaster vanished"
        self._pm_start = _cpu_ticks(fields)
        self._sample(at_start=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> CpuReading:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        fields = _stat_fields(self.postmaster_pid)
        assert fields is not None, "postmaster vanished"
        pm_own, pm_reaped = _cpu_ticks(fields)
        alive = set(_children(self.postmaster_pid))
        total = (pm_own - self._pm_start[0]) + (pm_reaped - self._pm_start[1])
        foreign = 0
        for pid, proc in self._processes.items():
            if pid in alive:
                current = _stat_fields(pid)
                if current is not None:
                    proc.last = _cpu_ticks(current)[0]
                total += proc.last - proc.first
            elif proc.seen_at_start:
                # Its whole life is in the postmaster's cutime; the part before the
                # window is not ours.
                total -= proc.first
            if proc.database is not None and proc.database != self.own_database:
                foreign += proc.last - proc.first
        return CpuReading(total_s=total / CLOCK_TICKS, foreign_s=foreign / CLOCK_TICKS)


def renice(pid: int, nice: int) -> None:
    """Give ``pid`` (a worker, or a backend serving the benchmark's database) priority.

    Needs root for a negative value; without it, or if the process is gone, nothing.
    """
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)


def postmaster_pid(conn: Conn) -> int | None:
    """The postmaster's pid, if the server runs on this machine (else None)."""
    row = conn.execute("select pg_backend_pid() as pid").fetchone()
    if row is None:
        return None
    fields = _stat_fields(int(row["pid"]))
    if fields is None:
        return None
    parent = int(fields[1])
    return parent if _stat_fields(parent) is not None else None


# WAL ---------------------------------------------------------------------------------


@dataclass
class WalMark:
    lsn: str
    wal_bytes: int | None
    wal_records: int | None
    wal_fpi: int | None
    checkpoints: int


def wal_mark(conn: Conn) -> WalMark:
    lsn = conn.execute("select pg_current_wal_insert_lsn()::text as lsn").fetchone()
    stat = conn.execute(
        "select wal_bytes::bigint as wal_bytes, wal_records, wal_fpi from pg_stat_wal"
    ).fetchone()
    ckpt = conn.execute(
        "select checkpoints_timed + checkpoints_req as n from pg_stat_bgwriter"
    ).fetchone()
    assert lsn is not None
    assert ckpt is not None
    return WalMark(
        lsn=str(lsn["lsn"]),
        wal_bytes=None if stat is None else int(stat["wal_bytes"]),
        wal_records=None if stat is None else int(stat["wal_records"]),
        wal_fpi=None if stat is None else int(stat["wal_fpi"]),
        checkpoints=int(ckpt["n"]),
    )


@dataclass
class WalReading:
    lsn_bytes: int
    records: int | None
    fpi: int | None
    checkpoints: int
    breakdown: dict[str, Any] = field(default_factory=dict)


def wal_between(conn: Conn, start: WalMark, end: WalMark) -> WalReading:
    row = conn.execute(
        "select pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint as n", (end.lsn, start.lsn)
    ).fetchone()
    assert row is not None
    return WalReading(
        lsn_bytes=int(row["n"]),
        records=None if start.wal_records is None or end.wal_records is None
        else end.wal_records - start.wal_records,
        fpi=None if start.wal_fpi is None or end.wal_fpi is None else end.wal_fpi - start.wal_fpi,
        checkpoints=end.checkpoints - start.checkpoints,
    )


# Each WAL record of the window, tagged as the benchmark database's own when one of its
# blocks lives in that database or its transaction touched that database (this takes in
# the commit records). The rest is other clients' work or the server's housekeeping.
_WAL_BREAKDOWN = """
with recs as (
  select r.xid::text::bigint as xid, r.resource_manager as rmgr, r.record_type,
         r.record_length, r.fpi_length,
         regexp_match(r.block_ref, 'rel (\\d+)/(\\d+)/(\\d+)') as m
  from pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn) r
), tagged as (
  select recs.*, (m[1])::oid as spc, (m[2])::oid as dboid, (m[3])::oid as filenode
  from recs
), own_xids as (
  select distinct t.xid from tagged t
  where t.dboid = (select oid from pg_database where datname = current_database())
    and t.xid <> 0
), own as (
  select t.*, (t.dboid = (select oid from pg_database where datname = current_database())
               or t.xid in (select xid from own_xids)) as is_own
  from tagged t
)
select is_own, rmgr, record_type,
       case when is_own and filenode is not null
            then coalesce(pg_filenode_relation(case when spc = 1663 then 0 else spc end,
                                               filenode)::text, 'filenode ' || filenode)
            else null end as relation,
       count(*)::bigint as records,
       sum(record_length)::bigint as bytes,
       sum(fpi_length)::bigint as fpi_bytes
from own
group by 1, 2, 3, 4
order by bytes desc
"""


def _flushed_up_to(conn: Conn, lsn: str, timeout: float = 3.0) -> str:
    """``lsn``, once WAL is flushed that far (pg_walinspect reads only flushed WAL).

    The WAL writer flushes within wal_writer_delay; an insert position just past a
    page header may never be reached by a flush, so give up after ``timeout`` and
    use the flush position, which then differs from ``lsn`` by that header only.
    """
    give_up = time.monotonic() + timeout
    while True:
        row = conn.execute(
            "select pg_current_wal_flush_lsn() >= %s::pg_lsn as ok,"
            " pg_current_wal_flush_lsn()::text as flushed", (lsn,)).fetchone()
        assert row is not None
        if row["ok"]:
            return lsn
        if time.monotonic() > give_up:
            return str(row["flushed"])
        time.sleep(0.05)


def wal_breakdown(conn: Conn, start: WalMark, end: WalMark) -> dict[str, Any]:
    """Bytes by resource manager, record type and relation (needs pg_walinspect)."""
    rows = conn.execute(
        _WAL_BREAKDOWN, {"start": start.lsn, "end": _flushed_up_to(conn, end.lsn)}).fetchall()
    own = [r for r in rows if r["is_own"]]
    by_relation: dict[str, int] = {}
    by_rmgr: dict[str, int] = {}
    for r in own:
        rel = r["relation"] or "(no relation: commit and other transaction records)"
        by_relation[rel] = by_relation.get(rel, 0) + int(r["bytes"])
        by_rmgr[r["rmgr"]] = by_rmgr.get(r["rmgr"], 0) + int(r["bytes"])
    return {
        "own_bytes": sum(int(r["bytes"]) for r in own),
        "own_records": sum(int(r["records"]) for r in own),
        "own_fpi_bytes": sum(int(r["fpi_bytes"]) for r in own),
        "foreign_bytes": sum(int(r["bytes"]) for r in rows if not r["is_own"]),
        "by_relation": dict(sorted(by_relation.items(), key=lambda kv: -kv[1])),
        "by_rmgr": dict(sorted(by_rmgr.items(), key=lambda kv: -kv[1])),
        "by_record": [
            {
                "rmgr": r["rmgr"], "record_type": r["record_type"], "relation": r["relation"],
                "records": int(r["records"]), "bytes": int(r["bytes"]),
                "fpi_bytes": int(r["fpi_bytes"]),
            }
            for r in own
        ],
    }


def enable_walinspect(dsn: str) -> bool:
    with connect(dsn) as conn:
        try:
            conn.execute("create extension if not exists pg_walinspect")
        except Exception:
            return False
    return True


# The window ----------------------------------------------------------------------------


@dataclass
class Window:
    """Everything read around one timed drain."""

    seconds: float = 0.0
    wal: WalReading | None = None
    cpu: CpuReading | None = None
    started: float = field(default_factory=time.perf_counter)
