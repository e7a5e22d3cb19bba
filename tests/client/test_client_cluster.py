"""The client's cluster metadata layer against a real EmbeddedServer: asking any broker under
both policies (producers' and consumers', the admin client's), and the one ListOffsets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest
from embedded_servers import free_port, running_embedded_server
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.cluster import BrokerNotAvailableError, BrokerPolicy, ClusterMetadata
from highwater.client.errors import BrokerUnavailableError, CoordinatorNotAvailableError
from highwater.client.producer import AsyncProducer
from highwater.embedded import EmbeddedServer
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)

EARLIEST, LATEST = -2, -1


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    async with running_embedded_server(tmp_path) as server:
        async with AdminClient(server.listen, request_timeout_s=10) as admin:
            (await admin.create_topics([NewTopic("c", 1, 1)]))["c"].raise_for_error()
        yield server


def dead_address() -> str:
    return f"127.0.0.1:{free_port()}"


class Refused(Exception):
    """What the test policy raises for a failure it does not move on after."""


def no_answer(
    what: str, tried: Sequence[str], failures: Sequence[tuple[str, grpc.aio.AioRpcError]]
) -> Exception:
    return LookupError(f"{what}: {[address for address, _ in failures]} of {list(tried)}")


async def test_list_offsets_answers_in_request_order_with_a_partition_asked_twice(
    server: EmbeddedServer,
) -> None:
    async with AsyncProducer({"bootstrap.servers": server.listen, "linger.ms": 0}) as producer:
        for i in range(3):
            await producer.send("c", f"v{i}")
    cluster = ClusterMetadata(server.listen)
    try:
        info = await cluster.topic_info("c")
        epoch = info.partitions[0].leader_epoch
        answers = await cluster.list_offsets(
            cluster.leader_address("c", 0),
            [("c", 0, EARLIEST, epoch), ("c", 0, LATEST, None), ("c", 9, LATEST, None)],
            10,
        )
    finally:
        await cluster.close()
    first, last, missing = answers
    assert first is not None and (first.error, first.offset) == (ErrorCode.NONE, 0)
    assert last is not None and (last.error, last.offset) == (ErrorCode.NONE, 3)
    assert missing is not None and missing.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_the_default_policy_moves_past_any_failure_and_names_what_it_tried(
    server: EmbeddedServer,
) -> None:
    dead = dead_address()
    cluster = ClusterMetadata([dead, server.listen], request_timeout_s=5)
    try:
        reply = await cluster.refresh(["c"])
        assert [t.name for t in reply.topics] == ["c"]
        assert cluster.topic("c") is not None
    finally:
        await cluster.close()
    nowhere = ClusterMetadata([dead], request_timeout_s=5)
    try:
        with pytest.raises(BrokerNotAvailableError, match=f"no broker answered Metadata.*{dead}"):
            await nowhere.refresh()
    finally:
        await nowhere.close()


async def test_a_bootstrap_only_policy_starts_with_the_broker_that_answered_last(
    server: EmbeddedServer,
) -> None:
    dead = dead_address()
    policy = BrokerPolicy(
        bootstrap_only=True,
        retriable_status=frozenset({grpc.StatusCode.UNAVAILABLE}),
        unavailable=no_answer,
    )
    cluster = ClusterMetadata([dead, server.listen], request_timeout_s=5, policy=policy)
    asked: list[str] = []

    def metadata(stub: broker_pb2_grpc.BrokerStub, timeout: float) -> Awaitable[object]:
        asked.append(next(a for a in (dead, server.listen) if cluster.stub(a) is stub))
        return stub.Metadata(pb.MetadataRequest(), timeout=timeout)

    try:
        await cluster.any_broker("Metadata", metadata)
        assert asked == [dead, server.listen]
        asked.clear()
        await cluster.any_broker("Metadata", metadata)
        assert asked == [server.listen]  # the live one first now
    finally:
        await cluster.close()

    alone = ClusterMetadata([dead], request_timeout_s=5, policy=policy)
    try:
        with pytest.raises(LookupError, match=rf"Metadata: \['{dead}'\]"):
            await alone.refresh()
    finally:
        await alone.close()


async def test_a_failure_the_policy_does_not_retry_is_raised_as_it_says() -> None:
    def refused(error: grpc.aio.AioRpcError) -> Exception:
        return Refused(error.code().name)

    policy = BrokerPolicy(retriable_status=frozenset(), rpc_error=refused, unavailable=no_answer)
    cluster = ClusterMetadata([dead_address(), dead_address()], request_timeout_s=5, policy=policy)
    try:
        with pytest.raises(Refused, match="UNAVAILABLE"):
            await cluster.find_coordinator("g")
    finally:
        await cluster.close()


async def test_the_admin_client_keeps_its_own_errors_over_the_shared_layer() -> None:
    dead = dead_address()
    async with AdminClient(dead, request_timeout_s=0.5) as admin:
        with pytest.raises(
            CoordinatorNotAvailableError,
            match=rf"FindCoordinator for group 'g': no bootstrap broker answered \({dead}: ",
        ):
            await admin.describe_consumer_groups(["g"])
        with pytest.raises(
            BrokerUnavailableError,
            match=rf"^Metadata: no bootstrap broker answered \({dead}: UNAVAILABLE\)$",
        ):
            await admin.list_topics()
