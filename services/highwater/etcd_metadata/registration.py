"""A broker's presence in etcd: the cluster's id, and its leased ``brokers/ids/<id>`` key.

The key is ZooKeeper's ephemeral ``/brokers/ids/<id>``: created only if absent, attached to
the broker's session lease, gone when the session ends. ZOOKEEPER-1740 (and KAFKA-1387) is
the race this guards: a broker whose session expired gets a new session while the old
session's node is not yet deleted; overwriting or deleting that node would either leave a
key that vanishes later, when the old lease is revoked, or take away another live
broker's. So a broker never touches a key held by another lease: it waits until the key
is gone and then creates its own (:meth:`BrokerPresence.register`), and after a renewed
session does the same with the new lease. A key still held after ``timeout_s`` means
another live process uses this broker id: a clear error naming the key.

The cluster id is created once, by whichever process comes first
(:func:`claim_cluster_id`); a data directory of another cluster, or two clusters pointed
at one prefix, meet a cluster id that is not theirs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Sequence

from highwater.errors import HighwaterError
from highwater.etcd_metadata.connection import (
    Compare,
    EtcdConnection,
    EtcdUnavailableError,
    Put,
)
from highwater.etcd_metadata.keys import KeySpace
from highwater.etcd_metadata.session import EtcdSession
from highwater.metadata.records import BrokerEndpoint
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "BrokerPresence",
    "DuplicateBrokerError",
    "InconsistentClusterIdError",
    "broker_key_value",
    "claim_cluster_id",
]

log = logging.getLogger(__name__)


class InconsistentClusterIdError(HighwaterError):
    """The cluster id at the prefix is another cluster's."""

    code = ErrorCode.INCONSISTENT_CLUSTER_ID


class DuplicateBrokerError(HighwaterError):
    """Another live process holds this broker id's key."""

    code = ErrorCode.DUPLICATE_BROKER_REGISTRATION


def _new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


async def claim_cluster_id(
    connection: EtcdConnection, space: KeySpace, expected: str | None = None
) -> str:
    """The cluster id at ``space``, created now if absent (``expected``, else a new one);
    :class:`InconsistentClusterIdError` naming the key if it is not ``expected``."""
    wanted = expected or _new_cluster_id()
    await connection.txn(
        [Compare(space.cluster_id, "create", 0)], [Put(space.cluster_id, wanted.encode())]
    )
    _, current = await connection.get(space.cluster_id)
    if current is None:
        raise EtcdUnavailableError(f"etcd key {space.cluster_id} vanished as it was created")
    found = current.value.decode(errors="replace")
    if expected is not None and found != expected:
        raise InconsistentClusterIdError(
            f"etcd key {space.cluster_id} holds cluster id {found}, but this node belongs to "
            f"cluster {expected}: two clusters on one prefix? (use another "
            "etcd://.../CLUSTER name)"
        )
    return found


def broker_key_value(listeners: Sequence[BrokerEndpoint], rack: str | None) -> bytes:
    """What a broker's ``brokers/ids/<id>`` holds (ZooKeeper's broker JSON)."""
    return json.dumps(
        {
            "listeners": [
                {
                    "name": e.name,
                    "host": e.host,
                    "port": e.port,
                    "security_protocol": e.security_protocol,
                }
                for e in listeners
            ],
            "rack": rack,
        },
        sort_keys=True,
    ).encode()


class BrokerPresence:
    """A broker's leased key, registered and re-registered with its session's lease."""

    def __init__(
        self,
        connection: EtcdConnection,
        space: KeySpace,
        session: EtcdSession,
        broker_id: int,
        value: bytes,
        *,
        timeout_s: float = 60.0,
    ) -> None:
        self.connection = connection
        self.key = space.broker_id(broker_id)
        self.session = session
        self.value = value
        self.timeout_s = timeout_s
        self.registrations = 0
        """How many times the key was created (re-registrations after expiry count)."""
        self.waited_for_old_key = False
        """Whether a registration had to wait for a previous session's key to go."""
        self._task: asyncio.Task[None] | None = None
        session.add_listener(self._on_session)

    async def register(self) -> None:
        """Create the key with the session's lease once no other lease holds it."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            lease = self.session.lease_id
            if lease is None:
                lease = await self.session.wait_alive(max(0.1, deadline - time.monotonic()))
            try:
                created = await self.connection.txn(
                    [Compare(self.key, "create", 0)], [Put(self.key, self.value, lease)]
                )
                if created.succeeded:
                    self.registrations += 1
                    log.info("registered %s with lease %x", self.key, lease)
                    return
                _, held = await self.connection.get(self.key)
            except EtcdUnavailableError as e:
                held = None
                log.debug("registering %s: %s", self.key, e)
            if held is not None and held.lease == lease:
                # Ours: a creation whose answer was lost. Registered as any other, so a
                # renewed session creates the key again.
                self.registrations += 1
                log.info("registered %s with lease %x (its answer was lost)", self.key, lease)
                return
            if held is not None:
                self.waited_for_old_key = True
                if time.monotonic() >= deadline:
                    raise DuplicateBrokerError(
                        f"etcd key {self.key} is held by lease {held.lease:x}, not this "
                        f"process's {lease:x}: is another live broker using this id?"
                    )
            await asyncio.sleep(0.1)

    def _on_session(self, lease_id: int | None) -> None:
        if lease_id is None or self.registrations == 0:
            return
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = asyncio.create_task(self._reregister(), name=f"re-register {self.key}")

    async def _reregister(self) -> None:
        try:
            await self.register()
        except Exception:
            log.exception("re-registering %s failed", self.key)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
