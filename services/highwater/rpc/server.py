"""Servers: the one place where a process makes a gRPC server, and the host it serves from.

:func:`new_server` makes every server of the package (the telemetry interceptors, the
message size caps, no ``SO_REUSEPORT``: a second process on the same port must fail) and
:func:`bind` binds it, so that transport security and authentication later plug in once.

:class:`GrpcHost` is a process's one gRPC server: the :class:`GrpcService` values it is
given (the Raft service, a controller's, a broker's, a coordinator's, on one port), plus
``grpc.health.v1`` (each service reported SERVING while the host runs, and any readiness
a service decides for itself through :meth:`GrpcHost.set_serving`) and server
reflection, which lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from highwater.rpc.channels import channel_options
from highwater.telemetry.rpc import server_interceptors

__all__ = ["GrpcHost", "GrpcService", "bind", "new_server"]


def new_server(*, max_message_bytes: int) -> grpc.aio.Server:
    """A server capped at ``max_message_bytes`` per message both ways, with the telemetry
    interceptors; a second process binding the same port fails instead of sharing it."""
    options = [
        *channel_options(max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    return grpc.aio.server(options=options, interceptors=server_interceptors())


def bind(server: grpc.aio.Server, listen: str) -> int:
    """Bind ``server`` to ``listen`` (``HOST:PORT``, port 0: any free one); the port bound.

    Raises :class:`OSError` when the address cannot be bound (in use, or not local).
    """
    try:
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
    listed by reflection and reported SERVING by health while the host runs."""

    name: str
    register: Callable[[grpc.aio.Server], None]


class GrpcHost:
    """The process's gRPC server on ``listen``: ``services``, health and reflection."""

    def __init__(
        self, listen: str, services: Sequence[GrpcService], *, max_message_bytes: int
    ) -> None:
        self.listen = listen
        self.services = tuple(services)
        self.max_message_bytes = max_message_bytes
        self._server: grpc.aio.Server | None = None
        self._health: Any = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The port bound (the real one when ``listen`` said 0)."""
        if self._port is None:
            raise RuntimeError("the gRPC host has not started")
        return self._port

    async def start(self) -> None:
        """Register the services, health and reflection, bind and start serving; every
        service (and the whole server, ``""``) is SERVING once this returns."""
        server = new_server(max_message_bytes=self.max_message_bytes)
        for service in self.services:
            service.register(server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        names = tuple(service.name for service in self.services)
        reflection.enable_server_reflection(
            (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        port = bind(server, self.listen)
        await server.start()
        self._server, self._health, self._port = server, health_servicer, port
        serving = health_pb2.HealthCheckResponse.SERVING
        await health_servicer.set("", serving)
        for name in names:
            await health_servicer.set(name, serving)

    async def set_serving(self, name: str, serving: bool) -> None:
        """Report ``name`` as SERVING or NOT_SERVING on ``grpc.health.v1`` (a readiness a
        service decides for itself, such as a broker's rolling-restart gate); nothing
        before the host started."""
        if self._health is not None:
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if serving
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            await self._health.set(name, status)

    async def enter_graceful_shutdown(self) -> None:
        """Report every service NOT_SERVING (and keep it so): the first step of a stop."""
        if self._health is not None:
            await self._health.enter_graceful_shutdown()

    async def stop(self, grace_s: float) -> None:
        """Stop serving; calls under way get ``grace_s`` seconds to finish."""
        if self._server is not None:
            await self._server.stop(grace_s)
