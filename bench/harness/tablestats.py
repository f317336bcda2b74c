"""Row-level counters of a system's tables around a drain, and index entries from WAL.

``pg_stat_user_tables`` counts the heap writes each table took: inserts, updates (of
which HOT: no index touched), deletes, and the dead tuples left. A backend sends its
counters to the shared statistics when it goes idle (at most once a second) and when it
exits, so the counters are read only once every other session of the database has
gone, and after ``pg_stat_clear_snapshot()`` so that no cached snapshot is served.
(``pg_stat_force_next_flush()`` exists from PostgreSQL 15 on, but flushes only the
calling session's own counters: the workers' sessions are what matter here.)

Index entries come from the WAL breakdown: every Btree ``INSERT_LEAF`` record (and
``INSERT_POST``, a leaf insert that splits a posting list) writes one new entry into a
leaf page of the index it names.
"""

from __future__ import annotations

import time
from typing import Any

from harness.pg import Conn, connect

_COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del", "n_dead_tup",
             "n_live_tup")

_READ = """
select schemaname || '.' || relname as name, n_tup_ins, n_tup_upd, n_tup_hot_upd,
       n_tup_del, n_dead_tup, n_live_tup
from pg_stat_user_tables
where (schemaname || '.' || relname) = any(%s) or relname = any(%s)
"""

#: The Btree records that add one entry to an index's leaf page.
INDEX_ENTRY_RECORDS = ("INSERT_LEAF", "INSERT_POST")


def wait_for_sessions_to_end(conn: Conn, timeout: float = 15.0) -> None:
    """Until no other session is connected to this database (their counters are then
    flushed), or ``timeout`` has passed; then a moment for the last exit's flush."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        row = conn.execute(
            "select count(*) as n from pg_stat_activity"
            " where datname = current_database() and pid <> pg_backend_pid()"
            " and backend_type = 'client backend'").fetchone()
        if row is not None and not row["n"]:
            break
        time.sleep(0.05)
    time.sleep(0.2)


def snapshot(dsn: str, tables: list[str]) -> dict[str, dict[str, int]]:
    """The counters of ``tables`` (schema-qualified or bare names) once the database's
    other sessions have ended."""
    with connect(dsn) as conn:
        wait_for_sessions_to_end(conn)
        conn.execute("select pg_stat_clear_snapshot()")
        rows = conn.execute(_READ, (tables, tables)).fetchall()
    return {r["name"]: {c: int(r[c]) for c in _COUNTERS} for r in rows}


def delta(before: dict[str, dict[str, int]],
          after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """What the window added per table (dead and live tuples: as left at its end)."""
    out: dict[str, dict[str, int]] = {}
    for name, end in after.items():
        start = before.get(name, dict.fromkeys(_COUNTERS, 0))
        row = {c: end[c] - start[c] for c in _COUNTERS if c not in ("n_dead_tup", "n_live_tup")}
        row["n_dead_tup"] = end["n_dead_tup"]
        row["n_live_tup"] = end["n_live_tup"]
        out[name] = row
    return out


def per_job(stats: dict[str, dict[str, int]], jobs: int) -> dict[str, dict[str, Any]]:
    """Every counter divided by the jobs, with the HOT ratio of the updates."""
    out: dict[str, dict[str, Any]] = {}
    for name, row in stats.items():
        entry: dict[str, Any] = {c: v / jobs for c, v in row.items()}
        entry["hot_ratio"] = row["n_tup_hot_upd"] / row["n_tup_upd"] if row["n_tup_upd"] else None
        entry["non_hot_upd"] = (row["n_tup_upd"] - row["n_tup_hot_upd"]) / jobs
        out[name] = entry
    return out


def index_entries(breakdown: dict[str, Any], jobs: int) -> dict[str, Any]:
    """Index entries written per job, in total and per index, from a WAL breakdown."""
    by_index: dict[str, float] = {}
    for rec in breakdown.get("by_record", []):
        if rec["rmgr"] == "Btree" and rec["record_type"] in INDEX_ENTRY_RECORDS:
            name = rec["relation"] or "?"
            by_index[name] = by_index.get(name, 0.0) + rec["records"] / jobs
    return {"per_job": sum(by_index.values()),
            "by_index": dict(sorted(by_index.items(), key=lambda kv: -kv[1]))}
