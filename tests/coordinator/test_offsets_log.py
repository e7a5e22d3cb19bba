"""Appending to ``__consumer_offsets`` as a partition's coordinator, against a real embedded
server: a newer owner's epoch marker fences every earlier owner, also after the broker
restarts, and a partition reads back exactly what was appended."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from embedded_servers import running_embedded_server
from highwater.coordinator.group import CommittedOffset
from highwater.coordinator.offsets_log import (
    CoordinatorFencedError,
    OffsetsLogSettings,
    OffsetsTopicClient,
    PartitionAppender,
)
from highwater.coordinator.records import (
    CoordinatorEpochMarker,
    KeyValue,
    OffsetCommitRecord,
    decode_record,
    encode_offset_commit,
)
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)

PARTITION = 7
TP = TopicPartition("orders", 0)


def commit(offset: int) -> tuple[bytes, bytes | None]:
    return encode_offset_commit("g", TP, CommittedOffset(offset, -1, "", 1))


def appender(client: OffsetsTopicClient, coordinator_id: int, epoch: int) -> PartitionAppender:
    return PartitionAppender(client, PARTITION, coordinator_id, epoch, still_owner=lambda: True)


async def wait_for_offsets_topic(client: OffsetsTopicClient) -> None:
    for _ in range(200):
        if client.leader_address(PARTITION) is not None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("__consumer_offsets got no leader")


async def test_a_newer_owner_fences_the_older_one_for_good(tmp_path: Path) -> None:
    async with running_embedded_server(tmp_path) as server:
        client = OffsetsTopicClient(server.controller.machine)
        await wait_for_offsets_topic(client)
        # Epochs above the embedded coordinator's own, which also writes to the topic.
        old, new = appender(client, 101, 40), appender(client, 102, 41)
        await old.fence()
        assert await old.append([commit(1)]) == 0
        marker_offset = await new.fence()
        with pytest.raises(CoordinatorFencedError):
            await old.append([commit(2)])
        assert await new.append([commit(3)]) == 0
        records = [decode_record(k, v) for k, v in await client.read(PARTITION, marker_offset + 2)]
        commits = [
            r.offset.offset for r in records if isinstance(r, OffsetCommitRecord) and r.offset
        ]
        markers = [r for r in records if isinstance(r, CoordinatorEpochMarker)]
        assert commits[-2:] == [1, 3]
        assert [(m.coordinator_id, m.coordinator_epoch) for m in markers][-2:] == [
            (101, 40),
            (102, 41),
        ]
        await client.close()
    # The broker rebuilds producer state from the log: the fence holds after a restart.
    async with running_embedded_server(tmp_path) as server:
        client = OffsetsTopicClient(server.controller.machine)
        await wait_for_offsets_topic(client)
        stale = appender(client, 101, 40)
        with pytest.raises(CoordinatorFencedError):
            await stale.fence()
        await client.close()


class LeaderMovedAfterAppend(OffsetsTopicClient):
    """The real client, except that its first append is written and then answered
    NOT_LEADER_OR_FOLLOWER (the leader lost its leadership while it waited for acks=all),
    and no leader is known for the next ``leaderless`` attempts."""

    def __init__(self, *args: Any, leaderless: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attempts = 0
        self.leaderless = leaderless

    async def produce(
        self,
        partition: int,
        records: Sequence[KeyValue],
        *,
        producer_epoch: int,
        base_sequence: int,
    ) -> tuple[int, int]:
        self.attempts += 1
        if self.attempts == 1:
            await super().produce(
                partition, records, producer_epoch=producer_epoch, base_sequence=base_sequence
            )
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
        if self.attempts <= 1 + self.leaderless:
            return ErrorCode.LEADER_NOT_AVAILABLE, -1
        return await super().produce(
            partition, records, producer_epoch=producer_epoch, base_sequence=base_sequence
        )


async def test_an_append_answered_not_leader_is_in_doubt_until_the_broker_answers(
    tmp_path: Path,
) -> None:
    """NOT_LEADER_OR_FOLLOWER may come after the append (the leader lost its leadership
    while it waited for the followers), so the batch is sent again unchanged until the
    broker answers for it, past ``offsets.commit.timeout.ms``: given up, its sequence
    numbers would go to the next append, which the broker would take for a duplicate of
    it and answer with its offset, leaving the next records out of the log."""
    settings = OffsetsLogSettings(offsets_commit_timeout_ms=200, retry_backoff_ms=20)
    async with running_embedded_server(tmp_path) as server:
        client = LeaderMovedAfterAppend(server.controller.machine, settings, leaderless=20)
        await wait_for_offsets_topic(client)
        owner = appender(client, 101, 40)
        marker = await owner.fence()
        client.attempts = 0
        assert await owner.append([commit(1)]) == ErrorCode.NONE
        assert client.attempts > 1 + 20  # past the commit timeout (20 attempts of 20 ms)
        assert await owner.append([commit(2)]) == ErrorCode.NONE
        records = [decode_record(k, v) for k, v in await client.read(PARTITION, marker + 3)]
        commits = [
            r.offset.offset for r in records if isinstance(r, OffsetCommitRecord) and r.offset
        ]
        assert commits[-2:] == [1, 2]
        await client.close()
