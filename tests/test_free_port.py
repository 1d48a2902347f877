"""free_port: a port outside the kernel's ephemeral range, so no client socket can take it before a server binds it."""

from __future__ import annotations

import socket

from kuberl.operator.cli.ports import _LOWEST_PORT, _ephemeral_low, free_port


def test_ports_lie_below_the_ephemeral_range_and_can_be_bound() -> None:
    low = _ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports), "a port was handed out twice"
    for port in ports:
        assert _LOWEST_PORT <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_something_listens_on_is_never_handed_out() -> None:
    listeners = []
    try:
        taken = set()
        for port in range(_LOWEST_PORT, _LOWEST_PORT + 200):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            s.listen()
            listeners.append(s)
            taken.add(port)
        picks = {free_port() for _ in range(300)}
        assert not picks & taken
    finally:
        for s in listeners:
            s.close()
