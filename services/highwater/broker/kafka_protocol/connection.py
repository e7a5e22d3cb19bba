"""A Kafka connection's bytes: request frames read into buffers of their own, answers written back.

:class:`FrameConnection` is the listener's ``asyncio.BufferedProtocol``: the transport (a
plain socket or TLS, on asyncio's loop or uvloop's) writes received bytes straight into a
buffer the protocol hands it, instead of a ``StreamReader`` copying them into its buffer
and ``readexactly`` copying each frame out again (two copies of every produce request's
records, the largest thing a broker reads).

A frame is a 4-byte big-endian size, then that many bytes. Small frames (requests of up
to 64 KiB, most of them) arrive in a per-connection scratch buffer, several per read, and
each is copied out as ``bytes`` (a copy of a few hundred bytes). A larger frame gets a
buffer of its own as soon as its size is read: the bytes already in the scratch buffer are
moved into it, and the transport then receives the rest in place, so a 1 MB produce
request is not copied in the process before it is decoded. That buffer is handed over as
a ``memoryview``; once the listener has decoded the request (the decoder copies what it
keeps: the records are ``bytes`` of their own) it gives the frame back
(:meth:`release`) and the connection receives its next large frame into the same buffer.
Measured in the broker, a fresh megabyte from the allocator costs about half a
millisecond (the kernel's page faults on memory returned to it), more than the copy into
it: the buffer is kept (up to :data:`SPARE_MAX_BYTES`) rather than allocated per request.

A size over ``socket.request.max.bytes`` (or negative) is reported when its frame is
asked for, before any of its bytes are read, and nothing is read after it.

Reading pauses while more than a few frames wait to be asked for (the listener stops
asking while a connection has its maximum of requests in flight), and writing follows the
transport's flow control (:meth:`drain`), as a ``StreamWriter``'s does. The connection
notes when bytes last moved either way (:attr:`FrameConnection.last_active`), for the
listener's idle timeout.
"""

from __future__ import annotations

import asyncio
import collections
import struct
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final, cast

__all__ = [
    "SCRATCH_BYTES",
    "SPARE_MAX_BYTES",
    "FrameConnection",
    "FrameTooLargeError",
    "IncompleteFrameError",
]

SCRATCH_BYTES: Final = 65_536
"""A connection's buffer for small frames; a frame larger than this less its size gets its
own buffer."""
SPARE_MAX_BYTES: Final = 16 * 1024 * 1024
"""The largest frame buffer a connection keeps for its next large frame."""
_SIZE: Final = struct.Struct(">i")
_HIGH_FRAMES: Final = 16
"""Frames waiting to be asked for at which reading pauses (it resumes at half)."""


class FrameTooLargeError(Exception):
    """A frame's size is negative or over the connection's limit (its bytes are not read)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a request of {size} bytes (socket.request.max.bytes is {limit})")
        self.size = size


class IncompleteFrameError(Exception):
    """The connection ended inside a frame."""

    def __init__(self) -> None:
        super().__init__("the connection ended inside a request")


class FrameConnection(asyncio.BufferedProtocol):
    """One connection: :meth:`read_frame` for each request, ``write``/``writelines`` and
    :meth:`drain` for the answers. ``serve(connection)`` runs as a task from the moment
    the connection is made (after its TLS handshake, on a TLS listener)."""

    def __init__(
        self,
        serve: Callable[[FrameConnection], Coroutine[Any, Any, None]],
        *,
        request_max_bytes: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._serve = serve
        self._loop = loop
        self.request_max_bytes = request_max_bytes
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.last_active = loop.time()
        """When bytes last arrived or were written (the loop's clock): what the listener's
        ``connections.max.idle.ms`` measures."""
        self._scratch = bytearray(SCRATCH_BYTES)
        self._start = 0  # unread bytes of the scratch buffer: [_start, _end)
        self._end = 0
        self._large: memoryview | None = None  # a large frame being received in place
        self._filled = 0
        self._spare: bytearray | None = None  # a released large frame's buffer
        self._frames: collections.deque[bytes | memoryview | FrameTooLargeError] = (
            collections.deque()
        )
        self._stopped = False  # a frame too large was met: nothing more is read
        self._reading_paused = False
        self._lost = False  # no more requests: the client's end of the stream, or no connection
        self._lost_inside_frame = False
        self._disconnected = False
        self._readable: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._drained: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed: asyncio.Future[None] = loop.create_future()
        self._ended: asyncio.Future[None] = loop.create_future()

    # --- asyncio's side -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but are ones)
        self.transport = cast(asyncio.Transport, transport)
        self.task = self._loop.create_task(self._serve(self))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._stopped:  # (reading is paused; whatever still comes is dropped)
            return memoryview(self._scratch)
        if self._large is not None:
            return self._large[self._filled :]
        if self._end == len(self._scratch):  # the unread tail to the front
            unread = self._end - self._start
            self._scratch[:unread] = self._scratch[self._start : self._end]
            self._start, self._end = 0, unread
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = self._loop.time()
        if self._stopped:
            return
        if self._large is not None:
            self._filled += nbytes
            if self._filled == len(self._large):
                self._frames.append(self._large)
                self._large = None
                self._filled = 0
        else:
            self._end += nbytes
            self._split()
        self._wake_reader()
        if len(self._frames) >= _HIGH_FRAMES and not self._reading_paused:
            self._reading_paused = True
            self._pause_reading()

    def _split(self) -> None:
        """Every whole frame of the scratch buffer out; a large frame's start into its
        own buffer."""
        scratch = self._scratch
        while self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(scratch, self._start)
            if size < 0 or size > self.request_max_bytes:
                self._frames.append(FrameTooLargeError(size, self.request_max_bytes))
                self._stopped = True
                self._pause_reading()
                return
            body = self._start + 4
            if self._end - body >= size:
                self._frames.append(bytes(memoryview(scratch)[body : body + size]))
                self._start = body + size
                continue
            if 4 + size > len(scratch):
                arrived = self._end - body
                spare, self._spare = self._spare, None
                if spare is None or len(spare) < size:
                    spare = bytearray(size)
                self._large = memoryview(spare)[:size]
                self._large[:arrived] = memoryview(scratch)[body : self._end]
                self._filled = arrived
                self._start = self._end = 0
            return
        if self._start == self._end:
            self._start = self._end = 0

    def eof_received(self) -> bool | None:
        # The client closed its end: as after a reset, the listener answers nothing more,
        # cancels the requests in flight and closes the connection (logging why, if it
        # must). Kafka's SocketServer closes such a channel at once.
        self._end_of_requests()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disconnected = True
        self._end_of_requests()
        while self._drained:
            waiter = self._drained.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("the connection was lost"))
        if not self._closed.done():
            self._closed.set_result(None)

    def _end_of_requests(self) -> None:
        if not self._lost:
            self._lost = True
            self._lost_inside_frame = self._large is not None or self._end > self._start
        self._wake_reader()
        if not self._ended.done():
            self._ended.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        while self._drained:
            waiter = self._drained.popleft()
            if not waiter.done():
                waiter.set_result(None)

    # --- the listener's side ------------------------------------------------------------------

    async def read_frame(self) -> bytes | memoryview | None:
        """The next request frame (without its size), or ``None`` at a clean end: ``bytes``,
        or a view of a large frame's buffer, to be given back (:meth:`release`) once
        nothing needs its bytes.

        :raises FrameTooLargeError: the next frame's size is over the limit.
        :raises IncompleteFrameError: the connection ended inside a frame.
        """
        while not self._frames:
            if self._lost:
                if self._lost_inside_frame:
                    raise IncompleteFrameError()
                return None
            self._readable = self._loop.create_future()
            try:
                await self._readable
            finally:
                self._readable = None
        frame = self._frames.popleft()
        if self._reading_paused and len(self._frames) <= _HIGH_FRAMES // 2 and not self._stopped:
            self._reading_paused = False
            if self.transport is not None and not self._disconnected:
                self.transport.resume_reading()
        if isinstance(frame, FrameTooLargeError):
            raise frame
        return frame

    def release(self, frame: bytes | memoryview) -> None:
        """``frame`` (from :meth:`read_frame`) is no longer read: its buffer may take the
        connection's next large frame. Nothing may keep a view of it."""
        if not isinstance(frame, memoryview):
            return
        buffer = frame.obj
        try:
            frame.release()
        except BufferError:  # something still reads it: it stays its own
            return
        if not isinstance(buffer, bytearray) or len(buffer) > SPARE_MAX_BYTES:
            return
        if self._spare is None or len(buffer) > len(self._spare):
            self._spare = buffer

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self.transport is not None
        self.last_active = self._loop.time()
        self.transport.write(data)

    def writelines(self, pieces: Iterable[bytes | bytearray | memoryview]) -> None:
        assert self.transport is not None
        self.last_active = self._loop.time()
        self.transport.writelines(pieces)

    async def drain(self) -> None:
        """Until the transport takes more (its buffer under its high-water mark).

        :raises ConnectionResetError: the connection was lost."""
        if self._disconnected:
            raise ConnectionResetError("the connection was lost")
        if not self._writing_paused:
            return
        waiter = self._loop.create_future()
        self._drained.append(waiter)
        await waiter

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        assert self.transport is not None
        return self.transport.get_extra_info(name, default)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    async def wait_ended(self) -> None:
        """Until the client has closed its end (FIN) or the connection is lost (a reset,
        or closed here): nothing sent after this reaches the client."""
        await asyncio.shield(self._ended)

    @property
    def ended_inside_frame(self) -> bool:
        """The client's end came inside a request frame."""
        return self._lost_inside_frame

    def _wake_reader(self) -> None:
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)

    def _pause_reading(self) -> None:
        if self.transport is not None and not self._disconnected:
            self.transport.pause_reading()
