"""Fixtures for the deployment tests: a stand-in for CloudFormation's response URL, the
migrations function's modules, and the template as aws-sam-translator expands it."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = ROOT / "functions" / "migrations"


@dataclass
class CapturedPut:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ResponseEndpoint:
    """A real HTTP server on the loopback address that records every PUT it receives."""

    base_url: str
    puts: list[CapturedPut] = field(default_factory=list)
    received: threading.Event = field(default_factory=threading.Event)

    def url(self, name: str = "response") -> str:
        return f"{self.base_url}/{name}?X-Amz-Signature=abc"

    def only_put(self) -> CapturedPut:
        assert len(self.puts) == 1, f"expected exactly one answer, got {len(self.puts)}"
        return self.puts[0]


@pytest.fixture
def response_endpoint() -> Iterator[ResponseEndpoint]:
    endpoint = ResponseEndpoint(base_url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            endpoint.puts.append(
                CapturedPut(self.path, {k.lower(): v for k, v in self.headers.items()},
                            json.loads(raw))
            )
            self.send_response(200)
            self.end_headers()
            endpoint.received.set()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    endpoint.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def migrations_app() -> Any:
    """functions/migrations/app.py, imported the way Lambda does (its folder on sys.path)."""
    import importlib.util

    if str(MIGRATIONS_DIR) not in sys.path:
        sys.path.append(str(MIGRATIONS_DIR))  # last: never shadows another function's app
    spec = importlib.util.spec_from_file_location(
        "leaseq_migrations_app", MIGRATIONS_DIR / "app.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
