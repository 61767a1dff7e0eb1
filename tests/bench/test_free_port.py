"""bench.servers.free_port: a port below the kernel's ephemeral range (where no outgoing
connection can take it before the server binds it), free, and not the same for two calls
that a seeded `random` would make alike."""

from __future__ import annotations

import random
import socket

from bench.servers import _ephemeral_low, free_port


def test_a_free_port_below_the_ephemeral_range() -> None:
    low = _ephemeral_low()
    ports = set()
    for _ in range(20):
        random.seed(7)  # a test that seeds the module's generator does not fix the pick
        port = free_port()
        assert port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free
        ports.add(port)
    assert len(ports) > 1
