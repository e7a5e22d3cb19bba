"""Embedded servers for tests: a free loopback port, and a running ``EmbeddedServer``.

``tests/support`` is on pytest's ``pythonpath``: tests in any folder import this module by
name. :func:`running_embedded_server` runs a server on the test's own event loop;
:class:`ServerThread` runs one on an event loop of its own in a background thread, for
tests that drive it from blocking code (the blocking clients, the CLI).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from highwater.embedded import EmbeddedServer
from highwater.rpc.endpoints import free_loopback_ports


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    return free_loopback_ports(1)[0]


@asynccontextmanager
async def running_embedded_server(
    data_dir: Path, listen: str | None = None
) -> AsyncIterator[EmbeddedServer]:
    """An embedded server (on a free port unless ``listen`` names one) whose broker is
    unfenced; stopped on exit."""
    server = EmbeddedServer(listen=listen or f"127.0.0.1:{free_port()}", data_dir=data_dir)
    await server.start()
    try:
        await server.broker.wait_unfenced()
        yield server
    finally:
        await server.stop()


class ServerThread:
    """An EmbeddedServer running on its own event loop in a background thread."""

    def __init__(self, data_dir: Path) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.data_dir = data_dir
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="embedded-server", daemon=True)

    def start(self) -> None:
        """Start the server and wait until its broker is unfenced."""
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("the embedded server did not start in 30 s")
        if self._failure is not None:
            raise AssertionError("the embedded server failed to start") from self._failure

    def stop(self) -> None:
        """Stop the server and join its thread; re-raise what failed in it."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the embedded server did not stop in 30 s"
        if self._failure is not None:
            raise AssertionError("the embedded server failed") from self._failure

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:
            self._failure = e
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with running_embedded_server(self.data_dir, self.address):
            self._ready.set()
            await self._stop.wait()
