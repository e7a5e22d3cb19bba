"""The Kafka listener: an asyncio TCP server at the broker's edge, and the relay of group calls.

Per connection, requests are read one frame at a time (a 4-byte big-endian size, then the
request), each handed to :class:`~highwater.broker.kafka_protocol.apis.KafkaApis` as it
arrives, and the answers written back in the order of the requests, as Kafka answers a
connection: a client may pipeline (``max.in.flight.requests.per.connection``). Each
request is a task started in arrival order, and a produce request's appends are its
task's first step (they wait for nothing), so the batches of a partition reach the log in
the order they were sent, while earlier requests may still wait for the ISR. Produce with
acks=0 gets no answer; if it failed, its connection is closed instead (after the answers
before it, and with a log line naming the partitions), as Kafka tells such a producer.

Each connection has its :class:`~highwater.broker.kafka_protocol.sasl.ConnectionSecurity`:
on an ``SSL`` or ``SASL_SSL`` listener the TLS handshake comes first (the process's
certificate, re-read when its files change as each connection is accepted), and on a
``SASL_*`` listener the SASL requests are answered here, in the order they arrive, before
the next request is read, so each later request runs as the principal they proved (the
request's task runs with :func:`~highwater.rpc.auth.serve_as` that principal, and every
ACL check reads it from there).

Bad input closes the connection, with one log line for it: a frame larger than
``socket.request.max.bytes`` (100 MiB) or of a negative size, bytes that are not a request
of the version they claim (garbage, a truncated request, a length past its end), a
request of an API or version not served (except ApiVersions: a client newer than the
broker gets the v0 answer with UNSUPPORTED_VERSION and the versions served, KIP-511), a
request whose handling failed unexpectedly, a request other than ApiVersions and SASL's
on a ``SASL_*`` listener before authentication or after the session expired, a failed
authentication (after its answer).
Nothing else is affected: other connections and the requests already answered stand.
A client that goes, by a reset or by closing its end of the stream (FIN), gets nothing
more: its connection is closed and its requests' work cancelled, as Kafka's
``SocketServer`` closes such a channel at once. A connection with no request in flight on
which no byte moved for ``connections.max.idle.ms`` (10 minutes) is closed, as Kafka's
are: a client that went without a word (its host gone, a NAT that forgot it) leaves no
connection open for ever.

:class:`GroupCoordinatorRelay` carries the group calls a Kafka client sends to this broker
(FindCoordinator names it) to the coordinator service that owns the group, over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any, Final

import grpc
import grpc.aio
from google.protobuf.message import Message
from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from highwater.broker.kafka_protocol.apis import (
    CloseConnectionError,
    KafkaApis,
    api_versions_response,
)
from highwater.broker.kafka_protocol.codec import (
    API_VERSIONS_KEY,
    PRODUCE_KEY,
    SASL_AUTHENTICATE_KEY,
    SASL_HANDSHAKE_KEY,
    Frame,
    KafkaRequest,
    RequestDecodeError,
    Spliced,
    UnsupportedVersionError,
    decode_request,
    encode_response,
    encode_spliced_response,
)
from highwater.broker.kafka_protocol.connection import (
    FrameConnection,
    FrameTooLargeError,
    IncompleteFrameError,
)
from highwater.broker.kafka_protocol.sasl import (
    AuthenticateAnswer,
    ConnectionSecurity,
    SecurityProtocol,
)
from highwater.broker.request_handler import RequestHandler
from highwater.errors import HighwaterError, SaslAuthenticationError
from highwater.metadata.image import MetadataImage
from highwater.rpc.auth import (
    CallPrincipal,
    authenticator,
    certificate_principal,
    forwarded_principal_metadata,
    serve_as,
)
from highwater.rpc.channels import open_channel
from highwater.rpc.tls import SocketTls
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import coordinator_pb2, coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "DEFAULT_CONNECTIONS_MAX_IDLE_MS",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_REQUEST_MAX_BYTES",
    "GroupCoordinatorRelay",
    "KafkaListener",
]

log = logging.getLogger(__name__)

DEFAULT_REQUEST_MAX_BYTES: Final = 104_857_600  # Kafka's socket.request.max.bytes
DEFAULT_MAX_IN_FLIGHT: Final = 1000
"""Requests read ahead of their answers on one connection before reading pauses."""
_SIZE: Final = struct.Struct(">i")
_NO_ANSWER: Final = b""

DEFAULT_CONNECTIONS_MAX_IDLE_MS: Final = 600_000  # Kafka's connections.max.idle.ms


class Answers(asyncio.Queue["asyncio.Future[Frame] | None"]):
    """A connection's answers in the order of its requests (``None``: no more requests),
    and how many are not written yet (:attr:`unwritten`: requests in flight)."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.unwritten = 0

    def put_nowait(self, item: asyncio.Future[Frame] | None) -> None:
        super().put_nowait(item)  # (``put`` ends with this too)
        if item is not None:
            self.unwritten += 1


class KafkaListener:
    """Serves Kafka's protocol on ``host:port`` (port 0: any free port, see :attr:`port`)."""

    def __init__(
        self,
        apis: KafkaApis,
        *,
        host: str,
        port: int,
        request_max_bytes: int = DEFAULT_REQUEST_MAX_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT,
        tls: SocketTls | None = None,
        connections_max_idle_ms: int = DEFAULT_CONNECTIONS_MAX_IDLE_MS,
    ) -> None:
        """``protocol``: the listener's security protocol; ``tls``: its TLS (required by
        ``SSL`` and ``SASL_SSL``, refused otherwise); ``connections_max_idle_ms``: a
        connection without a request in flight on which no byte moved for this long is
        closed (Kafka's ``connections.max.idle.ms``; negative: never)."""
        if protocol.uses_tls != (tls is not None):
            raise ValueError(
                f"a {protocol.value} listener {'needs' if protocol.uses_tls else 'takes no'} TLS"
            )
        self.apis = apis
        self.host = host
        self.port = port
        self.request_max_bytes = request_max_bytes
        self.max_in_flight = max_in_flight
        self.protocol = protocol
        self.tls = tls
        self.connections_max_idle_ms = connections_max_idle_ms
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._served: dict[FrameConnection, Answers] = {}
        self._idle_sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        tls = self.tls

        def connection() -> FrameConnection:
            # Called as a connection is accepted, before its TLS handshake.
            if tls is not None:
                tls.refresh()
            return FrameConnection(self._serve, request_max_bytes=self.request_max_bytes, loop=loop)

        self._server = await loop.create_server(
            connection,
            self.host,
            self.port,
            reuse_address=True,
            ssl=tls.context if tls is not None else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        if self.connections_max_idle_ms >= 0:
            self._idle_sweeper = asyncio.create_task(self._close_idle_connections())
        log.info("Kafka listener (%s) on %s:%d", self.protocol.value, self.host, self.port)

    async def _close_idle_connections(self) -> None:
        """Close every connection idle for ``connections.max.idle.ms``: no request in
        flight and no byte moved either way (Kafka's ``Selector`` closes them so, which
        frees what clients that went without a word left open: a host gone without a
        reset, a NAT that forgot the connection). Looked at every quarter of that time, so
        a connection goes between 1 and 1.25 times it after its last activity; its client
        connects again when it has something to ask, as Kafka's clients do."""
        idle_s = self.connections_max_idle_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(idle_s / 4, 0.01))  # (0 ms: every 10 ms, not a spin)
            now = loop.time()
            for connection, answers in list(self._served.items()):
                if answers.unwritten == 0 and now - connection.last_active >= idle_s:
                    log.debug(
                        "Kafka connection from %s closed: idle for %.0f ms "
                        "(connections.max.idle.ms %d)",
                        connection.get_extra_info("peername"),
                        (now - connection.last_active) * 1000,
                        self.connections_max_idle_ms,
                    )
                    connection.close()

    def _security(self, connection: FrameConnection, host: str) -> ConnectionSecurity:
        """A new connection's security: its certificate's principal, if it showed one."""
        principal = None
        ssl_object = connection.get_extra_info("ssl_object")
        if isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
            der = ssl_object.getpeercert(binary_form=True)
            if der:
                principal = certificate_principal(ssl.DER_cert_to_PEM_cert(der).encode())
        return ConnectionSecurity(
            self.protocol, host, authenticator(), certificate_principal=principal
        )

    async def stop(self) -> None:
        if self._server is None:
            return
        if self._idle_sweeper is not None:
            self._idle_sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_sweeper
            self._idle_sweeper = None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        self._server = None

    async def _serve(self, connection: FrameConnection) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = connection.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        try:
            security = self._security(connection, host)
        except SaslAuthenticationError as e:
            log.warning("Kafka connection from %s refused: %s", peer, e)
            connection.close()
            self._connections.discard(task)
            return
        answers = Answers(self.max_in_flight)
        self._served[connection] = answers
        responder = asyncio.create_task(self._respond(answers, connection, peer))
        reading = asyncio.create_task(self._read_all(connection, answers, security, responder))
        ended = asyncio.ensure_future(connection.wait_ended())
        try:
            await asyncio.wait((reading, ended), return_when=asyncio.FIRST_COMPLETED)
            if reading.done():
                problem = reading.result()
            else:  # (waiting for room in the in-flight queue when the client went)
                reading.cancel()
                problem = str(IncompleteFrameError()) if connection.ended_inside_frame else ""
            if problem:
                log.warning("Kafka connection from %s closed: %s", peer, problem)
            # The answers still due go out unless the client has gone (its end of the
            # stream or a reset, as Kafka's SocketServer closes such a channel at once):
            # then nothing is answered, and the work parked for them (a fetch's long poll,
            # a produce waiting on the ISR) is cancelled below.
            if not ended.done():
                if not responder.done():  # (else the queue may be full, and nobody reads it)
                    await answers.put(None)
                await asyncio.wait((responder, ended), return_when=asyncio.FIRST_COMPLETED)
            if responder.done() and not responder.cancelled():
                responder.exception()  # (a write to a lost connection's: nothing to add)
        except asyncio.CancelledError:
            responder.cancel()
            raise
        finally:
            ended.cancel()
            reading.cancel()
            responder.cancel()
            while not answers.empty():
                pending = answers.get_nowait()
                if pending is not None:
                    pending.cancel()
            connection.close()
            self._served.pop(connection, None)
            with contextlib.suppress(Exception):
                await connection.wait_closed()
            self._connections.discard(task)

    async def _read_all(
        self,
        connection: FrameConnection,
        answers: Answers,
        security: ConnectionSecurity,
        responder: asyncio.Task[None],
    ) -> str:
        """Read and dispatch requests until the connection ends or a request ends it; why
        ("" at a clean end, or when the answers' writing ended)."""
        while not responder.done():
            problem = await self._read_one(connection, answers, security)
            if problem is not None:
                return problem
        return ""

    async def _read_one(
        self, connection: FrameConnection, answers: Answers, security: ConnectionSecurity
    ) -> str | None:
        """Read and dispatch one request; why the connection ends ("" at a clean end)."""
        try:
            frame = await connection.read_frame()
        except (FrameTooLargeError, IncompleteFrameError) as e:
            return str(e)
        if frame is None:
            return ""
        if security.expects_bare_token:
            token = bytes(frame)
            connection.release(frame)
            return await self._bare_token(token, answers, security)
        try:
            request = decode_request(frame)
        except UnsupportedVersionError as e:
            if e.api_key != API_VERSIONS_KEY:
                return str(e)
            done: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
            done.set_result(
                encode_response(API_VERSIONS_KEY, 0, e.correlation_id, api_versions_response(35))
            )
            await answers.put(done)
            return None
        except RequestDecodeError as e:
            return f"an unreadable request: {e}"
        finally:
            connection.release(frame)  # (the request holds copies of what it keeps)
        if request.api_key == SASL_HANDSHAKE_KEY:
            handshake = security.handshake(request.body.mechanism, request.api_version)
            await answers.put(
                _answered(
                    request,
                    SaslHandshakeResponse(
                        error_code=handshake.error_code, mechanisms=list(handshake.mechanisms)
                    ),
                )
            )
            return f"SaslHandshake refused ({handshake.error_code})" if handshake.close else None
        if request.api_key == SASL_AUTHENTICATE_KEY:
            return await self._authenticate(request, answers, security)
        refusal = security.admit(request.api_key, time.time())
        if refusal is not None:
            return refusal
        await answers.put(asyncio.ensure_future(self._answer(request, security.principal)))
        return None

    async def _authenticate(
        self, request: KafkaRequest, answers: Answers, security: ConnectionSecurity
    ) -> str | None:
        """Answer a SaslAuthenticate; why the connection ends after it, if it does."""
        outcome = security.authenticate(bytes(request.body.auth_bytes), time.time())
        _log_outcome(security, outcome)
        response = SaslAuthenticateResponse(
            error_code=outcome.error_code,
            error_message=outcome.error_message,
            auth_bytes=outcome.auth_bytes,
            session_lifetime_ms=outcome.session_lifetime_ms,
        )
        if outcome.delay_s > 0:
            await answers.put(asyncio.ensure_future(_later(outcome.delay_s, request, response)))
        else:
            await answers.put(_answered(request, response))
        # The failure was logged above: the connection ends without another line.
        return "" if outcome.close else None

    async def _bare_token(
        self, token: bytes, answers: Answers, security: ConnectionSecurity
    ) -> str | None:
        """A SASL token after a v0 handshake (KIP-43): the answer is a bare frame too, and
        a failure closes the connection without one (after the failure's delay)."""
        outcome = security.authenticate(token, time.time())
        _log_outcome(security, outcome)
        if outcome.close:
            await asyncio.sleep(outcome.delay_s)
            return ""
        frame = _SIZE.pack(len(outcome.auth_bytes)) + outcome.auth_bytes
        done: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        done.set_result(frame)
        await answers.put(done)
        return None

    async def _answer(self, request: Any, principal: CallPrincipal) -> Frame:
        serve_as(principal)  # this request's task only
        response = await self.apis.handle(request)
        if response is None:
            assert request.api_key == PRODUCE_KEY
            return _NO_ANSWER
        if isinstance(response, Spliced):
            return encode_spliced_response(
                request.api_key,
                request.api_version,
                request.correlation_id,
                response.response,
                response.spliced,
            )
        return encode_response(
            request.api_key, request.api_version, request.correlation_id, response
        )

    async def _respond(self, answers: Answers, writer: FrameConnection, peer: Any) -> None:
        """Write the answers in the order of the requests (until one is a close: the
        answers after it are not written).

        However it ends, the answers still queued are cancelled and taken out, so that a
        reader waiting for room in a full queue goes on (and sees this ended)."""
        try:
            while (pending := await answers.get()) is not None:
                try:
                    frame = await pending
                except CloseConnectionError as e:
                    log.warning("Kafka connection from %s closed: %s", peer, e)
                    writer.close()
                    return
                except Exception:
                    log.exception("a Kafka request failed; closing its connection, from %s", peer)
                    writer.close()
                    return
                if isinstance(frame, list):
                    writer.writelines(frame)  # (one writev: the records are not copied)
                elif frame:
                    writer.write(frame)
                answers.unwritten -= 1
                if frame and answers.empty():
                    await writer.drain()
        finally:
            while not answers.empty():
                left = answers.get_nowait()
                if left is not None:
                    left.cancel()


def _log_outcome(security: ConnectionSecurity, outcome: AuthenticateAnswer) -> None:
    if not outcome.log:
        return
    if outcome.close:
        log.warning("Kafka SASL authentication from %s failed: %s", security.host, outcome.log)
    else:
        log.info("Kafka connection from %s: %s", security.host, outcome.log)


def _answered(request: KafkaRequest, response: Any) -> asyncio.Future[Frame]:
    done: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
    done.set_result(
        encode_response(request.api_key, request.api_version, request.correlation_id, response)
    )
    return done


async def _later(delay_s: float, request: KafkaRequest, response: Any) -> Frame:
    """A failed authentication's answer, after ``connection.failed.authentication.delay.ms``."""
    await asyncio.sleep(delay_s)
    return encode_response(request.api_key, request.api_version, request.correlation_id, response)


class CoordinatorUnreachableError(HighwaterError):
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class GroupCoordinatorRelay:
    """Group calls sent to the coordinator service that owns the group (over gRPC): the
    owner is the one ``FindCoordinator`` names from the metadata image. Each call carries
    the Kafka client's principal as a forwarded call does (``rpc/auth.py``), so the
    coordinator checks the client's ACLs, not the broker's; it takes it from the broker
    because the broker may ``CLUSTER_ACTION``."""

    # JoinGroup and SyncGroup are held at the coordinator: a join until every member has
    # rejoined, a sync until the leader's assignment comes, each bounded by the group's
    # rebalance timeout (the largest its members asked for, Kafka's ``max.poll.interval.ms``),
    # as Kafka's delayed join and pending sync are. Their deadline follows the rebalance
    # timeouts JoinGroups through this listener name (see ``_deadline_s``).
    _LONG_CALLS: Final = frozenset({"JoinGroup", "SyncGroup"})

    def __init__(
        self,
        requests: RequestHandler,
        image: Callable[[], MetadataImage],
        *,
        timeout_s: float = 30,
        long_timeout_s: float = 330,
    ) -> None:
        self.requests = requests
        self._image = image
        self.timeout_s = timeout_s
        """The deadline of a group call, and the margin added to a rebalance timeout."""
        self.long_timeout_s = long_timeout_s
        """The least deadline of a JoinGroup or SyncGroup (a Kafka client's default
        ``max.poll.interval.ms``, 5 min, and the margin)."""
        self._longest_rebalance_timeout_ms = 0
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _deadline_s(self, method: str, message: Message) -> float:
        """The deadline of ``method``'s call. A JoinGroup or SyncGroup gets the longest
        rebalance timeout a JoinGroup through this listener has named (this one's
        included), plus the margin: the coordinator bounds a join and a sync by the
        group's largest member rebalance timeout, which the relay cannot see (it keeps no
        groups; a SyncGroup names none), and a join or sync cut short answers
        COORDINATOR_NOT_AVAILABLE while the coordinator still holds it. The deadline is a
        backstop for a coordinator that never answers: a live one answers within its
        bound."""
        if method not in self._LONG_CALLS:
            return self.timeout_s
        if isinstance(message, coordinator_pb2.JoinGroupRequest):
            self._longest_rebalance_timeout_ms = max(
                self._longest_rebalance_timeout_ms, message.rebalance_timeout_ms
            )
        return max(self.long_timeout_s, self._longest_rebalance_timeout_ms / 1000 + self.timeout_s)

    def _stub(self, address: str) -> coordinator_pb2_grpc.GroupCoordinatorStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address)
        return coordinator_pb2_grpc.GroupCoordinatorStub(channel)

    async def _call_at(self, address: str, method: str, message: Message) -> Any:
        timeout = self._deadline_s(method, message)
        try:
            return await getattr(self._stub(address), method)(
                message, timeout=timeout, metadata=forwarded_principal_metadata(None)
            )
        except grpc.aio.AioRpcError as e:
            raise CoordinatorUnreachableError(
                f"{method} at {address}: {e.code().name} {e.details()}"
            ) from e

    async def call(self, group_id: str, method: str, message: Message) -> Any:
        found = self.requests.find_coordinator(
            pb.FindCoordinatorRequest(key_type=pb.COORDINATOR_TYPE_GROUP, keys=[group_id])
        ).coordinators[0]
        if found.error != ErrorCode.NONE:
            error = CoordinatorUnreachableError(found.error_message)
            error.code = found.error
            raise error
        return await self._call_at(f"{found.host}:{found.port}", method, message)

    async def call_every(self, method: str, message: Message) -> list[Any]:
        addresses = {
            f"{c.listeners[0].host}:{c.listeners[0].port}"
            for c in self._image().cluster.coordinators.values()
            if c.listeners
        }
        return list(
            await asyncio.gather(*(self._call_at(a, method, message) for a in sorted(addresses)))
        )

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
