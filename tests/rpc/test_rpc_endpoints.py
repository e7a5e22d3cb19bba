"""``HOST:PORT`` endpoints and ``controller.quorum.voters`` parsed and printed; free ports."""

from __future__ import annotations

import contextlib
import socket

import pytest
from highwater.rpc.endpoints import (
    format_endpoint,
    free_loopback_ports,
    parse_endpoint,
    parse_quorum_voters,
)


def test_parse_quorum_voters() -> None:
    assert parse_quorum_voters("1@localhost:9093, 2@[::1]:9094,3@10.0.0.3:9095") == {
        1: "localhost:9093",
        2: "[::1]:9094",
        3: "10.0.0.3:9095",
    }
    for bad in ("", "1@", "x@h:1", "1@host", "1@h:1,1@h:2", "1@h:0", "1@h:99999", "1:h:1"):
        with pytest.raises(ValueError):
            parse_quorum_voters(bad)
    assert parse_endpoint("[::1]:0") == ("::1", 0)


@pytest.mark.parametrize(
    ("host", "port", "text"),
    [
        ("localhost", 9092, "localhost:9092"),
        ("::1", 9093, "[::1]:9093"),
        ("10.0.0.1", 0, "10.0.0.1:0"),
    ],
)
def test_an_endpoint_formats_to_what_parses_back(host: str, port: int, text: str) -> None:
    assert format_endpoint(host, port) == text
    assert parse_endpoint(text) == (host, port)


@pytest.mark.parametrize("bad", ["", "host", ":9092", "host:", "host:65536", "[::1:9092", "a b:1"])
def test_a_bad_endpoint_is_a_value_error_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=r"HOST:PORT|out of range"):
        parse_endpoint(bad)


def test_free_loopback_ports_are_distinct_and_bindable() -> None:
    ports = free_loopback_ports(8)
    assert len(set(ports)) == 8 and all(0 < port < 65536 for port in ports)
    with contextlib.ExitStack() as stack:
        for port in ports:
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", port))


def test_free_loopback_ports_on_several_hosts_are_free_on_each() -> None:
    """The kernel's free port on 127.0.0.1 may be one another socket holds on 127.0.0.2."""
    with contextlib.ExitStack() as stack:
        taken: set[int] = set()
        for _ in range(1000):
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.2", 0))
            listener.listen()
            taken.add(listener.getsockname()[1])
        ports = free_loopback_ports(200, hosts=("127.0.0.1", "127.0.0.2"))
    assert len(set(ports)) == 200 and not taken & set(ports)
