"""A real etcd and ``highwater broker --metadata-store etcd://`` processes, for the etcd-mode tests.

:class:`EtcdServer` runs one etcd member (Debian's ``etcd-server``, started the way
bench/_etcd_peer.py starts its members) that a test can stop, start again on the same data
directory, pause (SIGSTOP) and resume; with :class:`EtcdServerTls` it serves its clients
over TLS (and, with a CA, only those with a certificate the CA signed: etcd's
``--client-cert-auth``). :class:`EtcdBrokerProcess` is one broker in etcd mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from highwater.etcd_metadata.connection import EtcdConnection, KeyVersion
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.rpc.endpoints import free_loopback_ports


@dataclass(frozen=True)
class EtcdServerTls:
    """etcd's client TLS: its certificate and key and, if given, the CA its clients'
    certificates must be signed by (``--trusted-ca-file`` with ``--client-cert-auth``)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def server_args(self) -> list[str]:
        args = ["--cert-file", str(self.cert_file), "--key-file", str(self.key_file)]
        if self.client_ca_file is not None:
            args += ["--trusted-ca-file", str(self.client_ca_file), "--client-cert-auth"]
        return args


@dataclass
class EtcdServer:
    """One etcd member on loopback: stop, start again, pause, resume. ``tls`` and
    ``etcdctl_tls`` (the CA, certificate and key flags etcdctl's health check uses):
    clients over TLS."""

    data_dir: Path
    client_port: int = 0
    peer_port: int = 0
    tls: EtcdServerTls | None = None
    etcdctl_tls: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.client_port:
            self.client_port, self.peer_port = free_loopback_ports(2)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.data_dir / "etcd.log", "ab")  # noqa: SIM115 - closed in stop
        scheme = "https" if self.tls is not None else "http"
        client = f"{scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.process = subprocess.Popen(
            [
                "etcd",
                "--name",
                "etcd0",
                "--data-dir",
                str(self.data_dir / "data"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"etcd0={peer}",
                *(self.tls.server_args() if self.tls is not None else ()),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.wait_healthy()

    def wait_healthy(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = subprocess.run(
                [
                    "etcdctl",
                    "--endpoints",
                    self.endpoint if self.tls is None else f"https://{self.endpoint}",
                    *self.etcdctl_tls,
                    "endpoint",
                    "health",
                ],
                capture_output=True,
                env=dict(os.environ, ETCDCTL_API="3"),
                check=False,
            )
            if result.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"etcd at {self.endpoint} did not become healthy")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def etcd_member(
    data_dir: Path, tls: EtcdServerTls | None = None, etcdctl_tls: tuple[str, ...] = ()
) -> Iterator[EtcdServer]:
    """One etcd member started in ``data_dir`` for the ``with`` block (a module's fixture)."""
    server = EtcdServer(data_dir, tls=tls, etcdctl_tls=etcdctl_tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class EtcdBrokerProcess:
    """One ``highwater broker --metadata-store etcd://...`` process (``role``
    ``"coordinator"``: a ``highwater coordinator`` in that mode)."""

    node_id: int
    port: int
    store: str
    data_dir: Path
    session_timeout_ms: int = 2000
    extra_args: tuple[str, ...] = ()
    """More flags for the process (``--kafka-listen``, the ``--etcd-*-file`` ones...)."""
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.role}-{self.node_id}.log"

    role: str = "broker"
    log_level: str | None = None
    """``--log-level`` for the process (its default, WARNING, when None)."""

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in reap
        role_args = (
            [
                "--data-dir",
                str(self.data_dir),
                "--etcd-session-timeout-ms",
                str(self.session_timeout_ms),
                # A controlled shutdown waits for every other broker's next heartbeat.
                "--broker-heartbeat-interval-ms",
                "250",
            ]
            if self.role == "broker"
            else ["--group-initial-rebalance-delay-ms", "0"]
        )
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "highwater",
                *(() if self.log_level is None else ("--log-level", self.log_level)),
                self.role,
                "--node-id",
                str(self.node_id),
                "--listen",
                self.address,
                "--metadata-store",
                self.store,
                *role_args,
                *self.extra_args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self.reap()

    def terminate(self, timeout_s: float = 30) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.reap()

    def reap(self) -> None:
        if self.process is not None:
            self.process.wait()
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def describe(self, lines: int = 40) -> str:
        """Whether the process runs (or how it exited) and its log's last ``lines``: what a
        failed wait on it should say."""
        code = None if self.process is None else self.process.poll()
        state = "running" if self.process is not None and code is None else f"exited {code}"
        tail = "\n".join(self.log_text().splitlines()[-lines:])
        return f"{self.role} {self.node_id} ({state}); its log ends:\n{tail}"

    def wait_serving(self, service: str, timeout_s: float = 120) -> None:
        """Until the process's gRPC health reports ``service`` SERVING; AssertionError
        with :meth:`describe` after ``timeout_s`` or once the process exits."""
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    break
                try:
                    answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass  # not listening yet, or the service not registered yet
                time.sleep(0.1)
        raise AssertionError(f"{service} not SERVING: {self.describe()}")


async def read_prefix(store: str) -> dict[str, KeyVersion]:
    """Every key of the cluster at ``store`` (an ``etcd://`` address)."""
    address = parse_metadata_store(store)
    connection = EtcdConnection(address)
    try:
        _, keys = await connection.get_prefix(address.prefix)
        return keys
    finally:
        await connection.close()


async def put_key(store: str, key: str, value: bytes) -> None:
    """Write one key by hand, as an operator with etcdctl would."""
    from highwater.etcd_metadata.connection import Put

    connection = EtcdConnection(parse_metadata_store(store))
    try:
        await connection.txn([], [Put(key, value)])
    finally:
        await connection.close()


async def wait_for(predicate, timeout_s: float = 30, interval_s: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll the async ``predicate`` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s: {predicate}")
        await asyncio.sleep(interval_s)
