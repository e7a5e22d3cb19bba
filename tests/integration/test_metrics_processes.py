"""Metrics follow the cluster: Prometheus endpoints of real processes change when it does.

One controller and three brokers, each started with ``--metrics-listen``. A topic with three
replicas is written to; the leader's endpoint shows the bytes in, the log end offset and
high watermark, the Produce calls it served and no under-replicated partition. A follower is
paused (SIGSTOP: its connections stay open, so only the session timeout fences it) and one
more record written: once the leader drops the follower from the ISR
(replica.lag.time.max.ms 2 s) it reports one under-replicated partition and an ISR shrink,
and the controller one fenced broker once the follower's session (4 s here) expired. The follower is
killed and started again: when it catches up, the partition is no longer
under-replicated, an expansion is counted and no broker is fenced. The controller reports
itself active and no offline partition throughout. The processes export their spans over
OTLP: followers' replica fetches and the controller's metadata commits are among them.
"""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from broker_processes import (
    SHORT_SESSION_ARGS,
    BrokerProcess,
    ProcessCluster,
    create_topic,
    process_cluster,
    wait_partition,
)
from highwater.client.admin import NewTopic
from highwater.client.producer import AsyncProducer
from highwater.rpc.endpoints import free_loopback_ports
from otlp_receiver import OtlpReceiver, otlp_receiver
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(150)

TOPIC = "watched"
BROKERS = (41, 42, 43)
REPLICA_LAG_TIME_MAX_MS = 2000

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Watched:
    processes: ProcessCluster
    controller_metrics: str
    broker_metrics: dict[int, str]
    spans: OtlpReceiver

    @property
    def brokers(self) -> dict[int, BrokerProcess]:
        return self.processes.brokers


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Watched]:
    with otlp_receiver() as (receiver, endpoint):
        # The processes export their spans to the receiver (the test process sets up no
        # telemetry: its clients ignore these variables).
        for name, value in {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }.items():
            monkeypatch.setenv(name, value)
        ids = BROKERS
        controller_port, *ports = free_loopback_ports(1 + len(ids))
        metrics = dict(zip(ids, ports, strict=True))
        processes = process_cluster(
            tmp_path,
            ids,
            controller_args=(
                "--metrics-listen",
                f"127.0.0.1:{controller_port}",
                *SHORT_SESSION_ARGS,
            ),
            replica_lag_time_max_ms=REPLICA_LAG_TIME_MAX_MS,
            broker_args=lambda node_id: ("--metrics-listen", f"127.0.0.1:{metrics[node_id]}"),
            taken=[controller_port, *ports],
        )
        try:
            processes.start()
            yield Watched(
                processes,
                f"http://127.0.0.1:{controller_port}/metrics",
                {n: f"http://127.0.0.1:{p}/metrics" for n, p in metrics.items()},
                receiver,
            )
        finally:
            processes.kill()


def scrape(url: str) -> Samples:
    """Every sample of a Prometheus text endpoint: (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


async def eventually(
    url: str, check: Callable[[Samples], bool], what: str, timeout_s: float = 60
) -> Samples:
    deadline = time.monotonic() + timeout_s
    samples: Samples = {}
    while time.monotonic() < deadline:
        try:
            samples = await asyncio.to_thread(scrape, url)
        except OSError:
            samples = {}
        if samples and check(samples):
            return samples
        await asyncio.sleep(0.2)
    names = sorted({n for n, _ in samples if n.startswith("highwater")})
    raise AssertionError(f"{what}: not within {timeout_s} s (metrics: {names})")


async def test_metrics_follow_isr_shrinks_and_expansions(cluster: Watched) -> None:
    await create_topic(
        cluster.brokers[BROKERS[0]].address,
        # min.insync.replicas 3: one follower down puts the partition under its min ISR.
        NewTopic(TOPIC, replica_assignment={0: list(BROKERS)}, config={"min.insync.replicas": "3"}),
    )
    state = await wait_partition(
        cluster.brokers.values(),
        TOPIC,
        lambda s: set(s.isr) == set(BROKERS) and s.leader_id in BROKERS,
        what="the full ISR",
    )
    # The preferred replica leads unless it had not been unfenced yet when the topic was
    # created: the roles are taken from what the cluster decided.
    leader_id = state.leader_id
    follower_id = next(b for b in BROKERS if b != leader_id)
    bootstrap = ",".join(b.address for b in cluster.brokers.values())
    async with AsyncProducer({"bootstrap.servers": bootstrap, "acks": "all"}) as producer:
        await asyncio.gather(*(producer.produce(TOPIC, b"x" * 100, partition=0) for _ in range(5)))

    url = cluster.broker_metrics[leader_id]
    topic = {"messaging_destination_name": TOPIC}
    partition = {**topic, "messaging_destination_partition_id": "0"}
    healthy = await eventually(
        url,
        lambda s: value(s, "highwater_partition_high_watermark", **partition) == 5,
        "the high watermark at 5",
    )
    assert value(healthy, "highwater_partition_log_end_offset", **partition) == 5
    assert value(healthy, "highwater_broker_in_bytes_total", **topic) > 500
    assert value(healthy, "highwater_broker_under_replicated_partitions") == 0
    assert value(healthy, "highwater_broker_under_min_isr_partitions") == 0
    assert value(healthy, "highwater_broker_leader_count") >= 1
    # Produce requests and the followers' fetches come over streams, timed by the broker.
    produced = {"highwater_produce_acks": "-1"}
    assert value(healthy, "highwater_broker_produce_duration_seconds_count", **produced) >= 1
    followers = {"highwater_fetch_replica": "true"}
    assert value(healthy, "highwater_broker_fetch_duration_seconds_count", **followers) >= 2
    assert value(healthy, "highwater_broker_isr_shrinks_total", **topic) == 0
    controller = await eventually(
        cluster.controller_metrics,
        lambda s: value(s, "highwater_controller_registered_brokers") == 3,
        "three brokers registered",
    )
    assert value(controller, "highwater_controller_active") == 1
    assert value(controller, "highwater_controller_offline_partitions") == 0

    # With tracing on, followers trace the fetches that brought records and the controller
    # its metadata commits.
    cluster.spans.wait_for(
        lambda r: (
            any(
                s.attributes.get("highwater.replica.leader_id") == leader_id
                for s in r.of("highwater-broker", "replica fetch")
            )
            and bool(r.of("highwater-controller", "raft commit"))
        ),
        "replica fetch and raft commit spans",
    )
    commit = cluster.spans.of("highwater-controller", "raft commit")[0]
    assert commit.attributes["highwater.raft.offset"] >= 0
    assert commit.attributes["highwater.raft.batch.entries"] >= 1
    assert value(controller, "highwater_raft_leader") == 1

    # A follower stops; the next write leaves it behind and the leader drops it from the
    # ISR once it has not caught up for the lag time. The controller fences it once its
    # session expires (a killed broker would be fenced at once, its connection closed, and
    # taken out of the ISR by the controller rather than by the leader).
    paused = cluster.brokers[follower_id]
    assert paused.process is not None
    paused.process.send_signal(signal.SIGSTOP)
    async with AsyncProducer({"bootstrap.servers": bootstrap, "acks": "1"}) as producer:
        await producer.produce(TOPIC, b"y" * 100, partition=0)
    shrunk = await eventually(
        url,
        lambda s: value(s, "highwater_broker_under_replicated_partitions") == 1,
        "one under-replicated partition",
    )
    assert value(shrunk, "highwater_broker_isr_shrinks_total", **topic) == 1
    assert value(shrunk, "highwater_broker_under_min_isr_partitions") == 1
    await eventually(
        cluster.controller_metrics,
        lambda s: value(s, "highwater_controller_fenced_brokers") == 1,
        "the dead broker fenced",
    )

    paused.kill()
    paused.start()
    healed = await eventually(
        url,
        lambda s: (
            value(s, "highwater_broker_under_replicated_partitions") == 0
            and value(s, "highwater_broker_isr_expands_total", **topic) >= 1
        ),
        "the partition fully replicated again",
    )
    assert value(healed, "highwater_partition_high_watermark", **partition) == 6
    assert value(healed, "highwater_broker_under_min_isr_partitions") == 0
    controller = await eventually(
        cluster.controller_metrics,
        lambda s: value(s, "highwater_controller_fenced_brokers") == 0,
        "the restarted broker unfenced",
    )
    assert value(controller, "highwater_controller_offline_partitions") == 0
