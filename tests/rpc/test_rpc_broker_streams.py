"""FetchStream and ProduceStream: requests over long-lived calls, each answered in order, the
call replaced after a failure, a timeout or a cancellation, requests in flight at once on
calls of their own, and unary calls for a broker without the stream.

The brokers here are small gRPC servers in this process whose ``Broker`` service answers
each fetch with its own request's ``min_bytes`` as the topic name, so that an answer that
belongs to another request shows; they can delay an answer, end the stream, or not serve
it at all (as a broker of an older version would not). Against real brokers the stream is
what every consumer uses (tests/integration).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import grpc
import grpc.aio
import pytest
from highwater.rpc.broker_streams import Expiry, FetchStream, ProduceStream
from highwater.security.authentication import SESSION_EXPIRED
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc


def answer(request: pb.FetchRequest) -> pb.FetchResponse:
    return pb.FetchResponse(topics=[pb.FetchTopicResponse(topic=str(request.min_bytes))])


def asked(number: int) -> pb.FetchRequest:
    return pb.FetchRequest(min_bytes=number)


def answered(reply: pb.FetchResponse) -> int:
    return int(reply.topics[0].topic)


def produce_answer(request: pb.ProduceRequest) -> pb.ProduceResponse:
    """The answer of a produce request names it by its ``timeout_ms``."""
    return pb.ProduceResponse(topics=[pb.ProduceTopicResponse(topic=str(request.timeout_ms))])


def produce_asked(number: int) -> pb.ProduceRequest:
    return pb.ProduceRequest(acks=-1, timeout_ms=number)


def produce_answered(reply: pb.ProduceResponse) -> int:
    return int(reply.topics[0].topic)


class StreamingBroker(broker_pb2_grpc.BrokerServicer):
    """Answers each request of a stream in turn: after ``delays[min_bytes]`` seconds if
    given; ends the stream after ``end_after`` answers if given; ends its first stream
    after ``expire_after`` answers as a server ends one its SASL session outlived, with the
    requests written after those unanswered (``rpc/auth.py``)."""

    def __init__(self) -> None:
        self.delays: dict[int, float] = {}
        self.end_after: int | None = None
        self.expire_after: int | None = None
        self.streams = 0
        self.unary = 0
        self.order: list[int] = []
        """The produce requests received, in order."""

    async def FetchStream(
        self, request_iterator: AsyncIterator[pb.FetchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FetchResponse]:
        self.streams += 1
        sent = 0
        async for request in request_iterator:
            if sent == self.expire_after and self.streams == 1:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, SESSION_EXPIRED)
            await asyncio.sleep(self.delays.get(request.min_bytes, 0))
            yield answer(request)
            sent += 1
            if self.end_after is not None and sent >= self.end_after:
                return

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        self.unary += 1
        return answer(request)

    async def ProduceStream(
        self,
        request_iterator: AsyncIterator[pb.ProduceRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProduceResponse]:
        self.streams += 1
        sent = 0
        async for request in request_iterator:
            if sent == self.expire_after and self.streams == 1:
                await asyncio.sleep(0.1)  # the requests in flight behind it are written
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, SESSION_EXPIRED)
            self.order.append(request.timeout_ms)
            await asyncio.sleep(self.delays.get(request.timeout_ms, 0))
            yield produce_answer(request)
            sent += 1
            if self.end_after is not None and sent >= self.end_after:
                return


class UnaryOnlyBroker(broker_pb2_grpc.BrokerServicer):
    """A broker that serves ``Fetch`` and ``Produce`` but not their streams (UNIMPLEMENTED)."""

    def __init__(self) -> None:
        self.unary = 0

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        self.unary += 1
        return answer(request)

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        self.unary += 1
        return produce_answer(request)


async def serve(servicer: broker_pb2_grpc.BrokerServicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    broker_pb2_grpc.add_BrokerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


_Streams = TypeVar("_Streams", FetchStream, ProduceStream)


@contextlib.asynccontextmanager
async def streaming_broker(
    make: Callable[[broker_pb2_grpc.BrokerStub], _Streams],
) -> AsyncIterator[tuple[StreamingBroker, _Streams]]:
    """A :class:`StreamingBroker` served here and ``make(stub)`` of a channel to it."""
    broker = StreamingBroker()
    server, address = await serve(broker)
    channel = grpc.aio.insecure_channel(address)
    streams = make(broker_pb2_grpc.BrokerStub(channel))
    try:
        yield broker, streams
    finally:
        streams.close()
        await channel.close()
        await server.stop(None)


@pytest.fixture
async def streaming() -> AsyncIterator[tuple[StreamingBroker, FetchStream]]:
    async with streaming_broker(FetchStream) as pair:
        yield pair


async def test_fetches_share_one_call_and_each_gets_its_answer(
    streaming: tuple[StreamingBroker, FetchStream],
) -> None:
    broker, fetches = streaming
    for number in range(1, 21):
        assert answered(await fetches.fetch(asked(number), 5)) == number
    assert (fetches.calls_opened, broker.streams, broker.unary) == (1, 1, 0)
    assert not fetches.is_unary


async def test_fetches_at_the_same_time_use_calls_of_their_own(
    streaming: tuple[StreamingBroker, FetchStream],
) -> None:
    broker, fetches = streaming
    broker.delays[1] = 0.2  # the first is still waiting when the second is sent
    first, second = await asyncio.gather(fetches.fetch(asked(1), 5), fetches.fetch(asked(2), 5))
    assert (answered(first), answered(second)) == (1, 2)
    assert fetches.calls_opened == 2
    # Both calls are kept: two more fetches at once need no new one.
    await asyncio.gather(fetches.fetch(asked(3), 5), fetches.fetch(asked(4), 5))
    assert fetches.calls_opened == 2


async def test_a_timed_out_fetch_ends_its_call_and_its_late_answer_goes_nowhere(
    streaming: tuple[StreamingBroker, FetchStream],
) -> None:
    broker, fetches = streaming
    assert answered(await fetches.fetch(asked(1), 5)) == 1
    broker.delays[2] = 0.5
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await fetches.fetch(asked(2), 0.1)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the deadline's cancel is taken back
    assert answered(await fetches.fetch(asked(3), 5)) == 3
    await asyncio.sleep(0.6)  # past the moment the late answer would have come
    assert answered(await fetches.fetch(asked(4), 5)) == 4
    assert fetches.calls_opened == 2


async def test_a_cancelled_fetch_does_not_hand_its_answer_to_the_next(
    streaming: tuple[StreamingBroker, FetchStream],
) -> None:
    broker, fetches = streaming
    broker.delays[1] = 0.3
    waiting = asyncio.create_task(fetches.fetch(asked(1), 5))
    await asyncio.sleep(0.1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert answered(await fetches.fetch(asked(2), 5)) == 2
    await asyncio.sleep(0.3)
    assert answered(await fetches.fetch(asked(3), 5)) == 3


async def test_a_stream_the_broker_ended_is_replaced(
    streaming: tuple[StreamingBroker, FetchStream],
) -> None:
    broker, fetches = streaming
    broker.end_after = 1
    assert answered(await fetches.fetch(asked(1), 5)) == 1
    await asyncio.sleep(0.2)  # the broker's end of the call arrives
    assert answered(await fetches.fetch(asked(2), 5)) == 2
    assert fetches.calls_opened == 2 and broker.streams == 2


async def test_a_fetch_on_a_stream_its_session_outlived_is_sent_again_on_a_new_one(
    streaming: tuple[StreamingBroker, FetchStream],
) -> None:
    broker, fetches = streaming
    broker.expire_after = 1
    assert answered(await fetches.fetch(asked(1), 5)) == 1
    assert answered(await fetches.fetch(asked(2), 5)) == 2  # no error: a new call
    assert fetches.calls_opened == 2 and broker.streams == 2


async def test_a_broker_without_the_stream_gets_unary_fetches() -> None:
    broker = UnaryOnlyBroker()
    server, address = await serve(broker)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            fetches = FetchStream(broker_pb2_grpc.BrokerStub(channel))
            for number in range(1, 4):
                assert answered(await fetches.fetch(asked(number), 5)) == number
            assert fetches.is_unary
            assert (fetches.calls_opened, broker.unary) == (1, 3)
    finally:
        await server.stop(None)


async def test_a_broker_that_is_gone_is_an_unavailable_error() -> None:
    broker = StreamingBroker()
    server, address = await serve(broker)
    await server.stop(None)
    async with grpc.aio.insecure_channel(address) as channel:
        fetches = FetchStream(broker_pb2_grpc.BrokerStub(channel))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await fetches.fetch(asked(1), 5)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.fixture
async def producing() -> AsyncIterator[tuple[StreamingBroker, ProduceStream]]:
    async with streaming_broker(ProduceStream) as pair:
        yield pair


async def test_produce_requests_in_flight_share_one_call_in_their_order(
    producing: tuple[StreamingBroker, ProduceStream],
) -> None:
    broker, produces = producing
    broker.delays[0] = 0.2  # the others are written while the first waits for its answer
    replies = await asyncio.gather(*(produces.produce(produce_asked(n), 5) for n in range(5)))
    assert [produce_answered(reply) for reply in replies] == list(range(5))
    assert broker.order == list(range(5))
    for n in range(5, 25):
        assert produce_answered(await produces.produce(produce_asked(n), 5)) == n
    assert (produces.calls_opened, broker.streams, broker.unary) == (1, 1, 0)


async def test_a_timed_out_produce_request_ends_the_call_and_those_in_flight_behind_it(
    producing: tuple[StreamingBroker, ProduceStream],
) -> None:
    broker, produces = producing
    broker.delays[1] = 0.5
    slow = asyncio.create_task(produces.produce(produce_asked(1), 0.1))
    await asyncio.sleep(0.02)
    behind = asyncio.create_task(produces.produce(produce_asked(2), 5))
    with pytest.raises(grpc.aio.AioRpcError) as timed_out:
        await slow
    assert timed_out.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await behind  # the producer resends it, in order
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert produce_answered(await produces.produce(produce_asked(3), 5)) == 3
    await asyncio.sleep(0.5)  # past the moment the late answers would have come
    assert produce_answered(await produces.produce(produce_asked(4), 5)) == 4
    assert produces.calls_opened == 2


async def test_a_produce_request_timed_out_in_its_own_task_takes_its_cancel_back(
    producing: tuple[StreamingBroker, ProduceStream],
) -> None:
    broker, produces = producing
    broker.delays[1] = 0.3
    with pytest.raises(grpc.aio.AioRpcError) as timed_out:
        await produces.produce(produce_asked(1), 0.05)
    assert timed_out.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_cancelled_produce_request_stays_cancelled(
    producing: tuple[StreamingBroker, ProduceStream],
) -> None:
    broker, produces = producing
    broker.delays[1] = 0.3
    waiting = asyncio.create_task(produces.produce(produce_asked(1), 5))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0.3)  # its late answer goes nowhere
    assert produce_answered(await produces.produce(produce_asked(2), 5)) == 2


async def test_a_produce_stream_the_broker_ended_fails_what_is_in_flight_and_is_replaced(
    producing: tuple[StreamingBroker, ProduceStream],
) -> None:
    broker, produces = producing
    broker.end_after = 1
    broker.delays[2] = 0.2
    first, second = await asyncio.gather(
        produces.produce(produce_asked(1), 5),
        produces.produce(produce_asked(2), 5),
        return_exceptions=True,
    )
    assert isinstance(first, pb.ProduceResponse) and produce_answered(first) == 1
    assert isinstance(second, grpc.aio.AioRpcError)
    assert second.code() == grpc.StatusCode.UNAVAILABLE
    assert produce_answered(await produces.produce(produce_asked(3), 5)) == 3
    assert produces.calls_opened == 2 and broker.streams == 2


async def test_produce_requests_a_session_expiry_left_unanswered_are_sent_again_in_order(
    producing: tuple[StreamingBroker, ProduceStream],
) -> None:
    broker, produces = producing
    broker.expire_after = 2
    replies = await asyncio.gather(*(produces.produce(produce_asked(n), 5) for n in range(5)))
    assert [produce_answered(reply) for reply in replies] == list(range(5))
    # The first call read 0 and 1 (answered) and 2 (not); 2, 3, 4 went again, in order.
    assert broker.order == [0, 1, 2, 3, 4]
    assert produces.calls_opened == 2 and broker.streams == 2


async def test_a_broker_without_the_produce_stream_gets_unary_produce_requests() -> None:
    broker = UnaryOnlyBroker()
    server, address = await serve(broker)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            produces = ProduceStream(broker_pb2_grpc.BrokerStub(channel))
            for n in range(3):
                assert produce_answered(await produces.produce(produce_asked(n), 5)) == n
            assert produces.is_unary and broker.unary == 3
    finally:
        await server.stop(None)


async def _park_under_expiry(timeout_s: float, parked: asyncio.Future[None]) -> str:
    """Wait on ``parked`` under an :class:`Expiry` as the streams do: 'answered', 'expired'
    (the deadline's own cancellation, taken back) or 'cancelled' (one from outside)."""
    expiry = Expiry(timeout_s)
    try:
        try:
            await parked
        finally:
            expiry.disarm()
    except asyncio.CancelledError:
        if expiry.expired():
            return "expired"
        raise
    return "answered"


async def test_an_expiry_and_a_cancel_from_outside_in_one_loop_turn_stay_a_cancellation() -> None:
    """The deadline fires, and a cancellation from outside arrives in the same loop turn,
    before the task resumes: the caller sees the cancellation, with one request counted
    (the outside one)."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(_park_under_expiry(0.01, loop.create_future()))
    await asyncio.sleep(0)  # parked, its deadline armed
    loop.call_later(0.015, task.cancel)  # due after the deadline
    time.sleep(0.03)  # both due: the next loop turn runs the deadline, then the cancel
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelling() == 1


async def test_an_expiry_inside_the_callers_own_timeout_leaves_it_a_timeout() -> None:
    """The caller's own ``asyncio.timeout`` and the deadline fire in one loop turn: the
    caller's timeout raises TimeoutError and no cancellation request is left counted."""
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):
            await _park_under_expiry(0, loop.create_future())
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_an_answer_before_the_deadline_disarms_it() -> None:
    """Answered in time: the timer is cancelled, so it cancels nothing later on."""
    loop = asyncio.get_running_loop()
    answered = loop.create_future()
    loop.call_soon(answered.set_result, None)
    assert await _park_under_expiry(0.01, answered) == "answered"
    await asyncio.sleep(0.03)  # past the deadline: the task was not cancelled
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
