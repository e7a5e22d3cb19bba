"""The Kafka listener: an asyncio TCP server at the broker's edge, and the relay of group calls.

Per connection, requests are read one frame at a time (a 4-byte big-endian size, then the
request), each handed to :class:`~highwater.broker.kafka_protocol.apis.KafkaApis` as it
arrives, and the answers written back in the order of the requests, as Kafka answers a
connection: a client may pipeline (``max.in.flight.requests.per.connection``). Each
request is a task started in arrival order, and a produce request's appends are its
task's first step (they wait for nothing), so the batches of a partition reach the log in
the order they were sent, while earlier requests may still wait for the ISR. Produce with
acks=0 gets no answer.

Bad input closes the connection, with one log line for it: a frame larger than
``socket.request.max.bytes`` (100 MiB) or of a negative size, bytes that are not a request
of the version they claim (garbage, a truncated request), a request of an API or version
not served (except ApiVersions: a client newer than the broker gets the v0 answer with
UNSUPPORTED_VERSION and the versions served, KIP-511), or a request whose handling failed
unexpectedly. Nothing else is affected: other connections and the requests already
answered stand.

:class:`GroupCoordinatorRelay` carries the group calls a Kafka client sends to this broker
(FindCoordinator names it) to the coordinator service that owns the group, over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable
from typing import Any, Final

import grpc
import grpc.aio
from google.protobuf.message import Message

from highwater.broker.kafka_protocol.apis import KafkaApis, api_versions_response
from highwater.broker.kafka_protocol.codec import (
    API_VERSIONS_KEY,
    PRODUCE_KEY,
    RequestDecodeError,
    UnsupportedVersionError,
    decode_request,
    encode_response,
)
from highwater.broker.request_handler import RequestHandler
from highwater.errors import HighwaterError
from highwater.metadata.image import MetadataImage
from highwater.rpc.channels import open_channel
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_REQUEST_MAX_BYTES",
    "GroupCoordinatorRelay",
    "KafkaListener",
]

log = logging.getLogger(__name__)

DEFAULT_REQUEST_MAX_BYTES: Final = 104_857_600  # Kafka's socket.request.max.bytes
DEFAULT_MAX_IN_FLIGHT: Final = 1000
"""Requests read ahead of their answers on one connection before reading pauses."""
_SIZE: Final = struct.Struct(">i")
_NO_ANSWER: Final = b""

Answers = asyncio.Queue["asyncio.Future[bytes | bytearray] | None"]
"""A connection's answers in the order of its requests (``None``: no more requests)."""


class KafkaListener:
    """Serves Kafka's protocol on ``host:port`` (port 0: any free port, see :attr:`port`)."""

    def __init__(
        self,
        apis: KafkaApis,
        *,
        host: str,
        port: int,
        request_max_bytes: int = DEFAULT_REQUEST_MAX_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.apis = apis
        self.host = host
        self.port = port
        self.request_max_bytes = request_max_bytes
        self.max_in_flight = max_in_flight
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=1 << 20, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("Kafka listener on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        answers: Answers = asyncio.Queue(self.max_in_flight)
        responder = asyncio.create_task(self._respond(answers, writer))
        try:
            while not responder.done():
                problem = await self._read_one(reader, answers)
                if problem is not None:
                    if problem:
                        log.warning("Kafka connection from %s closed: %s", peer, problem)
                    break
            await answers.put(None)
            with contextlib.suppress(Exception):
                await responder
        except asyncio.CancelledError:
            responder.cancel()
            raise
        finally:
            responder.cancel()
            while not answers.empty():
                pending = answers.get_nowait()
                if pending is not None:
                    pending.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._connections.discard(task)

    async def _read_one(self, reader: asyncio.StreamReader, answers: Answers) -> str | None:
        """Read and dispatch one request; why the connection ends ("" at a clean end)."""
        try:
            head = await reader.readexactly(4)
        except (asyncio.IncompleteReadError, ConnectionError):
            return ""
        (size,) = _SIZE.unpack(head)
        if size < 0 or size > self.request_max_bytes:
            return (
                f"a request of {size} bytes (socket.request.max.bytes is {self.request_max_bytes})"
            )
        try:
            frame = await reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return "the connection ended inside a request"
        try:
            request = decode_request(frame)
        except UnsupportedVersionError as e:
            if e.api_key != API_VERSIONS_KEY:
                return str(e)
            done: asyncio.Future[bytes | bytearray] = asyncio.get_running_loop().create_future()
            done.set_result(
                encode_response(API_VERSIONS_KEY, 0, e.correlation_id, api_versions_response(35))
            )
            await answers.put(done)
            return None
        except RequestDecodeError as e:
            return f"an unreadable request: {e}"
        await answers.put(asyncio.ensure_future(self._answer(request)))
        return None

    async def _answer(self, request: Any) -> bytes | bytearray:
        response = await self.apis.handle(request)
        if response is None:
            assert request.api_key == PRODUCE_KEY
            return _NO_ANSWER
        return encode_response(
            request.api_key, request.api_version, request.correlation_id, response
        )

    async def _respond(
        self,
        answers: Answers,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Write the answers in the order of the requests."""
        while (pending := await answers.get()) is not None:
            try:
                frame = await pending
            except Exception:
                log.exception("a Kafka request failed; closing its connection")
                writer.close()
                return
            if frame:
                writer.write(frame)
                if answers.empty():
                    await writer.drain()


class CoordinatorUnreachableError(HighwaterError):
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class GroupCoordinatorRelay:
    """Group calls sent to the coordinator service that owns the group (over gRPC): the
    owner is the one ``FindCoordinator`` names from the metadata image."""

    # JoinGroup and SyncGroup wait up to the group's rebalance timeout (at most 5 min).
    _LONG_CALLS: Final = frozenset({"JoinGroup", "SyncGroup"})

    def __init__(
        self,
        requests: RequestHandler,
        image: Callable[[], MetadataImage],
        *,
        timeout_s: float = 30,
        long_timeout_s: float = 330,
    ) -> None:
        self.requests = requests
        self._image = image
        self.timeout_s = timeout_s
        self.long_timeout_s = long_timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> coordinator_pb2_grpc.GroupCoordinatorStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address)
        return coordinator_pb2_grpc.GroupCoordinatorStub(channel)

    async def _call_at(self, address: str, method: str, message: Message) -> Any:
        timeout = self.long_timeout_s if method in self._LONG_CALLS else self.timeout_s
        try:
            return await getattr(self._stub(address), method)(message, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            raise CoordinatorUnreachableError(
                f"{method} at {address}: {e.code().name} {e.details()}"
            ) from e

    async def call(self, group_id: str, method: str, message: Message) -> Any:
        found = self.requests.find_coordinator(
            pb.FindCoordinatorRequest(key_type=pb.COORDINATOR_TYPE_GROUP, keys=[group_id])
        ).coordinators[0]
        if found.error != ErrorCode.NONE:
            error = CoordinatorUnreachableError(found.error_message)
            error.code = found.error
            raise error
        return await self._call_at(f"{found.host}:{found.port}", method, message)

    async def call_every(self, method: str, message: Message) -> list[Any]:
        addresses = {
            f"{c.listeners[0].host}:{c.listeners[0].port}"
            for c in self._image().cluster.coordinators.values()
            if c.listeners
        }
        return list(
            await asyncio.gather(*(self._call_at(a, method, message) for a in sorted(addresses)))
        )

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
