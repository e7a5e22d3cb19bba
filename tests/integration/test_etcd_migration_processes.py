"""The etcd → KRaft migration on real processes and a real etcd (docs/etcd-mode.md).

Three ``highwater broker --metadata-store etcd://...`` processes hold a topic of RF 3 that a
producer writes with acks=all all along. A one-voter quorum is started with
``--migration-from``: its controller claims etcd's controller key, copies the state, and
the brokers — still in etcd mode — follow it (their controller calls are redirected to
it, its pushes carry the claimed epoch). The brokers are rolled one at a time onto
``--controllers`` with the same node ids and data directories: each comes back in every
ISR, no partition is ever without a leader after a move, and the partition keeps the
leader epoch etcd had. The last one ends the migration: the quorum stops writing etcd
(its keys stay as they were), every acknowledged write is readable, and ``cluster
describe`` says KRaft. A store that cannot be reached, or a cluster id other than etcd's,
stops the controller before it writes anything.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from broker_processes import BrokerProcess, consume_all, metadata
from cli_process import highwater_cli
from click.testing import CliRunner
from etcd_processes import (
    EtcdBrokerProcess,
    EtcdServer,
    etcd_member,
    read_prefix,
    wait_for,
)
from highwater.broker.rolling import ClusterView, under_replicated
from highwater.cli.main import main
from highwater.cli.rolling import observe_cluster
from highwater.client.admin import AdminClient, AdminError, NewTopic
from highwater.client.producer import AsyncProducer
from highwater.rpc.endpoints import free_loopback_ports
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(240)

CLUSTER = "migrating"
PREFIX = f"/highwater/{CLUSTER}/"
BROKERS = (1, 2, 3)
CONTROLLER_ID = 3000
TOPIC = "events"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture(scope="module")
def store(etcd: EtcdServer) -> str:
    return f"etcd://{etcd.endpoint}/{CLUSTER}"


@dataclass
class Cluster:
    root: Path
    store: str
    etcd_brokers: dict[int, EtcdBrokerProcess]
    kraft_brokers: dict[int, BrokerProcess]
    controller: Controller

    @property
    def bootstrap(self) -> str:
        running = [b.address for b in self.etcd_brokers.values() if b.process is not None]
        running += [b.address for b in self.kraft_brokers.values() if b.alive]
        return ",".join(running)

    async def view(self) -> ClusterView | None:
        try:
            async with AdminClient(self.bootstrap, request_timeout_s=5) as admin:
                return await observe_cluster(admin)
        except (AdminError, OSError):
            return None

    async def wait_view(self, condition, timeout_s: float = 60) -> ClusterView:  # type: ignore[no-untyped-def]
        async def holds() -> ClusterView | None:
            view = await self.view()
            return view if view is not None and condition(view) else None

        return await wait_for(holds, timeout_s=timeout_s, interval_s=0.2)


@pytest.fixture(scope="module")
def cluster(store: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("migration")
    controller_port, *ports = free_loopback_ports(1 + len(BROKERS))
    etcd_brokers = {
        node: EtcdBrokerProcess(node, port, store, root / f"b{node}")
        for node, port in zip(BROKERS, ports, strict=True)
    }
    controller = Controller(
        CONTROLLER_ID,
        controller_port,
        f"{CONTROLLER_ID}@127.0.0.1:{controller_port}",
        root / "controller",
        root / "controller.log",
        extra_args=("--migration-from", store),
    )
    kraft_brokers = {
        node: BrokerProcess(
            node,
            process.port,
            controller.address,
            process.data_dir,
            root / f"kraft-broker-{node}.log",
            replica_lag_time_max_ms=2000,
        )
        for node, process in etcd_brokers.items()
    }
    for process in etcd_brokers.values():
        process.start()

    async def cluster_id_written() -> bool:
        return f"{PREFIX}cluster_id" in await read_prefix(store)

    running = Cluster(root, store, etcd_brokers, kraft_brokers, controller)
    try:
        # The etcd-mode cluster exists once its id is in etcd: a test that runs first
        # (alone, say) must not find the store empty.
        asyncio.run(wait_for(cluster_id_written, timeout_s=60))
        yield running
    finally:
        for broker in kraft_brokers.values():
            broker.kill()
        for process in etcd_brokers.values():
            process.kill()
        controller.kill()


def full(view: ClusterView) -> bool:
    """Every broker live, the topic there, led and fully replicated."""
    return (
        len(view.live_brokers) == len(BROKERS)
        and any(p.topic == TOPIC for p in view.partitions)
        and all(p.leader is not None for p in view.partitions)
        and not under_replicated(view)
    )


class Writer:
    """Writes ``events`` partition 0 with acks=all until stopped; what was acknowledged."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.acknowledged: list[bytes] = []
        self.failed = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        settings = {
            "bootstrap.servers": self.bootstrap,
            "acks": "all",
            "request.timeout.ms": 5_000,
            "delivery.timeout.ms": 20_000,
        }
        i = 0
        async with AsyncProducer(settings) as producer:
            while not self._stop.is_set():
                value = f"v{i}".encode()
                i += 1
                try:
                    await producer.produce(TOPIC, value, partition=0)
                except Exception:  # not acknowledged: it need not be there
                    self.failed += 1
                    await asyncio.sleep(0.05)
                    continue
                self.acknowledged.append(value)
                await asyncio.sleep(0.01)

    async def written(self, count: int) -> bool:
        """Whether more than ``count`` writes were acknowledged (for :func:`wait_for`)."""
        return len(self.acknowledged) > count

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        async with asyncio.timeout(30):
            await self._task


async def describe(bootstrap_server: str) -> str:
    return await highwater_cli("cluster", "describe", "--bootstrap-server", bootstrap_server)


def partition_state(keys, partition: int = 0) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(keys[f"{PREFIX}brokers/topics/{TOPIC}/partitions/{partition}/state"].value)


async def test_a_rolling_restart_moves_the_cluster_to_kraft_losing_nothing(
    cluster: Cluster,
) -> None:
    async def created() -> bool:
        try:
            async with AdminClient(cluster.bootstrap, request_timeout_s=3) as admin:
                results = await admin.create_topics([NewTopic(TOPIC, 1, 3)])
                results[TOPIC].raise_for_error()
        except AdminError:
            return False
        return True

    await wait_for(created, timeout_s=60, interval_s=0.2)
    await cluster.wait_view(full)
    writer = Writer(cluster.bootstrap)
    writer.start()
    try:
        before = partition_state(await read_prefix(cluster.store))
        # The quorum in migration mode claims etcd's controller key and copies the state,
        # while the writer goes on.
        cluster.controller.start()
        await wait_for(lambda: writer.written(10))

        async def claimed() -> dict | None:
            keys = await read_prefix(cluster.store)
            claim = keys.get(f"{PREFIX}controller")
            value = json.loads(claim.value) if claim is not None else None
            return value if value is not None and value["broker_id"] == CONTROLLER_ID else None

        claim = await wait_for(claimed, timeout_s=30)
        assert claim["epoch"] > before["controller_epoch"]

        async def described_by_kraft() -> bool:
            output = await describe(cluster.etcd_brokers[1].address)
            return f"ControllerId: {CONTROLLER_ID}" in output and "MetadataMode: etcd" in output

        await wait_for(described_by_kraft, timeout_s=30)
        view = await cluster.wait_view(full)
        # The copy changed no leader: the partition keeps the leader and leader epoch it had.
        for broker in cluster.etcd_brokers.values():
            reply = await metadata(broker.address, TOPIC)
            assert reply is not None
            (partition,) = reply.topics[0].partitions
            assert (partition.leader_id, partition.leader_epoch) == (
                before["leader"],
                before["leader_epoch"],
            )

        # Roll the brokers onto the quorum, one at a time.
        for node in reversed(BROKERS):
            acknowledged = len(writer.acknowledged)
            cluster.etcd_brokers[node].terminate(timeout_s=30)
            view = await cluster.wait_view(lambda view, node=node: node not in view.live_brokers)
            assert all(p.leader is not None and p.leader != node for p in view.partitions)
            # Dual write: the KRaft controller's changes are in etcd, under the claimed epoch.
            state = partition_state(await read_prefix(cluster.store))
            assert node not in state["isr"] and state["controller_epoch"] == claim["epoch"]
            cluster.kraft_brokers[node].start()
            view = await cluster.wait_view(full, timeout_s=60)
            assert all(node in p.isr for p in view.partitions)
            await wait_for(lambda n=acknowledged: writer.written(n + 5), timeout_s=30)

        # The last broker moved: the migration ends, etcd is released and no longer written.
        async def released() -> dict | None:
            keys = await read_prefix(cluster.store)
            return keys if f"{PREFIX}controller" not in keys else None

        at_end = await wait_for(released, timeout_s=30)
        async with AdminClient(cluster.bootstrap, request_timeout_s=10) as admin:
            (await admin.create_topics([NewTopic("after", 1, 3)]))["after"].raise_for_error()
        await cluster.wait_view(lambda view: any(p.topic == "after" for p in view.partitions))
        after = await read_prefix(cluster.store)
        assert {k: (v.value, v.mod_revision) for k, v in after.items()} == {
            k: (v.value, v.mod_revision) for k, v in at_end.items()
        }
        assert not any("/after" in key for key in after)
        assert "the etcd migration is over" in cluster.controller.log_path.read_text()
    finally:
        await writer.stop()

    consumed = await consume_all(cluster.bootstrap, TOPIC)
    assert len(writer.acknowledged) > 40
    missing = [v for v in writer.acknowledged if v not in set(consumed)]
    assert missing == []
    output = await describe(cluster.bootstrap)
    assert "MetadataMode: kraft" in output
    assert f"ControllerId: {CONTROLLER_ID}" in output


def start_controller(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["controller", *args])
    return result.exit_code, result.output + str(result.exception or "")


def test_an_unreachable_store_stops_the_controller_before_it_writes(tmp_path: Path) -> None:
    (port,) = free_loopback_ports(1)
    (dead,) = free_loopback_ports(1)
    data_dir = tmp_path / "controller"
    code, output = start_controller(
        [
            *("--node-id", "1", "--listen", f"127.0.0.1:{port}"),
            *("--voters", f"1@127.0.0.1:{port}", "--data-dir", str(data_dir)),
            *("--migration-from", f"etcd://127.0.0.1:{dead}/{CLUSTER}"),
        ]
    )
    assert code != 0
    assert f"127.0.0.1:{dead}" in output and "did not answer" in output
    assert not data_dir.exists() or not any(data_dir.iterdir())


def test_a_cluster_id_other_than_etcds_stops_the_controller_before_it_writes(
    cluster: Cluster, tmp_path: Path
) -> None:
    (port,) = free_loopback_ports(1)
    data_dir = tmp_path / "controller"
    code, output = start_controller(
        [
            *("--node-id", "1", "--listen", f"127.0.0.1:{port}"),
            *("--voters", f"1@127.0.0.1:{port}", "--data-dir", str(data_dir)),
            *("--cluster-id", "some-other-cluster", "--migration-from", cluster.store),
        ]
    )
    assert code != 0
    assert "some-other-cluster" in output and "differs" in output
    assert not data_dir.exists() or not any(data_dir.iterdir())
