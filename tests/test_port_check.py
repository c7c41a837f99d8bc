"""`farm cluster`'s check of its fixed ports: a port left in TIME_WAIT by a stopped cluster is free,
a port something listens on is taken."""

from __future__ import annotations

import socket

import pytest

from farm.errors import FarmError
from farm.run.clusterd import check_ports_free


def _port_in_time_wait() -> int:
    """A port whose listener accepted a connection and closed its side first, as a stopped
    scheduler does: the accepted socket stays in TIME_WAIT on that port (about 60 s on Linux)."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the side that closes first holds TIME_WAIT
        client.recv(1)  # the peer's FIN arrived
        client.close()
    return port


def _time_wait_ports() -> set[int]:
    """Local ports of IPv4 sockets in TIME_WAIT (state 06 in /proc/net/tcp)."""
    ports = set()
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            fields = line.split()
            if fields[3] == "06":
                ports.add(int(fields[1].split(":")[1], 16))
    return ports


def test_a_port_in_time_wait_counts_as_free():
    port = _port_in_time_wait()
    assert port in _time_wait_ports()
    check_ports_free("127.0.0.1", {"--port": port})


def test_a_port_something_listens_on_is_taken():
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(FarmError, match=rf"--port {port}: 127.0.0.1:{port} is taken"):
            check_ports_free("127.0.0.1", {"--port": port})


def test_port_zero_is_never_checked():
    check_ports_free("127.0.0.1", {"--port": 0, "--dashboard-port": 0})
