"""The elastic benchmark's tables: medians of the runs, ratios, and the targets."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

EFFICIENCY_TARGET = 0.70
P50_TARGET_S = 0.5
P99_TARGET_S = 2.0

LINE_LABELS = {
    "fanout-cold": "leaseq, fan-out, cold environments",
    "fanout-warm": "leaseq, fan-out, warm environments",
    "fanout": "leaseq, fan-out + wake",
    "scheduled": "leaseq, scheduled-only",
    "pgqueuer": "PgQueuer 1.6.0",
}


def seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


def median(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _med(runs: list[dict[str, Any]], pick: Callable[[dict[str, Any]], Any]) -> float | None:
    values = []
    for run in runs:
        try:
            values.append(pick(run))
        except (KeyError, TypeError):
            continue
    return median(values)


def _range(runs: list[dict[str, Any]], pick: Callable[[dict[str, Any]], Any],
           fmt: Callable[[float | None], str] = seconds) -> str:
    values = [v for v in (pick(r) for r in runs) if v is not None]
    if len(values) < 2:
        return ""
    return f" ({fmt(min(values))}–{fmt(max(values))})"


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _other_load(run: dict[str, Any]) -> float | None:
    """Cores the rest of the machine used during the window (someone else's work)."""
    cpu = run.get("cpu")
    if not cpu or not cpu.get("seconds"):
        return None
    ours = cpu["clients_s"] + cpu["orchestrator_s"] + (cpu["server_s"] or 0)
    return max(cpu["machine_busy_s"] - ours, 0.0) / cpu["seconds"]


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Medians per line and the ratios the docs quote."""
    summary: dict[str, Any] = {"backlog": {}, "latency": {}, "idle": {}}
    for line, runs in results.get("backlog", {}).items():
        summary["backlog"][line] = {
            key: _med(runs, lambda r, k=key: r[k]) for key in (
                "drain_s", "ideal_s", "efficiency", "full_concurrency_s", "ninety_percent_s",
                "peak_concurrency", "first_start_s", "gb_s_per_1000_jobs")}
        summary["backlog"][line]["other_load_cores"] = _med(runs, _other_load)
        summary["backlog"][line]["client_cpu_ms_per_job"] = _med(
            runs, lambda r: r["cpu"]["clients_s"] * 1000 / r["jobs"])
        summary["backlog"][line]["server_cpu_ms_per_job"] = _med(
            runs, lambda r: r["cpu"]["server_s"] * 1000 / r["jobs"])
        summary["backlog"][line]["peak_connections"] = max(
            r["connections"]["system_peak"] for r in runs)
        summary["backlog"][line]["budget"] = runs[0]["connections"]["budget"]
        summary["backlog"][line]["runs"] = len(runs)
    pgq = summary["backlog"].get("pgqueuer")
    for line in ("fanout-cold", "fanout-warm"):
        fan = summary["backlog"].get(line)
        if fan and pgq and fan["drain_s"] and pgq["drain_s"]:
            summary.setdefault("backlog_drain_ratio_vs_pgqueuer", {})[line] = (
                fan["drain_s"] / pgq["drain_s"])
    for key, runs in results.get("latency", {}).items():
        summary["latency"][key] = {
            q: _med(runs, lambda r, q=q: r["latency"][q]) for q in ("p50", "p95", "p99", "max")}
        summary["latency"][key].update({
            "jobs": _med(runs, lambda r: r["jobs"]),
            "peak_connections": max(r["connections"]["system_peak"] for r in runs),
            "budget": runs[0]["connections"]["budget"],
            "gb_s_per_1000_jobs": _med(runs, lambda r: r.get("gb_s_per_1000_jobs")),
            "invocations": _med(runs, lambda r: sum(
                f["invocations"] for f in r["lambda"].values()) if "lambda" in r else None),
            "wakes": _med(runs, lambda r: r.get("wakes_started")),
            "runs": len(runs)})
    summary["idle"] = {line: {k: r[k] for k in (
        "gb_s_per_hour", "worker_gb_s_per_hour", "invocations_per_hour", "queries_per_hour",
        "queries_counted_by")} for line, r in results.get("idle", {}).items()}
    return summary


def render(results: dict[str, Any]) -> str:
    setup = results["setup"]
    args = setup["args"]
    server = setup["server"]
    summary = summarise(results)
    out: list[str] = []
    target = setup["target_concurrency"]
    out.append(f"{server['version'].split(',')[0]} at {server.get('address', '?')}, "
               f"{server['cpus']} CPUs ({server.get('cpu_model', '?')}); source "
               f"{setup['source']}; MaxWorkers {args['max_workers']} x concurrency "
               f"{args['concurrency']} = {target}; handler {args['handler_ms']:g} ms; "
               f"median of {args['repeat']} runs")
    if not setup.get("fanout_available"):
        out.append("NOTE: this checkout has no fan-out: the fan-out lines ran scheduled-only.")
    backlog = results.get("backlog", {})
    if backlog:
        jobs = args["jobs"]
        out.append("")
        out.append(f"Backlog: {jobs:,} jobs x {args['handler_ms']:g} ms, ideal "
                   f"{jobs * args['handler_ms'] / 1000 / target:.2f} s")
        out.append("")
        out.append("| System | drain (min–max) | efficiency | full concurrency "
                   f"({target}) | 90% | peak at once | first job | peak connections "
                   "(budget) | GB-s / 1,000 jobs | client / server CPU ms per job | other "
                   "load |")
        out.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for line, runs in backlog.items():
            s = summary["backlog"][line]
            gb_s = _num(s["gb_s_per_1000_jobs"], 2) if line != "pgqueuer" else "–"
            out.append(
                f"| {LINE_LABELS.get(line, line)} | {seconds(s['drain_s'])}"
                f"{_range(runs, lambda r: r['drain_s'])} | "
                f"{_num((s['efficiency'] or 0) * 100)}% | {seconds(s['full_concurrency_s'])} | "
                f"{seconds(s['ninety_percent_s'])} | {_num(s['peak_concurrency'])} | "
                f"{seconds(s['first_start_s'])} | {s['peak_connections']} "
                f"({s['budget']}) | {gb_s} | {_num(s['client_cpu_ms_per_job'], 3)} / "
                f"{_num(s['server_cpu_ms_per_job'], 3)} | {_num(s['other_load_cores'], 2)} |")
        ratios = summary.get("backlog_drain_ratio_vs_pgqueuer") or {}
        if ratios:
            out.append("")
        for line, ratio in ratios.items():
            out.append(f"drain time of {LINE_LABELS[line]} / PgQueuer's: {ratio:.2f}")
    latency = results.get("latency", {})
    if latency:
        out.append("")
        out.append(f"Latency: Poisson arrivals for {args['duration']:g} s, enqueue-to-start")
        out.append("")
        out.append("| System | rate | jobs | p50 | p95 | p99 | max | peak connections (budget) "
                   "| invocations | wakes | GB-s / 1,000 jobs |")
        out.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for key, runs in latency.items():
            line, _, rate = key.partition("@")
            s = summary["latency"][key]
            out.append(
                f"| {LINE_LABELS.get(line, line)} | {rate}/s | {_num(s['jobs'])} | "
                f"{seconds(s['p50'])}{_range(runs, lambda r: r['latency'].get('p50'))} | "
                f"{seconds(s['p95'])} | {seconds(s['p99'])}"
                f"{_range(runs, lambda r: r['latency'].get('p99'))} | {seconds(s['max'])} | "
                f"{s['peak_connections']} ({s['budget']}) | {_num(s['invocations'])} | "
                f"{_num(s['wakes'])} | {_num(s['gb_s_per_1000_jobs'], 2)} |")
        out.append("")
        for key, runs in latency.items():
            if not key.startswith("pgqueuer"):
                out.append(f"enqueue ({key}): {runs[0]['enqueue']}")
    idle = results.get("idle", {})
    if idle:
        out.append("")
        out.append("Empty queue, the template's schedules (scaled to an hour)")
        out.append("")
        out.append("| Mode | invocations / h | Lambda GB-s / h | of which worker | "
                   "queries / h |")
        out.append("|---|--:|--:|--:|--:|")
        for line, r in idle.items():
            out.append(f"| {LINE_LABELS.get(line, line)} | {r['invocations_per_hour']:.0f} | "
                       f"{r['gb_s_per_hour']:.1f} | {r['worker_gb_s_per_hour']:.1f} | "
                       f"{r['queries_per_hour']:.0f} |")
        method = next(iter(idle.values()))["queries_counted_by"]
        out.append("")
        out.append(f"queries counted by {method}")
    verdicts = targets(summary)
    if verdicts:
        out.append("")
        out.append("| Target | Measured | Target | Met |")
        out.append("|---|--:|--:|:-:|")
        for name, measured, limit, met in verdicts:
            out.append(f"| {name} | {measured} | {limit} | {'yes' if met else '**no**'} |")
    return "\n".join(out)


def targets(summary: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    rows: list[tuple[str, str, str, bool]] = []
    for line in ("fanout-cold", "fanout-warm"):
        fan = summary["backlog"].get(line)
        if fan and fan["efficiency"] is not None:
            rows.append((f"backlog efficiency (ideal / drain), {line}",
                         f"{fan['efficiency']:.0%}", f">= {EFFICIENCY_TARGET:.0%}",
                         fan["efficiency"] >= EFFICIENCY_TARGET))
    for key, s in summary["latency"].items():
        if not key.startswith("fanout@"):
            continue
        rate = key.partition("@")[2]
        if s["p50"] is not None:
            rows.append((f"p50 enqueue-to-start at {rate}/s (fan-out + wake)", seconds(s["p50"]),
                         f"<= {seconds(P50_TARGET_S)}", s["p50"] <= P50_TARGET_S))
        if s["p99"] is not None:
            rows.append((f"p99 enqueue-to-start at {rate}/s (fan-out + wake)", seconds(s["p99"]),
                         f"<= {seconds(P99_TARGET_S)}", s["p99"] <= P99_TARGET_S))
    for scenario in ("backlog", "latency"):
        for key, s in summary[scenario].items():
            if s.get("budget") is None:
                continue
            rows.append((f"peak connections, {scenario} {key}", str(s["peak_connections"]),
                         f"<= {s['budget']}", s["peak_connections"] <= s["budget"]))
    return rows
