"""Appending to ``__consumer_offsets`` as a partition's coordinator, against a real embedded
server: a newer owner's epoch marker fences every earlier owner, also after the broker
restarts, and a partition reads back exactly what was appended."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from embedded_servers import running_embedded_server
from highwater.coordinator.group import CommittedOffset
from highwater.coordinator.offsets_log import (
    CoordinatorFencedError,
    OffsetsTopicClient,
    PartitionAppender,
)
from highwater.coordinator.records import (
    CoordinatorEpochMarker,
    OffsetCommitRecord,
    decode_record,
    encode_offset_commit,
)
from highwater.storage.topic_partition import TopicPartition

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
