"""AdminClient.delete_records against a real embedded server: the log start moves up, the
records below it are gone, and bad requests get typed errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from embedded_servers import running_embedded_server
from highwater.client.admin import AdminClient, AdminError, NewTopic, OffsetSpec
from highwater.client.admin import UnknownTopicOrPartitionError as UnknownTopic
from highwater.client.producer import AsyncProducer
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)


async def test_delete_records_moves_the_log_start_of_each_partition(tmp_path: Path) -> None:
    async with (
        running_embedded_server(tmp_path) as server,
        AdminClient(server.listen, request_timeout_s=10) as admin,
    ):
        await admin.create_topics([NewTopic("t", 2, 1)])
        async with AsyncProducer({"bootstrap.servers": server.listen}) as producer:
            await asyncio.gather(
                *(producer.produce("t", b"x", partition=p) for p in (0, 1) for _ in range(10))
            )
        low = await admin.delete_records({("t", 0): 4, ("t", 1): -1})
        assert low == {("t", 0): 4, ("t", 1): 10}  # -1: everything below the HW
        earliest = await admin.list_offsets({("t", 0): OffsetSpec.EARLIEST})
        assert earliest[("t", 0)].offset == 4
        with pytest.raises(AdminError) as beyond:
            await admin.delete_records({("t", 0): 11})
        assert beyond.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
        with pytest.raises(UnknownTopic):
            await admin.delete_records({("nope", 0): 1})
        with pytest.raises(UnknownTopic):
            await admin.delete_records({("t", 7): 1})
