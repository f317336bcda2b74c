"""From raw runs to the printed tables: medians, ratios, and each target's verdict."""

from __future__ import annotations

import statistics
from typing import Any

from harness import tablestats

LABELS = {
    "leaseq": "leaseq (library drain)",
    "leaseq-sql": "leaseq SQL floor (functions called directly)",
    "pgqueuer": "PgQueuer 1.6.0",
    "procrastinate": "procrastinate 3.10.0",
    "ceiling": "set-based SQL ceiling (pgbench)",
    "ceiling-reference": "the same ceiling on the reference schema",
}

# The issue's targets, as (description, comparison, limit).
WAL_TARGET_BYTES = 1700
CPU_TARGET_MS = 0.15
RT_TARGET = 0.25
LATENCY_RATIO_TARGET = 1.2
IMPORT_TARGET_MS = 250
RSS_GROWTH_TARGET = 0.05
VS_PGQUEUER_TARGET = 1.5
VS_CEILING_TARGET = 0.8
VS_PGQUEUER_WAITING_TARGET = 1.0


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def wal_bytes(run: dict[str, Any]) -> float | None:
    """The WAL this run's database caused: pg_walinspect's attribution when present,
    else the LSN distance (which includes other clients' WAL)."""
    wal = run.get("wal")
    if not wal:
        return None
    breakdown = wal.get("breakdown") or {}
    if "own_bytes" in breakdown:
        return float(breakdown["own_bytes"])
    return float(wal["lsn_bytes"])


def _median_map(maps: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for m in maps for k in m}
    return {k: statistics.median(m.get(k, 0.0) for m in maps) for k in sorted(keys)}


def _row_costs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per job, median of the runs: the drain's table counters and index entries, and
    the enqueue's server CPU, WAL and index entries."""
    out: dict[str, Any] = {}
    with_tables = [r for r in runs if r.get("tables")]
    if with_tables:
        names = sorted({t for r in with_tables for t in r["tables"]})
        tables: dict[str, Any] = {}
        for name in names:
            rows = [tablestats.per_job({name: r["tables"][name]}, r["jobs"])[name]
                    for r in with_tables if name in r["tables"]]
            tables[name] = {k: _median([row[k] for row in rows]) for k in rows[0]}
        out["tables"] = tables
    entries = [tablestats.index_entries(r["wal"]["breakdown"], r["jobs"]) for r in runs
               if r.get("wal") and "by_record" in (r["wal"].get("breakdown") or {})]
    if entries:
        out["index_entries_per_job"] = _median([e["per_job"] for e in entries])
        out["index_entries_by_index"] = _median_map([e["by_index"] for e in entries])
    enq = [r["enqueue"] for r in runs if r.get("enqueue")]
    if enq:
        out["enqueue_server_cpu_ms_per_job"] = _median([
            e["server_cpu_s"] * 1000 / e["jobs"] for e in enq if e["server_cpu_s"] is not None])
        out["enqueue_wal_bytes_per_job"] = _median([
            e["wal_own_bytes"] / e["jobs"] for e in enq if e["wal_own_bytes"] is not None])
        out["enqueue_index_entries_per_job"] = _median([
            e["index_entries"]["per_job"] for e in enq if e.get("index_entries")])
    return out


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    for name, runs in results["runs"].items():
        if not runs:
            continue
        rates = [r["jobs_per_s"] for r in runs]
        jobs = runs[0]["jobs"]
        cell: dict[str, Any] = {
            "jobs_per_s": {"median": statistics.median(rates), "min": min(rates),
                           "max": max(rates), "all": rates},
            "wal_bytes_per_job": _median([
                (wal_bytes(r) or 0) / r["jobs"] for r in runs if wal_bytes(r) is not None]),
            "wal_no_fpi_bytes_per_job": _median([
                (r["wal"]["breakdown"]["own_bytes"] - r["wal"]["breakdown"]["own_fpi_bytes"])
                / r["jobs"] for r in runs
                if r.get("wal") and "own_fpi_bytes" in (r["wal"].get("breakdown") or {})]),
            "wal_fpi_bytes_per_job": _median([
                r["wal"]["breakdown"]["own_fpi_bytes"] / r["jobs"] for r in runs
                if r.get("wal") and "own_fpi_bytes" in (r["wal"].get("breakdown") or {})]),
            "server_cpu_ms_per_job": _median([
                r["server_cpu"]["attributed_s"] * 1000 / r["jobs"] for r in runs
                if r.get("server_cpu")]),
            "client_cpu_ms_per_job": _median([
                r["client_cpu_s"] * 1000 / r["jobs"] for r in runs
                if r.get("client_cpu_s") is not None]),
            "other_load_cores": _median([
                r["other_machine_cpu_s"] / r["seconds"] for r in runs
                if r.get("other_machine_cpu_s") is not None and r["seconds"] > 0]),
            "jobs": jobs,
        }
        # What the machine's cores could drain if CPU were the only limit: a figure that
        # other load on a shared machine hardly moves, unlike the measured rate.
        server, client = cell["server_cpu_ms_per_job"], cell["client_cpu_ms_per_job"]
        cpus = results["setup"]["server"].get("cpus") or 1
        cell["cpu_bound_jobs_per_s"] = (
            cpus * 1000 / (server + client) if server and client is not None else None)
        rt = results.get("round_trips", {}).get(name)
        cell["round_trips_per_job"] = rt["per_job"] if rt else None
        cell.update(_row_costs(runs))
        cells[name] = cell

    def rate(name: str) -> float | None:
        return cells[name]["jobs_per_s"]["median"] if name in cells else None

    # Against PgQueuer at its most worker processes in this run (4 by default, 1 in the
    # waiting-handler runs).
    pgq_cells = sorted((int(n.partition("@c")[2]), n) for n in cells if n.startswith("pgqueuer@"))
    pgq_name = pgq_cells[-1][1] if pgq_cells else "pgqueuer@c4"
    pgq, ceiling = rate(pgq_name), rate("ceiling@c4")
    for cell in cells.values():
        m = cell["jobs_per_s"]["median"]
        cell["vs_pgqueuer"] = m / pgq if pgq else None
        cell["vs_ceiling"] = m / ceiling if ceiling else None

    lq = cells.get("leaseq@c4", {})
    targets: list[dict[str, Any]] = []
    setup = results["setup"]

    def target(name: str, value: float | None, limit: float, *, at_least: bool,
               unit: str = "", strict: bool = False) -> None:
        if value is None:
            ok = None
        elif at_least:
            ok = value >= limit
        else:
            ok = value < limit if strict else value <= limit
        sign = ">=" if at_least else ("<" if strict else "<=")
        shown = f"{limit:+.0%}" if unit == "%" else f"{limit:g}{unit}"
        targets.append({"target": name, "value": value, "limit": f"{sign} {shown}",
                        "met": ok, "unit": unit})

    if setup.get("handler_ms") is not None:
        # The waiting-handler run: one process each, N handlers at once in it.
        one = cells.get("leaseq@c1", {})
        target(f"leaseq c1 ÷ PgQueuer c1, handler waits {setup['handler_ms']:g} ms, "
               f"{setup['handler_concurrency']} at once", one.get("vs_pgqueuer"),
               VS_PGQUEUER_WAITING_TARGET, at_least=True, unit="×")
        target("SQL round trips per job (leaseq c1)", one.get("round_trips_per_job"),
               RT_TARGET, at_least=False)
        return {"cells": cells, "targets": targets, "pgqueuer": pgq_name}
    target("leaseq c4 jobs/s ÷ PgQueuer c4", lq.get("vs_pgqueuer"), VS_PGQUEUER_TARGET,
           at_least=True, unit="×")
    target("leaseq c4 jobs/s ÷ set-based ceiling c4", lq.get("vs_ceiling"),
           VS_CEILING_TARGET, at_least=True, unit="×")
    target("SQL round trips per job (leaseq c4, batch 10)", lq.get("round_trips_per_job"),
           RT_TARGET, at_least=False)
    target("WAL bytes per job (leaseq c4, audit kept)", lq.get("wal_bytes_per_job"),
           WAL_TARGET_BYTES, at_least=False, unit=" B")
    target("server CPU per job (leaseq c4)", lq.get("server_cpu_ms_per_job"), CPU_TARGET_MS,
           at_least=False, unit=" ms")
    latency = results.get("claim_latency")
    backlog = f" + {latency['ready_backlog']:,} ready" if latency and latency.get(
        "ready_backlog") else ""
    target(f"claim latency, 1M finished{backlog} ÷ empty database",
           latency.get("ratio") if latency else None, LATENCY_RATIO_TARGET,
           at_least=False, unit="×")
    imports = results.get("import_time") or {}
    target("import time of the worker handler module", imports.get("median_ms"),
           IMPORT_TARGET_MS, at_least=False, unit=" ms")
    rss = results.get("peak_rss")
    growth = (rss["large_kib"] / rss["small_kib"] - 1) if rss else None
    target("peak RSS growth, large drain vs jobs/10 drain", growth, RSS_GROWTH_TARGET,
           at_least=False, unit="%")
    return {"cells": cells, "targets": targets, "pgqueuer": pgq_name}


def _migrations(setup: dict[str, Any]) -> str:
    versions = [m["version"] for m in setup.get("leaseq_migrations", [])]
    return f"{min(versions):04d}-{max(versions):04d}" if versions else "?"


def _payload(setup: dict[str, Any]) -> str:
    size = setup.get("payload_bytes") or 0
    return f" with {size:,}-byte payloads" if size else ""


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def render(results: dict[str, Any]) -> str:
    summary = results["summary"]
    setup = results["setup"]
    if setup.get("handler_ms") is not None:
        jobs = (f"{setup['jobs']:,} jobs whose async handler waits {setup['handler_ms']:g} ms, "
                f"{setup['handler_concurrency']} at once per worker process")
    else:
        jobs = f"{setup['jobs']:,} no-op jobs"
    pgq = summary.get("pgqueuer", "pgqueuer@c4").partition("@")[2]
    lines = [
        f"{jobs}{_payload(setup)}, {setup['tenants']} tenants, "
        f"batch {setup['batch']}, "
        f"median of {setup['runs']} runs; {setup['server']['version'].split(' on ')[0]}, "
        f"{setup['server']['cpus']} CPUs",
        f"leaseq schema: migrations {_migrations(setup)}; source {setup.get('source', '?')}",
        "",
        f"| System | Workers | jobs/s median | min | max | × PgQueuer {pgq} | × ceiling c4 "
        "| WAL B/job | server CPU ms/job | client CPU ms/job | CPU-bound jobs/s "
        "| round trips/job | other load |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, cell in summary["cells"].items():
        key, _, conc = name.partition("@c")
        j = cell["jobs_per_s"]
        lines.append(
            f"| {LABELS.get(key, key)} | {conc} | {j['median']:,.0f} | {j['min']:,.0f} "
            f"| {j['max']:,.0f} | {_fmt(cell['vs_pgqueuer'], '.2f')} "
            f"| {_fmt(cell['vs_ceiling'], '.2f')} | {_fmt(cell['wal_bytes_per_job'], ',.0f')} "
            f"| {_fmt(cell['server_cpu_ms_per_job'], '.3f')} "
            f"| {_fmt(cell['client_cpu_ms_per_job'], '.3f')} "
            f"| {_fmt(cell.get('cpu_bound_jobs_per_s'), ',.0f')} "
            f"| {_fmt(cell['round_trips_per_job'], '.3f')} "
            f"| {_fmt(cell['other_load_cores'], '.2f')} |")
    lines += ["", "| Target | Measured | Target | Met |", "|---|--:|--:|:-:|"]
    for t in summary["targets"]:
        value = t["value"]
        if value is None:
            shown = "–"
        elif t["unit"] == "%":
            shown = f"{value:+.1%}"
        else:
            shown = f"{value:,.3f}{t['unit']}" if value < 10 else f"{value:,.0f}{t['unit']}"
        verdict = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
        lines.append(f"| {t['target']} | {shown} | {t['limit']} | {verdict} |")
    lines += latency_lines(results)
    rss = results.get("peak_rss")
    if rss:
        lines.append(f"peak RSS of one leaseq worker: {rss['large_jobs']:,} jobs "
                     f"{rss['large_kib'] / 1024:.1f} MiB, {rss['small_jobs']:,} jobs "
                     f"{rss['small_kib'] / 1024:.1f} MiB")
    imports = results.get("import_time") or {}
    if "median_ms" in imports:
        top = ", ".join(f"{m['package']} {m['self_ms']:.0f}" for m in imports["by_package"][:8])
        cpu = (f" (CPU {imports['cpu_median_ms']:.0f} ms)" if "cpu_median_ms" in imports
               else "")
        lines.append(f"import app (worker function): {imports['median_ms']:.0f} ms median{cpu}; "
                     f"by package (ms): {top}")
    elif imports:
        lines.append(f"import time: not measured ({imports.get('error')})")
    lines += ["", *row_table(summary), "", *wal_table(results)]
    return "\n".join(lines)


def row_table(summary: dict[str, Any]) -> list[str]:
    """Per job: what the enqueue and the drain wrote, row by row and index by index."""
    lines = ["Rows and index entries per job (drain unless marked enqueue; pg_stat_user_tables "
             "and Btree INSERT_LEAF records, median of the runs):", "",
             "| System | Workers | enqueue server CPU ms/job | enqueue WAL B/job "
             "| enqueue index entries/job | drain WAL B/job without FPI "
             "| drain index entries/job | table | ins/job "
             "| upd/job | HOT upd/job | HOT ratio | non-HOT upd/job | del/job | dead tuples/job |",
             "|---|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|"]
    for name, cell in summary["cells"].items():
        key, _, conc = name.partition("@c")
        tables = cell.get("tables") or {"–": {}}
        for i, (table, t) in enumerate(tables.items()):
            head = (f"| {LABELS.get(key, key)} | {conc} "
                    f"| {_fmt(cell.get('enqueue_server_cpu_ms_per_job'), '.3f')} "
                    f"| {_fmt(cell.get('enqueue_wal_bytes_per_job'), ',.0f')} "
                    f"| {_fmt(cell.get('enqueue_index_entries_per_job'), '.2f')} "
                    f"| {_fmt(cell.get('wal_no_fpi_bytes_per_job'), ',.0f')} "
                    f"| {_fmt(cell.get('index_entries_per_job'), '.2f')} ") if i == 0 else (
                    "| | | | | | | ")
            lines.append(
                f"{head}| {table} | {_fmt(t.get('n_tup_ins'), '.2f')} "
                f"| {_fmt(t.get('n_tup_upd'), '.2f')} | {_fmt(t.get('n_tup_hot_upd'), '.2f')} "
                f"| {_fmt(t.get('hot_ratio'), '.0%')} | {_fmt(t.get('non_hot_upd'), '.2f')} "
                f"| {_fmt(t.get('n_tup_del'), '.2f')} | {_fmt(t.get('n_dead_tup'), '.2f')} |")
    by_index = [(name, cell["index_entries_by_index"]) for name, cell in summary["cells"].items()
                if cell.get("index_entries_by_index")]
    for name, entries in by_index:
        lines.append("")
        lines.append(f"index entries per job, drain of {name}: " + ", ".join(
            f"{index} {n:.2f}" for index, n in entries.items() if n >= 0.005))
    return lines


def latency_lines(results: dict[str, Any]) -> list[str]:
    """Claim latency at size vs empty, for leaseq and PgQueuer when measured."""
    lines: list[str] = []
    for key, who in (("claim_latency", "leaseq"), ("pgqueuer_claim_latency", "PgQueuer")):
        latency = results.get(key)
        if latency:
            ready = latency.get("ready_backlog", latency["ready_rows"])
            p99 = (f", p99 {latency['empty']['p99_ms']:.2f}"
                   if "p99_ms" in latency["empty"] else "")
            p99_size = (f", p99 {latency['finished']['p99_ms']:.2f}"
                        if "p99_ms" in latency["finished"] else "")
            lines += ["",
                      f"claim latency of {who} (batch 10, 1 worker, {latency['samples']} "
                      f"claims{', interleaved' if latency.get('interleaved') else ''}): "
                      f"empty {latency['empty']['median_ms']:.2f} ms median "
                      f"(p95 {latency['empty']['p95_ms']:.2f}{p99}), "
                      f"{latency['finished_rows']:,} finished + {ready:,} ready "
                      f"{latency['finished']['median_ms']:.2f} ms median "
                      f"(p95 {latency['finished']['p95_ms']:.2f}{p99_size}); "
                      f"ratio {latency['ratio']:.2f}"
                      + (f" (p95 {latency['p95_ratio']:.2f})" if "p95_ratio" in latency else "")]
    return lines


def wal_table(results: dict[str, Any], name: str = "leaseq@c4", top: int = 12) -> list[str]:
    """Where leaseq's WAL goes, per relation and record type (median-rate run)."""
    runs = results["runs"].get(name) or []
    runs = [r for r in runs if r.get("wal") and "by_record" in (r["wal"].get("breakdown") or {})]
    if not runs:
        return []
    runs.sort(key=lambda r: r["jobs_per_s"])
    run = runs[len(runs) // 2]
    jobs = run["jobs"]
    lines = [f"WAL of {name} by relation and record type (bytes per job; run at "
             f"{run['jobs_per_s']:,.0f} jobs/s):", "",
             "| Relation | Record | records/job | bytes/job | of which FPI |",
             "|---|---|--:|--:|--:|"]
    for rec in run["wal"]["breakdown"]["by_record"][:top]:
        lines.append(
            f"| {rec['relation'] or '–'} | {rec['rmgr']}/{rec['record_type']} "
            f"| {rec['records'] / jobs:.2f} | {rec['bytes'] / jobs:,.0f} "
            f"| {rec['fpi_bytes'] / jobs:,.0f} |")
    by_rel = run["wal"]["breakdown"]["by_relation"]
    lines += ["", "per relation (bytes/job): " + ", ".join(
        f"{rel} {b / jobs:,.0f}" for rel, b in by_rel.items())]
    return lines
