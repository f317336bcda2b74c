"""One execution environment: a process running the real runtime interface client.

The process is ``python -m awslambdaric <handler>`` (the client AWS publishes on PyPI),
started in the function's code folder with the environment Lambda gives a function
(``AWS_LAMBDA_RUNTIME_API``, ``LAMBDA_TASK_ROOT``, ``_HANDLER``, ``AWS_LAMBDA_FUNCTION_*``,
``AWS_REGION``...). It imports the handler once (init) and then serves one invocation
at a time for as long as it stays warm, exactly as in Lambda:

* **Deadline.** Each invocation's ``Lambda-Runtime-Deadline-Ms`` is the moment it is
  handed to the runtime plus the function's timeout, so
  ``context.get_remaining_time_in_millis()`` counts down from the timeout.
* **Timeout.** At the deadline the whole process group is killed (SIGKILL: no callback,
  no ``finally``, as when Lambda resets an environment) and the invocation fails with
  ``Task timed out after N seconds``; the next invocation starts a new process.
* **Freeze.** Between invocations the process is stopped (SIGSTOP) once it asks for the
  next event, and continued when one comes: threads a handler left running do not run
  while idle, as in Lambda.
* **Errors.** A handler error and an init error are relayed as the runtime reports them
  (``errorType``, ``errorMessage``, ``stackTrace``); a process that dies mid-invocation
  is ``Runtime.ExitError``. After an init error or a death the environment is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Literal

from leaseq_lambda_local.runtime_api import RuntimeApiServer
from leaseq_lambda_local.template import FunctionSpec

#: Lambda's bound on the init phase; a slower init is retried within the function's
#: timeout (here: init may take the longer of the two).
INIT_LIMIT_SECONDS = 10.0
#: How long a killed process may take to be reaped before close() moves on.
REAP_SECONDS = 5.0

LogLine = Callable[[str], None]
State = Literal["new", "initialising", "idle", "busy", "dead"]


@dataclass
class Invocation:
    """One invocation on its way to a runtime (the Runtime API's view of it)."""

    request_id: str
    payload: bytes
    function_arn: str
    trace_id: str
    client_context: str | None = None
    deadline_epoch_ms: int = 0


@dataclass(frozen=True)
class Outcome:
    """What an invocation came to, in the Invoke API's terms."""

    payload: bytes
    #: None on success; else the function error's type (the header says Unhandled).
    error_type: str | None = None
    timed_out: bool = False
    #: The environment did not survive (timeout, init error, crash): next is cold.
    environment_lost: bool = False
    cold_start: bool = False
    #: The handler could not be loaded (the runtime posted /init/error).
    init_error: bool = False
    duration_ms: float = 0.0
    init_duration_ms: float | None = None

    @property
    def function_error(self) -> bool:
        """True when Lambda would set ``X-Amz-Function-Error``."""
        return self.error_type is not None


def _error_payload(error_type: str, message: str) -> bytes:
    return json.dumps({"errorType": error_type, "errorMessage": message}).encode()


def timeout_payload(request_id: str, timeout_seconds: float) -> bytes:
    """Lambda's answer for an invocation that ran out of time."""
    return _error_payload("Sandbox.Timedout", f"RequestId: {request_id} Error: Task timed "
                          f"out after {timeout_seconds:.2f} seconds")


def _error_type(body: bytes) -> str | None:
    """The ``errorType`` of an error payload (the header only ever says Unhandled)."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    found = document.get("errorType") if isinstance(document, dict) else None
    return str(found) if found else None


def _exit_description(code: int) -> str:
    if code < 0:
        return f"signal: {signal.strsignal(-code) or -code}".lower()
    return f"exit status {code}"


@dataclass
class _Shared:
    """State the invoking thread, the Runtime API threads and the reader share."""

    delivery: Invocation | None = None
    current: str | None = None
    handed_over: str | None = None
    deadline: float = 0.0
    result: tuple[bytes, str | None] | None = None
    init_error: tuple[bytes, str | None] | None = None
    exit_code: int | None = None
    waiting_for_next: bool = False
    frozen: bool = False
    closing: bool = False
    init_done_at: float | None = None
    log_tail: list[str] = field(default_factory=list)


class ExecutionEnvironment:
    """A process and its Runtime API; ``invoke`` runs one invocation in it."""

    def __init__(self, spec: FunctionSpec, environment: Mapping[str, str], *, python: str,
                 log: LogLine, freeze: bool = True,
                 on_start: Callable[[int], None] | None = None,
                 on_close: Callable[[int], None] | None = None) -> None:
        """``on_start`` / ``on_close`` get the process group when it starts and once it
        has been killed by close() (the watchdog's bookkeeping)."""
        self.spec = spec
        self._on_start = on_start
        self._on_close = on_close
        self.id = uuid.uuid4().hex[:12]
        self._environment = dict(environment)
        self._python = python
        self._log = log
        self._freeze = freeze
        self._cond = threading.Condition()
        self._shared = _Shared()
        self._process: subprocess.Popen[bytes] | None = None
        self._server: RuntimeApiServer | None = None
        self._threads: list[threading.Thread] = []
        self.state: State = "new"
        self.invocations = 0
        self.started_at: float | None = None

    # Process ----------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The runtime's process id once started."""
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        """Still able to take another invocation (warm)."""
        return self.state in ("new", "idle")

    def _spawn(self) -> None:
        self._server = RuntimeApiServer(self)
        serve = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                 name=f"runtime-api-{self.spec.name}-{self.id}", daemon=True)
        serve.start()
        now = datetime.now(UTC)
        env = {
            **self._environment,
            "AWS_LAMBDA_RUNTIME_API": self._server.address,
            "_HANDLER": self.spec.handler,
            "AWS_LAMBDA_LOG_STREAM_NAME": f"{now:%Y/%m/%d}/[$LATEST]{self.id}",
        }
        self._process = subprocess.Popen(
            [self._python, "-m", "awslambdaric", self.spec.handler],
            cwd=self.spec.code_dir, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = time.monotonic()
        if self._on_start is not None:
            self._on_start(self._process.pid)
        assert self._process.stdout is not None
        reader = threading.Thread(target=self._read_output, args=(self._process.stdout,),
                                  name=f"runtime-out-{self.spec.name}-{self.id}", daemon=True)
        reader.start()
        self._threads = [serve, reader]

    def _read_output(self, stream: IO[bytes]) -> None:
        """Copy the runtime's stdout/stderr to the log, then note how it ended."""
        for raw in iter(stream.readline, b""):
            # The runtime ends the lines of one error report with \r (one log event).
            lines = raw.decode("utf-8", "replace").rstrip("\r\n").split("\r")
            for line in lines:
                self._log(line)
            with self._cond:
                tail = self._shared.log_tail
                tail.extend(lines)
                del tail[:-50]
        assert self._process is not None
        code = self._process.wait()
        with self._cond:
            self._shared.exit_code = code
            self._cond.notify_all()

    def _kill(self) -> None:
        """SIGKILL the whole process group: a stopped or busy process dies at once."""
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        """Kill the process, stop its Runtime API, wait (bounded) for both."""
        with self._cond:
            first = not self._shared.closing
            self._shared.closing = True
            self.state = "dead"
            self._kill()
            self._cond.notify_all()
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=REAP_SECONDS)
            if first and self._on_close is not None:
                self._on_close(self._process.pid)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=REAP_SECONDS)

    def recent_output(self) -> list[str]:
        """The runtime's last lines of output, for error messages and tests."""
        with self._cond:
            return list(self._shared.log_tail)

    # The Runtime API's side --------------------------------------------------------------

    def next_invocation(self) -> Invocation | None:
        """Called by GET /next: freeze until an invocation comes, then hand it over."""
        with self._cond:
            shared = self._shared
            if shared.init_done_at is None:
                shared.init_done_at = time.monotonic()
            shared.waiting_for_next = True
            self._cond.notify_all()
            if shared.delivery is None and self._freeze and not shared.closing:
                self._signal(signal.SIGSTOP)
                shared.frozen = True
            while shared.delivery is None and not shared.closing:
                self._cond.wait(timeout=1.0)
            if shared.closing:
                return None
            delivery, shared.delivery = shared.delivery, None
            assert delivery is not None
            shared.waiting_for_next = False
            shared.deadline = time.monotonic() + self.spec.timeout_seconds
            delivery.deadline_epoch_ms = int(time.time() * 1000) + self.spec.timeout_seconds * 1000
            shared.current = shared.handed_over = delivery.request_id
            self._cond.notify_all()
            return delivery

    def invocation_result(self, request_id: str, body: bytes, error_type: str | None) -> bool:
        """Called by POST .../response or .../error."""
        with self._cond:
            if request_id != self._shared.current:
                return False
            self._shared.result = (body, error_type)
            self._shared.current = None
            self._cond.notify_all()
            return True

    def init_error(self, body: bytes, error_type: str | None) -> None:
        """Called by POST /init/error."""
        with self._cond:
            self._shared.init_error = (body, error_type)
            self._cond.notify_all()

    def _signal(self, signum: int) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signum)

    # Invoking -----------------------------------------------------------------------------

    def invoke(self, invocation: Invocation) -> Outcome:
        """Run one invocation (starting the process first on a cold start)."""
        if not self.alive:
            raise RuntimeError(f"environment {self.id} is {self.state}")
        cold = self.state == "new"
        started = time.monotonic()
        if cold:
            self.state = "initialising"
            self._spawn()
        self._log(f"START RequestId: {invocation.request_id} Version: $LATEST")
        with self._cond:
            self.state = "busy"
            self.invocations += 1
            shared = self._shared
            shared.result = None
            if shared.frozen:
                self._signal(signal.SIGCONT)
                shared.frozen = False
            shared.delivery = invocation
            self._cond.notify_all()
            outcome = self._await(invocation, started, cold)
        if outcome.environment_lost:
            self.close()
        else:
            self.state = "idle"
        self._report(invocation.request_id, outcome)
        return outcome

    def _await(self, invocation: Invocation, started: float, cold: bool) -> Outcome:
        """Wait (holding the condition) for init, then for the result or the deadline."""
        shared = self._shared
        request_id = invocation.request_id
        timeout = self.spec.timeout_seconds
        init_by = started + max(INIT_LIMIT_SECONDS, float(timeout))

        def lost(payload: bytes, error_type: str, *, timed_out: bool = False,
                 init_error: bool = False) -> Outcome:
            self._kill()
            self.state = "dead"
            return Outcome(payload, error_type, timed_out=timed_out, environment_lost=True,
                           cold_start=cold, init_error=init_error,
                           duration_ms=(time.monotonic() - started) * 1000,
                           init_duration_ms=self._init_ms(cold))

        while shared.handed_over != request_id:
            if shared.init_error is not None:
                body, error_type = shared.init_error
                return lost(body, _error_type(body) or error_type or "Runtime.Unknown",
                            init_error=True)
            if shared.exit_code is not None:
                return lost(_error_payload("Runtime.ExitError", f"RequestId: {request_id} "
                            f"Error: Runtime exited with error: "
                            f"{_exit_description(shared.exit_code)}"), "Runtime.ExitError")
            remaining = init_by - time.monotonic()
            if remaining <= 0:
                return lost(timeout_payload(request_id, timeout), "Sandbox.Timedout",
                            timed_out=True)
            self._cond.wait(timeout=min(remaining, 1.0))
        handed_at = time.monotonic()
        while shared.result is None:
            if shared.exit_code is not None or shared.closing:
                description = _exit_description(shared.exit_code) \
                    if shared.exit_code is not None else "signal: killed"
                return lost(_error_payload("Runtime.ExitError", f"RequestId: {request_id} "
                            f"Error: Runtime exited with error: {description}"),
                            "Runtime.ExitError")
            remaining = shared.deadline - time.monotonic()
            if remaining <= 0:
                shared.current = None
                return lost(timeout_payload(request_id, timeout), "Sandbox.Timedout",
                            timed_out=True)
            self._cond.wait(timeout=remaining)
        body, error_type = shared.result
        if error_type is not None:
            error_type = _error_type(body) or error_type
        return Outcome(body, error_type, cold_start=cold,
                       duration_ms=(time.monotonic() - handed_at) * 1000,
                       init_duration_ms=self._init_ms(cold))

    def _init_ms(self, cold: bool) -> float | None:
        done = self._shared.init_done_at
        if not cold or done is None or self.started_at is None:
            return None
        return (done - self.started_at) * 1000

    def _report(self, request_id: str, outcome: Outcome) -> None:
        if outcome.timed_out:
            self._log(f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%S.%f}"[:-3] + f"Z {request_id} "
                      f"Task timed out after {self.spec.timeout_seconds:.2f} seconds")
        self._log(f"END RequestId: {request_id}")
        init = "" if outcome.init_duration_ms is None else \
            f"\tInit Duration: {outcome.init_duration_ms:.2f} ms"
        self._log(f"REPORT RequestId: {request_id}\tDuration: {outcome.duration_ms:.2f} ms\t"
                  f"Billed Duration: {int(-(-outcome.duration_ms // 1))} ms\t"
                  f"Memory Size: {self.spec.memory_mb} MB{init}")
