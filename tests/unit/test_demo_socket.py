"""The demo serves on the socket it chose its port with: two demos started at the same moment
never pick the same port (one of them would fail to bind it)."""

from __future__ import annotations

import socket

from rig_conductor import demo


def test_the_chosen_port_is_held_until_the_demo_ends() -> None:
    with demo._listening_socket() as first, demo._listening_socket() as second:
        ports = first.getsockname()[1], second.getsockname()[1]
        assert ports[0] != ports[1]
        for port in ports:  # listening already: a client connects before uvicorn starts
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.socket() as taker:  # released at the end
        taker.bind(("127.0.0.1", ports[1]))
