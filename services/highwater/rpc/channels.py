"""Client channels: the one place where a process opens a gRPC channel to a peer.

Every channel of the package is opened here, so that what all of them share (the message
size caps and reconnect backoff of :func:`channel_options`, the keepalive pings of
:data:`KEEPALIVE_OPTIONS`, the trace-context interceptor, and transport security: the
process's :func:`~highwater.rpc.tls.client_tls`) is decided once, and every asyncio channel
closed through :func:`close_channels`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final

import grpc
import grpc.aio

from highwater.config.limits import GRPC_MESSAGE_MAX_BYTES
from highwater.rpc.client_auth import ClientSecurity, SaslSession, client_sasl
from highwater.rpc.tls import ClientTls, client_tls
from highwater.telemetry.rpc import client_interceptors

__all__ = [
    "KEEPALIVE_OPTIONS",
    "KEEPALIVE_TIME_MS",
    "MAX_MESSAGE_BYTES",
    "channel_options",
    "close_channels",
    "open_blocking_channel",
    "open_channel",
]

MAX_MESSAGE_BYTES: Final = GRPC_MESSAGE_MAX_BYTES
"""The largest gRPC message the package's servers take and send, both ways (a process's
one server: :class:`~highwater.rpc.server.GrpcHost`), and what the channels of clients that
send or receive large messages (produce requests, fetch answers, the controller's
metadata) are opened with: one number, so that what a client may send is what a server
takes. A Fetch answer carries up to the broker's ``fetch.max.bytes`` (55 MiB), or one batch
past it while the message holds it (up to 63 MiB of records, ``config/limits.py``), far past
gRPC's default 4 MiB."""


KEEPALIVE_TIME_MS: Final = 3000
"""How often a channel with calls open pings its peer over HTTP/2 (:data:`KEEPALIVE_OPTIONS`)."""

KEEPALIVE_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", 3000),
    ("grpc.http2.ping_timeout_ms", 3000),
    ("grpc.http2.max_pings_without_data", 0),
)
"""Keepalive pings of every channel :func:`open_channel` opens, while it has calls open: a
ping every :data:`KEEPALIVE_TIME_MS`, and a connection whose ping goes unanswered for 3 s
is closed, failing its calls (UNAVAILABLE), so that the next call connects afresh. The
unanswered ping is timed by ``grpc.http2.ping_timeout_ms``: the gRPC of this package
(1.85) ignores ``grpc.keepalive_timeout_ms`` there and waits its own default of a minute
(a stream to a stopped server failed 60 s after the ping without it, within 7 s of the
stop with it). With keepalive on, gRPC sets the socket's ``TCP_USER_TIMEOUT`` to the
keepalive timeout (gRPC proposal A18): bytes the peer's kernel leaves unacknowledged for
3 s close it too, which is what ends a connection through a link that drops packets.

Without them, a network partition that drops packets silently leaves the connection open,
and its in-flight bytes (a replica fetch's answer, a long poll's request) to the kernel's
retransmissions, whose interval doubles from 200 ms while the link is down: after an 8 s
cut a follower's fetch stream had its next answer 5.4 s after the link came back, and on
a new connection 1.3 s after it (``tests/rpc/test_rpc_channels.py``). A peer that is
alive answers a ping from gRPC's own threads, whatever its event loop is doing, so only a
stopped process or a cut link fails them; a stop of 3 to 6 s (which the Raft quorum's 2 s
fetch timeout already takes as the leader's loss) fails its peers' calls, which they retry.
Servers (:func:`~highwater.rpc.server.new_server`) take a ping every second without data in
between (:data:`~highwater.rpc.server.PING_POLICY`), and ping their clients far less often
(every 30 s, 10 s to answer): a client that went without a word loses its calls there
too, long after any session timeout has judged it."""


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """Channel options: message size caps, and reconnects quick enough for a restarted peer."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def open_channel(
    address: str,
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    traced: bool = False,
    tls: ClientTls | None = None,
    security: ClientSecurity | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` (``HOST:PORT``).

    ``max_message_bytes`` caps what it sends and receives (:func:`channel_options`; the
    package's servers' cap unless given: what a peer of the package may answer, such as a
    replica fetch's 10 MiB or a group coordinator's 5 MiB offsets load, must reach the
    caller); it pings its peer while calls are open (:data:`KEEPALIVE_OPTIONS`);
    ``traced`` puts the caller's trace context into every call's metadata
    (:func:`~highwater.telemetry.rpc.client_interceptors`), as clients do; ``tls`` (else
    the process's, else none) makes it a TLS channel; ``security`` (else the process's TLS and
    SASL) gives its TLS and its SASL credentials: with SASL, the channel authenticates
    with ``address`` before its first call (``rpc/client_auth.py``).
    """
    options = [*channel_options(max_message_bytes), *KEEPALIVE_OPTIONS]
    interceptors: list[Any] = list(client_interceptors()) if traced else []
    if security is not None:
        transport, sasl = security.tls, security.sasl
    else:
        transport, sasl = (tls if tls is not None else client_tls()), client_sasl()
    if sasl is not None:

        def plain() -> grpc.aio.Channel:
            return _channel(address, transport, options, None)

        interceptors[:0] = SaslSession(address, sasl, plain).interceptors()
    return _channel(address, transport, options, interceptors or None)


def _channel(
    address: str, tls: ClientTls | None, options: Any, interceptors: list[Any] | None
) -> grpc.aio.Channel:
    if tls is not None:
        return grpc.aio.secure_channel(
            address, tls.credentials(), options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


def open_blocking_channel(address: str, *, tls: ClientTls | None = None) -> grpc.Channel:
    """A blocking (not asyncio) channel to ``address``, for tools that poll from a thread,
    with the servers' message cap and reconnect backoff (:func:`channel_options`)."""
    security = tls if tls is not None else client_tls()
    options = channel_options()
    if security is not None:
        return grpc.secure_channel(address, security.credentials(), options=options)
    return grpc.insecure_channel(address, options=options)


_GRPC_STATUS_TASK: Final = "_AioCall._handle_status_once_received"
"""The coroutine of the task grpc.aio starts for each streaming call to receive its status."""


async def close_channels(
    channels: Iterable[grpc.aio.Channel], *, settle_s: float = 0.02, grace_s: float = 1.0
) -> None:
    """Close ``channels``, then let gRPC deliver the ends of the calls that closing cancelled.

    ``grpc.aio.Channel.close`` cancels the calls still open and returns at once. A streaming
    call's status is received by a task of gRPC's own, which gRPC's completion queue wakes
    through the call's event loop (``call_soon_threadsafe``) once its core has processed
    the cancellation, a millisecond or so later. A loop closed before that (``asyncio.run``
    returning right after a client's ``close``) makes that wake-up fail, and the thread of
    another loop that polled the completion queue logs "Exception in callback
    PollerCompletionQueue._handle_events ... Event loop is closed". So after closing, this
    waits for those status tasks of the loop: until none is left, or ``settle_s`` passes
    with none ending (the calls of other clients on the loop, still open, are not waited
    for), at most ``grace_s`` in all. The tasks are known by their coroutine's name
    (:data:`_GRPC_STATUS_TASK`); if a gRPC release renames it, this only closes.
    """
    for channel in channels:
        await channel.close()
    current = asyncio.current_task()
    pending = {
        task
        for task in asyncio.all_tasks()
        if task is not current
        and getattr(task.get_coro(), "__qualname__", None) == _GRPC_STATUS_TASK
    }
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while pending:
        done, pending = await asyncio.wait(
            pending, timeout=min(settle_s, max(deadline - loop.time(), 0.0))
        )
        if not done or loop.time() >= deadline:
            return
