"""The local Lambda service: functions, their warm environments, concurrency, async queue.

This is the part of Lambda that sits between the Invoke API and the execution
environments:

* **Concurrency.** A function with ``ReservedConcurrentExecutions`` never runs more
  environments at once than its reservation; the others share an account-wide limit
  (``unreserved_concurrency``, 10 unless set; AWS's default is 1000). A synchronous
  invoke beyond the limit is throttled at once (429, ``TooManyRequestsException``).
* **Warm reuse.** A finished environment goes back to its function's pool and takes the
  next invocation without init; one that timed out, crashed or failed to init is gone,
  so the next invocation is a cold start.
* **No orphans.** A watchdog process (watchdog.py) kills every environment left when
  the service dies without closing them (frozen ones would never notice).
* **Asynchronous invokes** (``Event``) are accepted at once into an in-memory queue per
  function and run when a slot is free, in the order they came (a retry goes to the
  back). A function error (a timeout included) is retried ``MaximumRetryAttempts`` times
  (0..2, default 2) after ``async_retry_delays`` (Lambda waits about one, then two
  minutes); an event older than ``MaximumEventAgeInSeconds`` is dropped unrun, whether it
  waits for a slot or for its retry. Delivery is at least
  once: a retried event may already have had its effect (an invocation that timed out
  after its side effects, say), as in AWS, so functions must be idempotent. The queue
  lives in memory: events still queued when the service stops are dropped and counted.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from leaseq_lambda_local.environment import ExecutionEnvironment, Invocation, Outcome
from leaseq_lambda_local.template import FunctionSpec, function_arn
from leaseq_lambda_local.watchdog import Watchdog

DEFAULT_UNRESERVED_CONCURRENCY = 10
#: Lambda's pause before the first and the second retry of a failed asynchronous event.
DEFAULT_ASYNC_RETRY_DELAYS = (60.0, 120.0)
#: Failed asynchronous events kept for /local/stats.
FAILED_EVENTS_KEPT = 50

ThrottleReason = Literal["ReservedFunctionConcurrentInvocationLimitExceeded",
                         "ConcurrentInvocationLimitExceeded"]


class Throttled(Exception):
    """No concurrency left for a synchronous invoke."""

    def __init__(self, function: str, reason: ThrottleReason) -> None:
        super().__init__(f"{function}: {reason}")
        self.function = function
        self.reason = reason


class ServiceClosed(Exception):
    """The service is stopping and takes no more invocations."""


@dataclass(frozen=True)
class LocalFunction:
    """A function of the template with the environment it runs with here."""

    spec: FunctionSpec
    environment: Mapping[str, str]


@dataclass
class AsyncEvent:
    """One queued asynchronous invocation."""

    request_id: str
    payload: bytes
    received: float
    trace_id: str
    source: str = "invoke"
    attempts: int = 0
    not_before: float = 0.0


@dataclass
class FunctionStats:
    """Per-function counters, as /local/stats shows them."""

    invocations: int = 0
    sync_invocations: int = 0
    async_accepted: int = 0
    async_attempts: int = 0
    async_retries: int = 0
    async_succeeded: int = 0
    async_dropped_age: int = 0
    async_dropped_retries: int = 0
    async_dropped_shutdown: int = 0
    scheduled: int = 0
    cold_starts: int = 0
    timeouts: int = 0
    function_errors: int = 0
    init_errors: int = 0
    throttles: int = 0
    concurrency_in_use: int = 0
    peak_concurrency: int = 0
    duration_ms_total: float = 0.0
    failed_async_events: deque[dict[str, Any]] = field(
        default_factory=lambda: deque(maxlen=FAILED_EVENTS_KEPT))


class _Function:
    def __init__(self, local: LocalFunction, arn: str) -> None:
        self.spec = local.spec
        self.environment = local.environment
        self.arn = arn
        self.idle: list[ExecutionEnvironment] = []
        self.environments: set[ExecutionEnvironment] = set()
        self.queue: deque[AsyncEvent] = deque()
        self.stats = FunctionStats()


@dataclass(frozen=True)
class ServiceSettings:
    """How the service behaves where Lambda has account settings or fixed delays."""

    region: str = "us-east-1"
    account: str = "123456789012"
    unreserved_concurrency: int = DEFAULT_UNRESERVED_CONCURRENCY
    async_retry_delays: tuple[float, ...] = DEFAULT_ASYNC_RETRY_DELAYS
    freeze: bool = True
    python: str = field(default_factory=lambda: sys.executable)


def trace_id() -> str:
    """An X-Ray trace header of the shape Lambda passes to the runtime."""
    epoch = f"{int(time.time()):08x}"
    return f"Root=1-{epoch}-{uuid.uuid4().hex[:24]};Parent={uuid.uuid4().hex[:16]};Sampled=0"


class LambdaService:
    """Runs the functions; the Invoke API (``invoke_api.py``) and schedules call it."""

    def __init__(self, functions: Mapping[str, LocalFunction], settings: ServiceSettings,
                 *, environment_for: Callable[[LocalFunction], Mapping[str, str]],
                 log: Callable[[str, str], None]) -> None:
        """``environment_for`` gives a function's full process environment at cold start
        (it knows the service's endpoint); ``log(function, line)`` takes every line."""
        self.settings = settings
        self._functions = {name: _Function(f, function_arn(name, settings.region,
                                                           settings.account))
                           for name, f in functions.items()}
        self._names: dict[str, str] = {}
        for name, function in self._functions.items():
            self._names[name] = name
            for alias in function.spec.aliases:
                self._names[alias] = name
        self._environment_for = environment_for
        self._log = log
        self._cond = threading.Condition()
        self._unreserved_in_use = 0
        self._closing = False
        self._runs: set[threading.Thread] = set()
        self._dispatcher = threading.Thread(target=self._dispatch, name="lambda-async",
                                            daemon=True)
        self._started = time.monotonic()
        self._watchdog = Watchdog(settings.python)
        self._dispatcher.start()

    # Lookup -------------------------------------------------------------------------------

    def resolve(self, name: str) -> str | None:
        """The function a name (or alias) means, or None."""
        return self._names.get(name)

    def arn(self, name: str) -> str:
        """The local ARN of a function."""
        return self._functions[name].arn

    @property
    def function_names(self) -> list[str]:
        """The template's functions, in template order."""
        return list(self._functions)

    def spec(self, name: str) -> FunctionSpec:
        """The definition a function runs with."""
        return self._functions[name].spec

    # Concurrency ----------------------------------------------------------------------

    def _try_acquire(self, function: _Function) -> ThrottleReason | None:
        """Take a slot (holding the condition); the throttle reason when there is none."""
        reserved = function.spec.reserved_concurrency
        stats = function.stats
        if reserved is not None:
            if stats.concurrency_in_use >= reserved:
                return "ReservedFunctionConcurrentInvocationLimitExceeded"
        else:
            if self._unreserved_in_use >= self.settings.unreserved_concurrency:
                return "ConcurrentInvocationLimitExceeded"
            self._unreserved_in_use += 1
        stats.concurrency_in_use += 1
        stats.peak_concurrency = max(stats.peak_concurrency, stats.concurrency_in_use)
        return None

    def _release(self, function: _Function) -> None:
        function.stats.concurrency_in_use -= 1
        if function.spec.reserved_concurrency is None:
            self._unreserved_in_use -= 1
        self._cond.notify_all()

    def _environment(self, function: _Function) -> ExecutionEnvironment:
        """A warm environment, or a new one (a cold start on first use)."""
        while function.idle:
            environment = function.idle.pop()
            if environment.alive:
                return environment
            function.environments.discard(environment)
        name = function.spec.name

        def log(line: str) -> None:
            self._log(name, line)

        environment = ExecutionEnvironment(
            function.spec, self._environment_for(LocalFunction(function.spec,
                                                               function.environment)),
            python=self.settings.python, freeze=self.settings.freeze, log=log,
            on_start=self._watchdog.watch, on_close=self._watchdog.forget)
        function.environments.add(environment)
        return environment

    def _run(self, function: _Function, invocation: Invocation) -> Outcome:
        """Run on an environment; the caller holds a slot, released here."""
        with self._cond:
            environment = self._environment(function)
        try:
            outcome = environment.invoke(invocation)
        except Exception:
            environment.close()
            with self._cond:
                function.environments.discard(environment)
                self._release(function)
            raise
        with self._cond:
            stats = function.stats
            stats.invocations += 1
            stats.cold_starts += int(outcome.cold_start)
            stats.timeouts += int(outcome.timed_out)
            stats.function_errors += int(outcome.function_error)
            stats.init_errors += int(outcome.init_error)
            stats.duration_ms_total += outcome.duration_ms
            keep = environment.alive and not self._closing
            if keep:
                function.idle.append(environment)
            else:
                function.environments.discard(environment)
            self._release(function)
        if not keep:
            environment.close()
        return outcome

    # Invocations -------------------------------------------------------------------------

    def invoke(self, name: str, payload: bytes, *, request_id: str | None = None,
               client_context: str | None = None, trace: str | None = None) -> Outcome:
        """A synchronous (RequestResponse) invoke; raises Throttled when no slot is free."""
        function = self._functions[name]
        with self._cond:
            if self._closing:
                raise ServiceClosed(name)
            reason = self._try_acquire(function)
            if reason is not None:
                function.stats.throttles += 1
                raise Throttled(name, reason)
            function.stats.sync_invocations += 1
        return self._run(function, Invocation(request_id or str(uuid.uuid4()), payload,
                                              function.arn, trace or trace_id(),
                                              client_context))

    def submit(self, name: str, payload: bytes, *, request_id: str | None = None,
               trace: str | None = None, source: str = "invoke") -> str:
        """An asynchronous (Event) invoke: queued, run later; returns the request id."""
        function = self._functions[name]
        event = AsyncEvent(request_id or str(uuid.uuid4()), payload, time.monotonic(),
                           trace or trace_id(), source)
        with self._cond:
            if self._closing:
                raise ServiceClosed(name)
            function.queue.append(event)
            function.stats.async_accepted += 1
            function.stats.scheduled += int(source == "schedule")
            self._cond.notify_all()
        return event.request_id

    def _drop(self, function: _Function, event: AsyncEvent, reason: str,
              detail: str | None = None) -> None:
        stats = function.stats
        if reason == "age":
            stats.async_dropped_age += 1
        elif reason == "retries":
            stats.async_dropped_retries += 1
        else:
            stats.async_dropped_shutdown += 1
        stats.failed_async_events.append({
            "request_id": event.request_id, "reason": reason, "attempts": event.attempts,
            "source": event.source, "error": detail})
        self._log(function.spec.name, f"async event {event.request_id} dropped: {reason} "
                  f"after {event.attempts} attempt(s)" + (f" ({detail})" if detail else ""))

    def _dispatch(self) -> None:
        """Start queued events while slots are free; drop those past their age."""
        with self._cond:
            while not self._closing:
                now = time.monotonic()
                wake = now + 1.0
                for function in self._functions.values():
                    max_age = function.spec.max_event_age_seconds
                    full = False
                    for event in list(function.queue):
                        if now - event.received > max_age:
                            function.queue.remove(event)
                            self._drop(function, event, "age")
                            continue
                        if event.not_before > now:
                            wake = min(wake, event.not_before)
                            continue
                        # No slot: the rest wait, but are still checked for their age.
                        full = full or self._try_acquire(function) is not None
                        if full:
                            continue
                        function.queue.remove(event)
                        run = threading.Thread(target=self._run_async, args=(function, event),
                                               name=f"lambda-event-{function.spec.name}",
                                               daemon=True)
                        self._runs.add(run)
                        run.start()
                self._cond.wait(timeout=max(0.01, wake - time.monotonic()))

    def _run_async(self, function: _Function, event: AsyncEvent) -> None:
        event.attempts += 1
        try:
            with self._cond:
                function.stats.async_attempts += 1
            outcome = self._run(function, Invocation(event.request_id, event.payload,
                                                     function.arn, event.trace_id))
        except Exception as exc:  # the environment could not even start
            outcome = Outcome(json.dumps({"errorMessage": str(exc)}).encode(),
                              type(exc).__name__)
        finally:
            with self._cond:
                self._runs.discard(threading.current_thread())
        with self._cond:
            if not outcome.function_error:
                function.stats.async_succeeded += 1
            elif self._closing:
                self._drop(function, event, "shutdown", outcome.error_type)
            elif event.attempts <= function.spec.max_retry_attempts:
                delays = self.settings.async_retry_delays or (0.0,)
                event.not_before = time.monotonic() + delays[min(event.attempts - 1,
                                                                 len(delays) - 1)]
                function.stats.async_retries += 1
                function.queue.append(event)
                self._cond.notify_all()
            else:
                self._drop(function, event, "retries", outcome.error_type)

    # Observability ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters per function, for ``GET /local/stats`` (a local-only extra)."""
        with self._cond:
            functions: dict[str, Any] = {}
            for name, function in self._functions.items():
                counters = {k: v for k, v in function.stats.__dict__.items()
                            if k != "failed_async_events"}
                functions[name] = {
                    **counters,
                    "duration_ms_total": round(function.stats.duration_ms_total, 1),
                    "gb_seconds": round(function.stats.duration_ms_total / 1000
                                        * function.spec.memory_mb / 1024, 3),
                    "queued_async_events": len(function.queue),
                    "reserved_concurrency": function.spec.reserved_concurrency,
                    "warm_environments": sum(1 for e in function.environments if e.alive),
                    "environments": [
                        {"id": e.id, "pid": e.pid, "state": e.state,
                         "invocations": e.invocations}
                        for e in function.environments],
                    "failed_async_events": list(function.stats.failed_async_events),
                }
            return {"uptime_seconds": round(time.monotonic() - self._started, 3),
                    "unreserved_concurrency": self.settings.unreserved_concurrency,
                    "functions": functions}

    def idle(self) -> bool:
        """Nothing queued and nothing running (what a test waits for)."""
        with self._cond:
            return all(not f.queue and f.stats.concurrency_in_use == 0
                       for f in self._functions.values())

    # Shutdown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the queue, kill every environment (busy ones too), wait for the threads."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            for function in self._functions.values():
                while function.queue:
                    self._drop(function, function.queue.popleft(), "shutdown")
            environments = [e for f in self._functions.values() for e in f.environments]
            self._cond.notify_all()
        self._dispatcher.join(timeout=5)
        for environment in environments:
            environment.close()
        with self._cond:
            runs = list(self._runs)
        for run in runs:
            run.join(timeout=5)
        self._watchdog.close()
