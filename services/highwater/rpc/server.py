"""Servers: the one place where a process makes a gRPC server, and the host it serves from.

:func:`new_server` makes every server of the package (the telemetry interceptors, the
message size caps, no ``SO_REUSEPORT``: a second process on the same port must fail) and
:func:`bind` binds it, so that transport security and authentication later plug in once.

:class:`GrpcHost` is a process's one gRPC server: the :class:`GrpcService` values it is
given (the Raft service, a controller's, a broker's, a coordinator's, on one port), plus
``grpc.health.v1`` and server reflection, which lists them all. Health reports a service
NOT_SERVING until the role behind it reports that it can serve what the service promises
(:meth:`GrpcHost.report_serving`: a broker registered and unfenced, a controller quorum
with a leader, a coordinator whose partitions are loaded), or from the start for a
service that can (``serving_at_start``: the Raft service, up while the process is); the
whole server, the empty name, is SERVING while every service it serves is. A role may
report a readiness of its own too, such as a broker's rolling-restart gate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from highwater.rpc.auth import AuthInterceptor, server_security
from highwater.rpc.authentication_service import (
    AUTHENTICATION_SERVICE_NAME,
    add_authentication_servicer,
)
from highwater.rpc.channels import KEEPALIVE_TIME_MS, channel_options
from highwater.rpc.listener_context import ListenerInterceptor
from highwater.rpc.tls import ServerTls, server_tls
from highwater.rpc.undecodable import DecodeInterceptor
from highwater.telemetry.rpc import server_interceptors

__all__ = [
    "CONNECTION_MAX_IDLE_MS",
    "PING_POLICY",
    "SERVER_KEEPALIVE_TIME_MS",
    "SERVER_PING_TIMEOUT_MS",
    "GrpcHost",
    "GrpcService",
    "bind",
    "new_server",
]

PING_POLICY: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.http2.min_ping_interval_without_data_ms", min(1000, KEEPALIVE_TIME_MS // 2)),
)
"""What a server takes of its clients' pings: one a second, data or not, so that the
keepalive pings of the package's channels (:data:`~highwater.rpc.channels.KEEPALIVE_OPTIONS`,
every 3 s while a call is open) are never counted against them. gRPC's default (one in
5 minutes without data sent between them, the third such ending the connection with
``too_many_pings``) would close the connection of a quiet stream, such as a broker's
liveness stream, whose end the controller takes for the broker's death."""


SERVER_KEEPALIVE_TIME_MS: Final = 30_000
"""How often a server pings a client connection that has calls open (:func:`new_server`)."""

SERVER_PING_TIMEOUT_MS: Final = 10_000
"""How long a server's ping may go unanswered before it closes the connection."""

CONNECTION_MAX_IDLE_MS: Final = 600_000
"""How long a client connection without a call stays open: Kafka's
``connections.max.idle.ms``, whose 10 minutes the Kafka listener takes too."""


def new_server(
    *,
    max_message_bytes: int,
    listener: str | None = None,
    keepalive_time_ms: int = SERVER_KEEPALIVE_TIME_MS,
    ping_timeout_ms: int = SERVER_PING_TIMEOUT_MS,
) -> grpc.aio.Server:
    """A server capped at ``max_message_bytes`` per message both ways, with the
    authentication and authorization interceptor (``rpc/auth.py``), the one that answers
    requests that do not decode with INVALID_ARGUMENT (``rpc/undecodable.py``) and the
    telemetry interceptors; a second process binding the same port fails instead of
    sharing it.
    ``listener``: the name of the listener it serves, which its handlers see as
    :func:`~highwater.rpc.listener_context.current_listener`.

    A client that went without a word (its host gone, a link dropping packets) leaves
    nothing open for ever: the server pings a connection with calls open every
    ``keepalive_time_ms`` and closes it when a ping goes unanswered for
    ``ping_timeout_ms``, which ends its calls (a consumer's or a follower's fetch stream,
    a broker's liveness stream: a stream its controller would otherwise keep); a
    connection without a call for :data:`CONNECTION_MAX_IDLE_MS` is sent GOAWAY, and its
    client connects again at its next call. A live client answers pings from gRPC's own
    threads whatever it is doing; one stopped longer than the two together loses its
    calls, as the session timeouts would have judged it long before."""
    options = [
        *channel_options(max_message_bytes),
        *PING_POLICY,
        ("grpc.keepalive_time_ms", keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", ping_timeout_ms),
        ("grpc.http2.ping_timeout_ms", ping_timeout_ms),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_connection_idle_ms", CONNECTION_MAX_IDLE_MS),
        ("grpc.so_reuseport", 0),
    ]
    interceptors: list[grpc.aio.ServerInterceptor] = [
        AuthInterceptor(),
        DecodeInterceptor(),
        *server_interceptors(),
    ]
    if listener is not None:
        interceptors.insert(0, ListenerInterceptor(listener))
    server = grpc.aio.server(options=options, interceptors=interceptors)
    _serve_by_generic_handlers(server)
    return server


def _serve_by_generic_handlers(server: grpc.aio.Server) -> None:
    """Make the generated ``add_*Servicer_to_server`` functions register their methods
    through the generic handlers alone, which they also add.

    With registered methods, grpc.aio's server keeps one pending request per registered
    method and, for every call it takes in, awaits all of them (``asyncio.wait`` over some
    40 tasks on a controller: the Controller, Raft and membership methods): about a
    quarter of the active controller's Python time per committed write in a profile.
    Without them it keeps one pending request; the generic handlers find every method, as
    the interceptors already see each call by its name (docs/raft.md)."""

    def ignore(service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        del service_name, method_handlers

    server.add_registered_method_handlers = ignore


def bind(server: grpc.aio.Server, listen: str, *, tls: ServerTls | None = None) -> int:
    """Bind ``server`` to ``listen`` (``HOST:PORT``, port 0: any free one); the port bound.
    ``tls`` (else the process's :func:`~highwater.rpc.tls.server_tls`, else none) makes it
    a TLS port.

    Raises :class:`OSError` when the address cannot be bound (in use, or not local).
    """
    security = tls if tls is not None else server_tls()
    try:
        if security is not None:
            port = server.add_secure_port(listen, security.credentials())
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as e:
        raise OSError(f"cannot listen on {listen}: {e}") from e
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    return port


@dataclass(frozen=True, slots=True)
class GrpcService:
    """A gRPC service to serve on the process's port (one process, one port):
    ``register`` adds its servicer to the server; ``name`` (the full service name) is
    listed by reflection, and reported NOT_SERVING by health until its role reports it
    can serve (:meth:`GrpcHost.report_serving`), SERVING from the start if
    ``serving_at_start``."""

    name: str
    register: Callable[[grpc.aio.Server], None]
    serving_at_start: bool = False
    health_aliases: tuple[str, ...] = ()
    """Other names health reports the service's status under: the names it had before it
    moved to another package, which probes (Kubernetes', docs/grpc.md's) keep asking."""


class GrpcHost:
    """The process's gRPC server on ``listen``: ``services``, health and reflection.

    With named listeners (``listener_name`` for ``listen``, ``more_listeners`` as
    ``(name, HOST:PORT)``), one server per listener, each serving every service, with the
    same health, and running its handlers with the listener's name
    (:mod:`highwater.rpc.listener_context`)."""

    def __init__(
        self,
        listen: str,
        services: Sequence[GrpcService],
        *,
        max_message_bytes: int,
        listener_name: str | None = None,
        more_listeners: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.listen = listen
        self.services = tuple(services)
        self.max_message_bytes = max_message_bytes
        self.listener_name = listener_name
        self.more_listeners = tuple(more_listeners)
        self._server: grpc.aio.Server | None = None
        self._more_servers: list[grpc.aio.Server] = []
        self._health: Any = None
        self._port: int | None = None
        self._stopping = False
        self._serving = {service.name: service.serving_at_start for service in self.services}
        self._aliases = {
            alias: service.name for service in self.services for alias in service.health_aliases
        }
        self._health_updates: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The port bound (the real one when ``listen`` said 0)."""
        if self._port is None:
            raise RuntimeError("the gRPC host has not started")
        return self._port

    async def start(self) -> None:
        """Register the services, health and reflection, bind and start serving; health
        then says what has been reported so far."""
        health_servicer = health.aio.HealthServicer()
        server = self._new_server(self.listener_name, health_servicer)
        port = bind(server, self.listen)
        more: list[grpc.aio.Server] = []
        try:
            for name, address in self.more_listeners:
                more.append(self._new_server(name, health_servicer))
                bind(more[-1], address)
        except BaseException:
            for unstarted in more:
                await unstarted.stop(None)
            await server.stop(None)
            raise
        await server.start()
        for extra in more:
            await extra.start()
        self._server, self._health, self._port = server, health_servicer, port
        self._more_servers = more
        await self._publish_health()

    def _new_server(self, listener: str | None, health_servicer: Any) -> grpc.aio.Server:
        server = new_server(max_message_bytes=self.max_message_bytes, listener=listener)
        for service in self.services:
            service.register(server)
        names = tuple(service.name for service in self.services)
        if server_security().authentication.enabled_mechanisms:
            add_authentication_servicer(server)
            names = (*names, AUTHENTICATION_SERVICE_NAME)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        return server

    def report_serving(self, name: str, serving: bool) -> None:
        """Report ``name`` (a service served here, or a readiness of its own) SERVING or
        NOT_SERVING; what is reported before the host starts is published when it does."""
        if self._serving.get(name) == serving:
            return
        self._serving[name] = serving
        if self._health is not None:
            task = asyncio.get_running_loop().create_task(self._publish_health())
            self._health_updates.add(task)
            task.add_done_callback(self._health_updates.discard)

    def is_serving(self, name: str = "") -> bool:
        """What health says of ``name`` (the empty name: the whole server)."""
        if name:
            return self._serving.get(self._aliases.get(name, name), False)
        return all(self._serving.get(service.name, False) for service in self.services)

    async def _publish_health(self) -> None:
        """Set every status on the health servicer as it stands now (so that updates
        running in any order leave the latest)."""
        if self._health is None or self._stopping:
            return
        aliases = [(alias, self.is_serving(alias)) for alias in self._aliases]
        for name, serving in [("", self.is_serving()), *self._serving.items(), *aliases]:
            await self._health.set(
                name,
                health_pb2.HealthCheckResponse.SERVING
                if serving
                else health_pb2.HealthCheckResponse.NOT_SERVING,
            )

    async def enter_graceful_shutdown(self) -> None:
        """Report every service NOT_SERVING (and keep it so): the first step of a stop."""
        self._stopping = True
        if self._health is not None:
            await self._health.enter_graceful_shutdown()

    async def stop(self, grace_s: float) -> None:
        """Stop serving; calls under way get ``grace_s`` seconds to finish."""
        servers = [s for s in (self._server, *self._more_servers) if s is not None]
        await asyncio.gather(*(server.stop(grace_s) for server in servers))
