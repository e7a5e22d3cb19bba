"""An asyncio TCP proxy on loopback that cuts a gRPC connection in the middle of a message.

Each connection a client opens to the proxy gets its own connection to the upstream
server, and bytes are copied both ways; the client's side is read frame by frame (HTTP/2:
a 9-byte header, then the payload). After :meth:`CuttingProxy.cut_next_message`, the
next DATA frame the client sends is forwarded only in part, as a well-formed DATA frame
that carries the gRPC message's 5-byte prefix and the first half of its body, without
END_STREAM; then both connections are reset (RST, via SO_LINGER 0). The server has read a
message's beginning and never gets its end, as when a network path dies under a client
mid-write. :attr:`CuttingProxy.forwarded` is how many bytes reached the server by then.

:meth:`CuttingProxy.stall` holds what clients send (the frames wait in the proxy, the
connections stay up) until :meth:`CuttingProxy.resume`: a server that is slow to answer,
or hung, as its clients see it. :attr:`CuttingProxy.accepted` counts the connections
clients opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

__all__ = ["CuttingProxy"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9
DATA = 0x0
END_STREAM, PADDED = 0x1, 0x8
GRPC_PREFIX = 5
_LINGER_RESET = struct.pack("ii", 1, 0)


class CuttingProxy:
    """``async with CuttingProxy(upstream) as proxy``: clients connect to ``proxy.address``."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._server: asyncio.Server | None = None
        self._armed = False
        self._connections: set[asyncio.Task[None]] = set()
        self.cut = asyncio.Event()
        """Set once a message was cut and the connections reset."""
        self.forwarded = 0
        """Bytes sent to the server from the clients' side, over every connection."""
        self.accepted = 0
        """Connections clients opened to the proxy."""
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.address = ""

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._server.wait_closed()

    def stall(self) -> None:
        """Hold every frame clients send from now on, until :meth:`resume`."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward the held frames, in order, and every frame after them."""
        self._flowing.set()

    def cut_next_message(self) -> None:
        """Cut the next DATA frame a client sends (see the module docstring)."""
        self.cut.clear()
        self._armed = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            self._connections.discard(task)
            return
        pumps = [
            asyncio.create_task(self._to_server(reader, up_writer, (writer, up_writer))),
            asyncio.create_task(_copy(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for pump in pumps:
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                    await pump
            for end in (writer, up_writer):
                end.close()
            self._connections.discard(task)

    async def _to_server(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        ends: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        preface = await reader.readexactly(len(PREFACE))
        await self._send(writer, preface)
        while True:
            header = await reader.readexactly(FRAME_HEADER)
            length = int.from_bytes(header[:3], "big")
            payload = await reader.readexactly(length) if length else b""
            frame_type, flags = header[3], header[4]
            if self._armed and frame_type == DATA and not flags & PADDED and length > 6:
                self._armed = False
                body = length - GRPC_PREFIX
                kept = GRPC_PREFIX + max(1, body // 2)
                part = bytes([*kept.to_bytes(3, "big"), DATA, 0]) + header[5:9]
                await self._send(writer, part + payload[:kept])
                for end in ends:
                    _reset(end)
                self.cut.set()
                return
            await self._send(writer, header + payload)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        await self._flowing.wait()
        writer.write(data)
        await writer.drain()
        self.forwarded += len(data)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a dead network path or a killed peer would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    writer.transport.abort()
