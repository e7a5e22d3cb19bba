"""``EtcdSession``: a process's etcd lease, kept alive; ZooKeeper's session in etcd terms.

The process's ephemeral keys (a broker's ``brokers/ids/<id>``, the controller's claim)
are attached to one lease of ``ttl_s`` seconds, refreshed every third of it. Like a
ZooKeeper client, the session decides on its own side when it is over: ``ttl_s`` after the
last refresh that succeeded was sent, once refreshes fail (etcd down, paused, or cut off),
the lease may be gone, so the session is *expired*: listeners hear it at once (a
controller steps down before etcd could have elected another, unless a refresh was still
in flight then), and from then on the session tries to grant a new lease,
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
        sent = time.monotonic()
        self._set_lease(await self.connection.grant_lease(self.ttl_s))
        self._task = asyncio.create_task(self._keep_alive(sent), name="etcd-session")

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

    async def _keep_alive(self, granted_at: float) -> None:
        """Refresh the lease every third of its TTL. The session is judged over ``ttl_s``
        after the last refresh etcd answered was *sent* (``granted_at`` for the first):
        etcd renewed the lease no earlier than that, so on etcd's side it lasts at least
        until then. Once a refresh failed, the loop wakes at that moment and ends the
        session then, without waiting for another call to fail (before, the end came only
        when a later refresh failed: up to a refresh interval plus a call's timeout after
        etcd could have let another candidate claim). A refresh still in flight at that
        moment is waited for (up to the call's timeout), so that a slow but answered
        refresh under load does not end a live session."""
        interval_s = self.ttl_s / 3
        refreshed = granted_at
        failed: EtcdUnavailableError | None = None
        while True:
            if self.lease_id is None:
                await asyncio.sleep(interval_s)
                sent = time.monotonic()
                try:
                    self._set_lease(await self.connection.grant_lease(self.ttl_s))
                    refreshed, failed = sent, None
                    log.info("etcd session renewed: lease %x", self.lease_id)
                except EtcdUnavailableError as e:
                    log.debug("etcd session: no new lease yet: %s", e)
                continue
            deadline = refreshed + self.ttl_s
            await asyncio.sleep(max(0.0, min(interval_s, deadline - time.monotonic())))
            if failed is not None and time.monotonic() >= deadline:
                self._expire(failed)
                failed = None
                continue
            sent = time.monotonic()
            try:
                remaining = await self.connection.keep_alive(self.lease_id)
            except EtcdUnavailableError as e:
                failed = e
                if time.monotonic() >= deadline:
                    self._expire(e)
                    failed = None
                continue
            failed = None
            if remaining <= 0:
                log.warning("etcd session expired: lease %x is gone", self.lease_id)
                self._set_lease(None)
                continue
            refreshed = sent

    def _expire(self, error: EtcdUnavailableError) -> None:
        log.warning("etcd session expired (no refresh for %ds): %s", self.ttl_s, error)
        self._set_lease(None)
