"""``EtcdSession``: a process's etcd lease, kept alive; ZooKeeper's session in etcd terms.

The process's ephemeral keys (a broker's ``brokers/ids/<id>``, the controller's claim)
are attached to one lease of ``ttl_s`` seconds, refreshed every third of it. Like a
ZooKeeper client, the session decides on its own side when it is over: ``ttl_s`` after the
last refresh that succeeded was sent (etcd down, paused, or cut off since), the lease may
be gone, so the session is *expired*: listeners hear it at once (a controller steps down before etcd
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
        """Refresh the lease every third of its TTL; judge the session over exactly
        ``ttl_s`` after the last refresh etcd answered was *sent* (``granted_at`` for the
        first): etcd renewed the lease no earlier than that, so on etcd's side it lasts at
        least until then, and the session ends first. A refresh still in flight at that
        moment is not waited for, and a failed one is not needed to notice: the moment
        alone decides (judging from the answer's arrival, and only when a refresh failed,
        let a controller under load step down after etcd had let another claim)."""
        interval_s = self.ttl_s / 3
        refreshed = granted_at
        while True:
            if self.lease_id is None:
                await asyncio.sleep(interval_s)
                sent = time.monotonic()
                try:
                    self._set_lease(await self.connection.grant_lease(self.ttl_s))
                    refreshed = sent
                    log.info("etcd session renewed: lease %x", self.lease_id)
                except EtcdUnavailableError as e:
                    log.debug("etcd session: no new lease yet: %s", e)
                continue
            await asyncio.sleep(
                max(0.0, min(interval_s, refreshed + self.ttl_s - time.monotonic()))
            )
            sent = time.monotonic()
            left_s = refreshed + self.ttl_s - sent
            problem = "no answer in time"
            if left_s > 0:
                try:
                    async with asyncio.timeout(left_s):  # not wait_for: see EtcdController._run
                        remaining = await self.connection.keep_alive(self.lease_id)
                except EtcdUnavailableError as e:
                    problem = str(e)
                except TimeoutError:
                    pass
                else:
                    if remaining <= 0:
                        log.warning("etcd session expired: lease %x is gone", self.lease_id)
                        self._set_lease(None)
                    else:
                        refreshed = sent
                    continue
            if time.monotonic() - refreshed >= self.ttl_s:
                log.warning("etcd session expired (no refresh for %ds): %s", self.ttl_s, problem)
                self._set_lease(None)
