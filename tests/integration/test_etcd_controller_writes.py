"""The etcd-mode controller's large writes and whole reads over a real etcd: a change past
``--max-txn-ops`` written as pipelined compare-and-swap transactions, each fenced by the
controller epoch; a whole prefix read in pages, all at one revision, so that a write
landing between pages is in none of them and the watch from the read's revision + 1 gives
it. A leader's ISR shrink is one compare-and-swap of its partition's state key."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence

import grpc
import pytest
from aetcd import rpc
from etcd_processes import EtcdServer, etcd_member
from highwater.controller.config import ControllerConfig
from highwater.controller.etcd_controller import EtcdController, EtcdControllerSettings
from highwater.controller_api import codec
from highwater.controller_api.messages import (
    AlterPartitionItem,
    AlterPartitionRequest,
    BrokerHeartbeatRequest,
    CreatableTopic,
    CreateTopicsRequest,
)
from highwater.etcd_metadata.connection import (
    Compare,
    Delete,
    EtcdCompactedError,
    EtcdConnection,
    PrefixChanges,
    Put,
    TxnResult,
)
from highwater.etcd_metadata.endpoints import parse_metadata_store
from highwater.etcd_metadata.keys import KeySpace, image_keys, partition_state_value
from highwater.etcd_metadata.session import EtcdSession
from highwater.metadata import MetadataImage, replay
from highwater.metadata.records import (
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(120)

BROKERS = 3
TOPICS = 10
PARTITIONS_PER_TOPIC = 10
MAX_TXN_OPS = 16
PIPELINE = 4


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_member(tmp_path_factory.mktemp("etcd")) as server:
        yield server


class CountingConnection(EtcdConnection):
    """The real connection, counting the transactions it has in flight at once."""

    in_flight = 0
    most_in_flight = 0
    transactions = 0

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        self.in_flight += 1
        self.transactions += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await super().txn(compares, success, failure)
        finally:
            self.in_flight -= 1


class GatedWatchConnection(CountingConnection):
    """The real connection whose watch holds back every response past ``release_through``
    until the test raises it: a watch that delivers late, as under load."""

    release_through = 2**62

    async def watch_prefix_changes(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[PrefixChanges]:
        async for changes in super().watch_prefix_changes(prefix, start_revision):
            while changes.revision > self.release_through:
                await asyncio.sleep(0.01)
            yield changes


def cluster_image() -> MetadataImage:
    """3 brokers registered and unfenced; 10 topics of 10 partitions, RF 3, leaders spread."""
    records: list[MetadataRecord] = []
    for broker_id in range(BROKERS):
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    for topic in range(TOPICS):
        topic_id = f"topic-id-{topic:013d}"
        records.append(TopicRecord(f"topic-{topic}", topic_id))
        for p in range(PARTITIONS_PER_TOPIC):
            replicas = tuple((topic + p + i) % BROKERS for i in range(3))
            records.append(PartitionRecord(topic_id, p, replicas, replicas, replicas[0]))
    return replay(records, len(records) - 1, 1)


@contextlib.asynccontextmanager
async def active_controller(
    endpoint: str, cluster: str, connection_type: type[CountingConnection] = CountingConnection
) -> AsyncIterator[tuple[EtcdController, CountingConnection, KeySpace]]:
    """A controller over ``cluster``'s prefix holding :func:`cluster_image`, its 3 brokers'
    leased keys present; etcd taking at most ``MAX_TXN_OPS`` operations per transaction
    (as the controller is told)."""
    address = parse_metadata_store(f"etcd://{endpoint}/{cluster}")
    space = KeySpace(address.prefix)
    image = cluster_image()
    connection = connection_type(address)
    session = EtcdSession(EtcdConnection(address), ttl_s=30)
    keys = {
        k: partition_state_value(v, 0) if "/partitions/" in k else v
        for k, v in image_keys(image, space).items()
    }
    items = list(keys.items())
    for first in range(0, len(items), MAX_TXN_OPS):
        await connection.txn((), [Put(k, v) for k, v in items[first : first + MAX_TXN_OPS]])
    await connection.txn((), [Put(space.metadata_offset, str(image.offset).encode())])
    await session.start()
    lease = session.lease_id
    assert lease is not None
    await connection.txn(
        (), [Put(space.broker_id(b), b'{"listeners": []}', lease) for b in range(BROKERS)]
    )
    controller = EtcdController(
        node_id=0,
        address="127.0.0.1:1",
        connection=connection,
        space=space,
        session=session,
        cluster_id=cluster,
        settings=EtcdControllerSettings(
            controller=ControllerConfig(broker_session_timeout_ms=3_600_000),
            max_txn_ops=MAX_TXN_OPS,
            write_pipeline=PIPELINE,
            seed=1,
        ),
    )
    try:
        await controller.start()
        await controller.wait_active(30)
        connection.transactions = connection.most_in_flight = 0
        yield controller, connection, space
    finally:
        await controller.stop()
        await session.stop()
        await connection.close()


def shutdown_request(image: MetadataImage, broker_id: int) -> BrokerHeartbeatRequest:
    return BrokerHeartbeatRequest(
        broker_id, image.brokers[broker_id].broker_epoch, image.offset, want_shutdown=True
    )


def partition_states(keys: dict[str, bytes]) -> dict[str, dict[str, object]]:
    return {k: json.loads(v) for k, v in keys.items() if k.endswith("/state")}


async def test_a_controlled_shutdown_past_max_txn_ops_is_written_pipelined(
    etcd: EtcdServer,
) -> None:
    async with active_controller(etcd.endpoint, "pipelined") as (controller, connection, space):
        before = controller.image
        led = before.partitions_led_by(2)
        assert led
        response = await controller.call(codec.BROKER_HEARTBEAT, shutdown_request(before, 2))
        assert response.error == ErrorCode.NONE
        async with asyncio.timeout(30):
            while controller.image.partitions_led_by(2):
                await asyncio.sleep(0.02)
        after = controller.image
        # Broker 2 left every ISR: 100 state keys changed, at most 14 a transaction (the
        # epoch's and the controller key's compares take two of etcd's 16), several in
        # flight, the offset last.
        assert connection.transactions >= -(-TOPICS * PARTITIONS_PER_TOPIC // 14) + 1
        assert 1 < connection.most_in_flight <= PIPELINE
        _, stored = await connection.get_prefix(space.prefix)
        states = partition_states({k: v.value for k, v in stored.items()})
        assert len(states) == TOPICS * PARTITIONS_PER_TOPIC
        for state in states.values():
            assert 2 not in state["isr"] and state["leader"] != 2  # type: ignore[operator]
            assert state["controller_epoch"] == controller.epoch
        assert int(stored[space.metadata_offset].value) == after.offset
        # What the controller holds as written is what etcd holds: no read is needed.
        reads = controller.prefix_reads
        await asyncio.sleep(0.5)
        assert controller.prefix_reads == reads
        assert controller.is_active and controller.inconsistency is None


async def test_a_deposed_controllers_pipelined_writes_all_fail_on_the_epoch(
    etcd: EtcdServer,
) -> None:
    async with active_controller(etcd.endpoint, "deposed") as (controller, connection, space):
        epoch = controller.epoch
        assert epoch is not None
        _, stored = await connection.get_prefix(space.prefix)
        # Another controller was elected (its epoch written) and the key not yet seen.
        await connection.txn((), [Put(space.controller_epoch, str(epoch + 1).encode())])
        response = await controller.call(
            codec.BROKER_HEARTBEAT, shutdown_request(controller.image, 2)
        )
        assert response.error == ErrorCode.NOT_CONTROLLER
        _, now = await connection.get_prefix(space.prefix)
        for key, version in stored.items():
            if key.endswith("/state") or key == space.metadata_offset:
                assert now[key].mod_revision == version.mod_revision, key
        assert controller.image.partitions_led_by(2)


async def test_a_whole_read_in_pages_is_one_snapshot_and_the_watch_gives_what_followed(
    etcd: EtcdServer,
) -> None:
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/paged")
    prefix = KeySpace(address.prefix).prefix
    connection = EtcdConnection(address, page_keys=3)
    try:
        await connection.txn((), [Put(f"{prefix}k{i:02d}", b"%d" % i) for i in range(10)])
        await connection.txn((), [Put(f"{prefix.rstrip('/')}0-beyond", b"not under the prefix")])
        snapshot_revision, snapshot = await connection.get_prefix(prefix)
        assert sorted(snapshot) == [f"{prefix}k{i:02d}" for i in range(10)]

        pages = connection.prefix_pages(prefix)
        revision, first = await anext(pages)
        assert sorted(first) == [f"{prefix}k00", f"{prefix}k01", f"{prefix}k02"]
        # Between pages: a key already read and one not yet read change, one not yet read
        # goes, one is created after the last.
        written = await connection.txn(
            (),
            [
                Put(f"{prefix}k01", b"new"),
                Put(f"{prefix}k05", b"new"),
                Delete(f"{prefix}k07"),
                Put(f"{prefix}k99", b"new"),
            ],
        )
        keys = dict(first)
        page_sizes = [len(first)]
        async for at, page in pages:
            assert at == revision
            page_sizes.append(len(page))
            keys.update(page)
        assert page_sizes == [3, 3, 3, 1]
        assert revision == snapshot_revision < written.revision
        assert keys == snapshot  # none of the write: not missed, not half-seen

        changes: list[tuple[str, bytes | None]] = []
        watch = connection.watch_prefix_changes(prefix, revision + 1)
        async with contextlib.aclosing(watch), asyncio.timeout(30):
            async for response in watch:
                changes += [(k, v.value if v else None) for k, _, v in response.changes]
                if len(changes) >= 4:
                    break
        assert sorted(changes, key=lambda c: c[0]) == [
            (f"{prefix}k01", b"new"),
            (f"{prefix}k05", b"new"),
            (f"{prefix}k07", None),
            (f"{prefix}k99", b"new"),
        ]
        _, after = await connection.get_prefix(prefix)
        assert {k: v.value for k, v in after.items()} == {
            **{k: v.value for k, v in snapshot.items() if not k.endswith("k07")},
            f"{prefix}k01": b"new",
            f"{prefix}k05": b"new",
            f"{prefix}k99": b"new",
        }
    finally:
        await connection.close()


async def test_a_read_whose_revision_is_compacted_between_pages_says_so(
    etcd: EtcdServer,
) -> None:
    address = parse_metadata_store(f"etcd://{etcd.endpoint}/compacted")
    prefix = KeySpace(address.prefix).prefix
    connection = EtcdConnection(address, page_keys=2)
    channel = grpc.aio.insecure_channel(etcd.endpoint)
    try:
        await connection.txn((), [Put(f"{prefix}k{i}", b"v") for i in range(5)])
        pages = connection.prefix_pages(prefix)
        revision, _ = await anext(pages)
        written = await connection.txn((), [Put(f"{prefix}k4", b"w")])
        await rpc.KVStub(channel).Compact(rpc.CompactionRequest(revision=written.revision))
        with pytest.raises(EtcdCompactedError, match=f"compacted revision {revision}"):
            await anext(pages)
        # A whole read starts again at the current revision.
        now, keys = await connection.get_prefix(prefix)
        assert now >= written.revision and keys[f"{prefix}k4"].value == b"w"
    finally:
        await channel.close()
        await connection.close()


async def test_a_broker_without_its_leased_key_stays_fenced_though_it_heartbeats(
    etcd: EtcdServer,
) -> None:
    """Liveness is the leased key, as the ephemeral znode was: a broker whose key went (its
    session expired, or it is cut off from etcd but not from the controller) is fenced and
    its heartbeats do not unfence it until its key is back."""
    async with active_controller(etcd.endpoint, "keyless") as (controller, connection, space):
        lease = controller.session.lease_id
        assert lease is not None
        await connection.txn((), [Delete(space.broker_id(2))])
        async with asyncio.timeout(30):
            while not controller.image.brokers[2].fenced:
                await asyncio.sleep(0.02)
        assert not controller.image.partitions_led_by(2)

        def heartbeat() -> BrokerHeartbeatRequest:
            image = controller.image
            return BrokerHeartbeatRequest(2, image.brokers[2].broker_epoch, image.offset)

        response = await controller.call(codec.BROKER_HEARTBEAT, heartbeat())
        assert response.error == ErrorCode.NONE
        assert response.is_fenced
        assert controller.image.brokers[2].fenced

        await connection.txn((), [Put(space.broker_id(2), b'{"listeners": []}', lease)])
        async with asyncio.timeout(30):
            while True:
                response = await controller.call(codec.BROKER_HEARTBEAT, heartbeat())
                if not response.is_fenced:
                    break
                await asyncio.sleep(0.05)
        assert not controller.image.brokers[2].fenced


async def test_a_hand_edit_seen_before_the_controllers_own_write_is_not_lost(
    etcd: EtcdServer,
) -> None:
    """A key edited behind the controller's back, whose event the watch delivers after the
    controller wrote something else (a view older than its own write), is still noticed
    once the view catches up: the controller takes etcd's state again."""
    async with active_controller(etcd.endpoint, "late-watch", GatedWatchConnection) as (
        controller,
        connection,
        space,
    ):
        key = space.partition_state("topic-0", 0)
        _, held = await connection.get(key)
        assert held is not None
        state = json.loads(held.value)
        assert len(state["isr"]) == 3
        state["isr"] = [state["leader"]]
        state["partition_epoch"] += 1
        connection.release_through = held.mod_revision  # nothing newer reaches the view
        edit = await connection.txn((), [Put(key, json.dumps(state).encode())])
        response = await controller.call(
            codec.CREATE_TOPICS,
            CreateTopicsRequest((CreatableTopic("late", 1, 1),)),
        )
        assert response.error == ErrorCode.NONE
        assert response.topics[0].error == ErrorCode.NONE
        # The edit reaches the view, the controller's own write not yet: a round looks.
        connection.release_through = edit.revision
        async with asyncio.timeout(30):
            while controller.view.revision < edit.revision:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        connection.release_through = 2**62
        async with asyncio.timeout(15):
            while len(controller.image.topics.by_name["topic-0"].partitions[0].isr) != 1:
                await asyncio.sleep(0.05)
        assert "late" in controller.image.topics.by_name


async def test_a_controller_whose_lease_is_gone_writes_nothing_though_no_other_was_elected(
    etcd: EtcdServer,
) -> None:
    """Paused past its lease: the ``controller`` key went with the lease, and no other
    candidate has claimed yet (the epoch is unchanged). The controller, not knowing it yet
    (its session not refreshed since, the key's deletion not yet delivered), must not write:
    every write is conditional on the key it claimed, not only on the epoch."""
    async with active_controller(etcd.endpoint, "lease-gone", GatedWatchConnection) as (
        controller,
        connection,
        space,
    ):
        lease = controller.session.lease_id
        assert lease is not None and controller.is_active
        revision, _ = await connection.get(space.controller)
        connection.release_through = revision  # the key's deletion stays unseen
        await connection.revoke_lease(lease)
        _, claim = await connection.get(space.controller)
        assert claim is None
        response = await controller.call(
            codec.CREATE_TOPICS, CreateTopicsRequest((CreatableTopic("unleased", 1, 1),))
        )
        assert response.error == ErrorCode.NOT_CONTROLLER
        _, topic = await connection.get(space.topic("unleased"))
        assert topic is None


async def test_an_isr_shrink_from_the_leader_is_one_compare_and_swap_of_its_state_key(
    etcd: EtcdServer,
) -> None:
    """AlterPartition from a partition's leader (the ZooKeeper era's ISR write with the
    znode's zkVersion): one transaction changing that partition's state key and
    ``metadata_offset`` only; the same request again carries a partition epoch that is no
    longer etcd's and is refused, writing nothing."""
    async with active_controller(etcd.endpoint, "isr-shrink") as (controller, connection, space):
        image = controller.image
        topic = image.topics.by_name["topic-3"]
        partition = topic.partitions[0]
        follower = next(b for b in partition.isr if b != partition.leader)
        shrunk = tuple(b for b in partition.isr if b != follower)
        request = AlterPartitionRequest(
            partition.leader,
            image.brokers[partition.leader].broker_epoch,
            (
                AlterPartitionItem(
                    topic.topic_id, 0, partition.leader_epoch, partition.partition_epoch, shrunk
                ),
            ),
        )
        _, before = await connection.get_prefix(space.prefix)
        reply = await controller.call(codec.ALTER_PARTITION, request)
        assert reply.error == ErrorCode.NONE
        (result,) = reply.partitions
        assert (result.error, tuple(result.isr)) == (ErrorCode.NONE, shrunk)
        assert connection.transactions == 1
        _, after = await connection.get_prefix(space.prefix)
        changed = {
            key
            for key, held in after.items()
            if key not in before or before[key].mod_revision != held.mod_revision
        }
        key = space.partition_state("topic-3", 0)
        assert changed == {key, space.metadata_offset}
        state = json.loads(after[key].value)
        assert tuple(state["isr"]) == shrunk
        assert state["partition_epoch"] == partition.partition_epoch + 1
        assert state["controller_epoch"] == controller.epoch

        stale = await controller.call(codec.ALTER_PARTITION, request)
        (refused,) = stale.partitions
        assert refused.error == ErrorCode.INVALID_UPDATE_VERSION
        assert connection.transactions == 1
        _, unchanged = await connection.get_prefix(space.prefix)
        assert {k: v.mod_revision for k, v in unchanged.items()} == {
            k: v.mod_revision for k, v in after.items()
        }
