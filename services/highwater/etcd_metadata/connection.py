"""``EtcdConnection``: the calls the etcd metadata mode makes, over aetcd, with typed errors.

One gRPC channel at a time, to one member of the ``etcd://`` address, with aetcd's stubs
and messages for etcd's v3 API (aetcd's ``Client`` opens only plaintext channels, so the
channel is made here: plaintext for ``etcd://``, TLS for ``https://`` with the address's
:class:`~highwater.rpc.tls.ClientTls`, whose files are read again for each new channel, so
rotated certificates reach the next connection). A call that fails
to reach it (refused, timed out: etcd down or paused) raises
:class:`EtcdUnavailableError` naming the member, and the next call goes to the next
member. Calls are short (``timeout_s`` each; each page of a whole prefix's read,
``range_timeout_s``): the callers retry on their own schedule. A whole prefix is read in
pages of ``page_keys`` keys, every page at the revision of the first, so that the read is
one snapshot however large the prefix (:meth:`EtcdConnection.prefix_pages`). A request etcd
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
The watch's channel is made as the unary calls' is (TLS included).

A TLS handshake that fails (a server certificate the CA given did not sign or that does
not name the member, a client certificate etcd refused) raises :class:`EtcdTlsError`, an
:class:`EtcdUnavailableError` whose message says so (the watch: an
:class:`EtcdWatchBrokenError` with that message).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from aetcd import rpc

from highwater.errors import HighwaterError
from highwater.etcd_metadata.endpoints import EtcdStoreAddress
from highwater.rpc.tls import TlsConfigError
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "KEEPALIVE_OPTIONS",
    "PAGE_KEYS",
    "Compare",
    "Delete",
    "EtcdCompactedError",
    "EtcdConnection",
    "EtcdRequestTooLargeError",
    "EtcdTlsError",
    "EtcdUnavailableError",
    "EtcdWatchBrokenError",
    "KeyVersion",
    "PrefixChanges",
    "Put",
    "TxnResult",
]

log = logging.getLogger(__name__)


class EtcdUnavailableError(HighwaterError):
    """No etcd member answered: the metadata store is down, paused or unreachable."""

    code = ErrorCode.NOT_CONTROLLER


class EtcdTlsError(EtcdUnavailableError):
    """The TLS handshake with an etcd member failed, or the TLS files could not be read:
    no call reaches it until the certificates (or the address) are fixed."""


class EtcdWatchBrokenError(EtcdUnavailableError):
    """A watch ended without the promise of every change: read in full, then watch again."""


class EtcdCompactedError(EtcdUnavailableError):
    """The revision a paged read of a prefix was taken at was compacted before its last
    page: the read must start again."""


class EtcdRequestTooLargeError(HighwaterError):
    """etcd refused a request for its size (``INVALID_ARGUMENT``: too many operations in
    one transaction, a request too large): the store's limits, not its availability."""

    code = ErrorCode.INVALID_REQUEST


MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""The largest message to or from etcd (a page of a prefix is far smaller: see
:data:`PAGE_KEYS`)."""

KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.http2.ping_timeout_ms", 3_000),
    ("grpc.http2.max_pings_without_data", 0),
)
"""Keepalive pings of the channels to etcd while they have calls open: one every 10 s, a
connection whose ping goes unanswered for 3 s closed (the ping timed by
``grpc.http2.ping_timeout_ms``, as :data:`~highwater.rpc.channels.KEEPALIVE_OPTIONS` say
why; ``TCP_USER_TIMEOUT`` at 3 s: bytes left unacknowledged that long close it too). A
watch is a call open for as long as it lasts: without them, one on a member that stopped
answering (paused, its host gone without a reset, a link dropping packets) waited on that
connection for as long as the kernel's TCP keepalive allows (2 hours by default), seeing no
change, while the unary calls' timeouts had moved them to the next member; with them it
ends within 13 s (12.1 s measured on a paused member) and is made again. 10 s, not the 3 s
of the package's other channels: etcd ends the connection of a client that pings more
often than its ``--grpc-keepalive-min-time``, 5 s by default."""

PAGE_KEYS = 10_000
"""Keys per page of a whole prefix read (about 200 bytes a partition: about 2 MB a page).
One answer for the whole prefix was about 228 MB at 1,000,000 partitions, under the
512 MiB limit only up to about 2.3 million."""

_COMPACTED_RETRIES = 3


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


_CALL_ERRORS = (TimeoutError, grpc.RpcError, OSError, TlsConfigError)
"""What a call to a member can fail with (a channel's TLS files are read as it is made)."""

_HANDSHAKE_WORDS = ("handshake", "ssl_error", "certificate", "tls", "tsi_")
"""Words of gRPC's status details that mean TLS failed (TSI: its transport security
layer; a client certificate etcd refuses shows after the handshake, as TSI_DATA_CORRUPTED)."""


def _detail(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__


def _unavailable(
    address: EtcdStoreAddress, member: str, error: BaseException
) -> EtcdUnavailableError:
    """The typed error for a call to ``member`` that failed with ``error``: a failed TLS
    handshake (or unreadable TLS files) says so; anything else is "did not answer"."""
    detail = _detail(error)
    if isinstance(error, TlsConfigError):
        return EtcdTlsError(f"etcd at {member}: TLS files: {detail}")
    if address.tls is not None and any(w in detail.lower() for w in _HANDSHAKE_WORDS):
        return EtcdTlsError(
            f"etcd at {member}: the TLS handshake failed ({detail}); etcd's certificate must "
            f"be signed by the CA of --etcd-ca-file and name {member.rpartition(':')[0]}, and "
            "a client certificate (--etcd-cert-file) must be one etcd trusts"
        )
    return EtcdUnavailableError(f"etcd at {member} did not answer ({detail})")


class EtcdConnection:
    """Calls to the etcd members of ``address`` (see the module docstring)."""

    def __init__(
        self,
        address: EtcdStoreAddress,
        *,
        timeout_s: float = 2.0,
        range_timeout_s: float = 60.0,
        page_keys: int = PAGE_KEYS,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.range_timeout_s = range_timeout_s
        self.page_keys = page_keys
        self._member = 0
        self._channel: grpc.aio.Channel | None = None
        self._kv: rpc.KVStub | None = None
        self._lease: rpc.LeaseStub | None = None

    @property
    def member(self) -> str:
        host, port = self.address.endpoints[self._member]
        return f"{host}:{port}"

    def open_channel(self) -> grpc.aio.Channel:
        """A new channel to the current member: TLS when the address says so."""
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            *KEEPALIVE_OPTIONS,
        ]
        if self.address.tls is None:
            return grpc.aio.insecure_channel(self.member, options=options)
        return grpc.aio.secure_channel(self.member, self.address.tls.credentials(), options=options)

    def _stubs(self) -> tuple[rpc.KVStub, rpc.LeaseStub]:
        if self._kv is None or self._lease is None:
            self._channel = channel = self.open_channel()
            self._kv, self._lease = rpc.KVStub(channel), rpc.LeaseStub(channel)
        return self._kv, self._lease

    async def _failed(
        self, error: BaseException, channel: grpc.aio.Channel | None
    ) -> HighwaterError:
        """The typed error of a call made on ``channel`` (None: it failed before it had
        one); the next call goes to the next member, unless another failed call on the
        same channel already moved on (calls in flight together fail together)."""
        member = self.member
        if (
            isinstance(error, grpc.aio.AioRpcError)
            and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        ):
            return EtcdRequestTooLargeError(f"etcd at {member} refused: {error.details()}")
        if channel is None or channel is self._channel:
            await self.close()
            self._member = (self._member + 1) % len(self.address.endpoints)
        return _unavailable(self.address, member, error)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        self._kv = self._lease = None
        if channel is not None:
            try:
                await asyncio.wait_for(channel.close(), self.timeout_s)
            except (TimeoutError, Exception):
                log.debug("closing the etcd channel failed", exc_info=True)

    async def get_prefix(self, prefix: str) -> tuple[int, dict[str, KeyVersion]]:
        """The store's revision and every key under ``prefix``, as of that one revision
        (read in pages: :meth:`prefix_pages`). A revision compacted between two pages
        starts the read again, a few times."""
        for attempt in range(_COMPACTED_RETRIES):
            keys: dict[str, KeyVersion] = {}
            revision = 0
            try:
                async for at, page in self.prefix_pages(prefix):
                    revision = at
                    keys.update(page)
            except EtcdCompactedError:
                if attempt + 1 == _COMPACTED_RETRIES:
                    raise
                continue
            return revision, keys
        raise AssertionError("unreachable")

    async def prefix_pages(
        self, prefix: str, page_keys: int | None = None
    ) -> AsyncIterator[tuple[int, dict[str, KeyVersion]]]:
        """Every key under ``prefix`` in pages of at most ``page_keys`` keys (default: the
        connection's ``page_keys``), in key order, each with the revision of the whole
        read: the first page is read at etcd's current revision R, every later one at R
        (a range with ``revision=R`` starting after the last key read), so the pages
        together are one snapshot, whatever is written between them; a watch from R + 1
        then gives every change after it. A write between pages is in none of them.
        Raises :class:`EtcdCompactedError` if etcd compacted R away between pages."""
        raw = prefix.encode()
        end = _range_end(raw)
        limit = page_keys or self.page_keys
        start, revision = raw, 0
        while True:
            request = rpc.RangeRequest(key=start, range_end=end, limit=limit, revision=revision)
            channel = None
            try:
                kv, _ = self._stubs()
                channel = self._channel
                reply = await kv.Range(request, timeout=self.range_timeout_s)
            except _CALL_ERRORS as e:
                if (
                    revision
                    and isinstance(e, grpc.aio.AioRpcError)
                    and e.code() == grpc.StatusCode.OUT_OF_RANGE
                ):
                    raise EtcdCompactedError(
                        f"etcd at {self.member} compacted revision {revision} while "
                        f"{prefix} was read at it ({e.details()})"
                    ) from None
                raise await self._failed(e, channel) from None
            if not revision:
                revision = reply.header.revision
            page = {
                kv.key.decode(): KeyVersion(kv.value, kv.create_revision, kv.mod_revision, kv.lease)
                for kv in reply.kvs
            }
            yield revision, page
            if not reply.more or not reply.kvs:
                return
            start = reply.kvs[-1].key + b"\0"

    async def get(self, key: str) -> tuple[int, KeyVersion | None]:
        """The store's revision and ``key`` (None: absent)."""
        channel = None
        try:
            kv, _ = self._stubs()
            channel = self._channel
            reply = await kv.Range(rpc.RangeRequest(key=key.encode()), timeout=self.timeout_s)
        except _CALL_ERRORS as e:
            raise await self._failed(e, channel) from None
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
        channel = None
        try:
            kv, _ = self._stubs()
            channel = self._channel
            reply = await kv.Txn(request, timeout=self.timeout_s)
        except _CALL_ERRORS as e:
            raise await self._failed(e, channel) from None
        return TxnResult(reply.succeeded, reply.header.revision)

    async def grant_lease(self, ttl_s: int) -> int:
        channel = None
        try:
            _, lease = self._stubs()
            channel = self._channel
            reply = await lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl_s), timeout=self.timeout_s)
        except _CALL_ERRORS as e:
            raise await self._failed(e, channel) from None
        return int(reply.ID)

    async def keep_alive(self, lease_id: int) -> int:
        """Refresh ``lease_id`` once; its remaining TTL (0 or less: it expired)."""
        channel = None
        try:
            _, lease = self._stubs()
            channel = self._channel
            call = lease.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self.timeout_s
            )
            async for reply in call:
                return int(reply.TTL)
        except _CALL_ERRORS as e:
            raise await self._failed(e, channel) from None
        return 0

    async def revoke_lease(self, lease_id: int) -> None:
        channel = None
        try:
            _, lease = self._stubs()
            channel = self._channel
            await lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease_id), timeout=self.timeout_s)
        except _CALL_ERRORS as e:
            raise await self._failed(e, channel) from None

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[int]:
        """The revisions at which keys under ``prefix`` changed, from ``start_revision``
        (inclusive) on, one per etcd watch response; raises :class:`EtcdWatchBrokenError`
        when the watch can no longer promise every change (see the module docstring)."""
        async for changes in self.watch_prefix_changes(prefix, start_revision):
            yield changes.revision

    async def watch_prefix_changes(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[PrefixChanges]:
        """As :meth:`watch_prefix`, with the changed keys and their values: what a watcher
        applies to its view instead of reading the prefix again."""
        raw = prefix.encode()
        member = self.member
        try:
            channel = self.open_channel()
        except TlsConfigError as e:
            raise EtcdWatchBrokenError(f"etcd at {member}: TLS files: {e}") from None
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
            failure = _unavailable(self.address, member, e)
            raise EtcdWatchBrokenError(f"the watch on {failure}") from None
        finally:
            await requests.put(None)
            await channel.close()


@dataclass(frozen=True, slots=True)
class PrefixChanges:
    """One watch response: the keys that changed, in revision order (``None``: deleted)."""

    revision: int
    changes: tuple[tuple[str, int, KeyVersion | None], ...]
    """``(key, revision, version)`` each."""
