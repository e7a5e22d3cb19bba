"""A group coordinator in the etcd mode while every broker is replaced, on real processes.

One etcd, three ``highwater broker --metadata-store etcd://...`` processes and a
``highwater coordinator`` in that mode. Each broker in turn is stopped and started again
with its data directory on another port (a rolling replacement, as pods that come back
at new addresses): once it is done, no address the coordinator saw at its start serves. The
coordinator calls the controller through the brokers registered in etcd now, so its
heartbeats keep being acknowledged for longer than its session timeout, it stays
registered, and a consumer group it coordinates commits and reads its offsets.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_processes import metadata
from cli_process import highwater_cli
from etcd_processes import EtcdBrokerProcess, EtcdServer, etcd_member, read_prefix, wait_for
from highwater.broker.service import BROKER_SERVICE_NAME
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.producer import AsyncProducer
from highwater.coordinator.service import COORDINATOR_SERVICE_NAME
from highwater.rpc.endpoints import free_loopback_ports

pytestmark = pytest.mark.timeout(300)

CLUSTER = "replaced"
SESSION_TIMEOUT_S = 9
"""The coordinator's default session timeout (``CoordinatorSettings.session_timeout_ms``)."""


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path / "etcd") as server:
        yield server


def bootstrap(brokers: list[EtcdBrokerProcess]) -> str:
    return ",".join(b.address for b in brokers)


async def produce(bootstrap_servers: str, values: list[bytes]) -> None:
    async with AsyncProducer({"bootstrap.servers": bootstrap_servers, "acks": "all"}) as producer:
        for value in values:
            await producer.send("events", value, partition=0)


async def consume_in_group(bootstrap_servers: str, topic: str, group: str, count: int) -> list[str]:
    output = await highwater_cli(
        "consume",
        "--topic",
        topic,
        "--group",
        group,
        "--from-beginning",
        "--max-messages",
        str(count),
        "--timeout-ms",
        "60000",
        "--bootstrap-server",
        bootstrap_servers,
    )
    return [line for line in output.splitlines() if len(line) == 1]


async def test_the_coordinator_reaches_the_controller_after_every_broker_moved(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    store = f"etcd://{etcd.endpoint}/{CLUSTER}"
    ports = free_loopback_ports(4)
    brokers = [
        EtcdBrokerProcess(node_id, port, store, tmp_path / f"b{node_id}")
        for node_id, port in zip((1, 2, 3), ports[:3], strict=True)
    ]
    coordinator = EtcdBrokerProcess(
        200, ports[3], store, tmp_path / "c200", role="coordinator", log_level="INFO"
    )
    processes = [*brokers, coordinator]
    try:
        for broker in brokers:
            broker.start()
        for broker in brokers:
            await asyncio.to_thread(broker.wait_serving, BROKER_SERVICE_NAME)
        coordinator.start()
        await asyncio.to_thread(coordinator.wait_serving, COORDINATOR_SERVICE_NAME)
        first_addresses = {b.address for b in brokers}

        async with AdminClient(bootstrap(brokers), request_timeout_s=60) as admin:
            (await admin.create_topics([NewTopic("events", 1, 3)]))["events"].raise_for_error()
        await produce(bootstrap(brokers), [b"a", b"b"])
        assert await consume_in_group(bootstrap(brokers), "events", "readers", 2) == ["a", "b"]

        new_ports = []
        for broker in brokers:
            broker.terminate()
            # Picked now, not at the start: a port found free long before may be taken.
            (port,) = free_loopback_ports(1)
            while port in ports:  # another address than any the coordinator saw
                (port,) = free_loopback_ports(1)
            new_ports.append(port)
            broker.port = port
            broker.start()
            await asyncio.to_thread(broker.wait_serving, BROKER_SERVICE_NAME)
        assert first_addresses.isdisjoint(b.address for b in brokers)

        async def registered_at_new_addresses() -> bool:
            keys = await read_prefix(store)
            registered = {
                json.loads(v.value)["listeners"][0]["port"]
                for k, v in keys.items()
                if "/brokers/ids/" in k
            }
            return registered == set(new_ports)

        await wait_for(registered_at_new_addresses, timeout_s=60)
        # Past the coordinator's session: only acknowledged heartbeats keep it registered.
        await asyncio.sleep(SESSION_TIMEOUT_S + 3)

        async def coordinator_listed() -> bool:
            reply = await metadata(brokers[0].address, "events")
            return reply is not None and [c.node_id for c in reply.coordinators] == [200]

        assert await coordinator_listed(), coordinator.describe()
        await produce(bootstrap(brokers), [b"c"])
        assert await consume_in_group(bootstrap(brokers), "events", "readers", 1) == ["c"], (
            coordinator.describe()
        )
        assert "no heartbeat acknowledged" not in coordinator.log_text()
    finally:
        for process in reversed(processes):
            process.terminate(timeout_s=15)
