"""The dashboard's HTTP routes, on Powertools' ``LambdaFunctionUrlResolver``.

One code path for AWS and the local command: a function URL event comes in (from Lambda,
or translated from a local HTTP request by :mod:`leaseq_dashboard.local`), the caller's
IAM principal is looked up in the :class:`AccessPolicy`, and the page is rendered from
the :class:`leaseq.read.views.QueueViews` that suit the viewer: operator views for operators
and viewers, tenant views (row-level security) for a tenant's viewer.

Routes (all HTML; every POST needs the CSRF token and the operator role):

``GET  /``                       overview: depth per tenant and kind, activity charts
``GET  /jobs``                   a state's list: filters, keyset pages, bulk actions
``GET  /jobs/<id>``              a job: payload, result, last error, every event
``POST /actions/<redrive|cancel>`` first the confirmation page, then (``confirmed=yes``)
                                 the action, audited with the operator as actor
``GET  /static/dashboard.css``   the only asset (no script anywhere)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from urllib.parse import parse_qs, urlencode
from uuid import UUID

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver, Response
from aws_lambda_powertools.shared.cookies import Cookie, SameSite
from jinja2 import Environment, PackageLoader, select_autoescape
from leaseq import InvalidRequestError, LeaseqError
from leaseq.read.views import STATES, Cursor, JobFilter, OperatorViews, QueueViews, TenantViews

from leaseq_dashboard import charts, csrf
from leaseq_dashboard.access import AccessDeniedError, AccessPolicy, Viewer, principal_of
from leaseq_dashboard.paths import same_origin_path

PAGE_SIZE = 50
#: The overview's time windows: label -> (window, buckets). The charts count every job
#: finished in the window, so their cost grows with the window's traffic; at a million
#: jobs a day a week would take about a second (docs/benchmarks.md, "Dashboard"). Longer
#: trends are the CloudWatch dashboard's job.
WINDOWS: dict[str, tuple[timedelta, int]] = {
    "1h": (timedelta(hours=1), 12),
    "6h": (timedelta(hours=6), 24),
    "24h": (timedelta(hours=24), 24),
}
ACTIONS = {"redrive": "dead", "cancel": "pending, retry_wait or running"}
MAX_SELECTED = 500
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make forms post Origin: null
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}


class ViewSource(Protocol):
    """Where a request gets its views: one connection per role, owned by the caller."""

    def operator(self) -> OperatorViews:
        """Views over the operator connection (leaseq_operator: every tenant, actions)."""
        ...

    def tenant(self, tenant_id: UUID) -> TenantViews:
        """Views over the tenant reader connection, for this tenant."""
        ...


class BadRequestError(Exception):
    """A query parameter or form field the page cannot use (answered with 400)."""


# Formatting, as template filters ---------------------------------------------------------


def _age(value: timedelta | None) -> str:
    if value is None:
        return "–"
    seconds = int(value.total_seconds())
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            rest = seconds % size
            small = {"d": 3600, "h": 60, "m": 1}[unit]
            return f"{sign}{seconds // size}{unit}{rest // small:02d}" if rest // small else \
                f"{sign}{seconds // size}{unit}"
    return f"{sign}{seconds}s"


def _since(value: datetime | None) -> str:
    return "–" if value is None else _age(datetime.now(UTC) - value)


def _until(value: datetime | None) -> str:
    return "–" if value is None else _age(value - datetime.now(UTC))


def _when(value: datetime | None) -> str:
    return "–" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _seconds(value: float) -> str:
    return _age(timedelta(seconds=value)) if value >= 1 else f"{value * 1000:.0f}ms"


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("leaseq_dashboard", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(age=_age, since=_since, until=_until, when=_when, pretty=_pretty)
    return env


# Parsing ---------------------------------------------------------------------------------


def _uuid(value: str | None, name: str) -> UUID | None:
    if value is None or not value.strip():
        return None
    try:
        return UUID(value.strip())
    except ValueError:
        raise BadRequestError(f"{name} must be a UUID (got {value!r})") from None


def _text(value: str | None) -> str | None:
    return value.strip() if value and value.strip() else None


_UNITS = {"m": 60, "h": 3600, "d": 86400}


def _time(value: str | None, name: str) -> datetime | None:
    """An absolute time (ISO 8601, UTC unless it says otherwise) or an age like 30m."""
    text = _text(value)
    if text is None:
        return None
    if text[-1:] in _UNITS and text[:-1].isdigit():
        return datetime.now(UTC) - timedelta(seconds=int(text[:-1]) * _UNITS[text[-1]])
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequestError(
            f"{name} must be a time such as 2026-12-01T09:00 or an age such as 30m, 6h, "
            f"2d (got {text!r})") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _cursor(value: str | None) -> Cursor | None:
    text = _text(value)
    if text is None:
        return None
    at, _, job = text.partition("~")
    moment = _time(at, "after")
    job_id = _uuid(job, "after")
    if moment is None or job_id is None:
        raise BadRequestError("after must be a sort time and a job id (use the Next link)")
    return Cursor(moment, job_id)


def _form(body: str | None) -> dict[str, list[str]]:
    return parse_qs(body or "", keep_blank_values=True, max_num_fields=MAX_SELECTED + 10)


def _first(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


# The application -------------------------------------------------------------------------


def build(source: ViewSource, policy: AccessPolicy, *, secure_cookies: bool = True,
          now: Callable[[], datetime] = lambda: datetime.now(UTC),
          identify: Callable[[Mapping[str, Any]], str | None] = principal_of,
          ) -> LambdaFunctionUrlResolver:
    """The resolver with every route; ``source`` gives each request its views.

    ``identify`` reads the caller's principal from the event: the deployed dashboard
    passes :meth:`leaseq_dashboard.origin.FunctionUrlOrigin.principal`, which refuses an
    event without the function URL's shape (403) before any page runs."""
    app = LambdaFunctionUrlResolver()
    env = _environment()

    def viewer() -> Viewer:
        return policy.viewer(identify(app.current_event.raw_event))

    def views(who: Viewer) -> QueueViews:
        if who.role == "tenant":
            assert who.tenant_id is not None
            return source.tenant(who.tenant_id)
        return source.operator()

    def query(name: str) -> str | None:
        return app.current_event.get_query_string_value(name)

    def cookies() -> dict[str, str]:
        found: dict[str, str] = {}
        for item in app.current_event.cookies or []:
            name, _, value = item.partition("=")
            found[name.strip()] = value.strip()
        return found

    def html(template: str, status: int = 200, **context: Any) -> Response[str]:
        token = csrf.cookie_token(cookies())
        fresh = token is None
        token = token or csrf.new_token()
        who: Viewer | None = context.pop("who", None)
        body = env.get_template(template).render(
            who=who, csrf_token=token, states=STATES, now=now(), **context)
        jar = [Cookie(csrf.COOKIE, token, path="/", secure=secure_cookies, http_only=True,
                      same_site=SameSite.STRICT_MODE)] if fresh else []
        return Response(status, "text/html; charset=utf-8", body, dict(SECURITY_HEADERS),
                        cookies=jar)

    def redirect(location: str) -> Response[str]:
        return Response(303, "text/plain; charset=utf-8", "", {
            **SECURITY_HEADERS, "Location": location})

    def _denied(exc: AccessDeniedError) -> Response[str]:
        return html("error.html", 403, title="Not allowed", message=str(exc))

    def _bad(exc: BadRequestError) -> Response[str]:
        return html("error.html", 400, title="Bad request", message=str(exc))

    def _invalid(exc: InvalidRequestError) -> Response[str]:
        return html("error.html", 400, title="Bad request", message=str(exc))

    def _failed(exc: LeaseqError) -> Response[str]:
        return html("error.html", 503, title="The database did not answer",
                    message=str(exc))

    for error_type, handler in ((AccessDeniedError, _denied), (BadRequestError, _bad),
                                (InvalidRequestError, _invalid), (LeaseqError, _failed)):
        app.exception_handler(error_type)(handler)

    @app.not_found
    def _missing(exc: Exception) -> Response[str]:
        return html("error.html", 404, title="Not found",
                    message=f"no page at {app.current_event.path}")

    @app.get("/static/dashboard.css")
    def _css() -> Response[str]:
        css = env.loader.get_source(env, "dashboard.css")[0] if env.loader else ""
        return Response(200, "text/css; charset=utf-8", css, {
            **SECURITY_HEADERS, "Cache-Control": "max-age=300"})

    @app.get("/")
    def overview() -> Response[str]:
        who = viewer()
        tenant = _uuid(query("tenant"), "tenant")
        kind = _text(query("kind"))
        window_name = query("window") or "24h"
        if window_name not in WINDOWS:
            raise BadRequestError(f"window must be one of {', '.join(WINDOWS)}")
        window, buckets = WINDOWS[window_name]
        v = views(who)
        depth = v.queue_depth(tenant, kind, 20)
        activity = v.job_activity(tenant, kind, window=window, buckets=buckets, samples=20)
        total = next((r for r in depth if r["dimension"] == "total"), None)
        labels = [_label(r["bucket_start"], window) for r in activity]
        throughput = charts.stacked_bars(
            "Finished jobs", labels,
            [("succeeded", "succeeded"), ("dead", "dead"), ("cancelled", "cancelled")],
            [{k: float(r[k]) for k in ("succeeded", "dead", "cancelled")} for r in activity])
        failure = charts.lines(
            "Failure rate", labels,
            [("dead_share", "dead"), ("retried_share", "needed a retry (sampled)")],
            [{"dead_share": charts.share(r["dead"], r["succeeded"] + r["dead"]),
              "retried_share": charts.share(r["samples_retried"], r["samples"])}
             for r in activity], lambda v: f"{v * 100:.0f}%")
        latency = charts.lines(
            "Enqueue to start", labels, [("p50", "p50"), ("p95", "p95")],
            [{"p50": _secs(r["latency_p50"]), "p95": _secs(r["latency_p95"])}
             for r in activity], _seconds)
        return html("overview.html", who=who, total=total,
                    kinds=[r for r in depth if r["dimension"] == "kind"],
                    tenants=[r for r in depth if r["dimension"] == "tenant"],
                    charts=[throughput, failure, latency], windows=list(WINDOWS),
                    window=window_name, filters={"tenant": tenant, "kind": kind},
                    activity_totals=_totals(activity), limits=v.limit_status())

    @app.get("/jobs")
    def job_list() -> Response[str]:
        who = viewer()
        wanted = _uuid(query("id"), "job id")
        if wanted is not None:
            return redirect(f"/jobs/{wanted}")
        state = query("state") or "dead"
        if state not in STATES:
            raise BadRequestError(f"state must be one of {', '.join(STATES)} (got {state!r})")
        where = JobFilter(state, _uuid(query("tenant"), "tenant"), _text(query("kind")),
                          _time(query("since"), "since"), _time(query("until"), "until"))
        after = _cursor(query("after"))
        rows = views(who).list_jobs(where, after, PAGE_SIZE + 1)
        more, rows = len(rows) > PAGE_SIZE, rows[:PAGE_SIZE]
        params = {k: query(k) for k in ("state", "tenant", "kind", "since", "until")
                  if _text(query(k))}
        params["state"] = state
        next_link = None
        if more:
            last = rows[-1]
            next_link = "/jobs?" + urlencode({
                **params, "after": f"{last['sort_at'].isoformat()}~{last['id']}"})
        first_link = "/jobs?" + urlencode(params) if after else None
        action = {"dead": "redrive", "pending": "cancel", "retry_wait": "cancel",
                  "running": "cancel"}.get(state)
        return html("jobs.html", who=who, rows=rows, state=state, where=where,
                    params=params, next_link=next_link, first_link=first_link,
                    action=action if who.may_act else None, notice=query("done"))

    @app.get("/schedules")
    def schedule_list() -> Response[str]:
        who = viewer()
        return html("schedules.html", who=who, schedules=views(who).list_schedules())

    @app.get("/queues")
    def queue_list() -> Response[str]:
        who = viewer()
        found = views(who).list_queues()
        rows = None if found is None else [q.as_dict(now()) for q in found]
        return html("queues.html", who=who, queues=rows, notice=query("done"))

    @app.post("/queues/<queue>/<change>")
    def queue_change(queue: str, change: str) -> Response[str]:
        who = viewer()
        if change not in ("pause", "resume"):
            raise BadRequestError(f"no queue action {change!r}: pause or resume")
        form = _form(app.current_event.decoded_body)
        refused = csrf.check(cookie=csrf.cookie_token(cookies()),
                             submitted=_first(form, csrf.FIELD),
                             headers=app.current_event.headers)
        if refused:
            return html("error.html", 403, who=who, title="Refused", message=refused)
        if not who.may_act:
            return html("error.html", 403, who=who, title="Not allowed", message=(
                f"{who.principal} is a {who.role} here: only operators may {change} queues"))
        reason = _text(_first(form, "reason"))
        if reason is not None and len(reason) > 500:
            raise BadRequestError("the reason is at most 500 characters")
        operator = source.operator()
        state = (operator.pause_queue(who.actor, queue, reason) if change == "pause"
                 else operator.resume_queue(who.actor, queue))
        notice = (f"paused queue {state.queue}: its jobs are not claimed until it is resumed; "
                  "running jobs finish" if state.paused
                  else f"resumed queue {state.queue}")
        return redirect(f"/queues?{urlencode({'done': notice})}")

    @app.get("/jobs/<job_id>")
    def job_page(job_id: str) -> Response[str]:
        who = viewer()
        wanted = _uuid(job_id, "job id")
        assert wanted is not None
        v = views(who)
        job = v.get_job(wanted)
        if job is None:
            return html("error.html", 404, who=who, title="No such job",
                        message=f"no job {wanted} (or not one you may see)")
        events = v.job_timeline(wanted)
        wait = v.job_wait(wanted)
        action = None
        if who.may_act:
            action = {"dead": "redrive", "pending": "cancel", "retry_wait": "cancel",
                      "running": "cancel"}.get(job["state"])
            if job["state"] == "running" and job.get("cancel_requested_at") is not None:
                action = None  # asked already: the job ends at its worker's next step
        return html("job.html", who=who, job=job, events=events, wait=wait, action=action,
                    notice=query("done"))

    @app.post("/actions/<name>")
    def act(name: str) -> Response[str]:
        who = viewer()
        if name not in ACTIONS:
            raise BadRequestError(f"no action {name!r}")
        form = _form(app.current_event.decoded_body)
        refused = csrf.check(cookie=csrf.cookie_token(cookies()),
                             submitted=_first(form, csrf.FIELD),
                             headers=app.current_event.headers)
        if refused:
            return html("error.html", 403, who=who, title="Refused", message=refused)
        if not who.may_act:
            return html("error.html", 403, who=who, title="Not allowed", message=(
                f"{who.principal} is a {who.role} here: only operators may {name} jobs"))
        ids = list(dict.fromkeys(u for u in (_uuid(i, "job id") for i in form.get("job", []))
                                 if u is not None))
        if not ids:
            raise BadRequestError("select at least one job")
        if len(ids) > MAX_SELECTED:
            raise BadRequestError(f"at most {MAX_SELECTED} jobs at once")
        reason = _text(_first(form, "reason"))
        if reason is not None and len(reason) > 500:
            raise BadRequestError("the reason is at most 500 characters")
        back = _text(_first(form, "back")) or "/jobs"
        if same_origin_path(back) is None:
            raise BadRequestError(f"back must be a path on this dashboard, such as "
                                  f"/jobs?state=dead (got {back[:100]!r})")
        if _first(form, "confirmed") != "yes":
            return html("confirm.html", who=who, action=name, ids=ids, reason=reason,
                        back=back, applies_to=ACTIONS[name])
        operator = source.operator()
        call = operator.redrive_jobs if name == "redrive" else operator.cancel_jobs
        done = call(who.actor, ids, reason)
        skipped = len(ids) - len(done)
        requested = sum(1 for row in done if row.get("state") == "running")
        notice = f"{name}: {len(done) - requested} job(s)" + (
            f", cancel requested for {requested} running job(s): each ends cancelled at "
            "its worker's next lease renewal or outcome" if requested else "") + (
            f", {skipped} skipped (no longer {ACTIONS[name]})" if skipped else "")
        separator = "&" if "?" in back else "?"
        return redirect(f"{back}{separator}{urlencode({'done': notice})}")

    return app


def _secs(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _label(start: datetime, window: timedelta) -> str:
    start = start.astimezone(UTC)
    return start.strftime("%m-%d %H:%M" if window > timedelta(days=1) else "%H:%M")


def _totals(activity: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("succeeded", "dead", "cancelled")
    sums: dict[str, Any] = {k: sum(int(r[k]) for r in activity) for k in keys}
    finished = sums["succeeded"] + sums["dead"]
    sums["failure_rate"] = charts.share(sums["dead"], finished)
    p95 = [r["latency_p95"] for r in activity if r["latency_p95"] is not None]
    sums["worst_p95"] = max(p95) if p95 else None
    return sums


def handle(app: LambdaFunctionUrlResolver, event: Mapping[str, Any], context: Any
           ) -> dict[str, Any]:
    """Resolve one function URL event (the Lambda handler and the local server call this)."""
    return app.resolve(dict(event), context)
