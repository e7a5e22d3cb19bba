"""A broker's first registration is tried for ``initial.broker.registration.timeout.ms``.

A new incarnation of a broker whose old one is paused (SIGSTOP: its connections stay open,
so the controller does not fence it at once as it does a killed one) is refused
(DUPLICATE_BROKER_REGISTRATION) until the old session expires at the controller. With the
session far longer than the registration timeout, the new incarnation gives up starting
after the timeout, naming the key, instead of waiting for the session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    """One controller whose broker sessions last 60 s."""
    (port,) = free_loopback_ports(1)
    running = Controller(
        0,
        port,
        f"0@127.0.0.1:{port}",
        tmp_path / "controller",
        tmp_path / "controller.log",
        ("--override", "broker.session.timeout.ms=60000"),
    )
    running.start()
    try:
        yield running
    finally:
        running.kill()


def start_broker(
    controller: Controller, data_dir: Path, port: int, *more: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "highwater",
            "broker",
            "--node-id",
            "7",
            "--listen",
            f"127.0.0.1:{port}",
            "--controllers",
            controller.address,
            "--data-dir",
            str(data_dir),
            *more,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def wait_registered(address: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        while time.monotonic() < deadline:
            try:
                if any(
                    b.node_id == 7 for b in stub.Metadata(pb.MetadataRequest(), timeout=2).brokers
                ):
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise AssertionError(f"broker 7 at {address} was not registered in {timeout_s} s")


def test_a_new_incarnation_refused_past_the_timeout_exits_naming_the_key(
    controller: Controller, tmp_path: Path
) -> None:
    first_port, second_port = free_loopback_ports(2)
    first = start_broker(controller, tmp_path / "first", first_port)
    try:
        wait_registered(f"127.0.0.1:{first_port}")
        first.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        second = start_broker(
            controller, tmp_path / "second", second_port,
            # 10 s: on a loaded machine the process start and a first RegisterBroker have
            # taken more than 3 s, and the refusal came after the deadline
            "--override", "initial.broker.registration.timeout.ms=10000",
        )  # fmt: skip
        try:
            _, stderr = second.communicate(timeout=60)
        finally:
            second.kill()
        took = time.monotonic() - began
    finally:
        first.kill()
        first.communicate(timeout=10)
    assert second.returncode != 0, stderr
    assert "initial.broker.registration.timeout.ms" in stderr, stderr
    assert "previous incarnation's session has not expired" in stderr, stderr
    assert took < 30, took  # the old session had 60 s to run
