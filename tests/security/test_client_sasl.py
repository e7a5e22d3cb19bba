"""A client's SASL exchange checks the server too: SCRAM is mutual (RFC 5802), so a
server that calls the exchange complete without proving that it knows the credential (no
server-final message, or one out of turn) is refused, and its session token is never
used; and a server that asks for fewer iterations than SCRAM's minimum (4096) gets no
proof to crack cheaply offline, as Kafka's client refuses it. The impostor is a stand-in
Authentication service on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio
import pytest
from highwater.errors import SaslAuthenticationError
from highwater.rpc.client_auth import SaslSession
from highwater.rpc.server import bind, new_server
from highwater.security.sasl_client import SaslCredentials
from highwater.v1 import security_pb2 as pb
from highwater.v1 import security_pb2_grpc

Answer = Callable[[pb.AuthenticateRequest], pb.AuthenticateResponse]


class Impostor(security_pb2_grpc.AuthenticationServicer):
    """Answers each step as ``answer`` says, knowing no credential."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    async def Authenticate(
        self, request: pb.AuthenticateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AuthenticateResponse:
        return self.answer(request)


def complete_at_once(request: pb.AuthenticateRequest) -> pb.AuthenticateResponse:
    return pb.AuthenticateResponse(complete=True, session_token="t", session_lifetime_ms=60_000)


def complete_without_server_final(request: pb.AuthenticateRequest) -> pb.AuthenticateResponse:
    if not request.exchange_id:  # the client-first message: a server-first anyone can make
        nonce = dict(part.split("=", 1) for part in request.auth_bytes.decode().split(",")[2:])
        first = f"r={nonce['r']}server,s=c2FsdHNhbHRzYWx0c2FsdA==,i=4096"
        return pb.AuthenticateResponse(auth_bytes=first.encode(), exchange_id="x")
    return pb.AuthenticateResponse(complete=True, session_token="t", session_lifetime_ms=60_000)


@pytest.fixture(params=[complete_at_once, complete_without_server_final])
async def impostor(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    server = new_server(max_message_bytes=1 << 20)
    security_pb2_grpc.add_AuthenticationServicer_to_server(Impostor(request.param), server)
    port = bind(server, "127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def test_a_server_that_does_not_prove_the_credential_is_refused(impostor: str) -> None:
    target = impostor
    session = SaslSession(
        target,
        SaslCredentials("SCRAM-SHA-256", username="alice", password="s3cret"),
        lambda: grpc.aio.insecure_channel(target),
    )
    with pytest.raises(SaslAuthenticationError, match="server"):
        await session.token()


class Counting(Impostor):
    """Answers a server-first message with ``iterations``; counts the client-finals."""

    def __init__(self, iterations: int) -> None:
        super().__init__(self._answer)
        self.iterations = iterations
        self.finals = 0

    def _answer(self, request: pb.AuthenticateRequest) -> pb.AuthenticateResponse:
        if request.exchange_id:
            self.finals += 1
            return pb.AuthenticateResponse(error=58, error_message="no")
        nonce = dict(part.split("=", 1) for part in request.auth_bytes.decode().split(",")[2:])
        first = f"r={nonce['r']}server,s=c2FsdHNhbHRzYWx0c2FsdA==,i={self.iterations}"
        return pb.AuthenticateResponse(auth_bytes=first.encode(), exchange_id="x")


@pytest.mark.parametrize("iterations", [1, 4095])
async def test_a_server_asking_for_too_few_iterations_gets_no_proof(iterations: int) -> None:
    impostor = Counting(iterations)
    server = new_server(max_message_bytes=1 << 20)
    security_pb2_grpc.add_AuthenticationServicer_to_server(impostor, server)
    target = f"127.0.0.1:{bind(server, '127.0.0.1:0')}"
    await server.start()
    try:
        session = SaslSession(
            target,
            SaslCredentials("SCRAM-SHA-512", username="alice", password="s3cret"),
            lambda: grpc.aio.insecure_channel(target),
        )
        with pytest.raises(SaslAuthenticationError, match="4096"):
            await session.token()
        assert impostor.finals == 0
    finally:
        await server.stop(0)
