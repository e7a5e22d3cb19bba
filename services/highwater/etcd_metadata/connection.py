"""``EtcdConnection``: the calls the etcd metadata mode makes, over aetcd, with typed errors.

One aetcd client at a time, to one member of the ``etcd://`` address; a call that fails
to reach it (refused, timed out: etcd down or paused) raises
:class:`EtcdUnavailableError` naming the member, and the next call goes to the next
member. Calls are short (``timeout_s`` each; reading a whole prefix, which grows with the
partitions, ``range_timeout_s``): the callers retry on their own schedule. A request etcd
refuses as too large (more operations in a transaction than its ``--max-txn-ops``, more
bytes than its ``--max-request-bytes``) raises :class:`EtcdRequestTooLargeError` instead:
retrying it elsewhere cannot help. Transactions are built from etcd's own request
messages so that the answer keeps the revision the write got (the ``mod_revision`` of
every key it put).

:meth:`EtcdConnection.watch_prefix` streams the revisions at which keys under a prefix
changed, over its own channel (a broken watch leaves the unary calls alone). It ends with
:class:`EtcdWatchBrokenError` when etcd compacted past the start revision, cancelled the
watch, or stopped answering; the caller then reads the prefix in full and watches again
from that read's revision, so no change is missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aetcd
import grpc
from aetcd import rpc

from highwater.errors import HighwaterError
from highwater.etcd_metadata.endpoints import EtcdStoreAddress
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "Compare",
    "Delete",
    "EtcdConnection",
    "EtcdRequestTooLargeError",
    "EtcdUnavailableError",
    "EtcdWatchBrokenError",
    "KeyVersion",
    "PrefixChanges",
    "Put",
    "TxnResult",
    "watch_prefix_changes",
]

log = logging.getLogger(__name__)


class EtcdUnavailableError(HighwaterError):
    """No etcd member answered: the metadata store is down, paused or unreachable."""

    code = ErrorCode.NOT_CONTROLLER


class EtcdWatchBrokenError(EtcdUnavailableError):
    """A watch ended without the promise of every change: read in full, then watch again."""


class EtcdRequestTooLargeError(HighwaterError):
    """etcd refused a request for its size (``INVALID_ARGUMENT``: too many operations in
    one transaction, a request too large): the store's limits, not its availability."""

    code = ErrorCode.INVALID_REQUEST


MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""The largest answer read from etcd (a whole prefix: about 150 bytes per partition)."""


@dataclass(frozen=True, slots=True)
class KeyVersion:
    """A key's value and etcd's bookkeeping of it (``mod_revision`` is ZooKeeper's
    zkVersion for our compare-and-swap writes)."""

    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class Compare:
    """``key``'s ``target`` (``"mod"``, ``"create"``, ``"value"``) equals ``expected``."""

    key: str
    target: str
    expected: int | bytes


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int


def _compare(compare: Compare) -> rpc.Compare:
    message = rpc.Compare(key=compare.key.encode(), result=rpc.Compare.EQUAL)
    if compare.target == "mod":
        message.target = rpc.Compare.MOD
        message.mod_revision = int(compare.expected)
    elif compare.target == "create":
        message.target = rpc.Compare.CREATE
        message.create_revision = int(compare.expected)
    elif compare.target == "value":
        message.target = rpc.Compare.VALUE
        assert isinstance(compare.expected, bytes)
        message.value = compare.expected
    else:
        raise ValueError(f"unknown compare target {compare.target!r}")
    return message


def _op(op: Put | Delete) -> rpc.RequestOp:
    if isinstance(op, Put):
        return rpc.RequestOp(
            request_put=rpc.PutRequest(key=op.key.encode(), value=op.value, lease=op.lease)
        )
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key.encode()))


def _range_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class EtcdConnection:
    """Calls to the etcd members of ``address`` (see the module docstring)."""

    def __init__(
        self, address: EtcdStoreAddress, *, timeout_s: float = 2.0, range_timeout_s: float = 60.0
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.range_timeout_s = range_timeout_s
        self._member = 0
        self._client: aetcd.Client | None = None

    @property
    def member(self) -> str:
        host, port = self.address.endpoints[self._member]
        return f"{host}:{port}"

    async def _stub_client(self) -> aetcd.Client:
        if self._client is None:
            host, port = self.address.endpoints[self._member]
            client = aetcd.Client(
                host=host,
                port=port,
                timeout=self.timeout_s,
                options={
                    "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
                    "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
                },
            )
            await client.connect()
            self._client = client
        return self._client

    async def _failed(self, error: BaseException) -> HighwaterError:
        member = self.member
        if (
            isinstance(error, grpc.aio.AioRpcError)
            and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        ):
            return EtcdRequestTooLargeError(f"etcd at {member} refused: {error.details()}")
        await self.close()
        self._member = (self._member + 1) % len(self.address.endpoints)
        if isinstance(error, grpc.aio.AioRpcError):
            detail = f"{error.code().name}: {error.details()}"
        else:
            detail = str(error) or type(error).__name__
        return EtcdUnavailableError(f"etcd at {member} did not answer ({detail})")

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), self.timeout_s)
            except (TimeoutError, Exception):
                log.debug("closing the etcd client failed", exc_info=True)

    async def get_prefix(self, prefix: str) -> tuple[int, dict[str, KeyVersion]]:
        """The store's revision and every key under ``prefix``."""
        raw = prefix.encode()
        request = rpc.RangeRequest(key=raw, range_end=_range_end(raw))
        try:
            client = await self._stub_client()
            reply = await client.kvstub.Range(request, timeout=self.range_timeout_s)
        except (TimeoutError, grpc.RpcError, aetcd.ClientError, OSError) as e:
            raise await self._failed(e) from None
        keys = {
            kv.key.decode(): KeyVersion(kv.value, kv.create_revision, kv.mod_revision, kv.lease)
            for kv in reply.kvs
        }
        return reply.header.revision, keys

    async def get(self, key: str) -> tuple[int, KeyVersion | None]:
        """The store's revision and ``key`` (None: absent)."""
        try:
            client = await self._stub_client()
            reply = await client.kvstub.Range(
                rpc.RangeRequest(key=key.encode()), timeout=self.timeout_s
            )
        except (TimeoutError, grpc.RpcError, aetcd.ClientError, OSError) as e:
            raise await self._failed(e) from None
        if not reply.kvs:
            return reply.header.revision, None
        kv = reply.kvs[0]
        return reply.header.revision, KeyVersion(
            kv.value, kv.create_revision, kv.mod_revision, kv.lease
        )

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        """One etcd transaction: ``success`` if every compare holds, else ``failure``."""
        request = rpc.TxnRequest(
            compare=[_compare(c) for c in compares],
            success=[_op(op) for op in success],
            failure=[_op(op) for op in failure],
        )
        try:
            client = await self._stub_client()
            reply = await client.kvstub.Txn(request, timeout=self.timeout_s)
        except (TimeoutError, grpc.RpcError, aetcd.ClientError, OSError) as e:
            raise await self._failed(e) from None
        return TxnResult(reply.succeeded, reply.header.revision)

    async def grant_lease(self, ttl_s: int) -> int:
        try:
            client = await self._stub_client()
            reply = await client.leasestub.LeaseGrant(
                rpc.LeaseGrantRequest(TTL=ttl_s), timeout=self.timeout_s
            )
        except (TimeoutError, grpc.RpcError, aetcd.ClientError, OSError) as e:
            raise await self._failed(e) from None
        return int(reply.ID)

    async def keep_alive(self, lease_id: int) -> int:
        """Refresh ``lease_id`` once; its remaining TTL (0 or less: it expired)."""
        try:
            client = await self._stub_client()
            call = client.leasestub.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self.timeout_s
            )
            async for reply in call:
                return int(reply.TTL)
        except (TimeoutError, grpc.RpcError, aetcd.ClientError, OSError) as e:
            raise await self._failed(e) from None
        return 0

    async def revoke_lease(self, lease_id: int) -> None:
        try:
            client = await self._stub_client()
            await client.leasestub.LeaseRevoke(
                rpc.LeaseRevokeRequest(ID=lease_id), timeout=self.timeout_s
            )
        except (TimeoutError, grpc.RpcError, aetcd.ClientError, OSError) as e:
            raise await self._failed(e) from None

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[int]:
        """The revisions at which keys under ``prefix`` changed, from ``start_revision``
        (inclusive) on, one per etcd watch response; raises :class:`EtcdWatchBrokenError`
        when the watch can no longer promise every change (see the module docstring)."""
        raw = prefix.encode()
        host, port = self.address.endpoints[self._member]
        member = f"{host}:{port}"
        channel = grpc.aio.insecure_channel(f"{host}:{port}")
        requests: asyncio.Queue[rpc.WatchRequest | None] = asyncio.Queue()
        create = rpc.WatchCreateRequest(
            key=raw, range_end=_range_end(raw), start_revision=start_revision
        )
        await requests.put(rpc.WatchRequest(create_request=create))

        async def request_stream() -> AsyncIterator[rpc.WatchRequest]:
            while (request := await requests.get()) is not None:
                yield request

        try:
            call = rpc.WatchStub(channel).Watch(request_stream())
            async for reply in call:
                if reply.compact_revision:
                    raise EtcdWatchBrokenError(
                        f"etcd at {member} compacted past revision {start_revision}"
                        f" (to {reply.compact_revision})"
                    )
                if reply.canceled:
                    raise EtcdWatchBrokenError(
                        f"etcd at {member} cancelled the watch: {reply.cancel_reason}"
                    )
                if reply.events:
                    yield max(event.kv.mod_revision for event in reply.events)
            raise EtcdWatchBrokenError(f"etcd at {member} ended the watch")
        except grpc.RpcError as e:
            detail = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else e
            raise EtcdWatchBrokenError(f"the watch on etcd at {member} broke ({detail})") from None
        finally:
            await requests.put(None)
            await channel.close()


@dataclass(frozen=True, slots=True)
class PrefixChanges:
    """One watch response: the keys that changed, in revision order (``None``: deleted)."""

    revision: int
    changes: tuple[tuple[str, int, KeyVersion | None], ...]
    """``(key, revision, version)`` each."""


async def watch_prefix_changes(
    connection: EtcdConnection, prefix: str, start_revision: int
) -> AsyncIterator[PrefixChanges]:
    """As :meth:`EtcdConnection.watch_prefix`, with the changed keys and their values: what
    a watcher applies to its view instead of reading the prefix again. Raises
    :class:`EtcdWatchBrokenError` the same way."""
    raw = prefix.encode()
    host, port = connection.address.endpoints[connection._member]
    member = f"{host}:{port}"
    channel = grpc.aio.insecure_channel(member)
    requests: asyncio.Queue[rpc.WatchRequest | None] = asyncio.Queue()
    create = rpc.WatchCreateRequest(
        key=raw, range_end=_range_end(raw), start_revision=start_revision
    )
    await requests.put(rpc.WatchRequest(create_request=create))

    async def request_stream() -> AsyncIterator[rpc.WatchRequest]:
        while (request := await requests.get()) is not None:
            yield request

    delete = rpc.Event.EventType.DELETE
    try:
        call = rpc.WatchStub(channel).Watch(request_stream())
        async for reply in call:
            if reply.compact_revision:
                raise EtcdWatchBrokenError(
                    f"etcd at {member} compacted past revision {start_revision}"
                    f" (to {reply.compact_revision})"
                )
            if reply.canceled:
                raise EtcdWatchBrokenError(
                    f"etcd at {member} cancelled the watch: {reply.cancel_reason}"
                )
            if reply.events:
                changes = tuple(
                    (
                        e.kv.key.decode(),
                        e.kv.mod_revision,
                        None
                        if e.type == delete
                        else KeyVersion(
                            e.kv.value, e.kv.create_revision, e.kv.mod_revision, e.kv.lease
                        ),
                    )
                    for e in reply.events
                )
                yield PrefixChanges(max(c[1] for c in changes), changes)
        raise EtcdWatchBrokenError(f"etcd at {member} ended the watch")
    except grpc.RpcError as e:
        detail = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else e
        raise EtcdWatchBrokenError(f"the watch on etcd at {member} broke ({detail})") from None
    finally:
        await requests.put(None)
        await channel.close()
