"""The channels every process opens (``rpc/channels.py``) against the servers it runs
(``rpc/server.py``): they take answers as large as the package's servers send, a quiet
stream outlives their keepalive pings, and a long-polled stream cut by a partition that
drops packets answers again soon after the link comes back (network namespaces)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from highwater.broker.replica_fetcher import GrpcFetchTransport
from highwater.broker.settings import BrokerSettings
from highwater.chaos.network import NamespaceNetwork, namespaces_available
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.internal.v1 import replication_pb2_grpc
from highwater.rpc.channels import (
    KEEPALIVE_TIME_MS,
    MAX_MESSAGE_BYTES,
    open_blocking_channel,
    open_channel,
)
from highwater.rpc.server import new_server

pytestmark = pytest.mark.timeout(90)

SERVICES = str(Path(__file__).resolve().parents[2] / "services")


class LargeAnswers(replication_pb2_grpc.ReplicaFetchServiceServicer):
    """Answers each fetch of a stream with ``answer_bytes`` of records."""

    def __init__(self, answer_bytes: int) -> None:
        self.answer_bytes = answer_bytes

    async def ReplicaFetch(
        self,
        request_iterator: AsyncIterator[rpb.ReplicaFetchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rpb.ReplicaFetchResponse]:
        async for request in request_iterator:
            answer = rpb.ReplicaFetchResponse(session_id=request.replica_id)
            topic = answer.topics.add(topic="t")
            chunk = 1 << 20
            for partition, start in enumerate(range(0, self.answer_bytes, chunk)):
                size = min(chunk, self.answer_bytes - start)
                topic.partitions.add(partition=partition, records=b"r" * size)
            yield answer


@pytest.fixture
async def large_answers() -> AsyncIterator[str]:
    """A server of the package answering every fetch with a replica fetch's largest
    answer: ``replica.fetch.response.max.bytes`` and one 1 MiB batch more."""
    settings = BrokerSettings()
    server = new_server(max_message_bytes=MAX_MESSAGE_BYTES)
    answer_bytes = settings.replica_fetch_response_max_bytes + settings.replica_fetch_max_bytes
    replication_pb2_grpc.add_ReplicaFetchServiceServicer_to_server(
        LargeAnswers(answer_bytes), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_a_follower_takes_a_replica_fetchs_largest_answer(large_answers: str) -> None:
    """gRPC's default 4 MiB would refuse it (RESOURCE_EXHAUSTED), and the follower would
    fetch the same partitions again and again, never catching up."""
    transport = GrpcFetchTransport(large_answers)
    try:
        answer = await transport.fetch(rpb.ReplicaFetchRequest(replica_id=2), 10)
    finally:
        await transport.close()
    settings = BrokerSettings()
    records = sum(len(p.records) for t in answer.topics for p in t.partitions)
    assert records == settings.replica_fetch_response_max_bytes + settings.replica_fetch_max_bytes


async def test_any_channel_takes_what_the_servers_may_send(large_answers: str) -> None:
    """A channel opened with no size (a group coordinator loading its offsets partition,
    5 MiB a fetch, the controller asking a broker) takes the servers' cap too."""
    async with open_channel(large_answers) as channel:
        stub = replication_pb2_grpc.ReplicaFetchServiceStub(channel)
        call = stub.ReplicaFetch()
        await call.write(rpb.ReplicaFetchRequest(replica_id=3))
        answer = await call.read()
        call.cancel()
    assert isinstance(answer, rpb.ReplicaFetchResponse) and answer.session_id == 3


async def test_a_blocking_channel_takes_what_the_servers_may_send(large_answers: str) -> None:
    """The tools' blocking channels (the dev cluster's and the chaos harness's polls) too."""

    def fetch() -> rpb.ReplicaFetchResponse:
        with open_blocking_channel(large_answers) as channel:
            stub = replication_pb2_grpc.ReplicaFetchServiceStub(channel)
            answers = stub.ReplicaFetch(iter([rpb.ReplicaFetchRequest(replica_id=4)]), timeout=10)
            return next(answers)

    answer = await asyncio.to_thread(fetch)
    assert answer.session_id == 4 and answer.ByteSize() > 10 << 20


async def test_a_quiet_stream_outlives_the_keepalive_pings() -> None:
    """A stream whose server writes nothing after its first message (a broker's liveness
    stream) sees a keepalive ping every 3 s. Servers with gRPC's default ping policy count
    the third such ping as abuse and end the connection (``too_many_pings``, 9 s in);
    the package's servers take them."""
    server = new_server(max_message_bytes=1 << 20)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            first = await watch.read()
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(TimeoutError):  # still open, nothing more to read
                async with asyncio.timeout(3.5 * KEEPALIVE_TIME_MS / 1000):
                    await watch.read()
            watch.cancel()
    finally:
        await server.stop(None)


SERVE = """
import asyncio, sys
sys.path.insert(0, sys.argv[2])
from highwater.internal.v1 import replication_pb2 as rpb, replication_pb2_grpc
from highwater.rpc.server import new_server, bind

class LongPoll(replication_pb2_grpc.ReplicaFetchServiceServicer):
    async def ReplicaFetch(self, request_iterator, context):
        async for request in request_iterator:
            await asyncio.sleep(0.5)
            yield rpb.ReplicaFetchResponse(session_id=request.replica_id)

async def main():
    server = new_server(max_message_bytes=1 << 20)
    replication_pb2_grpc.add_ReplicaFetchServiceServicer_to_server(LongPoll(), server)
    port = bind(server, sys.argv[1])
    await server.start()
    print("ready", port if "--print-port" in sys.argv else "", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""

FOLLOW = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[2])
from highwater.broker.replica_fetcher import GrpcFetchTransport, ReplicaFetchError
from highwater.internal.v1 import replication_pb2 as rpb

async def main():
    transport = GrpcFetchTransport(sys.argv[1])
    while True:
        try:
            await transport.fetch(rpb.ReplicaFetchRequest(replica_id=1), 30.5)
            print("answer", time.time(), flush=True)
        except ReplicaFetchError:
            print("failed", time.time(), flush=True)
            await asyncio.sleep(0.1)

asyncio.run(main())
"""


def end_stopped(process: subprocess.Popen[str]) -> None:
    """Kill a process the test may have stopped (SIGSTOP), and close its output."""
    process.send_signal(signal.SIGCONT)
    process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


async def test_a_stream_to_a_stopped_server_fails_within_the_ping_timeout() -> None:
    """A follower's fetch stream to a leader whose process is stopped (SIGSTOP: its kernel
    still acknowledges every packet, nothing answers): the channel's next keepalive ping
    goes unanswered and the connection is closed 3 s later, failing the call UNAVAILABLE so
    that the caller retries elsewhere. gRPC's own ping timeout, a minute, applied before
    the channels set ``grpc.http2.ping_timeout_ms``: the call failed 60 s after the ping."""
    leader = subprocess.Popen(
        [sys.executable, "-c", SERVE, "127.0.0.1:0", SERVICES, "--print-port"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert leader.stdout is not None
        ready, port = leader.stdout.readline().split()
        assert ready == "ready"
        async with open_channel(f"127.0.0.1:{port}") as channel:
            requests: asyncio.Queue[rpb.ReplicaFetchRequest] = asyncio.Queue()

            async def fetches() -> AsyncIterator[rpb.ReplicaFetchRequest]:
                while True:
                    yield await requests.get()

            stream = replication_pb2_grpc.ReplicaFetchServiceStub(channel).ReplicaFetch(fetches())
            await requests.put(rpb.ReplicaFetchRequest(replica_id=2))
            assert (await stream.read()).session_id == 2
            leader.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            await requests.put(rpb.ReplicaFetchRequest(replica_id=3))
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                async with asyncio.timeout(20):
                    await stream.read()
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            # A ping at most KEEPALIVE_TIME_MS after the stop, unanswered 3 s; a margin.
            assert time.monotonic() - stopped < KEEPALIVE_TIME_MS / 1000 + 3 + 2
    finally:
        end_stopped(leader)


STREAM_AND_WAIT = """
import asyncio, sys
sys.path.insert(0, sys.argv[2])
from highwater.internal.v1 import replication_pb2 as rpb, replication_pb2_grpc
from highwater.rpc.channels import open_channel

async def main():
    async with open_channel(sys.argv[1]) as channel:
        stream = replication_pb2_grpc.ReplicaFetchServiceStub(channel).ReplicaFetch(
            iter([rpb.ReplicaFetchRequest(replica_id=5)])
        )
        await stream.read()
        print("streaming", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


class Parked(replication_pb2_grpc.ReplicaFetchServiceServicer):
    """Answers the first request, then holds the stream open; notes when its call ends."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    async def ReplicaFetch(self, request_iterator, context):  # type: ignore[no-untyped-def]
        try:
            async for request in request_iterator:
                yield rpb.ReplicaFetchResponse(session_id=request.replica_id)
            await asyncio.Event().wait()  # the client half-closed: hold the call open
        finally:
            self.ended.set()


async def test_a_server_ends_the_calls_of_a_client_that_stopped_answering() -> None:
    """A client holding a stream open is stopped (SIGSTOP: its kernel acknowledges every
    packet, nothing answers). The server pings the connection and closes it when the ping
    goes unanswered, which ends the call: the server's side of a client that went without
    a word (its host gone) is not kept for ever. Without the server's pings the call
    stayed open as long as the client was stopped. The ping interval is shortened here
    (1 s, 1 s unanswered) from the servers' 30 s and 10 s."""
    server = new_server(max_message_bytes=1 << 20, keepalive_time_ms=1000, ping_timeout_ms=1000)
    parked = Parked()
    replication_pb2_grpc.add_ReplicaFetchServiceServicer_to_server(parked, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = subprocess.Popen(
        [sys.executable, "-c", STREAM_AND_WAIT, f"127.0.0.1:{port}", SERVICES],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None
        line = await asyncio.to_thread(client.stdout.readline)
        assert line.strip() == "streaming"
        client.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        await asyncio.wait_for(parked.ended.wait(), 10)
        assert time.monotonic() - stopped < 1 + 1 + 2  # a ping, its timeout, a margin
    finally:
        end_stopped(client)
        await server.stop(None)


@pytest.fixture
def network() -> Iterator[NamespaceNetwork]:
    reason = namespaces_available()
    assert reason is None, reason
    net = NamespaceNetwork()
    try:
        yield net
    finally:
        net.close()


def test_a_long_poll_cut_by_a_partition_answers_soon_after_it_heals(
    network: NamespaceNetwork,
) -> None:
    """A follower's fetch stream (the real ``GrpcFetchTransport``, each fetch long-polled
    0.5 s by the leader) in one namespace, its leader in another, the link between them cut
    for 8 s by dropping packets both ways. The leader's answer in flight at the cut was
    left to TCP's retransmissions, whose interval doubles while the link is down: the next
    answer came 5.4 s after the link was back. With the channels' keepalive the connection
    is closed during the cut and the follower reconnects (at most 1 s apart) as soon as it
    can: the next answer comes within 2.5 s."""
    addresses = network.assign(["leader", "follower"])
    leader = subprocess.Popen(
        network.wrap("leader", [sys.executable, "-c", SERVE, addresses["leader"], SERVICES]),
        stdout=subprocess.PIPE,
        text=True,
    )
    follower = None
    reader: threading.Thread | None = None
    try:
        assert leader.stdout is not None and leader.stdout.readline().strip() == "ready"
        follower = subprocess.Popen(
            network.wrap("follower", [sys.executable, "-c", FOLLOW, addresses["leader"], SERVICES]),
            stdout=subprocess.PIPE,
            text=True,
        )
        events: list[tuple[str, float]] = []

        def read(stream: object) -> None:
            for line in stream:  # type: ignore[attr-defined]
                kind, at = line.split()
                events.append((kind, float(at)))

        reader = threading.Thread(target=read, args=(follower.stdout,), daemon=True)
        reader.start()
        deadline = time.monotonic() + 20
        while sum(kind == "answer" for kind, _ in events) < 3:
            assert time.monotonic() < deadline, f"no answers before the cut: {events}"
            time.sleep(0.05)
        time.sleep(0.2)  # the next answer is in flight when the link goes
        network.cut(["leader"], ["follower"])
        time.sleep(8)
        network.heal()
        healed = time.time()
        deadline = time.monotonic() + 15
        while not any(kind == "answer" and at > healed for kind, at in events):
            assert time.monotonic() < deadline, "no answer within 15 s of the heal"
            time.sleep(0.05)
        after = min(at for kind, at in events if kind == "answer" and at > healed) - healed
        assert after < 2.5, f"the first answer came {after:.2f} s after the link was back"
    finally:
        for process in (follower, leader):
            if process is not None:
                process.kill()
                process.wait()
        if reader is not None:
            reader.join(5)  # at the follower's end of output
        for process in (follower, leader):
            if process is not None and process.stdout is not None:
                process.stdout.close()
