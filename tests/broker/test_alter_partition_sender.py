"""The AlterPartition sender: ISR changes queued while a request is in flight go together
in the next one; a change the controller refused for now is sent again after the backoff
(one it rejected is not); nothing is sent once the sender is closed.

The leader's partitions are real (a data directory, the metadata image, the pure leader
state making the proposals); the controller is a fake that holds each request until the
test lets it answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from highwater.broker.alter_partition import AlterPartitionManager
from highwater.broker.isr_expiration import propose_isr_shrinks
from highwater.broker.partitions import Partition, PartitionManager
from highwater.broker.replication import AlterPartitionProposal, IsrChange
from highwater.controller_api import messages as m
from highwater.metadata import (
    BrokerEndpoint,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    replay,
)
from highwater.storage.log_manager import LogManager
from highwater.v1.common_pb2 import ErrorCode

LEADER = 1
BROKER_EPOCH = 4
LAG_MS = 1_000
BACKOFF_MS = 20


@dataclass
class Controller:
    """Answers each AlterPartition request once ``answer`` is set; the n-th request's items
    with ``errors[n]`` (by partition id), if there is one, else without error."""

    requests: list[m.AlterPartitionRequest] = field(default_factory=list)
    errors: list[dict[int, int]] = field(default_factory=list)
    answer: asyncio.Event = field(default_factory=asyncio.Event)

    async def alter_partition(self, request: m.AlterPartitionRequest) -> m.AlterPartitionResponse:
        self.requests.append(request)
        await self.answer.wait()
        n = len(self.requests) - 1
        errors = self.errors[n] if n < len(self.errors) else {}
        return m.AlterPartitionResponse(
            partitions=tuple(
                m.AlterPartitionResult(
                    item.topic_id, item.partition_id, errors.get(item.partition_id, 0)
                )
                for item in request.partitions
            )
        )


def cluster(partitions: int) -> list[MetadataRecord]:
    records: list[MetadataRecord] = []
    for broker_id in (1, 2, 3):
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id, (endpoint,)))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    records.append(TopicRecord("orders", "orders-id"))
    for index in range(partitions):
        records.append(PartitionRecord("orders-id", index, (1, 2, 3), (1, 2, 3), LEADER))
    return records


@dataclass
class Leader:
    partitions: PartitionManager
    now: list[int]

    def shrinks(self) -> list[tuple[Partition, AlterPartitionProposal]]:
        """Let the followers fall behind; the shrinks the leader states propose."""
        self.now[0] += LAG_MS + 1
        found: list[tuple[Partition, AlterPartitionProposal]] = []
        propose_isr_shrinks(self.partitions, lambda p, proposal: found.append((p, proposal)))
        return found


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[Leader]:
    logs = LogManager(tmp_path)
    logs.startup(node_id=LEADER)
    now = [1_000_000]
    partitions = PartitionManager(
        LEADER, logs, clock=lambda: now[0], replica_lag_time_max_ms=LAG_MS
    )
    partitions.apply_image(replay(cluster(3), 10))
    yield Leader(partitions, now)
    logs.shutdown()


async def wait_for(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.005)


async def test_changes_queued_while_a_request_is_in_flight_go_together_in_the_next(
    leader: Leader,
) -> None:
    controller = Controller()
    proposed: list[AlterPartitionProposal] = []
    sender = AlterPartitionManager(
        controller,
        broker_id=LEADER,
        broker_epoch=lambda: BROKER_EPOCH,
        retry_backoff_ms=BACKOFF_MS,
        on_proposed=lambda _, proposal: proposed.append(proposal),
    )
    shrinks = leader.shrinks()
    assert [p.change for _, p in shrinks] == [IsrChange.SHRINK] * 3
    assert all(p.new_isr == (LEADER,) for _, p in shrinks)  # no follower ever fetched
    first, second, third = shrinks
    try:
        sender.propose(*first)
        await wait_for(lambda: len(controller.requests) == 1)
        sender.propose(*second)
        sender.propose(*third)
        assert sender.pending == 2  # held while the first is in flight
        controller.answer.set()
        await wait_for(lambda: len(controller.requests) == 2)
        assert [r.broker_epoch for r in controller.requests] == [BROKER_EPOCH] * 2
        assert [len(r.partitions) for r in controller.requests] == [1, 2]
        sent = {i.partition_id for r in controller.requests for i in r.partitions}
        assert sent == {0, 1, 2}
        assert controller.requests[1].partitions[0].new_isr == (LEADER,)
        assert len(proposed) == 3
    finally:
        await sender.close()


async def test_a_change_refused_for_now_is_sent_again_after_the_backoff(leader: Leader) -> None:
    controller = Controller(errors=[{0: ErrorCode.NOT_CONTROLLER, 1: ErrorCode.INELIGIBLE_REPLICA}])
    controller.answer.set()
    sender = AlterPartitionManager(
        controller, broker_id=LEADER, broker_epoch=lambda: BROKER_EPOCH, retry_backoff_ms=BACKOFF_MS
    )
    first, second, _ = leader.shrinks()
    try:
        sender.propose(*first)
        sender.propose(*second)
        await wait_for(lambda: len(controller.requests) >= 2)
        retried = controller.requests[1].partitions
        assert [i.partition_id for i in retried] == [0]  # INELIGIBLE_REPLICA: dropped
        await asyncio.sleep(BACKOFF_MS * 5 / 1000)
        assert len(controller.requests) == 2  # accepted: not sent again
    finally:
        await sender.close()


async def test_nothing_is_sent_once_the_sender_is_closed(leader: Leader) -> None:
    controller = Controller(errors=[{0: ErrorCode.NOT_CONTROLLER}])
    controller.answer.set()
    sender = AlterPartitionManager(
        controller, broker_id=LEADER, broker_epoch=lambda: BROKER_EPOCH, retry_backoff_ms=BACKOFF_MS
    )
    first, _, _ = leader.shrinks()
    sender.propose(*first)
    await wait_for(lambda: len(controller.requests) == 1)
    await sender.close()  # the retry scheduled for later is dropped
    await asyncio.sleep(BACKOFF_MS * 5 / 1000)
    sender.propose(*first)
    assert len(controller.requests) == 1
    assert sender.pending == 0
