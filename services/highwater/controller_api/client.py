"""``ControllerClient``: calls the active controller of a quorum, wherever it is, over gRPC.

Give it the controllers' addresses (``--controllers HOST:PORT,...``, any subset of the
voters). Each call goes to the controller that last answered, or else the next address
in turn; an answer of NOT_CONTROLLER that names the active controller's address sends
the call there, one without a hint (an election under way) to the next address after a
short backoff, and so does a controller that cannot be reached (``UNAVAILABLE``, a call
cut by a stopping server). A per-attempt timeout (``attempt_timeout_s``) at the controller
known to be active is retried there, after the backoff: a slow controller (a long commit
under load) is still the active one, and a standby would only answer NOT_CONTROLLER and
send the call back, a detour on every retry. A second timeout in a row there counts as
unreachable (a hung or cut-off process, which a connected channel does not reveal) and
the next address is asked, as after a timeout at any other address. It gives up with
:class:`ControllerUnavailableError` when ``timeout_s`` has passed. A caller that learns
where the controllers are now replaces the addresses (:meth:`ControllerClient.replace_bootstrap`).

A retried write may have been carried out by the controller that did not answer (it
crashed after committing): a retried CreateTopics can then answer TOPIC_ALREADY_EXISTS,
as a Kafka admin client's does. Requests and responses are the values of
:mod:`highwater.controller_api.messages`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Final, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from highwater.controller_api import codec
from highwater.controller_api import messages as m
from highwater.controller_api.codec import CONTROLLER_SERVICE_NAME, ControllerRpc
from highwater.errors import HighwaterError
from highwater.internal.v1 import controller_pb2
from highwater.rpc.channels import MAX_MESSAGE_BYTES, open_channel
from highwater.rpc.client_auth import ClientSecurity
from highwater.rpc.endpoints import parse_endpoint
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["ControllerClient", "ControllerUnavailableError"]

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")

_RETRIABLE: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    }
)


class ControllerUnavailableError(HighwaterError):
    """No active controller answered before the call's deadline."""

    code = ErrorCode.NOT_CONTROLLER


class ControllerClient:
    """Calls ``highwater.internal.v1.Controller`` on the active controller (see the module
    docstring).

    Use as ``async with ControllerClient(["h1:9093", "h2:9093"]) as client: ...`` or call
    :meth:`close`. Safe to share between tasks of one event loop.
    """

    def __init__(
        self,
        bootstrap: Sequence[str] | str,
        *,
        timeout_s: float = 30.0,
        attempt_timeout_s: float = 5.0,
        retry_backoff_ms: int = 50,
        max_retry_backoff_ms: int = 1000,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        security: ClientSecurity | None = None,
    ) -> None:
        """``security``: the channels' TLS and SASL (else the process's, ``rpc/client_auth.py``)."""
        addresses = (
            [a.strip() for a in bootstrap.split(",") if a.strip()]
            if isinstance(bootstrap, str)
            else list(bootstrap)
        )
        if not addresses:
            raise ValueError("a controller client needs at least one address")
        for address in addresses:
            parse_endpoint(address)
        self.bootstrap = tuple(addresses)
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self.retry_backoff_ms = retry_backoff_ms
        self.max_retry_backoff_ms = max_retry_backoff_ms
        self._max_message_bytes = max_message_bytes
        self._security = security
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._methods: dict[tuple[str, str], Any] = {}
        self._active: str | None = None
        self._next = 0

    @property
    def active_controller(self) -> str | None:
        """The address of the controller that answered last, if any."""
        return self._active

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._methods.clear()
        for channel in channels:
            await channel.close()

    # --- the RPCs --------------------------------------------------------------------------

    async def register_broker(
        self, request: m.RegisterBrokerRequest, *, timeout_s: float | None = None
    ) -> m.RegisterBrokerResponse:
        return await self.call(codec.REGISTER_BROKER, request, timeout_s=timeout_s)

    async def broker_heartbeat(
        self, request: m.BrokerHeartbeatRequest
    ) -> m.BrokerHeartbeatResponse:
        return await self.call(codec.BROKER_HEARTBEAT, request)

    async def unregister_broker(
        self, request: m.UnregisterBrokerRequest
    ) -> m.UnregisterBrokerResponse:
        return await self.call(codec.UNREGISTER_BROKER, request)

    async def alter_partition(self, request: m.AlterPartitionRequest) -> m.AlterPartitionResponse:
        return await self.call(codec.ALTER_PARTITION, request)

    async def create_topics(self, request: m.CreateTopicsRequest) -> m.CreateTopicsResponse:
        return await self.call(codec.CREATE_TOPICS, request)

    async def delete_topics(self, request: m.DeleteTopicsRequest) -> m.DeleteTopicsResponse:
        return await self.call(codec.DELETE_TOPICS, request)

    async def create_partitions(
        self, request: m.CreatePartitionsRequest
    ) -> m.CreatePartitionsResponse:
        return await self.call(codec.CREATE_PARTITIONS, request)

    async def elect_leaders(self, request: m.ElectLeadersRequest) -> m.ElectLeadersResponse:
        return await self.call(codec.ELECT_LEADERS, request)

    async def alter_partition_reassignments(
        self, request: m.AlterPartitionReassignmentsRequest
    ) -> m.AlterPartitionReassignmentsResponse:
        return await self.call(codec.ALTER_PARTITION_REASSIGNMENTS, request)

    async def list_partition_reassignments(
        self, request: m.ListPartitionReassignmentsRequest
    ) -> m.ListPartitionReassignmentsResponse:
        return await self.call(codec.LIST_PARTITION_REASSIGNMENTS, request)

    async def alter_configs(self, request: m.AlterConfigsRequest) -> m.AlterConfigsResponse:
        return await self.call(codec.ALTER_CONFIGS, request)

    async def describe_configs(
        self, request: m.DescribeConfigsRequest
    ) -> m.DescribeConfigsResponse:
        return await self.call(codec.DESCRIBE_CONFIGS, request)

    async def create_acls(self, request: m.CreateAclsRequest) -> m.CreateAclsResponse:
        return await self.call(codec.CREATE_ACLS, request)

    async def describe_acls(self, request: m.DescribeAclsRequest) -> m.DescribeAclsResponse:
        return await self.call(codec.DESCRIBE_ACLS, request)

    async def delete_acls(self, request: m.DeleteAclsRequest) -> m.DeleteAclsResponse:
        return await self.call(codec.DELETE_ACLS, request)

    async def alter_user_scram_credentials(
        self, request: m.AlterUserScramCredentialsRequest
    ) -> m.AlterUserScramCredentialsResponse:
        return await self.call(codec.ALTER_USER_SCRAM_CREDENTIALS, request)

    async def describe_user_scram_credentials(
        self, request: m.DescribeUserScramCredentialsRequest
    ) -> m.DescribeUserScramCredentialsResponse:
        return await self.call(codec.DESCRIBE_USER_SCRAM_CREDENTIALS, request)

    async def alter_client_quotas(
        self, request: m.AlterClientQuotasRequest
    ) -> m.AlterClientQuotasResponse:
        return await self.call(codec.ALTER_CLIENT_QUOTAS, request)

    async def describe_client_quotas(
        self, request: m.DescribeClientQuotasRequest
    ) -> m.DescribeClientQuotasResponse:
        return await self.call(codec.DESCRIBE_CLIENT_QUOTAS, request)

    async def allocate_producer_ids(
        self, request: m.AllocateProducerIdsRequest
    ) -> m.AllocateProducerIdsResponse:
        return await self.call(codec.ALLOCATE_PRODUCER_IDS, request)

    async def register_coordinator(
        self, request: m.RegisterCoordinatorRequest, *, timeout_s: float | None = None
    ) -> m.RegisterCoordinatorResponse:
        return await self.call(codec.REGISTER_COORDINATOR, request, timeout_s=timeout_s)

    async def coordinator_heartbeat(
        self, request: m.CoordinatorHeartbeatRequest
    ) -> m.CoordinatorHeartbeatResponse:
        return await self.call(codec.COORDINATOR_HEARTBEAT, request)

    async def unregister_coordinator(
        self, request: m.UnregisterCoordinatorRequest
    ) -> m.UnregisterCoordinatorResponse:
        return await self.call(codec.UNREGISTER_COORDINATOR, request)

    # --- the retry loop --------------------------------------------------------------------

    async def call(
        self,
        rpc: ControllerRpc[Req, Resp],
        request: Req,
        *,
        timeout_s: float | None = None,
        metadata: tuple[tuple[str, str | bytes], ...] | None = None,
    ) -> Resp:
        """Send ``request`` to the active controller, retrying as the module says;
        ``metadata`` goes with each attempt (a forwarded call's principal)."""
        wire = rpc.request_to_proto(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout_s if timeout_s is None else timeout_s)
        backoff_ms = self.retry_backoff_ms
        problems: list[str] = []
        redirected = False
        timed_out: str | None = None  # the active controller, after one attempt there timed out
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                tried = "; ".join(problems[-3:]) or "no attempt"
                raise ControllerUnavailableError(
                    f"{rpc.name}: no active controller answered in time ({tried})"
                )
            address = self._target()
            try:
                reply: Any = await self._method(address, rpc)(
                    wire, timeout=min(self.attempt_timeout_s, remaining), metadata=metadata
                )
            except grpc.aio.AioRpcError as e:
                status = e.code()
                if status not in _RETRIABLE:
                    raise
                problems.append(f"{address}: {status.name}")
                slow_active = (
                    status == grpc.StatusCode.DEADLINE_EXCEEDED
                    and address == self._active
                    and timed_out != address
                )
                timed_out = address if slow_active else None
                if not slow_active:
                    self._failed(address)
            else:
                if reply.error != ErrorCode.NOT_CONTROLLER:
                    self._active = address
                    return rpc.response_from_proto(reply)
                timed_out = None
                hint = reply.controller_address
                problems.append(f"{address}: NOT_CONTROLLER (active: {hint or 'unknown'})")
                if hint:
                    # The named controller (this one, if it is still taking office).
                    self._active = hint
                    if hint != address and not redirected:
                        redirected = True
                        continue  # a fresh hint: go there at once
                else:
                    self._failed(address)
            redirected = False
            await asyncio.sleep(min(backoff_ms, max(remaining, 0) * 1000) / 1000)
            backoff_ms = min(backoff_ms * 2, self.max_retry_backoff_ms)

    def replace_bootstrap(self, addresses: Sequence[str]) -> None:
        """Ask ``addresses`` from now on instead of the addresses given at construction
        (a caller that learns where the controllers are now, as an etcd-mode coordinator
        from the brokers' registrations); an empty list changes nothing. The controller
        that answered last is still asked first: if it went away, the next attempt moves
        on to the new addresses."""
        if not addresses:
            return
        for address in addresses:
            parse_endpoint(address)
        self.bootstrap = tuple(addresses)

    def open_broker_liveness(self) -> tuple[str, Any]:
        """Open a ``BrokerLiveness`` stream (controller.proto) to the controller believed
        active: its address and the call, to write ``BrokerLivenessRequest`` messages to
        and read ``BrokerLivenessResponse`` ones from. Report how it went with
        :meth:`liveness_answered`."""
        address = self._target()
        method = self._methods.get((address, "BrokerLiveness"))
        if method is None:
            method = self._channel(address).stream_stream(
                f"/{CONTROLLER_SERVICE_NAME}/BrokerLiveness",
                request_serializer=lambda message: message.SerializeToString(),
                response_deserializer=controller_pb2.BrokerLivenessResponse.FromString,
            )
            self._methods[(address, "BrokerLiveness")] = method
        return address, method()

    def liveness_answered(self, address: str, error: int | None, hint: str = "") -> None:
        """What a ``BrokerLiveness`` stream to ``address`` got: ``None`` if it could not
        be opened, NOT_CONTROLLER with the active controller's address (``hint``), or
        NONE (``address`` is the active controller)."""
        if error == ErrorCode.NONE:
            self._active = address
        elif error == ErrorCode.NOT_CONTROLLER and hint:
            self._active = hint
        else:
            self._failed(address)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_channel(
                address, max_message_bytes=self._max_message_bytes, security=self._security
            )
            self._channels[address] = channel
        return channel

    def _target(self) -> str:
        if self._active is not None:
            return self._active
        return self.bootstrap[self._next % len(self.bootstrap)]

    def _failed(self, address: str) -> None:
        """``address`` did not serve the call: try the next bootstrap address."""
        if self._active == address:
            self._active = None
        if self.bootstrap[self._next % len(self.bootstrap)] == address:
            self._next += 1

    def _method(self, address: str, rpc: ControllerRpc[Any, Any]) -> Any:
        key = (address, rpc.name)
        method = self._methods.get(key)
        if method is None:
            channel = self._channel(address)
            proto_response: type[Message] = rpc.proto_response
            method = channel.unary_unary(
                f"/{CONTROLLER_SERVICE_NAME}/{rpc.name}",
                request_serializer=lambda message: message.SerializeToString(),
                response_deserializer=proto_response.FromString,
            )
            self._methods[key] = method
        return method
