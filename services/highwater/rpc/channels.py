"""Client channels: the one place where a process opens a gRPC channel to a peer.

Every channel of the package is opened here, so that what all of them share (today the
message size caps and reconnect backoff of :func:`channel_options` and the trace-context
interceptor; later transport security and credentials) is decided once.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from highwater.telemetry.rpc import client_interceptors

__all__ = ["channel_options", "open_blocking_channel", "open_channel"]


def channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    """Channel options: message size caps, and reconnects quick enough for a restarted peer."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def open_channel(
    address: str, *, max_message_bytes: int | None = None, traced: bool = False
) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` (``HOST:PORT``).

    ``max_message_bytes`` sets :func:`channel_options` (else gRPC's defaults: 4 MiB
    received); ``traced`` puts the caller's trace context into every call's metadata
    (:func:`~highwater.telemetry.rpc.client_interceptors`), as clients do.
    """
    options = channel_options(max_message_bytes) if max_message_bytes is not None else None
    interceptors = client_interceptors() if traced else None
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


def open_blocking_channel(address: str) -> grpc.Channel:
    """A blocking (not asyncio) channel to ``address``, for tools that poll from a thread."""
    return grpc.insecure_channel(address)
