"""The Lambda Invoke API over HTTP on 127.0.0.1, as boto3's Lambda client speaks it.

``POST /2015-03-31/functions/{FunctionName}/invocations`` with
``X-Amz-Invocation-Type``:

* ``RequestResponse`` (the default): runs the function and answers 200 with its payload;
  a function error adds ``X-Amz-Function-Error: Unhandled`` with the runtime's
  ``errorType`` / ``errorMessage`` payload; no concurrency left is 429
  ``TooManyRequestsException`` with its ``Reason``;
* ``Event``: 202 at once; the event is queued (see service.py);
* ``DryRun``: 204 once the name resolves.

``FunctionName`` may be a name (``WorkerFunction``), a name with a qualifier
(``WorkerFunction:$LATEST``), a partial ARN (``123456789012:function:WorkerFunction``) or a
full ARN; ``?Qualifier=`` is honoured. Only ``$LATEST`` exists locally. Errors carry
``x-amzn-ErrorType`` and a JSON body, so botocore raises the modelled exceptions
(``ResourceNotFoundException``, ``TooManyRequestsException``, ...).

Local-only extras, never part of AWS's API: ``GET /local/stats`` (per-function counters)
and ``GET /local/health``.

Written on the standard library's ThreadingHTTPServer: one route family, JSON bodies with
explicit lengths, and no framework worth a dependency for that.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import sys
import threading
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from leaseq_lambda_local.service import LambdaService, ServiceClosed, Throttled

#: The Invoke API's payload bounds (synchronous request and response; asynchronous event).
MAX_SYNC_PAYLOAD = 6 * 1024 * 1024
MAX_ASYNC_PAYLOAD = 1024 * 1024
_INVOKE = re.compile(r"^/2015-03-31/functions/([^/]+)/invocations$")
_PARTIAL_ARN = re.compile(r"^(\d{12}):function:(.+)$")


class ApiError(Exception):
    """An error answer of the Invoke API."""

    def __init__(self, status: int, error_type: str, message: str,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.extra = extra or {}


def parse_function_name(raw: str, qualifier: str | None, *, region: str,
                        account: str) -> tuple[str, str | None]:
    """Split what boto3 sends into (name, qualifier), checking an ARN's region/account."""
    text = unquote(raw)
    found_region, found_account = region, account
    if text.startswith("arn:"):
        parts = text.split(":")
        if len(parts) not in (7, 8) or parts[2] != "lambda" or parts[5] != "function":
            raise ApiError(HTTPStatus.BAD_REQUEST, "InvalidParameterValueException",
                           f"not a function ARN: {text}")
        found_region, found_account = parts[3], parts[4]
        name, from_name = parts[6], (parts[7] if len(parts) == 8 else None)
    else:
        partial = _PARTIAL_ARN.match(text)
        if partial is not None:
            found_account, text = partial.group(1), partial.group(2)
        name, _, rest = text.partition(":")
        from_name = rest or None
    if (found_region, found_account) != (region, account):
        raise ApiError(HTTPStatus.NOT_FOUND, "ResourceNotFoundException",
                       f"Function not found: {text} (this service is {region}, account "
                       f"{account})")
    if from_name and qualifier and from_name != qualifier:
        raise ApiError(HTTPStatus.BAD_REQUEST, "InvalidParameterValueException",
                       "The derived qualifier from the function name does not match the "
                       "specified qualifier.")
    return name, from_name or qualifier


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are separate writes: without TCP_NODELAY every answer would wait
    # for the peer's delayed ACK (about 40 ms).
    disable_nagle_algorithm = True
    server: InvokeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
              ) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if status != HTTPStatus.NO_CONTENT:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and status != HTTPStatus.NO_CONTENT:
            self.wfile.write(body)

    def _fail(self, error: ApiError, request_id: str) -> None:
        body = {"Type": "User", "message": error.message, **error.extra}
        self._send(error.status, json.dumps(body).encode(),
                   {"x-amzn-ErrorType": error.error_type, "x-amzn-RequestId": request_id})

    def _json(self, document: Any) -> None:
        self._send(HTTPStatus.OK, json.dumps(document, indent=1).encode())

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/local/stats":
            self._json(self.server.service.stats())
        elif path == "/local/health":
            self._json({"status": "ok", "functions": self.server.service.function_names})
        else:
            self._fail(ApiError(HTTPStatus.NOT_FOUND, "UnknownOperationException",
                                f"no operation GET {path}"), str(uuid.uuid4()))

    def do_POST(self) -> None:
        request_id = str(uuid.uuid4())
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            status, payload, headers = self._invoke(body, request_id)
        except ApiError as error:
            self._fail(error, request_id)
            return
        self._send(status, payload, {"x-amzn-RequestId": request_id, **headers})

    def _invoke(self, body: bytes, request_id: str) -> tuple[int, bytes, dict[str, str]]:
        url = urlsplit(self.path)
        match = _INVOKE.match(url.path)
        if match is None:
            raise ApiError(HTTPStatus.NOT_FOUND, "UnknownOperationException",
                           f"no operation POST {url.path}")
        service = self.server.service
        qualifiers = parse_qs(url.query).get("Qualifier") or []
        name, qualifier = parse_function_name(match.group(1),
                                              qualifiers[0] if qualifiers else None,
                                              region=service.settings.region,
                                              account=service.settings.account)
        function = service.resolve(name)
        if function is None or qualifier not in (None, "$LATEST"):
            shown = f"{name}:{qualifier}" if qualifier else name
            raise ApiError(HTTPStatus.NOT_FOUND, "ResourceNotFoundException",
                           f"Function not found: arn:aws:lambda:{service.settings.region}:"
                           f"{service.settings.account}:function:{shown}")
        kind = self.headers.get("X-Amz-Invocation-Type") or "RequestResponse"
        if kind not in ("RequestResponse", "Event", "DryRun"):
            raise ApiError(HTTPStatus.BAD_REQUEST, "InvalidParameterValueException",
                           f"unknown invocation type {kind}")
        payload = body or b"{}"
        limit = MAX_ASYNC_PAYLOAD if kind == "Event" else MAX_SYNC_PAYLOAD
        if len(payload) > limit:
            raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestTooLargeException",
                           f"Request must be smaller than {limit} bytes for the "
                           "InvokeFunction operation")
        try:
            json.loads(payload)
        except ValueError as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "InvalidRequestContentException",
                           f"Could not parse request body into json: {exc}") from exc
        if kind == "DryRun":
            return HTTPStatus.NO_CONTENT, b"", {}
        trace = self.headers.get("X-Amzn-Trace-Id") or None
        try:
            if kind == "Event":
                service.submit(function, payload, request_id=request_id, trace=trace)
                return HTTPStatus.ACCEPTED, b"", {}
            outcome = service.invoke(function, payload, request_id=request_id,
                                     client_context=_client_context(self.headers),
                                     trace=trace)
        except Throttled as exc:
            raise ApiError(HTTPStatus.TOO_MANY_REQUESTS, "TooManyRequestsException",
                           "Rate Exceeded.", {"Reason": exc.reason}) from exc
        except ServiceClosed as exc:
            raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "ServiceException",
                           "the local Lambda service is stopping") from exc
        headers = {"X-Amz-Executed-Version": "$LATEST"}
        if outcome.function_error:
            headers["X-Amz-Function-Error"] = "Unhandled"
        return HTTPStatus.OK, outcome.payload, headers


def _client_context(headers: Any) -> str | None:
    """``X-Amz-Client-Context`` (base64 JSON) as the runtime receives it (plain JSON)."""
    raw = headers.get("X-Amz-Client-Context")
    if not raw:
        return None
    try:
        return base64.b64decode(raw).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, "InvalidRequestContentException",
                       "X-Amz-Client-Context must be base64-encoded JSON") from exc


class InvokeApiServer(ThreadingHTTPServer):
    """The service's Invoke API; binds to 127.0.0.1 only."""

    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that went away mid-answer (a killed runtime, a client that gave up) is
        expected; anything else is reported as usual."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def __init__(self, service: LambdaService, port: int = 3001) -> None:
        self.service = service
        super().__init__(("127.0.0.1", port), _Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: what endpoint_url / AWS_ENDPOINT_URL_LAMBDA take."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name="lambda-invoke-api",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting requests and free the port."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
        self.server_close()
