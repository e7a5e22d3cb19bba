"""A rolling restart of real broker processes, gated as the Kubernetes chart gates it: each
broker stops (SIGTERM, a controlled shutdown) only when ``may_stop`` allows it, and the
next one only once the restarted broker is ``ready`` again.

One controller and three brokers; two topics of RF 3 whose leaders are spread over the
brokers. While a broker is down its partitions are under-replicated: the gate keeps every
other broker from stopping (also through ``highwater rolling pre-stop --no-wait``, as the
preStop hook runs it), the stopped broker leads nothing, and once it is back it is not
ready until it is in every ISR again — as the library's view says and as the broker itself
reports on its gRPC health service (``highwater.broker.ready``, what the readiness probe
asks). Nothing acknowledged is lost across the roll.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest
from broker_processes import BrokerProcess, consume_all, create_topic
from grpc_health.v1 import health_pb2, health_pb2_grpc
from highwater.broker.rolling import (
    READY_SERVICE,
    ClusterView,
    leaderships,
    may_stop,
    readiness,
    under_replicated,
)
from highwater.cli.rolling import observe_cluster
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.producer import AsyncProducer
from highwater.rpc.endpoints import free_loopback_ports
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(180)

SERVING = health_pb2.HealthCheckResponse.SERVING


async def wait_health(address: str, status: int, timeout_s: float = 30) -> None:
    """Until the broker's ``grpc.health.v1`` reports :data:`READY_SERVICE` as ``status``
    (what the Kubernetes readiness probe asks)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        async with asyncio.timeout(timeout_s):
            while True:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=READY_SERVICE))
                if reply.status == status:
                    return
                await asyncio.sleep(0.2)


BROKERS = (41, 42, 43)
TOPICS = {"orders": [41, 42, 43], "payments": [43, 41, 42]}


@dataclass
class Cluster:
    controller: Controller
    brokers: dict[int, BrokerProcess]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers.values() if b.alive)

    async def view(self) -> ClusterView:
        async with AdminClient(self.bootstrap, request_timeout_s=10) as admin:
            return await observe_cluster(admin)

    async def wait_view(
        self, condition: Callable[[ClusterView], bool], timeout_s: float = 60
    ) -> ClusterView:
        """The cluster's view once ``condition`` holds for it."""
        view = await self.view()
        async with asyncio.timeout(timeout_s):
            while not condition(view):
                await asyncio.sleep(0.2)
                view = await self.view()
        return view


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    controller_port, *ports = free_loopback_ports(1 + len(BROKERS))
    controller = Controller(
        1,
        controller_port,
        f"1@127.0.0.1:{controller_port}",
        tmp_path / "controller",
        tmp_path / "controller.log",
    )
    brokers = {
        node: BrokerProcess(
            node,
            port,
            controller.address,
            tmp_path / f"broker-{node}",
            tmp_path / f"broker-{node}.log",
            replica_lag_time_max_ms=2000,
        )
        for node, port in zip(BROKERS, ports, strict=True)
    }
    running = Cluster(controller, brokers)
    try:
        controller.start()
        for broker in brokers.values():
            broker.start()
        yield running
    finally:
        for broker in brokers.values():
            broker.kill()
        controller.kill()


def pre_stop_now(cluster: Cluster, node: int) -> subprocess.CompletedProcess[str]:
    """``highwater rolling pre-stop --no-wait`` for ``node``, as its preStop hook runs it."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "highwater", "rolling", "pre-stop", "--no-wait"),
            *("--node-id", str(node), "--bootstrap-server", cluster.brokers[node].address),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


async def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    settings = {"bootstrap.servers": bootstrap, "acks": "all", "request.timeout.ms": 20_000}
    async with AsyncProducer(settings) as producer:
        await asyncio.gather(*(producer.produce(topic, v, partition=0) for v in values))


async def test_a_gated_rolling_restart_never_stops_a_broker_while_partitions_lag(
    cluster: Cluster,
) -> None:
    first = cluster.brokers[BROKERS[0]]
    for name, replicas in TOPICS.items():
        await create_topic(first.address, NewTopic(name, replica_assignment={0: replicas}))

    def full(view: ClusterView) -> bool:
        """Every broker live, every topic there, led and fully replicated."""
        return (
            len(view.live_brokers) == len(BROKERS)
            and {p.topic for p in view.partitions} >= set(TOPICS)
            and all(p.leader is not None for p in view.partitions)
            and not under_replicated(view)
        )

    view = await cluster.wait_view(full)
    assert all(may_stop(view, node).allowed and readiness(view, node).allowed for node in BROKERS)
    for node in BROKERS:  # each broker says so itself, on its gRPC health service
        await wait_health(cluster.brokers[node].address, SERVING)
    written: dict[str, list[bytes]] = {name: [] for name in TOPICS}

    # The StatefulSet order: highest ordinal first.
    for step, node in enumerate(reversed(BROKERS)):
        values = [f"{node}-{i}".encode() for i in range(5)]
        for name in TOPICS:
            await produce(cluster.bootstrap, name, values)
            written[name] += values
        view = await cluster.wait_view(full)
        assert may_stop(view, node).allowed, may_stop(view, node)

        # preStop allowed it: SIGTERM, the controlled shutdown moves the leaderships away.
        led_before = {p.name for p in leaderships(view, node)}
        assert cluster.brokers[node].terminate() == 0
        view = await cluster.wait_view(lambda view, node=node: node not in view.live_brokers)
        assert leaderships(view, node) == []
        assert all(p.leader is not None for p in view.partitions), view.partitions
        if step == 0:
            assert led_before, "a broker of the roll led something before it stopped"
        assert not readiness(view, node).allowed
        lagging = {p.name for p in under_replicated(view)}
        assert {f"{name}-0" for name in TOPICS} <= lagging

        # While it is down no other broker may stop, by the library or the hook.
        for other in BROKERS:
            if other == node:
                continue
            decision = may_stop(view, other)
            assert not decision.allowed
            assert "under-replicated" in str(decision)
            hook = pre_stop_now(cluster, other)
            assert hook.returncode == 1, hook.stdout + hook.stderr
            assert f"broker {other} may stop: " in hook.stderr
            assert "under-replicated" in hook.stderr

        # Back up: not ready until it is in every ISR again, and then the next may stop.
        cluster.brokers[node].start()
        view = await cluster.wait_view(
            lambda view, node=node: readiness(view, node).allowed, timeout_s=90
        )
        assert all(node in p.isr for p in view.partitions if node in p.replicas)
        assert not under_replicated(view)
        await wait_health(cluster.brokers[node].address, SERVING)

    for name, values in written.items():
        assert await consume_all(cluster.bootstrap, name) == values
