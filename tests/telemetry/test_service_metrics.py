"""Metrics of an embedded server and of a client, read from a real process: the Prometheus
endpoint of ``highwater server --metrics-listen`` after a group consumed a topic, and the
lag a consumer reports when it is behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from embedded_servers import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(120)

TOPIC = "metered"


def highwater(*args: str) -> list[str]:
    return [sys.executable, "-m", "highwater", *args]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A running ``highwater server --metrics-listen``: (address, metrics URL)."""
    address, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        highwater(
            "server", "--listen", address, "--data-dir", str(tmp_path / "data"),
            "--metrics-listen", metrics,
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        with grpc.insecure_channel(address) as channel:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True
            )
        yield address, f"http://{metrics}/metrics"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def run(*args: str, stdin: str = "") -> str:
    done = subprocess.run(highwater(*args), input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(url: str, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples(url).items() if n == name and wanted <= have)


def test_a_group_consuming_shows_in_the_servers_metrics(server: tuple[str, str]) -> None:
    address, url = server
    bootstrap = ("--bootstrap-server", address)
    run("topics", "create", *bootstrap, "--topic", TOPIC, "--partitions", "2")
    run("produce", *bootstrap, "--topic", TOPIC, stdin="".join(f"r{i}\n" for i in range(20)))
    assert total(url, "highwater_coordinator_rebalances_total") == 0
    consumed = run(
        "consume", *bootstrap, "--topic", TOPIC, "--group", "billing",
        "--from-beginning", "--max-messages", "20",
    )  # fmt: skip
    assert len(consumed.split()) == 20

    group = {"messaging_consumer_group_name": "billing"}
    assert total(url, "highwater_coordinator_rebalances_total", **group) >= 1
    assert total(url, "highwater_coordinator_rebalance_duration_seconds_count", **group) >= 1
    deadline = time.monotonic() + 30
    while total(url, "highwater_coordinator_groups", highwater_group_state="Empty") != 1:
        assert time.monotonic() < deadline, (
            "the group is not reported Empty after the consumer left"
        )
        time.sleep(0.2)
    assert total(url, "highwater_broker_in_bytes_total", messaging_destination_name=TOPIC) > 0
    assert total(url, "highwater_broker_out_bytes_total", messaging_destination_name=TOPIC) > 0
    assert total(url, "rpc_server_call_duration_seconds_count", rpc_method="JoinGroup") >= 1
    assert total(url, "rpc_server_call_duration_seconds_count", rpc_method="OffsetCommit") >= 1
    assert total(url, "highwater_raft_commit_duration_seconds_count") >= 1
    assert total(url, "highwater_controller_active") == 1
    # The broker's one log directory: its disk, the logs in it, online.
    [(_, log_dir)] = [
        (n, dict(labels)) for (n, labels) in samples(url) if n == "highwater_log_dir_offline"
    ]
    assert log_dir["highwater_log_dir"].endswith("/data/broker")
    where = {"highwater_log_dir": log_dir["highwater_log_dir"]}
    assert total(url, "highwater_log_dir_offline", **where) == 0
    capacity = total(url, "highwater_log_dir_capacity_bytes", **where)
    assert 0 < total(url, "highwater_log_dir_usable_bytes", **where) <= capacity
    assert total(url, "highwater_log_dir_size_bytes", **where) > 0


def test_a_consumer_reports_its_lag_behind_the_high_watermark(server: tuple[str, str]) -> None:
    address, _url = server
    bootstrap = ("--bootstrap-server", address)
    run("topics", "create", *bootstrap, "--topic", TOPIC, "--partitions", "1")
    run("produce", *bootstrap, "--topic", TOPIC, stdin="".join(f"r{i}\n" for i in range(30)))
    script = Path(__file__).with_name("lagging_consumer.py")
    done = subprocess.run(
        [sys.executable, str(script), address, TOPIC, "reports", "12"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["lag"] == {f"{TOPIC}-0": [18, "reports"]}
    assert report["consumed"] == 12
