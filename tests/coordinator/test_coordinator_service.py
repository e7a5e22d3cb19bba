"""The coordinator service over gRPC, where it adds to the core: OffsetCommit checks each
partition against the coordinator's metadata image.

One embedded server (controller, broker and coordinator in this process).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc.aio
import pytest
from embedded_servers import running_embedded_server
from highwater.client.admin import AdminClient, NewTopic
from highwater.v1 import coordinator_pb2 as pb
from highwater.v1 import coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)

NOT_SERVED_YET = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}


def commit_request(group: str, *partitions: tuple[str, int, int]) -> pb.OffsetCommitRequest:
    request = pb.OffsetCommitRequest(group_id=group)
    for topic, partition, offset in partitions:
        request.topics.add(name=topic).partitions.add(
            partition_index=partition, committed_offset=offset
        )
    return request


def errors(reply: pb.OffsetCommitResponse) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.error for t in reply.topics for p in t.partitions}


async def test_offset_commits_of_partitions_the_image_does_not_have_are_refused(
    tmp_path: Path,
) -> None:
    # Kafka's handleOffsetCommitRequest: UNKNOWN_TOPIC_OR_PARTITION per partition not in the
    # metadata; the others are committed (any offset, -1 included).
    async with running_embedded_server(tmp_path) as server:
        async with AdminClient(server.listen) as admin:
            assert (await admin.create_topics([NewTopic("orders", 2, 1)]))["orders"].error is None
        async with grpc.aio.insecure_channel(server.listen) as channel:
            stub = coordinator_pb2_grpc.GroupCoordinatorStub(channel)
            request = commit_request(
                "app", ("orders", 0, -1), ("orders", 2, 5), ("orders", -1, 5), ("missing", 0, 5)
            )
            deadline = time.monotonic() + 30
            while True:
                reply = await stub.OffsetCommit(request, timeout=10)
                answered = errors(reply)
                if answered[("orders", 0)] not in NOT_SERVED_YET | {
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # the coordinator's image lags
                }:
                    break
                assert time.monotonic() < deadline, answered
                await asyncio.sleep(0.05)
            assert answered == {
                ("orders", 0): ErrorCode.NONE,
                ("orders", 2): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                ("orders", -1): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                ("missing", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            }
            fetched = await stub.OffsetFetch(
                pb.OffsetFetchRequest(group_id="app", all_topics=True), timeout=10
            )
            committed = [
                (t.name, p.partition_index, p.committed_offset)
                for t in fetched.topics
                for p in t.partitions
            ]
            assert committed == [("orders", 0, -1)]
