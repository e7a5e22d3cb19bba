"""SASL sessions end streams too (KIP-368's idea): a streaming call that outlives its
session token is ended ``UNAUTHENTICATED`` ("session expired; re-authenticate"), and the
client library authenticates again and carries on over new calls, so that a producer and
a consumer run across several expiries without one failed request.

One embedded server in this process for the module, with SCRAM-SHA-256 offered and
the session tokens' lifetime (``grpc.session.token.lifetime.ms``) at one second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from broker_roles import leads
from embedded_servers import running_embedded_server
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.consumer import OFFSET_BEGINNING, AsyncConsumer, TopicPartition
from highwater.client.producer import AsyncProducer
from highwater.embedded import EmbeddedServer
from highwater.rpc import auth
from highwater.rpc.client_auth import SaslSession
from highwater.security.authentication import SESSION_EXPIRED, AuthenticationSettings
from highwater.security.sasl_client import SaslCredentials
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="module")]

LIFETIME_S = 1.0
TOPIC = "expiring"
USER, PASSWORD, MECHANISM = "alice", "alice-pw", "SCRAM-SHA-256"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedServer]:
    before = auth.server_security()
    auth.configure(
        auth.ServerSecurity(
            authentication=AuthenticationSettings(
                enabled_mechanisms=(MECHANISM,), max_session_s=LIFETIME_S
            )
        )
    )
    try:
        async with running_embedded_server(tmp_path_factory.mktemp("expiry")) as server:
            async with AdminClient(server.listen) as admin:
                await admin.create_topics([NewTopic(TOPIC, num_partitions=1)])
                outcome = await admin.alter_user_scram_credentials([(USER, MECHANISM, PASSWORD)])
                assert outcome == {USER: None}
            async with asyncio.timeout(30):  # the raw fetches below do not retry
                while not leads(server.broker, TOPIC, 0):
                    await asyncio.sleep(0.02)
            yield server
    finally:
        auth.configure(before)


def sasl_config(server: EmbeddedServer) -> dict[str, str]:
    return {
        "bootstrap.servers": server.listen,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECHANISM,
        "sasl.username": USER,
        "sasl.password": PASSWORD,
    }


def fetch_request(max_wait_ms: int) -> pb.FetchRequest:
    request = pb.FetchRequest(max_wait_ms=max_wait_ms, max_bytes=1 << 20)
    request.topics.add(topic=TOPIC).partitions.add(partition=0, fetch_offset=0)
    return request


async def test_a_stream_outliving_its_session_is_ended(server: EmbeddedServer) -> None:
    session = SaslSession(
        server.listen,
        SaslCredentials(MECHANISM, username=USER, password=PASSWORD),
        lambda: grpc.aio.insecure_channel(server.listen),
    )
    token = await session.token()
    issued = time.monotonic()
    async with grpc.aio.insecure_channel(server.listen) as channel:
        call = broker_pb2_grpc.BrokerStub(channel).FetchStream(
            metadata=(("highwater-session", token),)
        )
        await call.write(fetch_request(max_wait_ms=0))
        answer = await call.read()
        assert answer.topics[0].partitions[0].error == 0
        # Idle from here on: the session's end ends the call all the same.
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async with asyncio.timeout(LIFETIME_S + 5):
                await call.read()
        ended_after = time.monotonic() - issued
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ended.value.details() == SESSION_EXPIRED
    assert LIFETIME_S - 0.2 <= ended_after <= LIFETIME_S + 2, ended_after
    # A call opened with the expired token is refused at once.
    async with grpc.aio.insecure_channel(server.listen) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await broker_pb2_grpc.BrokerStub(channel).Metadata(
                pb.MetadataRequest(), metadata=(("highwater-session", token),), timeout=5
            )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_producer_and_a_consumer_carry_on_across_expiries(
    server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="highwater.rpc.auth")
    config = sasl_config(server)
    expiries = 3
    sent: list[bytes] = []
    received: list[bytes | None] = []
    async with (
        AsyncProducer({**config, "acks": "all", "linger.ms": "0"}) as producer,
        AsyncConsumer(config) as consumer,
    ):
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])

        async def consume() -> None:
            while True:
                message = await consumer.poll(0.2)
                if message is not None:
                    assert message.error() is None, message.error()
                    received.append(message.value())

        consuming = asyncio.create_task(consume())
        try:
            started = time.monotonic()
            i = 0
            while time.monotonic() - started < expiries * LIFETIME_S + 0.5:
                value = f"m{i}".encode()
                await producer.send(TOPIC, value, partition=0)  # raises on a failed delivery
                sent.append(value)
                i += 1
                await asyncio.sleep(0.05)
            async with asyncio.timeout(10):
                while len(received) < len(sent):
                    await asyncio.sleep(0.05)
        finally:
            consuming.cancel()
    assert received[: len(sent)] == sent
    ended = [r.getMessage() for r in caplog.records if "its session expired" in r.message]
    # The producer's and the consumer's streams were each ended (at least) twice on the way.
    assert sum("ProduceStream of User:alice" in line for line in ended) >= expiries - 1, ended
    assert sum("FetchStream of User:alice" in line for line in ended) >= expiries - 1, ended
