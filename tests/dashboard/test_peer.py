"""Which OS user opened a loopback connection, read from the kernel's socket table."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from leaseq_dashboard import peer

pytestmark = pytest.mark.skipif(not peer.TABLES[0].exists(),
                                reason="only Linux lists sockets in /proc/net/tcp")


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        yield server
    finally:
        server.close()


def test_the_owner_of_a_loopback_connection_is_the_user_that_opened_it(
    listening: socket.socket
) -> None:
    with socket.create_connection(listening.getsockname()):
        accepted, client = listening.accept()
        with accepted:
            assert peer.peer_uid(client, listening.getsockname()) == os.geteuid()


def test_a_client_on_an_ipv6_socket_with_a_mapped_address_is_found_too(
    listening: socket.socket
) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 sockets here")
    with socket.socket(socket.AF_INET6) as client_socket:
        client_socket.connect(("::ffff:127.0.0.1", listening.getsockname()[1]))
        accepted, client = listening.accept()
        with accepted:
            assert peer.peer_uid(client, listening.getsockname()) == os.geteuid()


def test_a_connection_the_table_does_not_list_is_a_lookup_error(
    listening: socket.socket
) -> None:
    with pytest.raises(LookupError, match=r"no socket from 127\.0\.0\.1:1 to"):
        peer.peer_uid(("127.0.0.1", 1), listening.getsockname())


def test_where_the_platform_has_no_socket_table_the_owner_is_unknown(
    listening: socket.socket, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(peer, "TABLES", (tmp_path / "no-such-table",))
    assert peer.peer_uid(("127.0.0.1", 1), listening.getsockname()) is None
