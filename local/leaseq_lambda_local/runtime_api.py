"""The Lambda Runtime API (version 2018-06-01) that one execution environment talks to.

Every execution environment gets a server of its own on an ephemeral port of
127.0.0.1, named in its ``AWS_LAMBDA_RUNTIME_API``: the runtime interface client reads
that variable once, and its native HTTP client cannot carry a path prefix, so one port
per environment is how invocations stay apart (a killed environment's server simply
goes away with it).

Routes, as the runtime interface client uses them:

* ``GET /2018-06-01/runtime/invocation/next``: blocks until the service hands this
  environment an invocation; answers with the event and the ``Lambda-Runtime-*`` headers
  (request id, deadline in epoch milliseconds, invoked function ARN, trace id, client
  context);
* ``POST /2018-06-01/runtime/invocation/{id}/response`` and ``.../error``: the result,
  answered 202; an id that is not the current invocation's gets 400;
* ``POST /2018-06-01/runtime/init/error``: the handler could not be loaded; 202.

The standard library's ThreadingHTTPServer is enough here and adds no dependency: four
routes, one client, HTTP/1.1 keep-alive with explicit lengths.
"""

from __future__ import annotations

import json
import re
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

PREFIX = "/2018-06-01/runtime"
_RESULT = re.compile(rf"^{PREFIX}/invocation/([^/]+)/(response|error)$")


class Delivery(Protocol):
    """An invocation as the runtime receives it."""

    request_id: str
    payload: bytes
    deadline_epoch_ms: int
    function_arn: str
    trace_id: str
    client_context: str | None


class RuntimeSide(Protocol):
    """What the Runtime API asks of its execution environment."""

    def next_invocation(self) -> Delivery | None:
        """Block until there is an invocation; None when the environment is closing."""

    def invocation_result(self, request_id: str, body: bytes, error_type: str | None) -> bool:
        """Record a result (``error_type`` set for /error); False for an unknown id."""

    def init_error(self, body: bytes, error_type: str | None) -> None:
        """Record that the runtime failed to initialise."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are separate writes: without TCP_NODELAY every answer would wait
    # for the peer's delayed ACK (about 40 ms).
    disable_nagle_algorithm = True
    server: RuntimeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        return  # the environment's own output is what the developer wants to read

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
              ) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _error(self, status: int, error_type: str, message: str) -> None:
        self._send(status, json.dumps({"errorType": error_type,
                                       "errorMessage": message}).encode())

    def do_GET(self) -> None:
        if self.path != f"{PREFIX}/invocation/next":
            self._error(HTTPStatus.NOT_FOUND, "NotFound", f"no route {self.path}")
            return
        delivery = self.server.side.next_invocation()
        if delivery is None:
            self._error(HTTPStatus.GONE, "EnvironmentClosing", "the environment is closing")
            self.close_connection = True
            return
        headers = {
            "Lambda-Runtime-Aws-Request-Id": delivery.request_id,
            "Lambda-Runtime-Deadline-Ms": str(delivery.deadline_epoch_ms),
            "Lambda-Runtime-Invoked-Function-Arn": delivery.function_arn,
            "Lambda-Runtime-Trace-Id": delivery.trace_id,
        }
        if delivery.client_context:
            headers["Lambda-Runtime-Client-Context"] = delivery.client_context
        self._send(HTTPStatus.OK, delivery.payload, headers)

    def do_POST(self) -> None:
        body = self._body()
        error_type = self.headers.get("Lambda-Runtime-Function-Error-Type")
        if self.path == f"{PREFIX}/init/error":
            self.server.side.init_error(body, error_type)
            self._send(HTTPStatus.ACCEPTED, b'{"status":"OK"}')
            return
        match = _RESULT.match(self.path)
        if match is None:
            self._error(HTTPStatus.NOT_FOUND, "NotFound", f"no route {self.path}")
            return
        request_id, kind = match.groups()
        accepted = self.server.side.invocation_result(
            request_id, body, (error_type or "Unhandled") if kind == "error" else None)
        if accepted:
            self._send(HTTPStatus.ACCEPTED, b'{"status":"OK"}')
        else:
            self._error(HTTPStatus.BAD_REQUEST, "InvalidRequestID",
                        f"{request_id} is not the current invocation")


class RuntimeApiServer(ThreadingHTTPServer):
    """The Runtime API of one execution environment, on 127.0.0.1 and a free port."""

    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that went away mid-answer (a killed runtime, a client that gave up) is
        expected; anything else is reported as usual."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def __init__(self, side: RuntimeSide) -> None:
        self.side = side
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def address(self) -> str:
        """``host:port``, the form ``AWS_LAMBDA_RUNTIME_API`` takes."""
        return f"127.0.0.1:{self.server_address[1]}"
