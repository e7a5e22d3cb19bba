"""Where the cluster's processes listen, and how links between them are cut.

:class:`LoopbackNetwork` puts every process on 127.0.0.1 with a port of its own: no
partitions possible. :class:`NamespaceNetwork` gives every process (and the harness's
clients) a Linux network namespace of its own, joined by veth pairs to a bridge in a hub
namespace, with an address from ``10.213.0.0/24`` that exists only inside those
namespaces. A partition cuts a minority of processes off from the other processes: with
nftables (``nft``), a table in each namespace involved drops every packet to and from the
other side, silently, as a failed link does; without it, ``blackhole`` routes in both
directions (a send to the other side fails at once). The clients still reach every
process. Healing deletes the tables (or routes). Namespaces and links are made with
iproute2 (``ip``) and removed by :meth:`NamespaceNetwork.close`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence

from highwater.rpc.endpoints import free_loopback_ports

CLONE_NEWNET = 0x40000000
SUBNET = "10.213.0"
PORT = 9000


class Network:
    """Loopback: the base class; every process on 127.0.0.1."""

    mode = "loopback"
    can_partition = False

    def assign(self, names: Sequence[str]) -> dict[str, str]:
        """An address (HOST:PORT) for each process name."""
        ports = free_loopback_ports(len(names))
        return {name: f"127.0.0.1:{port}" for name, port in zip(names, ports, strict=True)}

    def second_address(self, name: str, address: str) -> str:
        """Another address of process ``name`` (assigned ``address``), for a second listener
        (a broker's Kafka listener)."""
        return f"127.0.0.1:{free_loopback_ports(1)[0]}"

    def wrap(self, name: str, command: list[str]) -> list[str]:
        """The command line that runs ``command`` as process ``name``."""
        return command

    def cut(self, isolated: Sequence[str], others: Sequence[str]) -> None:
        """Loopback has no links to cut: a run without namespaces schedules no partition
        (``can_partition``), so asking for one is the caller's error."""
        raise RuntimeError("processes on loopback cannot be partitioned: no network namespaces")

    def heal(self) -> None:
        """Remove every cut."""

    def close(self) -> None:
        """Remove whatever the network made."""


LoopbackNetwork = Network


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def namespaces_available() -> str | None:
    """None if network namespaces can be made here, else why not."""
    name = f"hwprobe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.SubprocessError) as e:
        detail = (
            e.stderr.decode(errors="replace").strip() if hasattr(e, "stderr") and e.stderr else e
        )
        return f"ip netns add failed: {detail}"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        _ip("netns", "del", name)
    return None


class NamespaceNetwork(Network):
    """A namespace per process plus one for the clients, bridged in a hub namespace."""

    mode = "netns"
    can_partition = True

    def __init__(self) -> None:
        self.nftables = shutil.which("nft") is not None
        self.cut_with = "nftables drop rules" if self.nftables else "blackhole routes"
        self._tables: set[str] = set()
        self.prefix = f"hw{uuid.uuid4().hex[:6]}"
        self.hub = f"{self.prefix}-hub"
        self.client_ns = f"{self.prefix}-cli"
        self.namespaces: dict[str, str] = {}
        self.ips: dict[str, str] = {}
        self.routes: list[tuple[str, str]] = []
        self._made: list[str] = []
        self._add_namespace(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        self._attach(self.client_ns, 2)

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _attach(self, namespace: str, host: int) -> str:
        """Make ``namespace`` with a veth to the hub's bridge and the address .``host``."""
        self._add_namespace(namespace)
        hub_end = f"h{host}"
        _ip(
            "-n",
            self.hub,
            "link",
            "add",
            hub_end,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            namespace,
        )
        _ip("-n", self.hub, "link", "set", hub_end, "master", "br0")
        _ip("-n", self.hub, "link", "set", hub_end, "up")
        ip = f"{SUBNET}.{host}"
        _ip("-n", namespace, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        return ip

    def assign(self, names: Sequence[str]) -> dict[str, str]:
        addresses = {}
        for host, name in enumerate(names, start=10):
            namespace = f"{self.prefix}-{host}"
            self.ips[name] = self._attach(namespace, host)
            self.namespaces[name] = namespace
            addresses[name] = f"{self.ips[name]}:{PORT}"
        return addresses

    def second_address(self, name: str, address: str) -> str:
        return f"{self.ips[name]}:{PORT + 1}"

    def wrap(self, name: str, command: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[name], *command]

    def enter_client_namespace(self) -> None:
        """Move the calling thread (call it before any other thread starts) into the
        clients' namespace, so the threads it starts later are there too."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{self.client_ns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"setns: {os.strerror(errno)}")
        finally:
            os.close(fd)

    def cut(self, isolated: Sequence[str], others: Sequence[str]) -> None:
        peers: dict[str, set[str]] = {}
        for a in isolated:
            for b in others:
                peers.setdefault(a, set()).add(self.ips[b])
                peers.setdefault(b, set()).add(self.ips[a])
        for name, ips in peers.items():
            namespace = self.namespaces[name]
            if self.nftables:
                addresses = ", ".join(sorted(ips))
                script = (
                    "table inet hwchaos {\n"
                    "  chain input { type filter hook input priority 0; policy accept; "
                    f"ip saddr {{ {addresses} }} drop; }}\n"
                    "  chain output { type filter hook output priority 0; policy accept; "
                    f"ip daddr {{ {addresses} }} drop; }}\n"
                    "}\n"
                )
                subprocess.run(
                    ["ip", "netns", "exec", namespace, "nft", "-f", "-"],
                    input=script.encode(),
                    check=True,
                    capture_output=True,
                    timeout=10,
                )
                self._tables.add(namespace)
            else:
                for ip in sorted(ips):
                    _ip("-n", namespace, "route", "add", "blackhole", f"{ip}/32")
                    self.routes.append((namespace, ip))

    def heal(self) -> None:
        tables, self._tables = self._tables, set()
        for namespace in tables:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    ["ip", "netns", "exec", namespace, "nft", "delete", "table", "inet", "hwchaos"],
                    check=True,
                    capture_output=True,
                    timeout=10,
                )
        routes, self.routes = self.routes, []
        for namespace, ip in routes:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _ip("-n", namespace, "route", "del", "blackhole", f"{ip}/32")

    def close(self) -> None:
        self.heal()
        for namespace in reversed(self._made):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _ip("netns", "del", namespace)
        self._made.clear()
