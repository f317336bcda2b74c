"""A local TCP port forward, standing in for a Session Manager (or SSH) tunnel.

``aws ssm start-session --document-name AWS-StartPortForwardingSessionToRemoteHost`` listens
on a local port and carries each connection to a host inside the VPC. This does the same
on the loopback address: it listens on 127.0.0.1 and copies bytes both ways to a target
that is on this machine too, counting the connections it carried, so a test can tell that
a client went through it. Bounded: it stops with its context, and each copy ends when
either side closes.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field


@dataclass
class PortForward:
    """Where the forward listens, and how many connections it has carried."""

    port: int
    carried: list[tuple[str, int]] = field(default_factory=list)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def port_forward(target_host: str, target_port: int) -> Iterator[PortForward]:
    """Forward 127.0.0.1:<a free port> to ``target_host:target_port`` (a loopback address)."""
    assert target_host.startswith("127."), "the forward's target must be on this machine"
    forward = PortForward(port=0)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            client: socket.socket = self.request
            upstream = socket.create_connection((target_host, target_port), timeout=30)
            upstream.settimeout(None)
            forward.carried.append(client.getpeername())
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join(timeout=30)
            upstream.close()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", 0), Handler)
    forward.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield forward
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
