"""kvpool.tcp: the one free-port and the one wait-until-it-listens helper."""

from __future__ import annotations

import socket

from kvpool.tcp import free_port, wait_listening


def test_free_port_is_bindable_and_start_skips_taken_ports() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        # Asked from a taken port upwards: the next free one, not the taken one.
        assert free_port(start=port, span=50) != port
        assert wait_listening(f"127.0.0.1:{port}", 5.0)


def test_wait_listening_gives_up_on_a_closed_port_or_when_told() -> None:
    port = free_port()  # nothing listens there
    assert not wait_listening(f"127.0.0.1:{port}", 0.2)
    calls: list[int] = []

    def gave_up() -> bool:
        calls.append(1)
        return True

    assert not wait_listening(f"127.0.0.1:{port}", 60.0, gave_up)
    assert calls == [1]  # asked before the first attempt: a dead process is not waited for
