"""A counting TCP relay between the workers and the server: SQL round trips per job.

A round trip is counted each time a client starts sending again after the server
last spoke on that connection (or for its first message): a pipelined batch of
statements is one round trip, a BEGIN / statement / COMMIT sequence is three. The
relay knows nothing about any queue library, so every system is counted the same
way. It is used in a separate, untimed pass: relaying costs CPU on the same machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict, make_conninfo


@dataclass
class _Counter:
    round_trips: int = 0
    connections: int = 0


class RoundTripRelay:
    def __init__(self, upstream_dsn: str) -> None:
        params = conninfo_to_dict(upstream_dsn)
        self.upstream_host = str(params.get("host") or "127.0.0.1")
        self.upstream_port = int(params.get("port") or 5432)
        self._counter = _Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self.port = 0

    def dsn_for(self, dsn: str) -> str:
        """The same DSN, routed through the relay (TLS off so bytes are countable)."""
        return make_conninfo(dsn, host="127.0.0.1", port=str(self.port), sslmode="disable")

    @property
    def round_trips(self) -> int:
        with self._lock:
            return self._counter.round_trips

    def __enter__(self) -> RoundTripRelay:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        fut.result(timeout=10)
        return self

    def __exit__(self, *_: object) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._server.wait_closed(), 2)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(
                self.upstream_host, self.upstream_port)
        except OSError:
            client_w.close()
            return
        with self._lock:
            self._counter.connections += 1
        # True while the last bytes on this connection came from the server.
        state = {"server_spoke": True}

        async def client_to_server() -> None:
            while data := await client_r.read(65536):
                if state["server_spoke"]:
                    state["server_spoke"] = False
                    with self._lock:
                        self._counter.round_trips += 1
                server_w.write(data)
                await server_w.drain()
            server_w.close()

        async def server_to_client() -> None:
            while data := await server_r.read(65536):
                state["server_spoke"] = True
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        with contextlib.suppress(Exception):
            await asyncio.gather(client_to_server(), server_to_client())
