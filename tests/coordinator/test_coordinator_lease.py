"""The coordinator service after its session lease lapsed while the controller kept its
session (issue 20): it serves its groups again, in new coordinator epochs.

One embedded server (controller, broker and coordinator in this process). The lease is made
to lapse by checking it at a moment past its end (the service's monotonic clock moved on by
a minute for that one check), as a pause or a cut from the controller would; the controller's
session, nine seconds, does not expire, so the image still assigns every partition of
``__consumer_offsets`` to the coordinator in the same epochs. Taking them over again in those
epochs restarted the producer's sequence at 0 under a producer id and epoch the broker had
appends from: with many appends behind, the broker refused the epoch marker
(OUT_OF_ORDER_SEQUENCE_NUMBER) and the group's partition stayed unserved; with few, as here,
it took the marker and the next commit for duplicates of the first batches of the epoch,
acknowledged them and appended nothing (the commit was lost at the next load). The
coordinator now registers again as a new incarnation and takes its partitions over in the
epochs the controller gives it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc.aio
import pytest
from embedded_servers import free_port
from highwater.client.admin import AdminClient, NewTopic
from highwater.coordinator import service
from highwater.coordinator.core import GroupCoordinatorSettings
from highwater.coordinator.records import OffsetCommitRecord, decode_record
from highwater.coordinator.service import CoordinatorSettings
from highwater.embedded import EmbeddedServer
from highwater.metadata.consumer_offsets import CONSUMER_OFFSETS_TOPIC, partition_for_group
from highwater.v1 import coordinator_pb2 as pb
from highwater.v1 import coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)

GROUP, TOPIC = "ledger", "entries"


async def commit(stub: coordinator_pb2_grpc.GroupCoordinatorStub, offset: int) -> int:
    request = pb.OffsetCommitRequest(group_id=GROUP)
    request.topics.add(name=TOPIC).partitions.add(partition_index=0, committed_offset=offset)
    reply: pb.OffsetCommitResponse = await stub.OffsetCommit(request, timeout=10)
    return reply.topics[0].partitions[0].error


async def fetch(stub: coordinator_pb2_grpc.GroupCoordinatorStub) -> tuple[int, int]:
    """(error, committed offset) of the group's one partition."""
    request = pb.OffsetFetchRequest(group_id=GROUP)
    request.topics.add(name=TOPIC, partition_indexes=[0])
    reply: pb.OffsetFetchResponse = await stub.OffsetFetch(request, timeout=10)
    if reply.error != ErrorCode.NONE:
        return reply.error, -1
    return ErrorCode.NONE, reply.topics[0].partitions[0].committed_offset


async def until_committed(stub: coordinator_pb2_grpc.GroupCoordinatorStub, offset: int) -> None:
    """Commit ``offset``, asking again while the group's partition is not served yet (or the
    coordinator's image does not have the topic yet)."""
    deadline = time.monotonic() + 20
    while (error := await commit(stub, offset)) != ErrorCode.NONE:
        assert error in (
            ErrorCode.NOT_COORDINATOR,
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ), error
        assert time.monotonic() < deadline, "the group's partition is not served again"
        await asyncio.sleep(0.05)


def embedded_server(data_dir: Path) -> EmbeddedServer:
    """An embedded server whose coordinator renews its lease every 200 ms and forms groups
    at once."""
    return EmbeddedServer(
        listen=f"127.0.0.1:{free_port()}",
        data_dir=data_dir,
        coordinator_settings=CoordinatorSettings(
            group=GroupCoordinatorSettings(group_initial_rebalance_delay_ms=0),
            heartbeat_interval_ms=200,
        ),
    )


async def test_a_coordinator_whose_lease_lapsed_serves_again_in_new_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = embedded_server(tmp_path)
    await server.start()
    try:
        await server.broker.wait_unfenced()
        async with AdminClient(server.listen) as admin:
            created = await admin.create_topics([NewTopic(TOPIC, 1, 1)])
            assert created[TOPIC].error is None
        coordinator = server.coordinator
        partition = coordinator.partition_for(GROUP)
        assert partition == partition_for_group(GROUP, coordinator.offsets_partition_count())
        async with grpc.aio.insecure_channel(server.listen) as channel:
            stub = coordinator_pb2_grpc.GroupCoordinatorStub(channel)
            await until_committed(stub, 5)
            before = server.controller.machine.image.coordinator_assignment(partition)
            assert before is not None
            incarnation = coordinator.incarnation_id

            later = time.monotonic() + 60
            with monkeypatch.context() as clock:
                clock.setattr(service, "_monotonic_ms", lambda: int(later * 1000))
                coordinator.check_lease()
            assert coordinator.ownership.lapsed
            assert await fetch(stub) == (ErrorCode.NOT_COORDINATOR, -1)
            # Its groups are not listed meanwhile: the listing says so, not just leaves them out.
            listed = await stub.ListGroups(pb.ListGroupsRequest(), timeout=10)
            assert listed.error == ErrorCode.COORDINATOR_NOT_AVAILABLE and not listed.groups

            await until_committed(stub, 7)  # the next heartbeat renews the lease
            assert await fetch(stub) == (ErrorCode.NONE, 7)
        after = server.controller.machine.image.coordinator_assignment(partition)
        assert after is not None
        assert after.coordinator_id == before.coordinator_id
        assert after.coordinator_epoch == before.coordinator_epoch + 1
        assert coordinator.incarnation_id != incarnation
        registered = server.controller.machine.image.coordinator(coordinator.node_id)
        assert registered is not None and registered.incarnation_id == coordinator.incarnation_id
        # The acknowledged commit is in the log, not only in the coordinator's cache.
        log = server.broker.partitions.get(CONSUMER_OFFSETS_TOPIC, partition)
        raw = await coordinator.offsets.read(partition, log.high_watermark)
        commits = [
            r.offset.offset
            for r in (decode_record(k, v) for k, v in raw)
            if isinstance(r, OffsetCommitRecord) and r.group_id == GROUP and r.offset
        ]
        assert commits == [5, 7]
    finally:
        await server.stop()


async def test_a_coordinator_waking_from_a_pause_past_its_lease_expires_no_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause longer than the lease and a member's session: the timer wakes first. It must
    not expire the member (which heartbeated to nobody meanwhile) and store the group empty;
    the partition is loaded again and the member carries on in its generation."""
    server = embedded_server(tmp_path)
    await server.start()
    try:
        await server.broker.wait_unfenced()
        coordinator = server.coordinator
        async with grpc.aio.insecure_channel(server.listen) as channel:
            stub = coordinator_pb2_grpc.GroupCoordinatorStub(channel)
            join = pb.JoinGroupRequest(
                group_id=GROUP,
                protocol_type="consumer",
                session_timeout_ms=6_000,
                rebalance_timeout_ms=6_000,
            )
            join.protocols.add(name="range", metadata=b"sub")
            deadline = time.monotonic() + 20
            while (joined := await stub.JoinGroup(join, timeout=10)).error in (
                ErrorCode.NOT_COORDINATOR,
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                ErrorCode.MEMBER_ID_REQUIRED,
            ):
                join.member_id = joined.member_id
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert joined.error == ErrorCode.NONE
            member, generation = joined.member_id, joined.generation_id
            synced = await stub.SyncGroup(
                pb.SyncGroupRequest(
                    group_id=GROUP,
                    generation_id=generation,
                    member_id=member,
                    assignments=[pb.SyncGroupAssignment(member_id=member, assignment=b"A")],
                ),
                timeout=10,
            )
            assert synced.error == ErrorCode.NONE

            later_ms = int((time.monotonic() + 60) * 1000)
            wall_ms = time.time_ns() // 1_000_000 + 60_000
            with monkeypatch.context() as clock:  # a minute's pause: the timer runs first
                clock.setattr(service, "_monotonic_ms", lambda: later_ms)
                clock.setattr(service, "_now_ms", lambda: wall_ms)
                coordinator._timer_wake.set()
                for _ in range(5):
                    await asyncio.sleep(0)
            heartbeat = pb.HeartbeatRequest(
                group_id=GROUP, generation_id=generation, member_id=member
            )
            deadline = time.monotonic() + 20
            while (beat := await stub.Heartbeat(heartbeat, timeout=10)).error in (
                ErrorCode.NOT_COORDINATOR,
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
            ):
                assert time.monotonic() < deadline, "the group's partition is not served again"
                await asyncio.sleep(0.05)
            assert beat.error == ErrorCode.NONE
    finally:
        await server.stop()
