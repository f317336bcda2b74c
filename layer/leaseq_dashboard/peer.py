"""Which OS user opened a loopback TCP connection, where the platform says (Linux).

A browser speaks TCP, not Unix sockets, so the local dashboard listens on 127.0.0.1,
where every user of the machine may connect. On Linux the kernel lists every TCP socket
of the network namespace in ``/proc/net/tcp`` (and ``tcp6``) with the user that created
it; the client's end of a loopback connection is the row whose local address is the
peer's address and whose remote address is the server's. That is how the server refuses
another user's connection before reading a word of it as a page request, without root
and without a firewall rule.

Hand-written because no maintained library exposes it: psutil lists connections but
not their owners (only their processes, and those only for our own user or root).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path

#: The kernel's socket tables (IPv4 and IPv6, the latter for v4-mapped clients).
TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_TIME_WAIT = "06"  # such rows are no socket any more, and list uid 0


def _address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``0100007F:1F90`` -> (127.0.0.1, 8080): each 32-bit word is in host byte order."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    packed = b"".join(struct.pack("=I", int.from_bytes(raw[i:i + 4], "big"))
                      for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(packed) == 4 else socket.AF_INET6
    address = ipaddress.ip_address(socket.inet_ntop(family, packed))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped, int(port, 16)
    return address, int(port, 16)


def peer_uid(peer: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid that owns the client end of the connection from ``peer`` to ``server``.

    None when this platform has no such table (the caller must then rely on something
    else); :class:`LookupError` when it has one that does not list the connection (the
    client is gone, or is not on this machine's loopback).
    """
    tables = [t for t in TABLES if t.exists()]
    if not tables:
        return None
    wanted_local = (ipaddress.ip_address(peer[0]), int(peer[1]))
    wanted_remote = (ipaddress.ip_address(server[0]), int(server[1]))
    port_suffix = f":{int(peer[1]):04X}"  # decode only the rows of the peer's port
    for table in tables:
        with table.open(encoding="ascii") as rows:
            next(rows, None)  # the heading
            for row in rows:
                fields = row.split()
                if (len(fields) < 8 or fields[3] == _TIME_WAIT
                        or not fields[1].endswith(port_suffix)):
                    continue
                if (_address(fields[1]) == wanted_local
                        and _address(fields[2]) == wanted_remote):
                    return int(fields[7])
    raise LookupError(f"no socket from {peer[0]}:{peer[1]} to {server[0]}:{server[1]} "
                      f"in {', '.join(str(t) for t in tables)}")
