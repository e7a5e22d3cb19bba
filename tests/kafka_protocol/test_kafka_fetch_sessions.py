"""Incremental fetch sessions (KIP-227): the pure cache, then a session over the listener."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from highwater.broker.fetch_sessions import (
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH,
    FetchPartitionState,
    FetchSessionCache,
)
from highwater.broker.kafka_protocol.apis import GroupCalls, KafkaApis
from highwater.broker.kafka_protocol.codec import SUPPORTED, decode_request
from highwater.broker.request_handler import RequestHandler
from highwater.controller_api.client import ControllerClient
from highwater.metadata.image import MetadataImage
from highwater.v1 import broker_pb2 as pb
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka_servers import KafkaServer, connect, read_frame, request_frame

pytestmark = pytest.mark.timeout(60)

NOT_LEADER_OR_FOLLOWER = 6


def state(offset: int) -> FetchPartitionState:
    return FetchPartitionState(fetch_offset=offset, partition_max_bytes=1 << 20)


def test_a_sessionless_fetch_keeps_nothing() -> None:
    cache = FetchSessionCache()
    fetch = cache.resolve(0, -1, [(("t", 0), state(5))])
    assert (fetch.session_id, fetch.incremental, len(cache)) == (0, False, 0)
    assert fetch.include(("t", 0), 10, 0, 0, has_records=False)


def test_a_session_remembers_its_partitions_and_answers_only_what_changed() -> None:
    cache = FetchSessionCache()
    full = cache.resolve(0, 0, [(("t", 0), state(0)), (("t", 1), state(0))])
    assert full.session_id > 0 and not full.incremental
    assert full.include(("t", 0), 10, 0, 0, has_records=True)
    assert full.include(("t", 1), 0, 0, 0, has_records=False)  # a full answer lists all

    nothing_new = cache.resolve(full.session_id, 1, [])
    assert [key for key, _ in nothing_new.partitions] == [("t", 0), ("t", 1)]
    assert nothing_new.incremental
    assert not nothing_new.include(("t", 0), 10, 0, 0, has_records=False)
    assert not nothing_new.include(("t", 1), 0, 0, 0, has_records=False)

    moved = cache.resolve(full.session_id, 2, [(("t", 0), state(10))], forgotten=[("t", 1)])
    assert [(key, s.fetch_offset) for key, s in moved.partitions] == [(("t", 0), 10)]
    assert moved.include(("t", 0), 12, 0, 0, has_records=False)  # the high watermark moved
    assert moved.include(("t", 0), 12, 0, 6, has_records=False)  # an error is always told


def test_a_wrong_epoch_or_an_unknown_session_is_refused_and_a_final_epoch_closes() -> None:
    cache = FetchSessionCache()
    session = cache.resolve(0, 0, [(("t", 0), state(0))]).session_id
    assert cache.resolve(session, 5, []).error == INVALID_FETCH_SESSION_EPOCH
    assert cache.resolve(session + 100, 1, []).error == FETCH_SESSION_ID_NOT_FOUND
    closed = cache.resolve(session, -1, [(("t", 0), state(3))])
    assert (closed.session_id, closed.error, len(cache)) == (0, 0, 0)
    assert cache.resolve(session, 1, []).error == FETCH_SESSION_ID_NOT_FOUND


def test_a_full_cache_evicts_only_a_session_idle_past_the_eviction_time() -> None:
    cache = FetchSessionCache(max_sessions=2)
    first = cache.resolve(0, 0, [], now_ms=0).session_id
    second = cache.resolve(0, 0, [], now_ms=0).session_id
    cache.resolve(first, 1, [], now_ms=1_000)  # first is used: second is now the oldest
    # Both active: a newcomer gets no session (a full fetch) and evicts nobody.
    assert cache.resolve(0, 0, [], now_ms=2_000).session_id == 0
    assert cache.resolve(second, 1, [], now_ms=2_000).error == 0
    # Idle past the eviction time (120 s): the least recently used makes room.
    assert cache.resolve(0, 0, [], now_ms=122_001).session_id > 0
    assert cache.resolve(first, 2, [], now_ms=122_001).error == FETCH_SESSION_ID_NOT_FOUND
    assert cache.resolve(second, 2, [], now_ms=122_001).error == 0


class NothingToRead:
    """Stands in for the broker's reads: every fetch answers no partition."""

    async def fetch(self, request: pb.FetchRequest, *args: Any, **kwargs: Any) -> pb.FetchResponse:
        return pb.FetchResponse()


async def test_the_listener_uses_its_sessions_at_its_clocks_time() -> None:
    """The cache's eviction follows the times its callers pass: the listener passes its
    clock's."""
    now = 5_000
    apis = KafkaApis(
        node_id=1,
        requests=cast(RequestHandler, NothingToRead()),
        controller=cast(ControllerClient, None),
        groups=cast(GroupCalls, None),
        image=cast(Callable[[], MetadataImage], None),
        clock=lambda: now,
    )

    async def fetch_over(session: int, epoch: int) -> int:
        frame = request_frame(fetch_request(session, epoch, [("t", 0, 0)]), 12, epoch)
        answer = await apis.fetch(decode_request(frame[4:]))
        return int(answer.response.session_id)

    session = await fetch_over(0, 0)
    found = apis.fetch_sessions.get(session)
    assert found is not None and (found.created_ms, found.last_fetch_ms) == (5_000, 5_000)
    now = 7_000
    assert await fetch_over(session, 1) == session
    assert found.last_fetch_ms == 7_000


@pytest.mark.parametrize("api_key", sorted(SUPPORTED))
def test_every_api_served_decodes_at_its_lowest_and_highest_version(api_key: int) -> None:
    api = SUPPORTED[api_key]
    for version in (api.min_version, api.max_version):
        message = api.request()
        message.API_VERSION = version
        message.with_header(correlation_id=9, client_id="codec")
        frame = bytes(message.encode(header=True))
        decoded = decode_request(frame)
        assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (
            api_key,
            version,
            9,
        )
        assert decoded.client_id == "codec"


def produce_one(sock: socket.socket, topic: str, value: bytes, correlation_id: int) -> int:
    """Send one record with acks=1 and return the partition's error code."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    builder.append(0, timestamp=None, key=None, value=value, headers=[])
    R = ProduceRequest
    request = R(
        transactional_id=None, acks=1, timeout_ms=5000,
        topic_data=[R.TopicProduceData(name=topic, partition_data=[
            R.TopicProduceData.PartitionProduceData(index=0, records=bytes(builder.build()))])],
    )  # fmt: skip
    sock.sendall(request_frame(request, 9, correlation_id))
    response = ProduceResponse.decode(read_frame(sock)[5:], version=9)
    (topic_response,) = response.responses
    return int(topic_response.partition_responses[0].error_code)


def fetch_request(session: int, epoch: int, partitions: list[tuple[str, int, int]],
                  max_wait_ms: int = 0) -> Any:  # fmt: skip
    R = FetchRequest
    return R(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
        session_id=session, session_epoch=epoch,
        topics=[R.FetchTopic(topic=t, partitions=[R.FetchTopic.FetchPartition(
            partition=p, fetch_offset=o, partition_max_bytes=1 << 20, current_leader_epoch=-1,
            last_fetched_epoch=-1, log_start_offset=-1)]) for t, p, o in partitions],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip


def fetch(sock: socket.socket, session: int, epoch: int, partitions: list[tuple[str, int, int]],
          correlation_id: int, max_wait_ms: int = 0) -> object:  # fmt: skip
    request = fetch_request(session, epoch, partitions, max_wait_ms)
    sock.sendall(request_frame(request, 12, correlation_id))
    return FetchResponse.decode(read_frame(sock)[5:], version=12)


def test_an_incremental_fetch_session_over_the_listener(server: KafkaServer) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    for future in admin.create_topics([NewTopic("sessions", 1, 1)]).values():
        future.result(30)
    with connect(server) as sock:
        # A new partition answers NOT_LEADER_OR_FOLLOWER (retriable) until its leader has
        # opened its log, even once the metadata names that leader: retried as a client does.
        deadline = time.monotonic() + 30
        while (error := produce_one(sock, "sessions", b"first", 1)) == NOT_LEADER_OR_FOLLOWER:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert error == 0
        full: object = fetch(sock, 0, 0, [("sessions", 0, 0)], 2)
        session = full.session_id  # type: ignore[attr-defined]
        assert session > 0
        (topic,) = full.responses  # type: ignore[attr-defined]
        assert topic.partitions[0].high_watermark == 1 and topic.partitions[0].records

        # The client moves its position (the partition is sent again): nothing new.
        unchanged = fetch(sock, session, 1, [("sessions", 0, 1)], 3)
        assert unchanged.responses == []  # type: ignore[attr-defined]
        assert produce_one(sock, "sessions", b"second", 4) == 0
        # Nothing named: the session's partition is fetched, and has a record now.
        (topic,) = fetch(sock, session, 2, [], 5).responses  # type: ignore[attr-defined]
        assert topic.partitions[0].high_watermark == 2 and topic.partitions[0].records

        stale = fetch(sock, session, 2, [], 6)
        assert stale.error_code == INVALID_FETCH_SESSION_EPOCH  # type: ignore[attr-defined]
        unknown = fetch(sock, session + 1000, 1, [], 7)
        assert unknown.error_code == FETCH_SESSION_ID_NOT_FOUND  # type: ignore[attr-defined]


def test_a_fetch_with_min_bytes_0_is_answered_at_once(server: KafkaServer) -> None:
    """Kafka answers a fetch of min_bytes 0 at once whatever its max_wait_ms (nothing is
    too little), where the broker's own FetchRequest reads 0 as 1: it must not wait."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    for future in admin.create_topics([NewTopic("min-bytes-0", 1, 1)]).values():
        future.result(30)
    with connect(server) as sock:
        deadline = time.monotonic() + 30
        while (error := produce_one(sock, "min-bytes-0", b"one", 1)) == NOT_LEADER_OR_FOLLOWER:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert error == 0
        started = time.monotonic()
        answer = fetch(sock, 0, -1, [("min-bytes-0", 0, 1)], 2, max_wait_ms=5000)
        assert time.monotonic() - started < 2.5
        (topic,) = answer.responses  # type: ignore[attr-defined]
        assert topic.partitions[0].high_watermark == 1 and not topic.partitions[0].records
