"""A broker's lifecycle with the controller (KIP-631): registration, heartbeats, controlled
shutdown, and the readiness it reports to its gRPC host.

The broker registers with the active controller under an incarnation id (one per
process); a previous incarnation that did not shut down cleanly holds the broker id until
its session expires, so registration is tried again until then, as Kafka's brokers do
(the broker epoch kept in the clean-shutdown marker lets a cleanly stopped broker back at
once). It then heartbeats every ``broker.heartbeat.interval.ms`` (more often while
fenced) with the offset of the metadata it has applied; the controller unfences it once
that has caught up. ``controlled_shutdown`` asks to go, and returns once the controller
has moved the broker's leaderships away.

Beside the heartbeats the broker holds a ``BrokerLiveness`` stream open to the active
controller (controller.proto): when the broker's process dies the kernel closes its
connection, the stream ends without the broker's word that it is leaving, and the
controller fences it at once instead of after ``broker.session.timeout.ms``. A broker
that stops on purpose says it is leaving first; one that is only slow or paused keeps
its connection and is judged by its session. The stream follows the active
controller: when a controller stops being active it ends the stream, and the broker
opens one to the next.

The broker also writes a message on the open stream every heartbeat interval, and the
controller counts each as contact when it arrives. A heartbeat is answered only once
everything the controller appended before it has committed, and the next heartbeat goes
only after that answer (an attempt cut at the client's 5 s deadline is retried, possibly
by way of another controller): with commits slower than the session (a loaded machine,
a quorum electing), heartbeats alone leave gaps longer than the session and a live
broker is fenced. The stream's messages wait for nothing. A paused broker writes none,
so it is still fenced once its session expires (a pause shorter than the session keeps
its leaderships).

Readiness: the Broker service is SERVING while this incarnation is registered, unfenced
and not shutting down in the metadata image; :data:`~highwater.broker.rolling.READY_SERVICE`
while it is also back in the ISR of every partition it replicates (the rolling-restart
gate, docs/kubernetes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

import grpc.aio

from highwater.broker.rolling import READY_SERVICE, broker_readiness
from highwater.broker.settings import BrokerSettings
from highwater.config.listeners import DEFAULT_LISTENER_NAME
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient, ControllerUnavailableError
from highwater.errors import HighwaterError
from highwater.internal.v1 import controller_pb2 as pb_internal
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import BrokerEndpoint
from highwater.rpc.endpoints import parse_endpoint
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["BROKER_SERVICE_NAME", "BrokerLifecycle", "ServingReport"]

log = logging.getLogger(__name__)

BROKER_SERVICE_NAME: Final = pb.DESCRIPTOR.services_by_name["Broker"].full_name

OfflineReport = Callable[[], tuple[list[str], list[m.OfflineReplica]]]
"""The failed log directories' ids and the replicas the broker cannot serve, for the
heartbeat (KIP-858)."""

ServingReport = Callable[[str, bool], None]
"""Says whether a gRPC service (by its full name) can serve: the host's health."""


class BrokerLifecycle:
    """Broker ``node_id``'s registration and session with the controller (see the module
    docstring). ``metadata_offset`` is the offset of the metadata image the broker applied."""

    def __init__(
        self,
        *,
        node_id: int,
        advertised: str,
        settings: BrokerSettings,
        listeners: Sequence[BrokerEndpoint] = (),
        controller: ControllerClient,
        metadata_offset: Callable[[], int],
        report_serving: ServingReport | None = None,
        offline_report: OfflineReport | None = None,
    ) -> None:
        self.node_id = node_id
        self.advertised = advertised
        self.listeners = tuple(listeners)
        """What the broker registers: every advertised listener, the inter-broker one
        first; empty: ``advertised`` as the one listener ``PLAINTEXT``."""
        self.settings = settings
        self.controller = controller
        self._metadata_offset = metadata_offset
        self._report_serving = report_serving
        self.incarnation_id = str(uuid.uuid4())
        self.broker_epoch = -1
        """The epoch of this incarnation's registration; -1 before it registered."""
        self.is_fenced = True
        self.stopping = False
        """Set when the broker stops: it reports NOT_SERVING and starts no more work."""
        self._heartbeats: asyncio.Task[None] | None = None
        self._liveness: asyncio.Task[None] | None = None
        self._liveness_call: Any = None
        self._liveness_writes = asyncio.Lock()
        """One write at a time on the liveness stream (the pings and the leaving word)."""
        self._leaving = False
        self._offline_report = offline_report
        self._wake = asyncio.Event()
        self.extra_listeners: tuple[BrokerEndpoint, ...] = ()
        """Listeners registered after the broker's own (its Kafka listener)."""

    @property
    def is_registered(self) -> bool:
        return self.broker_epoch >= 0

    async def register(
        self, previous_broker_epoch: int = -1, *, log_dirs: Sequence[str] = ()
    ) -> int:
        """Register this incarnation; the broker epoch.
        ``previous_broker_epoch``: the one the clean-shutdown marker kept, or -1;
        ``log_dirs``: the ids of the online log directories (KIP-858).

        Tried for ``initial.broker.registration.timeout.ms`` (controllers still electing a
        leader, a previous incarnation's session lasting), as Kafka's broker does at start;
        then :class:`~highwater.errors.HighwaterError` naming the setting."""
        host, port = parse_endpoint(self.advertised)
        request = m.RegisterBrokerRequest(
            broker_id=self.node_id,
            incarnation_id=self.incarnation_id,
            listeners=(
                *(self.listeners or (BrokerEndpoint(DEFAULT_LISTENER_NAME, host, port),)),
                *self.extra_listeners,
            ),
            rack=self.settings.rack,
            previous_broker_epoch=previous_broker_epoch,
            log_dirs=tuple(log_dirs),
        )
        waited = False
        timeout_ms = self.settings.initial_registration_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                reply = await self.controller.register_broker(
                    request, timeout_s=max(deadline - time.monotonic(), 0.001)
                )
            except ControllerUnavailableError as e:
                if waited:  # refused as a duplicate before: the last try ran out of time
                    raise self._session_not_expired(timeout_ms) from e
                raise HighwaterError(
                    f"broker {self.node_id} could not register with the controllers in "
                    f"{timeout_ms} ms (initial.broker.registration.timeout.ms): {e}"
                ) from e
            if reply.error == ErrorCode.NONE:
                self.broker_epoch = reply.broker_epoch
                return reply.broker_epoch
            if reply.error != ErrorCode.DUPLICATE_BROKER_REGISTRATION:
                raise HighwaterError(
                    f"broker {self.node_id} could not register: {reply.error_message}"
                )
            if time.monotonic() >= deadline:
                raise self._session_not_expired(timeout_ms)
            if not waited:
                log.info(
                    "broker %d: the previous incarnation's session has not expired yet; "
                    "registering again until it has",
                    self.node_id,
                )
                waited = True
            await asyncio.sleep(self.settings.registration_retry_backoff_ms / 1000)

    def _session_not_expired(self, timeout_ms: int) -> HighwaterError:
        """Why registration gave up after the controller refused it as a duplicate: named
        even when the last try ran out of time instead of being refused again."""
        return HighwaterError(
            f"broker {self.node_id} could not register in {timeout_ms} ms "
            "(initial.broker.registration.timeout.ms): the previous incarnation's "
            "session has not expired"
        )

    async def wait_unfenced(self, timeout_s: float = 30) -> None:
        async with asyncio.timeout(timeout_s):
            while self.is_fenced:
                await asyncio.sleep(0.02)

    async def controlled_shutdown(self) -> None:
        """Ask to shut down, heartbeat until the controller lets the broker go (its
        leaderships moved away), at most ``controlled_shutdown_timeout_ms``; a controller
        that cannot be reached does not hold the broker. Nothing to do if it never
        registered."""
        if self._heartbeats is None:
            return
        with contextlib.suppress(HighwaterError, asyncio.TimeoutError, grpc.aio.AioRpcError):
            async with asyncio.timeout(self.settings.controlled_shutdown_timeout_ms / 1000):
                while True:
                    reply = await self.controller.broker_heartbeat(
                        m.BrokerHeartbeatRequest(
                            self.node_id,
                            self.broker_epoch,
                            self._metadata_offset(),
                            want_shutdown=True,
                        )
                    )
                    if reply.should_shut_down or reply.error != ErrorCode.NONE:
                        return
                    await asyncio.sleep(self.settings.fenced_heartbeat_interval_ms / 1000)

    def start_heartbeats(self) -> None:
        """Heartbeat every ``broker.heartbeat.interval.ms`` (the fenced interval while
        fenced), and hold the liveness stream open, until :meth:`stop_heartbeats`."""
        if self._heartbeats is None:
            self._heartbeats = asyncio.create_task(self._heartbeat_forever())
        if self._liveness is None:
            self._liveness = asyncio.create_task(self._liveness_forever())

    async def stop_heartbeats(self) -> None:
        """Stop heartbeating; tell the controller on the liveness stream that this broker
        leaves on purpose (so it is not fenced as a dead one), then close it."""
        if self._liveness is not None:
            self._leaving = True
            call = self._liveness_call
            if call is not None:
                # Said and half-closed; the controller then ends the call, and the
                # stream's task returns (cancelling the call first would look like a
                # dead broker to the controller).
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1), self._liveness_writes:
                        await call.write(
                            pb_internal.BrokerLivenessRequest(
                                broker_id=self.node_id,
                                broker_epoch=self.broker_epoch,
                                leaving=True,
                            )
                        )
                        await call.done_writing()
                        await asyncio.shield(self._liveness)
            self._liveness.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._liveness
            self._liveness = None
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
            self._heartbeats = None

    async def _liveness_forever(self) -> None:
        """Keep a ``BrokerLiveness`` stream open to the active controller (see the module
        docstring); open the next one when it ends."""
        backoff_s = self.settings.fenced_heartbeat_interval_ms / 1000
        while not self._leaving:
            address, call = self.controller.open_broker_liveness()
            self._liveness_call = call
            error: int | None = None
            try:
                await call.write(
                    pb_internal.BrokerLivenessRequest(
                        broker_id=self.node_id, broker_epoch=self.broker_epoch
                    )
                )
                reply = await call.read()
                if reply is not grpc.aio.EOF:
                    error = reply.error
                    self.controller.liveness_answered(
                        address, reply.error, reply.controller_address
                    )
                    if reply.error == ErrorCode.NONE:
                        # Held open until that controller steps down; pinged meanwhile.
                        pings = asyncio.create_task(self._ping_liveness(call))
                        try:
                            await call.read()
                        finally:
                            pings.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await pings
                        if self._leaving:
                            return
                        continue
                    if reply.error == ErrorCode.NOT_CONTROLLER and reply.controller_address not in (
                        "",
                        address,
                    ):
                        continue  # there at once
                else:
                    self.controller.liveness_answered(address, None)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError) as e:
                log.debug("broker %d: liveness stream to %s: %s", self.node_id, address, e)
                self.controller.liveness_answered(address, None)
            finally:
                self._liveness_call = None
                call.cancel()
            if error == ErrorCode.STALE_BROKER_EPOCH:
                log.debug("broker %d: liveness stream refused: stale epoch", self.node_id)
            await asyncio.sleep(backoff_s)

    async def _ping_liveness(self, call: Any) -> None:
        """Write a message on the open liveness stream every heartbeat interval: contact
        the controller counts on arrival (the module docstring). Ends with the stream."""
        ping = pb_internal.BrokerLivenessRequest(
            broker_id=self.node_id, broker_epoch=self.broker_epoch
        )
        interval_s = self.settings.heartbeat_interval_ms / 1000
        while not self._leaving:
            await asyncio.sleep(interval_s)
            async with self._liveness_writes:
                if self._leaving:
                    return
                try:
                    await call.write(ping)
                except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                    return  # the stream ended: _liveness_forever opens the next one

    def heartbeat_now(self) -> None:
        """Send the next heartbeat without waiting for the interval (a log directory
        failed: the controller should move leadership off its partitions at once)."""
        self._wake.set()

    def _heartbeat_request(self) -> m.BrokerHeartbeatRequest:
        offline_dirs, offline_replicas = (
            self._offline_report() if self._offline_report is not None else ([], [])
        )
        return m.BrokerHeartbeatRequest(
            self.node_id,
            self.broker_epoch,
            self._metadata_offset(),
            offline_log_dirs=tuple(offline_dirs),
            offline_replicas=tuple(offline_replicas),
        )

    async def _heartbeat_forever(self) -> None:
        while True:
            self._wake.clear()
            sent = time.monotonic()
            try:
                reply = await self.controller.broker_heartbeat(self._heartbeat_request())
                if reply.error == ErrorCode.NONE:
                    self.is_fenced = reply.is_fenced
            except HighwaterError as e:
                log.warning("broker %d: heartbeat failed: %s", self.node_id, e)
            waited_s = time.monotonic() - sent
            if waited_s * 1000 >= self.settings.heartbeat_interval_ms:
                # The next heartbeat waits for this answer: the controller heard nothing
                # else from this broker meanwhile (a slow commit, or this loop blocked).
                log.warning(
                    "broker %d: a heartbeat took %.1f s to be answered", self.node_id, waited_s
                )
            interval_ms = (
                self.settings.fenced_heartbeat_interval_ms
                if self.is_fenced
                else self.settings.heartbeat_interval_ms
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval_ms / 1000)

    def report_readiness(self, image: MetadataImage) -> None:
        """Health, as the module docstring says: before it registered, a broker's answers
        would be NOT_LEADER_OR_FOLLOWER and its topic creations INVALID_REPLICATION_FACTOR."""
        report = self._report_serving
        if report is None:
            return
        registration = image.broker(self.node_id)
        serving = (
            self.is_registered
            and not self.stopping
            and registration is not None
            and registration.broker_epoch == self.broker_epoch
            and registration.is_active
        )
        report(BROKER_SERVICE_NAME, serving)
        report(READY_SERVICE, serving and broker_readiness(image, self.node_id).allowed)
