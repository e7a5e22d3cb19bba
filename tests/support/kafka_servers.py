"""``highwater server --kafka-listen`` in a subprocess, for tests that drive it with real Kafka
clients (kafka-python, confluent-kafka, aiokafka, kcat), and raw Kafka frames over a socket.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from embedded_servers import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass(frozen=True)
class KafkaServer:
    """A running server: its gRPC address, its Kafka bootstrap address and its log."""

    address: str
    bootstrap: str
    log: Path


@contextmanager
def kafka_server(
    data_dir: Path,
    *extra: str,
    protocol: str = "PLAINTEXT",
    credentials: grpc.ChannelCredentials | None = None,
) -> Iterator[KafkaServer]:
    """``highwater server`` with a Kafka listener of security protocol ``protocol``, once
    every service is SERVING (asked over TLS with ``credentials`` if given)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    address, bootstrap = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    log_path = data_dir / "server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable, "-m", "highwater", "server",
            "--listen", address, "--data-dir", str(data_dir / "data"),
            "--kafka-listen", f"{protocol}://{bootstrap}", *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        with (
            grpc.insecure_channel(address)
            if credentials is None
            else grpc.secure_channel(address, credentials)
        ) as channel:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=60, wait_for_ready=True
            )
        yield KafkaServer(address, bootstrap, log_path)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


# --- raw frames ---------------------------------------------------------------------------


def connect(server: KafkaServer) -> socket.socket:
    host, port = server.bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def request_frame(message: Any, version: int, correlation_id: int) -> bytes:
    message.API_VERSION = version
    message.with_header(correlation_id=correlation_id, client_id="raw")
    return bytes(message.encode(header=True, framed=True))


def read_frame(sock: socket.socket) -> bytes:
    head = recv_exactly(sock, 4)
    (size,) = struct.unpack(">i", head)
    return recv_exactly(sock, size)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def wait_for(condition: Callable[[], Any], timeout_s: float = 30, what: str = "") -> Any:
    """``condition()``'s first truthy value, polled every 50 ms; AssertionError after
    ``timeout_s``, naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or condition}")
