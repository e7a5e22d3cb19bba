"""Every call's principal, and the ACL checks of every call: the server side of security.

One server interceptor (:class:`AuthInterceptor`, on every server :func:`new_server`
makes) gives each call its principal before the servicer runs:

1. a call carrying a session token (metadata ``highwater-session``, from the
   ``Authenticate`` call of this process) is the token's principal; an invalid, expired or
   forged token is ``UNAUTHENTICATED``, whatever else the call carries. The token comes
   first so that SASL over mutual TLS (Kafka's ``SASL_SSL``) is the SASL user's;
2. else a verified client certificate: ``User:<CN>`` by ``ssl.principal.mapping.rules``;
3. else ``User:ANONYMOUS``.

A call a broker forwards to the controller (an admin call, KIP-590) also carries the
original caller's principal (metadata ``highwater-forwarded-principal``); the controller
takes it only from a caller allowed ``CLUSTER_ACTION`` on the cluster and refuses it from
anyone else (``PERMISSION_DENIED``), and only on the calls a broker forwards (the admin
calls, the group calls: ``rpc_access.FORWARDABLE``); on any other it refuses the call.

With the authorizer on (``--authorizer acl`` or ``--super-users``), the interceptor then
applies the table of ``security/rpc_access.py``: the whole-call checks (``OnCluster``)
there (for a stream, again on each request it reads), refused with
``CLUSTER_AUTHORIZATION_FAILED`` in the answer's ``error`` where the answer has one (the
Broker, Controller and GroupCoordinator calls), else with the status
``PERMISSION_DENIED`` (the Raft service, streams); the per-item checks in the servicers,
through :func:`authorize`, which answer a refused item with its typed error. Every refusal is
logged, once per principal, operation and resource every :data:`REFUSAL_LOG_INTERVAL_S`.

:func:`principal_of` is the one way to ask a call's principal (the servicers, quotas).
A listener that is not gRPC's (the Kafka listener) identifies its connections itself and
runs each request with :func:`serve_as` its connection's principal, so the same checks
(:func:`authorize`, the broker's and coordinator's ``authorization`` modules, forwarded
calls) see it.
The process's settings are set once at start (:func:`configure`), and each role tells
this module where its metadata image is (:func:`follow_image`): the ACLs and SCRAM
credentials are read from it at each call, so an ACL change applies at the next call
after the image has it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import grpc
import grpc.aio
from cryptography import x509
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message

from highwater.errors import SaslAuthenticationError
from highwater.rpc.method_wrapping import MethodWrappingInterceptor
from highwater.security.acl import AclOperation, ResourceType
from highwater.security.authentication import (
    ANONYMOUS,
    SESSION_EXPIRED,
    SESSION_METADATA_KEY,
    AuthenticationSettings,
    Authenticator,
)
from highwater.security.authorizer import AclAuthorizer, Decision
from highwater.security.node_identities import NodeIdentities
from highwater.security.principal import SslPrincipalMapper
from highwater.security.rpc_access import CLUSTER_NAME, FORWARDABLE, OnCluster, access_of
from highwater.security.scram import ScramCredential
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "FORWARDED_PRINCIPAL_BIN_KEY",
    "FORWARDED_PRINCIPAL_KEY",
    "AuthInterceptor",
    "CallPrincipal",
    "ServerSecurity",
    "authenticator",
    "authorize",
    "authorizer_enabled",
    "certificate_principal",
    "configure",
    "current_authorizer",
    "follow_image",
    "forwarded_principal_metadata",
    "node_identities",
    "principal_of",
    "serve_as",
    "server_security",
]

log = logging.getLogger(__name__)

FORWARDED_PRINCIPAL_KEY: Final = "highwater-forwarded-principal"
FORWARDED_PRINCIPAL_BIN_KEY: Final = "highwater-forwarded-principal-bin"
"""The same, UTF-8, for a principal gRPC's text metadata cannot carry (printable ASCII
only): a SCRAM user's or a token subject's name may be any Unicode."""
REFUSAL_LOG_INTERVAL_S: Final = 10.0


class _AclsView(Protocol):
    def authorizer(
        self, super_users: Iterable[str] = (), *, allow_everyone_if_no_acl_found: bool = False
    ) -> AclAuthorizer: ...


class _ScramView(Protocol):
    def credential(self, user: str, mechanism: str) -> ScramCredential | None: ...


class _RegistrationView(Protocol):
    @property
    def principal(self) -> str: ...


class SecurityImage(Protocol):
    """What this module reads of a metadata image."""

    @property
    def acls(self) -> _AclsView: ...

    @property
    def scram(self) -> _ScramView: ...

    def broker(self, broker_id: int) -> _RegistrationView | None: ...


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """A process's authentication and authorization settings (docs/security.md)."""

    authentication: AuthenticationSettings = field(default_factory=AuthenticationSettings)
    authorizer: str = "none"
    """``authorizer.class.name``: ``acl`` or ``none``."""
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False
    principal_mapping_rules: str = "DEFAULT"

    def __post_init__(self) -> None:
        if self.authorizer not in ("acl", "none"):
            raise ValueError(f"authorizer.class.name={self.authorizer}: acl or none")
        for user in self.super_users:
            if ":" not in user:
                raise ValueError(f"super.users: {user!r} is not TYPE:NAME, e.g. User:admin")

    @property
    def authorizer_on(self) -> bool:
        """Giving super users or ``acl`` turns the ACL checks on."""
        return self.authorizer == "acl" or bool(self.super_users)

    @staticmethod
    def parse_super_users(text: str) -> frozenset[str]:
        """Kafka's ``super.users``: ``User:a;User:b``."""
        return frozenset(user.strip() for user in text.split(";") if user.strip())


@dataclass(frozen=True, slots=True)
class CallPrincipal:
    """Who makes a call: ``principal`` (the forwarded one for a forwarded admin call),
    the peer's ``host``, and ``authenticated_by`` (``certificate``, a SASL mechanism, or
    ``none``)."""

    principal: str
    host: str
    authenticated_by: str = "none"
    session_expires_at_s: float | None = None
    """When the SASL session the call came with expires (wall-clock seconds); ``None``
    without one (a certificate's or an anonymous call)."""


class _Process:
    """The process's security state (one per process, as the TLS settings)."""

    def __init__(self, settings: ServerSecurity) -> None:
        self.settings = settings
        self.mapper = SslPrincipalMapper(settings.principal_mapping_rules)
        self.image: Callable[[], SecurityImage] | None = None
        self.authenticator = Authenticator(settings.authentication, self._credential)
        self.nodes = NodeIdentities()
        self._certificates: dict[bytes, str] = {}
        self._logged: dict[tuple[str, str, str], float] = {}

    def _credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.image().scram.credential(user, mechanism) if self.image else None

    def node_owner(self, node_id: int) -> str | None:
        """The principal the metadata records as broker ``node_id``'s (``None``: none)."""
        if self.image is None:
            return None
        registration = self.image().broker(node_id)
        return registration.principal or None if registration is not None else None

    def authorizer(self) -> AclAuthorizer | None:
        if not self.settings.authorizer_on:
            return None
        if self.image is None:  # no metadata yet: only super users
            return AclAuthorizer((), super_users=self.settings.super_users)
        return self.image().acls.authorizer(
            self.settings.super_users,
            allow_everyone_if_no_acl_found=self.settings.allow_everyone_if_no_acl_found,
        )

    def certificate_principal(self, pem: bytes) -> str:
        principal = self._certificates.get(pem)
        if principal is None:
            principal = self.mapper.principal(x509.load_pem_x509_certificate(pem))
            if len(self._certificates) > 1000:
                self._certificates.clear()
            self._certificates[pem] = principal
        return principal

    def log_refusal(self, call: CallPrincipal, operation: str, resource: str) -> None:
        key = (call.principal, operation, resource)
        now = time.monotonic()
        if now - self._logged.get(key, -REFUSAL_LOG_INTERVAL_S) < REFUSAL_LOG_INTERVAL_S:
            return
        if len(self._logged) > 10_000:
            self._logged.clear()
        self._logged[key] = now
        log.warning(
            "refused: principal %s from %s may not %s %s",
            call.principal,
            call.host,
            operation,
            resource,
        )


_process = _Process(ServerSecurity())
_call: contextvars.ContextVar[CallPrincipal | None] = contextvars.ContextVar(
    "highwater_call_principal", default=None
)


def configure(settings: ServerSecurity) -> None:
    """Set the process's security (the server flags); sessions issued before are void."""
    global _process
    image = _process.image
    _process = _Process(settings)
    _process.image = image


def server_security() -> ServerSecurity:
    return _process.settings


def follow_image(image: Callable[[], SecurityImage]) -> None:
    """Read ACLs and SCRAM credentials from ``image()`` (the role's current metadata)."""
    _process.image = image


def authorizer_enabled() -> bool:
    return _process.settings.authorizer_on


def current_authorizer() -> AclAuthorizer | None:
    """The process's authorizer over its current image (``None``: the authorizer is off)."""
    return _process.authorizer()


def authenticator() -> Authenticator:
    return _process.authenticator


def node_identities() -> NodeIdentities:
    return _process.nodes


def certificate_principal(pem: bytes) -> str:
    """The principal of a verified client certificate (PEM), by the process's
    ``ssl.principal.mapping.rules``; :class:`SaslAuthenticationError` if no rule applies."""
    return _process.certificate_principal(pem)


def serve_as(call: CallPrincipal) -> None:
    """Make ``call`` the principal of the task being run (and of the tasks it starts): a
    listener outside gRPC sets its connection's principal so on each request's task."""
    _call.set(call)


def _call_metadata(context: grpc.aio.ServicerContext) -> tuple[str | None, str | None]:
    """The call's session token and forwarded principal (metadata), in one pass."""
    token = forwarded = None
    for key, value in context.invocation_metadata() or ():
        if key == SESSION_METADATA_KEY:
            if token is None:
                token = value if isinstance(value, str) else value.decode()
        elif key in (FORWARDED_PRINCIPAL_KEY, FORWARDED_PRINCIPAL_BIN_KEY) and forwarded is None:
            forwarded = value if isinstance(value, str) else value.decode("utf-8", "replace")
    return token, forwarded


def peer_host(context: grpc.aio.ServicerContext) -> str:
    """The peer's address without its port (``ipv4:1.2.3.4:5`` -> ``1.2.3.4``)."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return rest or peer


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, *, kafka_error: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.kafka_error = kafka_error
        """The Kafka error code to answer with, where the answer has an ``error`` field."""


_ANSWER_TYPES: dict[str, type[Message] | None] = {}


def _error_answer(method: str, refusal: _Refused) -> Message | None:
    """The answer of ``method`` that carries ``refusal``'s Kafka error, if the call is
    unary and its answer has an ``error`` field (not the Raft service's: its nodes read
    their error codes as protocol)."""
    if not refusal.kafka_error:
        return None
    if method not in _ANSWER_TYPES:
        service, _, name = method.lstrip("/").rpartition("/")
        answer_type: type[Message] | None = None
        try:
            descriptor = descriptor_pool.Default().FindServiceByName(service)
            rpc = descriptor.FindMethodByName(name)
        except KeyError:
            rpc = None
        if (
            rpc is not None
            and service != "highwater.internal.v1.Raft"
            and not rpc.client_streaming
            and not rpc.server_streaming
            and "error" in rpc.output_type.fields_by_name
        ):
            answer_type = message_factory.GetMessageClass(rpc.output_type)
        _ANSWER_TYPES[method] = answer_type
    answer_type = _ANSWER_TYPES[method]
    if answer_type is None:
        return None
    answer = answer_type(error=refusal.kafka_error)
    if "error_message" in answer.DESCRIPTOR.fields_by_name:
        answer.error_message = str(refusal)  # type: ignore[attr-defined]
    return answer


def _identify(context: grpc.aio.ServicerContext, token: str | None) -> CallPrincipal:
    """The caller (steps 1-3 of the module docstring; ``token``: the call's session
    token); :class:`_Refused` if it cannot be."""
    process = _process
    host = peer_host(context)
    if token is not None:
        try:
            session = process.authenticator.session(token, time.time())
        except SaslAuthenticationError as e:
            raise _Refused(
                grpc.StatusCode.UNAUTHENTICATED, f"SASL_AUTHENTICATION_FAILED: {e}"
            ) from None
        return CallPrincipal(
            session.principal, host, session.mechanism, session_expires_at_s=session.expires_at_s
        )
    pems = (context.auth_context() or {}).get("x509_pem_cert")
    if pems:
        try:
            return CallPrincipal(process.certificate_principal(pems[0]), host, "certificate")
        except (SaslAuthenticationError, ValueError) as e:
            raise _Refused(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None
    return CallPrincipal(ANONYMOUS, host)


def _may_forward(authorizer: AclAuthorizer, direct: CallPrincipal) -> bool:
    """Whether ``direct`` may speak for another principal: a super user, or allowed
    CLUSTER_ACTION on the cluster by an ACL. ``allow.everyone.if.no.acl.found`` does not
    count here: with no ACL on the cluster it allows CLUSTER_ACTION to every caller, and
    any client could then forward a call as a super user. Kafka takes a forwarded request
    (an Envelope) only on its brokers' privileged listener besides CLUSTER_ACTION; a
    Highwater server has one listener for everyone, so the grant must be explicit."""
    if direct.principal in authorizer.super_users:
        return True
    return authorizer.matching(ResourceType.CLUSTER, CLUSTER_NAME) != [] and (
        authorizer.authorize(
            direct.principal,
            direct.host,
            AclOperation.CLUSTER_ACTION,
            ResourceType.CLUSTER,
            CLUSTER_NAME,
        )
        is Decision.ALLOWED
    )


def _forwarded(direct: CallPrincipal, forwarded: str | None, method: str | None) -> CallPrincipal:
    """The caller ``direct``, or the principal it forwards (``forwarded``: the call's
    forwarded-principal metadata) if it may forward calls and ``method`` is one a broker
    forwards (``FORWARDABLE``; ``None``: not known, no interceptor ran)."""
    if forwarded is None:
        return direct
    if method is not None and method not in FORWARDABLE:
        _process.log_refusal(direct, "forward", method)
        raise _Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"CLUSTER_AUTHORIZATION_FAILED: {method} is not a call a broker forwards "
            f"in another principal's name ({direct.principal})",
            kafka_error=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        )
    authorizer = _process.authorizer()
    if authorizer is None:
        # Nothing is checked; still, only a service (a certificate) may speak for another.
        if direct.authenticated_by != "certificate":
            return direct
    elif not _may_forward(authorizer, direct):
        _process.log_refusal(direct, "CLUSTER_ACTION (forward a call)", "Cluster:kafka-cluster")
        raise _Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"CLUSTER_AUTHORIZATION_FAILED: {direct.principal} may not forward calls",
        )
    host, _, principal = forwarded.partition("|")
    return CallPrincipal(principal or host, host if principal else direct.host, "forwarded")


def _admit(context: grpc.aio.ServicerContext, method: str) -> CallPrincipal:
    """Identify the caller and apply the whole-call checks; :class:`_Refused` if refused."""
    token, forwarded = _call_metadata(context)
    call = _forwarded(_identify(context, token), forwarded, method)
    _call.set(call)
    authorizer = _process.authorizer()
    if authorizer is None:
        return call
    access = access_of(method)
    if access is None:
        _process.log_refusal(call, "call", method)
        raise _Refused(grpc.StatusCode.PERMISSION_DENIED, f"{method} is not open to callers")
    if isinstance(access, OnCluster):
        _check_on_cluster(authorizer, call, access, method)
    return call


def _check_on_cluster(
    authorizer: AclAuthorizer, call: CallPrincipal, access: OnCluster, method: str
) -> None:
    """A whole-call check (:class:`OnCluster`); :class:`_Refused` if refused."""
    decision = authorizer.authorize(
        call.principal, call.host, access.operation, ResourceType.CLUSTER, CLUSTER_NAME
    )
    if decision is not Decision.ALLOWED and access.or_operation is not None:
        decision = authorizer.authorize(
            call.principal, call.host, access.or_operation, ResourceType.CLUSTER, CLUSTER_NAME
        )
    if decision is not Decision.ALLOWED:
        _process.log_refusal(call, access.operation.name, f"Cluster:{CLUSTER_NAME} ({method})")
        raise _Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"CLUSTER_AUTHORIZATION_FAILED: {call.principal} may not "
            f"{access.operation.name} on the cluster ({method})",
            kafka_error=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        )


async def _checked_each(
    requests: Any, call: CallPrincipal, access: OnCluster, method: str
) -> AsyncIterator[Any]:
    """The requests of a stream checked whole, each checked again as it is read, against
    the image of that moment: Kafka checks every request (a follower's every Fetch), so an
    ACL removed while the stream is open refuses its next request, which the servicer
    never sees (:class:`_Refused` ends the call)."""
    async for request in requests:
        authorizer = _process.authorizer()
        if authorizer is not None:
            _check_on_cluster(authorizer, call, access, method)
        yield request


def principal_of(context: grpc.aio.ServicerContext | None = None) -> CallPrincipal:
    """The principal of the call being served (the interceptor's answer; computed from
    ``context`` where no interceptor ran, ``User:ANONYMOUS`` outside any call)."""
    call = _call.get()
    if call is not None:
        return call
    if context is None:
        return CallPrincipal(ANONYMOUS, "")
    token, forwarded = _call_metadata(context)
    try:
        return _forwarded(_identify(context, token), forwarded, None)
    except _Refused:
        return CallPrincipal(ANONYMOUS, peer_host(context))


def authorize(
    context: grpc.aio.ServicerContext | None,
    operation: AclOperation,
    resource_type: ResourceType,
    resource_name: str,
    *,
    log_if_denied: bool = True,
) -> bool:
    """May the caller do ``operation`` to the resource? Always yes with the authorizer off;
    a refusal is logged (rate-limited) unless ``log_if_denied`` is false: listings that
    leave out what the caller may not see (every topic of a Metadata request, ListGroups)
    are not refusals, as in Kafka's ``logIfDenied = false``."""
    authorizer = _process.authorizer()
    if authorizer is None:
        return True
    call = principal_of(context)
    decision = authorizer.authorize(
        call.principal, call.host, operation, resource_type, resource_name
    )
    if decision is Decision.ALLOWED:
        return True
    if log_if_denied:
        _process.log_refusal(call, operation.name, f"{resource_type.name.title()}:{resource_name}")
    return False


def may_speak_for_node(context: grpc.aio.ServicerContext | None, node_id: int) -> bool:
    """Whether the caller may act as broker ``node_id`` (``security/node_identities.py``)."""
    authorizer = _process.authorizer()
    if authorizer is None:
        return True
    call = principal_of(context)
    # The principal of the node's registration in the metadata speaks for it, on every
    # controller and broker, after failovers and restarts. Before a registration is in
    # the metadata (or one made with the checks off), the first principal to speak for
    # the node on this process does. A super user's word records it too, so that no one
    # else may speak for that node afterwards; a super user itself is never refused.
    owner = _process.node_owner(node_id)
    if owner is not None:
        if owner == call.principal:
            return True
    elif _process.nodes.claim(node_id, call.principal):
        return True
    if call.principal in _process.settings.super_users:
        return True
    _process.log_refusal(call, "act as", f"node {node_id}")
    return False


def forwarded_principal_metadata(
    context: grpc.aio.ServicerContext | None,
) -> tuple[tuple[str, str | bytes], ...]:
    """The metadata that carries the caller's principal on a forwarded call (the binary
    key when the principal is not printable ASCII)."""
    call = principal_of(context)
    value = f"{call.host}|{call.principal}"
    if value.isascii() and value.isprintable():
        return ((FORWARDED_PRINCIPAL_KEY, value),)
    return ((FORWARDED_PRINCIPAL_BIN_KEY, value.encode()),)


class AuthInterceptor(MethodWrappingInterceptor):
    """Identifies and admits every call (see the module docstring). The wrapping of each
    method is made once (:class:`~highwater.rpc.method_wrapping.MethodWrappingInterceptor`);
    the identity and ACL checks run inside it, on every call, against the image of that
    moment."""

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        return _admitting(method, handler)


def _admitting(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with every call of ``method`` identified and admitted first."""
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _unary(method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _streaming(method, handler.unary_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _unary(method, handler.stream_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.stream_stream_rpc_method_handler(
        _streaming(method, handler.stream_stream),
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _unary(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            _admit(context, method)
        except _Refused as e:
            answer = _error_answer(method, e)
            if answer is not None:
                return answer
            await context.abort(e.code, str(e))
        return await behavior(request, context)

    return call


def _streaming(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    access = access_of(method)

    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            caller = _admit(context, method)
        except _Refused as e:
            await context.abort(e.code, str(e))
        if (
            isinstance(access, OnCluster)
            and hasattr(request, "__aiter__")
            and _process.authorizer() is not None
        ):
            request = _checked_each(request, caller, access, method)
        try:
            if caller.session_expires_at_s is not None:
                async for answer in _until_session_expires(
                    caller, method, behavior, request, context
                ):
                    yield answer
                return
            result = behavior(request, context)
            if hasattr(result, "__aiter__"):
                async for answer in result:
                    yield answer
            else:
                await result
        except _Refused as e:  # a request of the stream, refused as it was read
            await context.abort(e.code, str(e))

    return call


SESSION_DRAIN_S: Final = 30.0
"""How long a stream whose session expired may take to answer the requests it had read
(a produce waiting for the ISR, a fetch's long poll) before it is cut."""


async def _until_session_expires(
    caller: CallPrincipal,
    method: str,
    behavior: Callable[..., Any],
    request: Any,
    context: grpc.aio.ServicerContext,
) -> AsyncIterator[Any]:
    """A streaming call that lasts no longer than its SASL session (KIP-368: Kafka closes
    a connection whose session lifetime passed without re-authentication).

    At the session's expiry the servicer reads no further request (its request iterator
    ends, as when the client half-closes), answers those it had read, and the call then
    ends ``UNAUTHENTICATED`` with :data:`SESSION_EXPIRED`; so a request the client wrote
    is either answered or was never read, and the client may send the unanswered ones
    again on a new call, with a new session. A servicer still busy
    :data:`SESSION_DRAIN_S` after the expiry is cut there."""
    assert caller.session_expires_at_s is not None
    loop = asyncio.get_running_loop()
    expires_at = loop.time() + (caller.session_expires_at_s - time.time())
    requests: _RequestsUntil | None = None
    if hasattr(request, "__aiter__"):
        request = requests = _RequestsUntil(request, expires_at)
    result = behavior(request, context)
    cut_at = expires_at + SESSION_DRAIN_S if requests is not None else expires_at
    cut = False
    if hasattr(result, "__aiter__"):
        answers = aiter(result)
        while True:
            try:
                async with asyncio.timeout_at(cut_at):
                    answer = await anext(answers)
            except StopAsyncIteration:
                break
            except TimeoutError:
                cut = True
                break
            yield answer
    else:
        try:
            async with asyncio.timeout_at(cut_at):
                await result
        except TimeoutError:
            cut = True
    if cut or (requests is not None and requests.expired) or loop.time() >= expires_at:
        log.info(
            "ended %s of %s from %s: its session expired%s",
            method,
            caller.principal,
            caller.host,
            f" (cut after {SESSION_DRAIN_S:.0f} s)" if cut and requests is not None else "",
        )
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, SESSION_EXPIRED)


class _RequestsUntil:
    """A call's requests until ``deadline`` (loop time): then none more (the read under
    way is left to the call's end)."""

    def __init__(self, requests: Any, deadline: float) -> None:
        self._requests = aiter(requests)
        self._deadline = deadline
        self._reading: asyncio.Task[tuple[bool, Any]] | None = None
        self.expired = False

    def __aiter__(self) -> _RequestsUntil:
        return self

    async def __anext__(self) -> Any:
        if self.expired:
            raise StopAsyncIteration
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._next())
        reading = self._reading
        remaining = self._deadline - asyncio.get_running_loop().time()
        try:
            done, _ = await asyncio.wait((reading,), timeout=max(remaining, 0.0))
        except asyncio.CancelledError:  # the servicer stopped reading: so does this
            reading.cancel()
            reading.add_done_callback(_ignore_outcome)
            raise
        if not done:
            self.expired = True
            reading.add_done_callback(_ignore_outcome)
            raise StopAsyncIteration
        self._reading = None
        more, item = reading.result()
        if not more:
            raise StopAsyncIteration
        return item

    async def _next(self) -> tuple[bool, Any]:
        try:
            return True, await anext(self._requests)
        except StopAsyncIteration:
            return False, None


def _ignore_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
