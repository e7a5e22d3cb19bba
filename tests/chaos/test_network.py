"""Network namespaces of the chaos harness: processes reach each other over the bridge, a
cut drops their packets both ways, healing restores them, closing removes everything."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from highwater.chaos.network import NamespaceNetwork, namespaces_available

pytestmark = pytest.mark.timeout(60)

LISTEN = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen()
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(b"hello")
    conn.close()
"""

CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5) as s:
        print(s.recv(5).decode())
except OSError as e:
    print("failed", type(e).__name__)
"""


@pytest.fixture
def network() -> Iterator[NamespaceNetwork]:
    reason = namespaces_available()
    assert reason is None, reason  # the harness falls back to process faults; this test cannot
    net = NamespaceNetwork()
    try:
        yield net
    finally:
        net.close()


def reaches(net: NamespaceNetwork, source: str, address: str) -> bool:
    host, port = address.split(":")
    answer = subprocess.run(
        net.wrap(source, [sys.executable, "-c", CONNECT, host, port]),
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    return answer.stdout.strip() == "hello"


def test_a_cut_drops_packets_both_ways_and_healing_restores_them(
    network: NamespaceNetwork,
) -> None:
    addresses = network.assign(["a", "b", "c"])
    servers = []
    try:
        for name in ("a", "b"):
            host, port = addresses[name].split(":")
            server = subprocess.Popen(
                network.wrap(name, [sys.executable, "-c", LISTEN, host, port]),
                stdout=subprocess.PIPE,
                text=True,
            )
            servers.append(server)
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        assert reaches(network, "b", addresses["a"]) and reaches(network, "a", addresses["b"])
        assert reaches(network, "c", addresses["a"])

        network.cut(["a"], ["b"])
        assert not reaches(network, "b", addresses["a"])
        assert not reaches(network, "a", addresses["b"])
        assert reaches(network, "c", addresses["a"]), "c is on neither side"

        network.heal()
        assert reaches(network, "b", addresses["a"]) and reaches(network, "a", addresses["b"])
    finally:
        for server in servers:
            server.kill()
            server.wait(10)
            if server.stdout is not None:
                server.stdout.close()
    names = set(network.namespaces.values())
    network.close()
    time.sleep(0.1)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert not names & {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
