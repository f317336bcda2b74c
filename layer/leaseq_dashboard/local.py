"""Serve the dashboard on this machine: local HTTP requests become function URL events.

So the local page runs exactly the code that runs behind the Lambda function URL: the
same resolver, the same access policy, the same CSRF checks. What Lambda would put in
the request context (the caller's IAM principal) is filled in from the local identity
the server was started with.

The server listens on 127.0.0.1 only and answers one request at a time, like one Lambda
execution environment: the connections a :class:`ConnectionViewSource` holds are never
used by two requests at once. Only the OS user who started it gets past its door: on
Linux a connection another user opened is refused (:mod:`leaseq_dashboard.peer`), and
every request must name this server as its Host and bring the run's key or the cookie
it gives (:mod:`leaseq_dashboard.local_door`), before the pages see it. Written on the
standard library's ``http.server`` (no web framework needed: all it does is check the
door, translate a request and write the response back).
"""

from __future__ import annotations

import base64
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit
from uuid import UUID

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver
from leaseq.read.views import OperatorViews, TenantViews
from leaseq.store.client import DEFAULT_MAX_IDLE_SECONDS, QueueClient
from leaseq.store.db import Connection
from leaseq.store.duties import OperatorClient, ReaderClient

from leaseq_dashboard import peer
from leaseq_dashboard.app import handle
from leaseq_dashboard.local_door import LOOPBACK, Admitted, Answer, LocalDoor

MAX_BODY = 1 << 20
#: Seconds a connection may take to send its request (one slow client blocks the rest).
REQUEST_TIMEOUT = 30.0


class ConnectionViewSource:
    """Views over two clients, each with one lazily opened connection, checked before
    each request and reopened when it has gone bad or idle (:class:`QueueClient`).

    ``operator_connect`` opens an operator (leaseq_operator) connection; ``reader_connect`` a tenant
    reader's (None when no tenant viewer is configured: asking for tenant views then
    fails, since a tenant's viewer must never be served through the operator's rights).
    """

    def __init__(self, operator_connect: Callable[[], Connection],
                 reader_connect: Callable[[], Connection] | None = None, *,
                 max_idle_seconds: float = DEFAULT_MAX_IDLE_SECONDS) -> None:
        # A connection idle for long may have been cut while a Lambda environment was
        # frozen: each client pings it after max_idle_seconds and reconnects if it must.
        self._operator = QueueClient(operator_connect, max_idle_seconds=max_idle_seconds)
        self._reader = None if reader_connect is None else QueueClient(
            reader_connect, max_idle_seconds=max_idle_seconds)
        self.max_idle_seconds = max_idle_seconds

    def operator(self) -> OperatorViews:
        """Views over the operator connection."""
        self._operator.check()
        return OperatorViews(OperatorClient(self._operator))

    def tenant(self, tenant_id: UUID) -> TenantViews:
        """Views over the tenant reader connection, for ``tenant_id``."""
        if self._reader is None:
            raise RuntimeError("no tenant reader connection is configured "
                               "(LEASEQ_DASHBOARD_READER_URL or _SECRET_ARN)")
        self._reader.check()
        return TenantViews(ReaderClient(self._reader), tenant_id)

    def close(self) -> None:
        """Close whatever is open."""
        self._operator.close()
        if self._reader is not None:
            self._reader.close()


def function_url_event(method: str, target: str, headers: dict[str, str], body: bytes,
                       principal: str | None, *, source_ip: str = LOOPBACK) -> dict[str, Any]:
    """The Lambda function URL event (payload 2.0) for one HTTP request."""
    parts = urlsplit(target)
    lowered = {k.lower(): v for k, v in headers.items()}
    cookies = [c.strip() for c in lowered.pop("cookie", "").split(";") if c.strip()]
    query: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        query[key] = f"{query[key]},{value}" if key in query else value
    now = datetime.now(UTC)
    text_body = body.decode("utf-8", errors="replace")
    authorizer = {"iam": {"userArn": principal, "accessKey": None, "accountId": None,
                          "callerId": None, "userId": None}} if principal else None
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": parts.path or "/",
        "rawQueryString": parts.query,
        "cookies": cookies,
        "headers": lowered,
        "queryStringParameters": query or None,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "local",
            "authorizer": authorizer,
            "domainName": lowered.get("host", LOOPBACK),
            "domainPrefix": "local",
            "http": {"method": method, "path": parts.path or "/", "protocol": "HTTP/1.1",
                     "sourceIp": source_ip, "userAgent": lowered.get("user-agent", "")},
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(now.timestamp() * 1000),
        },
        "body": text_body or None,
        "isBase64Encoded": False,
    }


def another_users_connection(client: tuple[str, int], server: tuple[str, int]) -> str | None:
    """Why the connection is refused when another OS user opened it, else None.

    Where the platform cannot tell (no ``/proc/net/tcp``), None: the key is the barrier.
    """
    try:
        uid = peer.peer_uid(client, server)
    except LookupError as exc:
        return f"this connection's owner could not be found ({exc})"
    if uid is None or uid == os.geteuid():
        return None
    return (f"this dashboard belongs to another OS user; connections of uid {uid} are "
            "refused")


def _handler_class(app: LambdaFunctionUrlResolver, principal: str | None, door: LocalDoor,
                   log: Callable[[str], None]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """Check the door, translate, resolve, write back."""

        server_version = "leaseq-dashboard"
        timeout = REQUEST_TIMEOUT

        def _answer(self, answer: Answer) -> None:
            # Read what was sent first: closing on unread bytes resets the connection,
            # and the client would lose the answer that says why it was refused.
            length = self.headers.get("content-length") or "0"
            if length.isdigit() and int(length) <= MAX_BODY:
                self.rfile.read(int(length))
            data = answer.body.encode()
            self.send_response(answer.status)
            for name, value in answer.all_headers():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            log(f"{self.command} {urlsplit(self.path).path} {answer.status} (door)")

        def _serve(self) -> None:
            client = (str(self.client_address[0]), int(self.client_address[1]))
            foreign = another_users_connection(client, (LOOPBACK, door.port))
            if foreign is not None:
                self._answer(Answer(403, f"Refused: {foreign}.\n"))
                return
            passed = door.admit(self.command, self.path, self.headers.items())
            if not isinstance(passed, Admitted):
                self._answer(passed)
                return
            length = int(self.headers.get("content-length") or 0)
            if length > MAX_BODY:
                self.send_error(413, "request body too large")
                return
            body = self.rfile.read(length) if length else b""
            event = function_url_event(self.command, self.path, passed.headers,
                                       body, principal, source_ip=self.client_address[0])
            started = time.perf_counter()
            response = handle(app, event, None)
            elapsed = (time.perf_counter() - started) * 1000
            payload = response.get("body") or ""
            data = base64.b64decode(payload) if response.get("isBase64Encoded") \
                else str(payload).encode()
            self.send_response(int(response.get("statusCode", 500)))
            for name, value in (response.get("headers") or {}).items():
                self.send_header(name, str(value))
            for name, values in (response.get("multiValueHeaders") or {}).items():
                for value in values:
                    self.send_header(name, str(value))
            for cookie in response.get("cookies") or []:
                self.send_header("Set-Cookie", cookie)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            log(f"{self.command} {self.path} {response.get('statusCode')} {elapsed:.0f} ms")

        do_GET = _serve
        do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            """Requests are logged once, by _serve, with their time."""

    return Handler


class LocalServer:
    """The dashboard on http://127.0.0.1:PORT (port 0 picks a free one), behind its door."""

    def __init__(self, app: LambdaFunctionUrlResolver, *, principal: str | None,
                 port: int = 0, log: Callable[[str], None] = lambda line: None) -> None:
        # Bound first: the door needs the port (0 is chosen by the kernel), the handler
        # needs the door.
        self.httpd = HTTPServer((LOOPBACK, port), BaseHTTPRequestHandler)
        self.door = LocalDoor(int(self.httpd.server_address[1]))
        self.httpd.RequestHandlerClass = _handler_class(app, principal, self.door, log)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where the dashboard answers (a browser needs :attr:`login_url` first)."""
        return self.door.url

    @property
    def login_url(self) -> str:
        """The URL with this run's key: print it to the operator, nowhere else."""
        return self.door.login_url

    def serve_forever(self) -> None:
        """Answer requests until interrupted (the command's foreground loop)."""
        self.httpd.serve_forever()

    def start(self) -> LocalServer:
        """Answer requests on a background thread (tests, benchmarks)."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
