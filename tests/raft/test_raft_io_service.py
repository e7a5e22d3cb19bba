"""``RaftServer`` in one event loop: real gRPC on loopback, real files, several replicas.

What the driver adds to the pure core: persistence before sending, group-committed
flushes, the request/response matching of the servicer, proposals that resolve on commit,
snapshots written and shipped to a replica that fell behind the log start, the health and
reflection services, and typed errors for damaged files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from highwater.errors import KafkaStorageError, UnexpectedAppendOffsetError
from highwater.internal.v1 import raft_pb2, raft_pb2_grpc
from highwater.raft.driver import (
    MetadataLogLayout,
    RaftServer,
    RaftServerSettings,
    default_cluster_id,
)
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.node import NotLeaderError, RoleChange
from highwater.raft.partition_raft_log import metadata_log_config
from highwater.raft.quorum_state_file import CorruptQuorumStateError, QuorumStateFile
from highwater.raft.state import Role
from highwater.raft.state_machine import SnapshotReader
from highwater.records import RecordBatch
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1.common_pb2 import ErrorCode
from raft_timing import FAST

pytestmark = pytest.mark.timeout(120)


class RecordingStateMachine:
    """Keeps every committed value; snapshots are the JSON list of them."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self.loaded: list[OffsetAndEpoch] = []
        self.snapshots: list[OffsetAndEpoch] = []

    def apply(self, batches: Sequence[RecordBatch], high_watermark: int) -> None:
        for batch in batches:
            assert batch.next_offset <= high_watermark
            for record in batch.records():
                assert record.value is not None
                self.values.append(record.value.decode())

    def load_snapshot(self, reader: SnapshotReader) -> None:
        self.values = json.loads(reader.read())
        self.loaded.append(reader.snapshot_id)

    def snapshot(self, snapshot_id: OffsetAndEpoch) -> bytes:
        self.snapshots.append(snapshot_id)
        return json.dumps(self.values).encode()


class Quorum:
    def __init__(self, root: Path, size: int, settings: RaftServerSettings) -> None:
        ports = free_loopback_ports(size)
        self.root = root
        self.voters = {n: f"127.0.0.1:{p}" for n, p in zip(range(1, size + 1), ports, strict=True)}
        self.settings = settings
        self.servers: dict[int, RaftServer] = {}
        self.machines: dict[int, RecordingStateMachine] = {}
        self.roles: dict[int, list[RoleChange]] = {}

    async def start(self, node_id: int) -> RaftServer:
        machine = self.machines.setdefault(node_id, RecordingStateMachine())
        roles = self.roles.setdefault(node_id, [])
        server = RaftServer(
            node_id=node_id,
            listen=self.voters[node_id],
            voters=self.voters,
            data_dir=self.root / f"node-{node_id}",
            state_machine=machine,
            settings=self.settings,
            role_listeners=[roles.append],
        )
        await server.start()
        self.servers[node_id] = server
        return server

    async def stop(self, node_id: int) -> None:
        await self.servers.pop(node_id).stop()

    async def leader(self, timeout_s: float = 20) -> RaftServer:
        async with asyncio.timeout(timeout_s):
            while True:
                leaders = [s for s in self.servers.values() if s.is_leader]
                if len(leaders) == 1:
                    return leaders[0]
                await asyncio.sleep(0.02)

    async def propose(self, value: str, timeout_s: float = 20) -> int:
        async with asyncio.timeout(timeout_s):
            while True:
                leader = await self.leader()
                try:
                    return await leader.propose([value.encode()])
                except NotLeaderError:
                    await asyncio.sleep(0.05)

    async def wait_applied(self, node_id: int, offset: int, timeout_s: float = 20) -> None:
        async with asyncio.timeout(timeout_s):
            while self.servers[node_id].applied_offset < offset:
                await asyncio.sleep(0.02)


@pytest.fixture
async def quorum3(tmp_path: Path) -> AsyncIterator[Quorum]:
    quorum = Quorum(tmp_path, 3, RaftServerSettings(raft=FAST))
    try:
        yield quorum
    finally:
        for node_id in list(quorum.servers):
            await quorum.stop(node_id)


# --- the cluster id -------------------------------------------------------------------------


def test_default_cluster_id_is_the_same_for_every_voter() -> None:
    a = default_cluster_id({1: "h:1", 2: "h:2"})
    assert a == default_cluster_id({2: "h:2", 1: "h:1"})
    assert a != default_cluster_id({1: "h:1", 2: "h:3"})
    assert len(a) == 22


# --- one voter --------------------------------------------------------------------------------


async def test_single_voter_commits_and_recovers_its_state(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, 1, RaftServerSettings(raft=FAST))
    server = await quorum.start(1)
    try:
        assert server.is_leader
        offsets = [await server.propose([f"v{i}".encode()]) for i in range(5)]
        assert offsets == sorted(offsets)
        batch = await asyncio.gather(*(server.propose([f"w{i}".encode()]) for i in range(50)))
        assert len(set(batch)) == 50
        assert quorum.machines[1].values == [f"v{i}" for i in range(5)] + [
            f"w{i}" for i in range(50)
        ]
        assert quorum.roles[1][-1].role == Role.LEADER
        description = server.describe()
        assert description.leader_id == 1
        assert description.high_watermark == server.high_watermark
    finally:
        await quorum.stop(1)
    state = QuorumStateFile(MetadataLogLayout(tmp_path / "node-1").quorum_state_path).read()
    assert state is not None and state.leader_epoch >= 1 and state.voters == (1,)

    quorum.machines[1] = RecordingStateMachine()
    server = await quorum.start(1)
    try:
        await quorum.wait_applied(1, offsets[-1] + 1)
        assert quorum.machines[1].values[:5] == [f"v{i}" for i in range(5)]
        assert server.cluster_id == default_cluster_id(quorum.voters)
    finally:
        await quorum.stop(1)


async def test_append_returns_its_offset_at_once_and_commits_later(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, 1, RaftServerSettings(raft=FAST))
    server = await quorum.start(1)
    try:
        await quorum.leader()
        await server.propose([b"first"])
        epoch = server.describe().leader_epoch
        end = server.applied_offset
        last, committed = server.append([b"a", b"b", b"c"], epoch=epoch, base_offset=end)
        assert last == OffsetAndEpoch(end + 2, epoch)
        assert not committed.done()
        assert await committed == end + 2
        assert quorum.machines[1].values[-3:] == ["a", "b", "c"]
        assert server.applied_offset == end + 3

        # Guards: nothing is appended when the epoch or the log end is not the expected one.
        with pytest.raises(NotLeaderError):
            server.append([b"x"], epoch=epoch + 1)
        with pytest.raises(UnexpectedAppendOffsetError, match=f"ends at offset {end + 3}"):
            server.append([b"x"], base_offset=end + 2)
        last, committed = server.append([b"d"], epoch=epoch, base_offset=end + 3)
        assert last.offset == end + 3 and await committed == end + 3
        assert quorum.machines[1].values[-2:] == ["c", "d"]
    finally:
        await quorum.stop(1)


async def test_snapshots_are_written_and_loaded_on_restart(tmp_path: Path) -> None:
    settings = RaftServerSettings(
        raft=FAST,
        log_config=metadata_log_config(segment_bytes=2048),
        metadata_log_max_record_bytes_between_snapshots=4096,
    )
    quorum = Quorum(tmp_path, 1, settings)
    server = await quorum.start(1)
    try:
        for i in range(200):
            await server.propose([f"value-{i:04d}".encode() + b"x" * 40])
        machine = quorum.machines[1]
        assert machine.snapshots
        layout = MetadataLogLayout(tmp_path / "node-1")
        assert len(list(layout.snapshot_dir.glob("*.checkpoint"))) == 1  # older ones deleted
        # The log start moved past the first segments, which are gone.
        assert not (layout.log_dir / "00000000000000000000.log").exists()
        committed = server.high_watermark
    finally:
        await quorum.stop(1)
    quorum.machines[1] = RecordingStateMachine()
    await quorum.start(1)
    try:
        machine = quorum.machines[1]
        await quorum.wait_applied(1, committed)
        assert machine.loaded, "the restarted replica did not start from its snapshot"
        assert machine.values == [f"value-{i:04d}" + "x" * 40 for i in range(200)]
    finally:
        await quorum.stop(1)


async def test_a_corrupt_quorum_state_file_stops_the_start(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, 1, RaftServerSettings(raft=FAST))
    await quorum.start(1)
    await quorum.stop(1)
    path = MetadataLogLayout(tmp_path / "node-1").quorum_state_path
    path.write_text('{"clusterId": "x", "leaderEpoch": ')
    with pytest.raises(CorruptQuorumStateError, match=str(path)):
        await quorum.start(1)
    # The data directory was released: a repaired file lets it start.
    path.unlink()
    await quorum.start(1)
    await quorum.stop(1)


async def test_a_data_directory_serves_one_process(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, 1, RaftServerSettings(raft=FAST))
    await quorum.start(1)
    try:
        twin = RaftServer(
            node_id=1,
            listen="127.0.0.1:0",
            voters=quorum.voters,
            data_dir=tmp_path / "node-1",
            state_machine=RecordingStateMachine(),
        )
        with pytest.raises(KafkaStorageError, match="in use"):
            await twin.start()
    finally:
        await quorum.stop(1)


async def test_another_cluster_id_is_refused(tmp_path: Path) -> None:
    quorum = Quorum(tmp_path, 1, RaftServerSettings(raft=FAST))
    await quorum.start(1)
    await quorum.stop(1)
    other = RaftServer(
        node_id=1,
        listen=quorum.voters[1],
        voters=quorum.voters,
        data_dir=tmp_path / "node-1",
        state_machine=RecordingStateMachine(),
        cluster_id="another-cluster",
    )
    with pytest.raises(KafkaStorageError, match="belongs to cluster"):
        await other.start()


# --- three voters ----------------------------------------------------------------------------


async def test_three_voters_elect_replicate_and_fail_over(quorum3: Quorum) -> None:
    for node_id in quorum3.voters:
        await quorum3.start(node_id)
    leader = await quorum3.leader()
    offsets = [await quorum3.propose(f"a{i}") for i in range(10)]
    for node_id in quorum3.voters:
        await quorum3.wait_applied(node_id, offsets[-1] + 1)
        assert quorum3.machines[node_id].values == [f"a{i}" for i in range(10)]

    for _ in range(5):  # on a loaded machine, leadership may move between the two steps
        leader = await quorum3.leader()
        follower = next(s for n, s in quorum3.servers.items() if n != leader.node_id)
        with pytest.raises(NotLeaderError) as raised:
            await follower.propose([b"nope"])
        if leader.is_leader:
            break
    assert raised.value.leader_id == leader.node_id

    # A graceful stop of the leader: it resigns, another takes over quickly.
    old_leader = leader.node_id
    await quorum3.stop(old_leader)
    new_leader = await quorum3.leader(timeout_s=10)
    assert new_leader.node_id != old_leader
    offset = await quorum3.propose("after-failover")
    await quorum3.start(old_leader)
    for node_id in quorum3.voters:
        await quorum3.wait_applied(node_id, offset + 1)
        assert quorum3.machines[node_id].values[-1] == "after-failover"
    roles = [change.role for change in quorum3.roles[old_leader]]
    assert Role.LEADER in roles and Role.RESIGNED in roles


@pytest.fixture
async def patient_quorum3(tmp_path: Path) -> AsyncIterator[Quorum]:
    """Three voters whose leader keeps leading 3 s without hearing from its followers
    (FAST's is 600 ms): stopping two voters on a loaded machine can take longer than that."""
    quorum = Quorum(
        tmp_path, 3, RaftServerSettings(raft=dataclasses.replace(FAST, fetch_timeout_ms=3000))
    )
    try:
        yield quorum
    finally:
        for node_id in list(quorum.servers):
            await quorum.stop(node_id)


async def test_a_deposed_leaders_truncated_proposals_fail(patient_quorum3: Quorum) -> None:
    """The old leader's two uncommitted entries are truncated when it follows the new
    leader, whose log ends before the second: both proposals fail at once, rather than
    the second waiting for a write that covers its offset. The leader must still lead
    when it appends them after its followers stopped, hence the patient quorum."""
    quorum3 = patient_quorum3
    for node_id in quorum3.voters:
        await quorum3.start(node_id)
    deposed = await quorum3.leader()
    await quorum3.propose("committed")
    followers = [n for n in quorum3.voters if n != deposed.node_id]
    for node_id in followers:
        await quorum3.stop(node_id)
    _, first = deposed.append([b"lost-1"])
    _, second = deposed.append([b"lost-2"])
    # The followers come back unable to reach the old leader, and elect one of their own.
    unreachable = {**quorum3.voters, deposed.node_id: f"127.0.0.1:{free_loopback_ports(1)[0]}"}
    for node_id in followers:
        server = RaftServer(
            node_id=node_id,
            listen=quorum3.voters[node_id],
            voters=unreachable,
            data_dir=quorum3.root / f"node-{node_id}",
            state_machine=quorum3.machines[node_id],
            settings=quorum3.settings,
        )
        await server.start()
        quorum3.servers[node_id] = server
    for proposal in (first, second):
        with pytest.raises(NotLeaderError):
            await asyncio.wait_for(asyncio.shield(proposal), 15)
    assert not deposed.is_leader
    assert quorum3.machines[deposed.node_id].values == ["committed"]


async def test_grpc_describe_quorum_health_and_reflection(quorum3: Quorum) -> None:
    for node_id in quorum3.voters:
        await quorum3.start(node_id)
    offset = await quorum3.propose("x")
    # A commit needs one follower only: wait until both have fetched, so both know the leader.
    for node_id in quorum3.voters:
        await quorum3.wait_applied(node_id, offset + 1)
    leader = await quorum3.leader()
    follower_id = next(n for n in quorum3.voters if n != leader.node_id)
    async with grpc.aio.insecure_channel(quorum3.voters[leader.node_id]) as channel:
        response = await raft_pb2_grpc.RaftStub(channel).DescribeQuorum(
            raft_pb2.DescribeQuorumRequest(), timeout=5
        )
        assert response.error == ErrorCode.NONE
        assert response.leader_id == leader.node_id
        assert response.cluster_id == leader.cluster_id
        assert {r.replica_id for r in response.current_voters} == set(quorum3.voters)
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="highwater.v1.Raft"), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = set()
        async for reply in replies:
            names |= {s.name for s in reply.list_services_response.service}
        assert {"highwater.internal.v1.Raft", "grpc.health.v1.Health"} <= names
    async with grpc.aio.insecure_channel(quorum3.voters[follower_id]) as channel:
        response = await raft_pb2_grpc.RaftStub(channel).DescribeQuorum(
            raft_pb2.DescribeQuorumRequest(), timeout=5
        )
        assert response.error == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert response.leader_id == leader.node_id


async def test_requests_with_another_cluster_id_are_answered_with_an_error(
    quorum3: Quorum,
) -> None:
    for node_id in quorum3.voters:
        await quorum3.start(node_id)
    leader = await quorum3.leader()
    async with grpc.aio.insecure_channel(quorum3.voters[leader.node_id]) as channel:
        response = await raft_pb2_grpc.RaftStub(channel).Fetch(
            raft_pb2.RaftFetchRequest(
                cluster_id="elsewhere", replica_id=99, fetch_offset=0, max_wait_ms=0
            ),
            timeout=5,
        )
    assert response.error == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert response.replica_id == 99


async def test_an_observer_long_polls_the_leader(quorum3: Quorum) -> None:
    for node_id in quorum3.voters:
        await quorum3.start(node_id)
    leader = await quorum3.leader()
    end = await quorum3.propose("seen-by-observer")
    async with grpc.aio.insecure_channel(quorum3.voters[leader.node_id]) as channel:
        stub = raft_pb2_grpc.RaftStub(channel)
        request = raft_pb2.RaftFetchRequest(
            cluster_id=leader.cluster_id,
            replica_id=1000,
            current_leader_epoch=leader.describe().leader_epoch,
            fetch_offset=end + 1,
            last_fetched_epoch=leader.describe().leader_epoch,
            max_wait_ms=5000,
            max_bytes=1 << 20,
        )
        # The first fetch brings news (the high watermark); the next one waits for data.
        first = await stub.Fetch(request, timeout=10)
        assert first.error == ErrorCode.NONE and not first.records
        assert first.high_watermark == end + 1
        poll = asyncio.ensure_future(stub.Fetch(request, timeout=10))
        await asyncio.sleep(0.3)
        assert not poll.done(), f"a fetch at the log end must wait: {poll.result()}"
        await quorum3.propose("wakes-the-poll")
        response = await asyncio.wait_for(poll, 5)
    assert response.error == ErrorCode.NONE
    assert response.records
    description = leader.describe()
    assert 1000 in {o.replica_id for o in description.observers}


async def test_fetches_on_one_stream_are_answered_in_order(quorum3: Quorum) -> None:
    for node_id in quorum3.voters:
        await quorum3.start(node_id)
    # On a loaded machine the leader may move before the stream's first answer: the test
    # starts again with the new one (the stream's own behaviour is checked below).
    async with asyncio.timeout(60):
        while True:
            leader = await quorum3.leader()
            end = await quorum3.propose("first")
            epoch = leader.describe().leader_epoch
            if await _stream_fetches_in_order(quorum3, leader, end, epoch):
                return


async def _stream_fetches_in_order(
    quorum3: Quorum, leader: RaftServer, end: int, epoch: int
) -> bool:
    """Fetches on one stream to ``leader``, answered in order; False if it was not the
    leader of ``epoch`` any more when the first answer came."""

    def fetch(offset: int, max_wait_ms: int) -> raft_pb2.RaftFetchRequest:
        return raft_pb2.RaftFetchRequest(
            cluster_id=leader.cluster_id,
            replica_id=1001,
            current_leader_epoch=epoch,
            fetch_offset=offset,
            last_fetched_epoch=epoch if offset else 0,
            max_wait_ms=max_wait_ms,
            max_bytes=1 << 20,
        )

    async with grpc.aio.insecure_channel(quorum3.voters[leader.node_id]) as channel:
        call = raft_pb2_grpc.RaftStub(channel).FetchStream()
        await call.write(fetch(end + 1, 0))  # at the log end: the high watermark only
        at_end = await asyncio.wait_for(call.read(), 10)
        if at_end.error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH):
            call.cancel()
            return False
        assert at_end.error == ErrorCode.NONE and not at_end.records
        assert at_end.high_watermark == end + 1
        await call.write(fetch(end + 1, 5000))  # a long poll on the stream
        poll = asyncio.ensure_future(call.read())
        await asyncio.sleep(0.3)
        assert not poll.done(), "a fetch at the log end must wait on the stream too"
        await quorum3.propose("second")
        woken = await asyncio.wait_for(poll, 5)
        assert woken.error == ErrorCode.NONE and woken.records
        await call.write(fetch(end + 1, 0))  # the same stream carries on
        again = await asyncio.wait_for(call.read(), 10)
        assert again.records == woken.records
        await call.done_writing()
        assert await asyncio.wait_for(call.read(), 10) is grpc.aio.EOF
    return True


async def test_a_replica_behind_the_log_start_loads_the_leaders_snapshot(
    tmp_path: Path,
) -> None:
    settings = RaftServerSettings(
        raft=FAST,
        log_config=metadata_log_config(segment_bytes=2048),
        metadata_log_max_record_bytes_between_snapshots=4096,
    )
    quorum = Quorum(tmp_path, 3, settings)
    try:
        for node_id in quorum.voters:
            await quorum.start(node_id)
        leader = await quorum.leader()
        lagging = next(n for n in quorum.voters if n != leader.node_id)
        await quorum.stop(lagging)
        for i in range(300):
            await quorum.propose(f"n{i:04d}" + "y" * 40)
        leader = await quorum.leader()
        assert leader.describe().high_watermark > 0
        layout = MetadataLogLayout(tmp_path / f"node-{leader.node_id}")
        assert not (layout.log_dir / "00000000000000000000.log").exists()
        await quorum.start(lagging)
        await quorum.wait_applied(lagging, leader.high_watermark)
        machine = quorum.machines[lagging]
        assert machine.loaded, "the lagging replica should have fetched a snapshot"
        assert machine.values[-1] == "n0299" + "y" * 40
        assert machine.values == quorum.machines[leader.node_id].values
    finally:
        for node_id in list(quorum.servers):
            await quorum.stop(node_id)
