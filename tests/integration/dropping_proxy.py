"""An asyncio TCP proxy for gRPC (HTTP/2) that loses Produce replies: the request reaches the
broker and is appended, the reply never reaches the producer.

Every connection a client opens to the proxy gets its own connection to the upstream
broker; bytes are copied both ways, frame by frame (HTTP/2 frames: a 9-byte header, then
the payload). The proxy reads the gRPC messages (each length-prefixed, carried in DATA
frames) that go both ways: a request message that decodes as a ``ProduceRequest`` carrying
record batches is a produce request, whether it is a unary ``Produce`` call or one of the
requests of a ``ProduceStream`` call, and the next reply message on the same HTTP/2 stream
answers it. After :meth:`DroppingProxy.drop_produce_replies`, the next replies to produce
requests are not delivered: when the DATA frame of such a reply comes back from the broker
(after the append), the proxy resets both connections (RST, via SO_LINGER 0) instead.
Dropping bytes out of an HTTP/2 connection would corrupt it, so a reset is how a reply gets
lost; the client sees the call fail with UNAVAILABLE, as it would when a network path dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from google.protobuf.message import DecodeError
from highwater.v1 import broker_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9
DATA, HEADERS = 0x0, 0x1
END_STREAM, PADDED = 0x1, 0x8
_LINGER_RESET = struct.pack("ii", 1, 0)


def is_produce_request(message: bytes) -> bool:
    """Whether a gRPC request message (5-byte prefix, then the protobuf) is a Produce with
    record batches (a Metadata or InitProducerId request does not decode as one)."""
    if len(message) < 5 or message[0] != 0:
        return False
    try:
        request = pb.ProduceRequest.FromString(message[5:])
    except DecodeError:
        return False
    return any(p.record_batches for t in request.topics for p in t.partitions)


def _messages(
    buffers: dict[int, bytearray], stream_id: int, flags: int, frame: bytes
) -> list[bytes]:
    """The gRPC messages (prefix included) a DATA frame completes on its stream."""
    payload = frame[FRAME_HEADER:]
    if flags & PADDED and payload:
        payload = payload[1 : len(payload) - payload[0]]
    data = buffers.setdefault(stream_id, bytearray())
    data += payload
    messages = []
    while len(data) >= 5:
        end = 5 + int.from_bytes(data[1:5], "big")
        if len(data) < end:
            break
        messages.append(bytes(data[:end]))
        del data[:end]
    if flags & END_STREAM:
        buffers.pop(stream_id, None)
    return messages


class _Connection:
    """One client connection and its upstream connection."""

    def __init__(
        self,
        proxy: DroppingProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.upstream_reader, self.upstream_writer = upstream
        self.request_data: dict[int, bytearray] = {}
        self.reply_data: dict[int, bytearray] = {}
        self.produce_requests: dict[int, int] = {}
        """Per HTTP/2 stream, the produce requests not answered yet."""
        self.closed = False

    async def run(self) -> None:
        pumps = [
            asyncio.create_task(self._requests()),
            asyncio.create_task(self._replies()),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for pump in pumps:
                with contextlib.suppress(
                    asyncio.CancelledError, EOFError, ConnectionError, OSError
                ):
                    await pump
            self.close(reset=False)

    async def _requests(self) -> None:
        """Client to broker: forward every frame, counting the produce requests per stream."""
        preface = await self.client_reader.readexactly(len(PREFACE))
        self.upstream_writer.write(preface)
        while True:
            frame_type, flags, stream_id, frame = await self._read_frame(self.client_reader)
            if frame_type == DATA and stream_id != 0:
                for message in _messages(self.request_data, stream_id, flags, frame):
                    if is_produce_request(message):
                        self.produce_requests[stream_id] = (
                            self.produce_requests.get(stream_id, 0) + 1
                        )
            self.upstream_writer.write(frame)
            await self.upstream_writer.drain()

    async def _replies(self) -> None:
        """Broker to client: forward every frame, unless it carries a reply to drop."""
        while True:
            frame_type, flags, stream_id, frame = await self._read_frame(self.upstream_reader)
            if frame_type == DATA and self.produce_requests.get(stream_id):
                for _ in _messages(self.reply_data, stream_id, flags, frame):
                    self.produce_requests[stream_id] -= 1
                    if self.proxy.take_drop():
                        self.close(reset=True)
                        return
                    self.proxy.produce_replies_delivered += 1
            self.client_writer.write(frame)
            await self.client_writer.drain()

    @staticmethod
    async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes]:
        header = await reader.readexactly(FRAME_HEADER)
        length = int.from_bytes(header[:3], "big")
        payload = await reader.readexactly(length) if length else b""
        stream_id = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
        return header[3], header[4], stream_id, header + payload

    def close(self, *, reset: bool) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in (self.client_writer, self.upstream_writer):
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
                writer.transport.abort()
            else:
                writer.close()


class DroppingProxy:
    """Listens on ``listen_port`` (127.0.0.1) and forwards to ``upstream`` (``host:port``)."""

    def __init__(self, upstream: str, listen_port: int) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream_host, self.upstream_port = host, int(port)
        self.listen_port = listen_port
        self.produce_replies_dropped = 0
        self.produce_replies_delivered = 0
        self._to_drop = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    def drop_produce_replies(self, count: int) -> None:
        """Reset the connection instead of delivering the next ``count`` Produce replies."""
        self._to_drop += count

    @property
    def drops_pending(self) -> int:
        return self._to_drop

    def take_drop(self) -> bool:
        if self._to_drop <= 0:
            return False
        self._to_drop -= 1
        self.produce_replies_dropped += 1
        return True

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.listen_port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            try:
                upstream = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            except OSError:
                writer.transport.abort()
                return
            connection = _Connection(self, (reader, writer), upstream)
            await connection.run()
        finally:
            self._connections.discard(task)
