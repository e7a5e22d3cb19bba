"""``EtcdSession``: a process's etcd lease, kept alive; ZooKeeper's session in etcd terms.

The process's ephemeral keys (a broker's ``brokers/ids/<id>``, the controller's claim)
are attached to one lease of ``ttl_s`` seconds, refreshed every third of it. Like a
ZooKeeper client, the session decides on its own side when it is over: once no refresh
succeeded for ``ttl_s`` (etcd down, paused, or cut off), the lease may be gone, so the
session is *expired*: listeners hear it at once (a controller steps down before etcd
could have elected another), and from then on the session tries to grant a new lease,
telling the listeners the new id when it has one. A refresh that etcd answers with a TTL
of 0 (the lease was revoked while we were away) expires the session too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from highwater.etcd_metadata.connection import EtcdConnection, EtcdUnavailableError

__all__ = ["EtcdSession"]

log = logging.getLogger(__name__)

SessionListener = Callable[[int | None], None]
"""Called with the new lease id, or None when the session expired."""


class EtcdSession:
    """One lease, kept alive (see the module docstring): ``await start()``, ``await stop()``."""

    def __init__(self, connection: EtcdConnection, *, ttl_s: int = 6) -> None:
        self.connection = connection
        self.ttl_s = ttl_s
        self.lease_id: int | None = None
        self.expirations = 0
        """How many times the session expired (for tests and logs)."""
        self._listeners: list[SessionListener] = []
        self._task: asyncio.Task[None] | None = None
        self._alive = asyncio.Event()

    def add_listener(self, listener: SessionListener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        """Grant the first lease (raises :class:`EtcdUnavailableError` if etcd does not
        answer) and keep it alive."""
        self._set_lease(await self.connection.grant_lease(self.ttl_s))
        self._task = asyncio.create_task(self._keep_alive(), name="etcd-session")

    async def wait_alive(self, timeout_s: float) -> int:
        async with asyncio.timeout(timeout_s):
            await self._alive.wait()
        assert self.lease_id is not None
        return self.lease_id

    async def stop(self) -> None:
        """Stop refreshing and revoke the lease (its keys go at once), best effort."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.lease_id is not None:
            with contextlib.suppress(EtcdUnavailableError):
                await self.connection.revoke_lease(self.lease_id)
        self.lease_id = None
        await self.connection.close()

    def _set_lease(self, lease_id: int | None) -> None:
        self.lease_id = lease_id
        if lease_id is None:
            self._alive.clear()
            self.expirations += 1
        else:
            self._alive.set()
        for listener in self._listeners:
            try:
                listener(lease_id)
            except Exception:
                log.exception("an etcd session listener failed")

    async def _keep_alive(self) -> None:
        interval_s = self.ttl_s / 3
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(interval_s)
            if self.lease_id is None:
                try:
                    self._set_lease(await self.connection.grant_lease(self.ttl_s))
                    last_ok = time.monotonic()
                    log.info("etcd session renewed: lease %x", self.lease_id)
                except EtcdUnavailableError as e:
                    log.debug("etcd session: no new lease yet: %s", e)
                continue
            try:
                remaining = await self.connection.keep_alive(self.lease_id)
            except EtcdUnavailableError as e:
                if time.monotonic() - last_ok >= self.ttl_s:
                    log.warning("etcd session expired (no refresh for %ds): %s", self.ttl_s, e)
                    self._set_lease(None)
                continue
            if remaining <= 0:
                log.warning("etcd session expired: lease %x is gone", self.lease_id)
                self._set_lease(None)
                continue
            last_ok = time.monotonic()
