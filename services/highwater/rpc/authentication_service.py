"""``highwater.v1.Authentication``: the ``Authenticate`` call over the pure core of
``security/authentication.py`` (the process's ``Authenticator``).

Served by every role whose ``sasl.enabled.mechanisms`` is not empty
(:class:`~highwater.rpc.server.GrpcHost` adds it). A failed step is answered after
``connection.failed.authentication.delay.ms``, and its reason is logged here, never told
to the client beyond "authentication failed".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Final

import grpc
import grpc.aio

from highwater.rpc.auth import authenticator, peer_host
from highwater.v1 import security_pb2 as pb
from highwater.v1 import security_pb2_grpc

__all__ = ["AUTHENTICATION_SERVICE_NAME", "AuthenticationServicer", "add_authentication_servicer"]

log = logging.getLogger(__name__)

AUTHENTICATION_SERVICE_NAME: Final = "highwater.v1.Authentication"
_FAILED: Final = "authentication failed"


class AuthenticationServicer(security_pb2_grpc.AuthenticationServicer):
    async def Authenticate(
        self, request: pb.AuthenticateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AuthenticateResponse:
        core = authenticator()
        host = peer_host(context)
        result = core.step(
            host, request.mechanism, request.auth_bytes, request.exchange_id, time.time()
        )
        if result.failed:
            log.warning(
                "failed %s authentication from %s: %s",
                request.mechanism,
                host,
                result.error_message,
            )
            await asyncio.sleep(core.settings.failed_authentication_delay_ms / 1000)
            result = dataclasses.replace(result, error_message=_FAILED)
        elif result.complete:
            log.info("%s authenticated from %s with %s", result.principal, host, request.mechanism)
        return pb.AuthenticateResponse(
            error=result.error,  # type: ignore[arg-type]
            error_message=result.error_message,
            auth_bytes=result.auth_bytes,
            exchange_id=result.exchange_id,
            complete=result.complete,
            session_token=result.session_token,
            session_lifetime_ms=result.session_lifetime_ms,
            principal=result.principal,
            enabled_mechanisms=list(core.enabled_mechanisms),
        )


def add_authentication_servicer(server: grpc.aio.Server) -> None:
    security_pb2_grpc.add_AuthenticationServicer_to_server(AuthenticationServicer(), server)
