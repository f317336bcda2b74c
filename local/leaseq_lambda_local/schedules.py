"""The template's schedules, fired as EventBridge would: asynchronous invokes on a rate.

Each enabled ``rate(...)`` schedule fires every period (``every`` overrides every
rate's period, to scale time in tests and demos), first one period after the service starts,
as an ``Event`` invoke through the same queue as any other asynchronous invoke:

* ``ScheduleV2`` (EventBridge Scheduler) sends its ``Input`` with the context attributes
  filled in (``<aws.scheduler.scheduled-time>``, ``<aws.scheduler.schedule-arn>``,
  ``<aws.scheduler.execution-id>``, ``<aws.scheduler.attempt-number>``); without an
  Input, ``{}``;
* ``Schedule`` (an EventBridge rule) sends its ``Input``, or else the
  ``"detail-type": "Scheduled Event"`` envelope.

``cron(...)`` expressions are not fired locally; the service says so when it starts.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from leaseq_lambda_local.template import Schedule

Submit = Callable[[str, bytes], None]


@dataclass
class _Timer:
    function: str
    schedule: Schedule
    period: float
    next_at: float


def schedule_event(function: str, schedule: Schedule, when: datetime, *, region: str,
                   account: str) -> bytes:
    """The payload a schedule delivers at ``when``."""
    stamp = when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    arn = (f"arn:aws:scheduler:{region}:{account}:schedule/default/"
           f"{function}-{schedule.event_name}")
    if schedule.input is not None:
        text = schedule.input
        if schedule.kind == "ScheduleV2":
            for key, value in (("scheduled-time", stamp), ("schedule-arn", arn),
                               ("execution-id", str(uuid.uuid4())),
                               ("attempt-number", "1")):
                text = text.replace(f"<aws.scheduler.{key}>", value)
        return text.encode()
    if schedule.kind == "ScheduleV2":
        return b"{}"
    return json.dumps({
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event",
        "source": "aws.events", "account": account, "time": stamp, "region": region,
        "resources": [f"arn:aws:events:{region}:{account}:rule/{function}-"
                      f"{schedule.event_name}"],
        "detail": {}}).encode()


class Scheduler:
    """A thread that fires every due schedule; ``stop()`` ends it."""

    def __init__(self, schedules: list[tuple[str, Schedule]], submit: Submit, *,
                 every: float | None, region: str, account: str) -> None:
        now = time.monotonic()
        self.timers = [
            _Timer(function, schedule, every or period, now + (every or period))
            for function, schedule in schedules
            if schedule.enabled and (period := schedule.period_seconds)]
        self._submit = submit
        self._region = region
        self._account = account
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lambda-schedules", daemon=True)

    def start(self) -> None:
        """Start firing (nothing to do without timers)."""
        if self.timers:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for timer in self.timers:
                if timer.next_at <= now:
                    payload = schedule_event(timer.function, timer.schedule, datetime.now(UTC),
                                             region=self._region, account=self._account)
                    try:
                        self._submit(timer.function, payload)
                    except Exception:  # a stopping service refuses; the loop ends below
                        return
                    # Fixed rate from the first due time: a slow submit never piles up.
                    while timer.next_at <= now:
                        timer.next_at += timer.period
            wait = min(t.next_at for t in self.timers) - time.monotonic()
            self._stop.wait(timeout=max(0.01, min(wait, 1.0)))

    def stop(self) -> None:
        """Stop firing and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
