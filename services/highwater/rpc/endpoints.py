"""Network addresses: ``HOST:PORT`` endpoints, Kafka's quorum voters list, free loopback ports."""

from __future__ import annotations

import re
import socket

__all__ = ["format_endpoint", "free_loopback_ports", "parse_endpoint", "parse_quorum_voters"]

_ENDPOINT = re.compile(
    r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+)):(?P<port>[0-9]+)"
)


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as ``(host, port)``; ``ValueError`` if bad."""
    match = _ENDPOINT.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not HOST:PORT")
    port = int(match["port"])
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: port {port} is out of range")
    return match["ipv6"] or match["host"], port


def format_endpoint(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets: what :func:`parse_endpoint` reads."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_quorum_voters(text: str) -> dict[int, str]:
    """Kafka's ``controller.quorum.voters``: ``1@host:port,2@host:port,...`` as id -> address."""
    voters: dict[int, str] = {}
    for part in text.split(","):
        entry = part.strip()
        node_id, at, endpoint = entry.partition("@")
        if not at or not node_id.strip().isdigit():
            raise ValueError(f"{entry!r} is not ID@HOST:PORT")
        voter_id = int(node_id)
        if voter_id > 2**31 - 1:
            raise ValueError(f"{entry!r}: node id {voter_id} is out of range")
        if voter_id in voters:
            raise ValueError(f"node id {voter_id} appears twice")
        host, port = parse_endpoint(endpoint)
        if port == 0:
            raise ValueError(f"{entry!r}: a voter needs a real port, not 0")
        voters[voter_id] = format_endpoint(host, port)
    return voters


def free_loopback_ports(count: int, hosts: tuple[str, ...] = ("127.0.0.1",)) -> list[int]:
    """``count`` distinct TCP ports that nothing listens on right now on any of ``hosts``.

    All are bound at once before any is released, so the kernel cannot hand the same port out
    twice; a process started a moment later may still lose one to another program (the port is
    free, not reserved), which is why only local clusters and tests use this. A caller that
    binds one port on several loopback addresses (a listener on 127.0.0.1, another on
    127.0.0.2) names them all: a port free on 127.0.0.1 may be taken on 127.0.0.2, and the
    kernel's choice for 127.0.0.1 does not look there.
    """
    first, *others = hosts
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket()
            held.append(sock)
            sock.bind((first, 0))
            port = int(sock.getsockname()[1])
            try:
                for host in others:
                    other = socket.socket()
                    held.append(other)
                    other.bind((host, port))
            except OSError:
                continue  # taken on another host: keep it held so it is not offered again
            ports.append(port)
        return ports
    finally:
        for sock in held:
            sock.close()
