"""``highwater server --kafka-listen`` in a subprocess, for tests that drive it with real Kafka
clients (kafka-python, confluent-kafka, aiokafka, kcat): one per test module.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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
def kafka_server(data_dir: Path, *extra: str) -> Iterator[KafkaServer]:
    """``highwater server`` with a Kafka listener, once every service is SERVING."""
    data_dir.mkdir(parents=True, exist_ok=True)
    address, bootstrap = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    log_path = data_dir / "server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable, "-m", "highwater", "server",
            "--listen", address, "--data-dir", str(data_dir / "data"),
            "--kafka-listen", bootstrap, *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        with grpc.insecure_channel(address) as channel:
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
