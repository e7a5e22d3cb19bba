"""Broker and coordinator membership (Kafka's ``ClusterControlManager``): registration and liveness.

Brokers register (fenced, with the offset of their record as broker epoch), heartbeat,
are unfenced once they have replayed the log up to their registration (and the moves
off their previous incarnation are written), may ask to be
fenced or to shut down, and are fenced when their session expires. Each step that
takes a broker out of service moves its leaderships and ISR memberships, the first
``leader_moves_per_batch`` in the same batch, the rest by the next ticks
(:meth:`ReplicationControl.move_away_from`); a broker coming back gets the
leaderless partitions it can lead.

Coordinators register (the offset of their record is the registration epoch),
heartbeat, and share the partitions of ``__consumer_offsets``
(:func:`~highwater.controller.coordinators.assign_coordinators`). A coordinator has no
fenced state: one that leaves (UnregisterCoordinator, a heartbeat with
``want_shutdown``) or is not heard from for ``coordinator.session.timeout.ms`` gets an
``UnregisterCoordinatorRecord``, and in the same batch its partitions go to the live
coordinators with their coordinator epochs one higher; it registers again to come back.
A partition moved off a *live* coordinator (balancing) is revoked first and assigned once
that coordinator's heartbeat reports a metadata offset at or past the revocation
(:mod:`~highwater.controller.coordinators`).
The controller creates ``__consumer_offsets`` once a coordinator is registered and a
broker is active, whichever comes last, and assigns its partitions in the same batch.
"""

from __future__ import annotations

import logging

from highwater.controller.config import ControllerConfig
from highwater.controller.coordinators import (
    assign_coordinators,
    offsets_topic_configs,
    revoked_from,
)
from highwater.controller.heartbeats import BrokerHeartbeatManager
from highwater.controller.replication_control import ReplicationControl
from highwater.controller.results import ControllerApiError, ControllerResult, refuse
from highwater.controller_api.messages import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    CoordinatorHeartbeatRequest,
    CoordinatorHeartbeatResponse,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
    RegisterCoordinatorRequest,
    RegisterCoordinatorResponse,
    UnregisterBrokerRequest,
    UnregisterBrokerResponse,
    UnregisterCoordinatorRequest,
    UnregisterCoordinatorResponse,
)
from highwater.errors import InvalidConfigError
from highwater.metadata.consumer_offsets import CONSUMER_OFFSETS_TOPIC
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import (
    MetadataImage,
    TopicIdPartition,
)
from highwater.metadata.placement import InvalidReplicationFactorError
from highwater.metadata.records import (
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    MetadataRecord,
    RegisterBrokerRecord,
    RegisterCoordinatorRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    UnregisterCoordinatorRecord,
)
from highwater.v1.common_pb2 import ErrorCode

__all__ = ["CONSUMER_OFFSETS_TOPIC", "ClusterControl"]

log = logging.getLogger(__name__)


class ClusterControl:
    """Membership decisions; keeps the broker and coordinator sessions (soft state)."""

    def __init__(
        self,
        config: ControllerConfig,
        heartbeats: BrokerHeartbeatManager,
        replication: ReplicationControl,
        coordinator_sessions: BrokerHeartbeatManager | None = None,
    ) -> None:
        self.config = config
        self.heartbeats = heartbeats
        self.replication = replication
        self.coordinator_sessions = (
            coordinator_sessions
            if coordinator_sessions is not None
            else BrokerHeartbeatManager(config.coordinator_session_timeout_ms)
        )
        self.revocations: dict[tuple[int, int], int] = {}
        """(partition, coordinator epoch of its revocation) -> a metadata offset at or
        past the revocation record: the partition's old owner has let it go once its
        heartbeat reports that offset. Soft state, noted from the image the first time
        this controller sees the revocation (:meth:`note_revocations`), so a controller
        that becomes active notes the revocations in flight anew."""

    def register_broker(
        self,
        image: MetadataImage,
        request: RegisterBrokerRequest,
        now_ms: int,
        *,
        principal: str = "",
    ) -> ControllerResult[RegisterBrokerResponse]:
        """Register a broker (or a new incarnation of it): fenced, with a new broker epoch.

        The epoch is the offset of the RegisterBrokerRecord, so it grows with every
        registration. A retry of the same registration gets the same epoch and no record.
        A new incarnation while the old one still has a session and did not shut down
        cleanly is a DUPLICATE_BROKER_REGISTRATION. The old incarnation's leaderships
        and ISR memberships (except as a last member) move off it, and without the
        clean-shutdown epoch its ELR memberships too: it may have lost records it had not
        flushed. They go ``leader_moves_per_batch`` partitions at a time, as a fence's:
        the first batch with the registration, the rest by the ticks that follow; the new
        incarnation is not unfenced before the last is written (it must not lead, or count
        as in sync, on the old one's behalf). The record says whether the shutdown was
        unclean (``unclean_shutdown``, kept in the image until the broker is unfenced), so
        that a controller that becomes active before the last batch finishes the ELR
        removals too (:meth:`ReplicationControl.resume_moves`). An incarnation that was
        never unfenced after an unclean shutdown passes that on to the next one, even a
        cleanly stopped one: its ELR removals may not be written yet.

        ``principal`` (the caller's, with the ACL checks on) goes into the record: every
        controller and broker then knows which principal speaks for the node id, across
        failovers and restarts (``security/node_identities.py``).
        """
        try:
            self._check_cluster_id(request.cluster_id)
            if request.broker_id < 0:
                raise refuse(ErrorCode.INVALID_REQUEST, f"Invalid broker id {request.broker_id}")
            if not request.incarnation_id:
                raise refuse(
                    ErrorCode.INVALID_REQUEST, "A broker registration needs an incarnation id"
                )
            existing = image.broker(request.broker_id)
            if existing is not None:
                same_incarnation = existing.incarnation_id == request.incarnation_id
                if (
                    same_incarnation
                    and existing.listeners == request.listeners
                    and existing.rack == request.rack
                    and existing.log_dirs == request.log_dirs
                    and existing.principal == principal
                ):
                    self.heartbeats.touch(request.broker_id, existing.broker_epoch, now_ms, -1)
                    return ControllerResult(
                        [], RegisterBrokerResponse(broker_epoch=existing.broker_epoch)
                    )
                clean = request.previous_broker_epoch == existing.broker_epoch
                if (
                    not same_incarnation
                    and not clean
                    and not existing.fenced
                    and self.heartbeats.has_valid_session(
                        request.broker_id, existing.broker_epoch, now_ms
                    )
                ):
                    raise refuse(
                        ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                        f"Another broker is registered with broker id {request.broker_id} "
                        f"(incarnation {existing.incarnation_id}) and its session has not "
                        "expired",
                    )
        except ControllerApiError as e:
            return ControllerResult([], RegisterBrokerResponse(e.code, e.message))
        epoch = image.offset + 1
        if existing is not None:
            epoch = max(epoch, existing.broker_epoch + 1)
        # Without the clean-shutdown epoch the broker may have lost what it had not
        # flushed. An incarnation that still owed those removals (never unfenced since its
        # own unclean registration) passes them on: a clean stop of it brought nothing back.
        unclean_shutdown = existing is not None and (
            request.previous_broker_epoch != existing.broker_epoch or existing.unclean_shutdown
        )
        register = RegisterBrokerRecord(
            broker_id=request.broker_id,
            incarnation_id=request.incarnation_id,
            broker_epoch=epoch,
            listeners=request.listeners,
            rack=request.rack,
            fenced=True,
            log_dirs=request.log_dirs,
            principal=principal,
            unclean_shutdown=unclean_shutdown,
        )
        delta = MetadataDelta(image)
        delta.replay(register)
        records: list[MetadataRecord] = [register]
        records.extend(
            self.replication.move_away_from(
                delta,
                request.broker_id,
                unclean_shutdown=unclean_shutdown,
                limit=self.config.leader_moves_per_batch,
                before_unfence=True,
            )
        )
        self.replication.forget_offline_replicas(request.broker_id)
        self.heartbeats.register(request.broker_id, epoch, now_ms)
        return ControllerResult(records, RegisterBrokerResponse(broker_epoch=epoch))

    def broker_heartbeat(
        self, image: MetadataImage, request: BrokerHeartbeatRequest, now_ms: int
    ) -> ControllerResult[BrokerHeartbeatResponse]:
        """Record liveness and move the broker through fenced, active, controlled shutdown."""
        broker = image.broker(request.broker_id)
        if broker is None:
            return ControllerResult(
                [],
                BrokerHeartbeatResponse(
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                    f"Broker {request.broker_id} is not registered",
                ),
            )
        if broker.broker_epoch != request.broker_epoch:
            return ControllerResult(
                [],
                BrokerHeartbeatResponse(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"Broker {request.broker_id} has epoch {broker.broker_epoch}, "
                    f"not {request.broker_epoch}",
                ),
            )
        broker_id = broker.broker_id
        self.heartbeats.touch(
            broker_id, broker.broker_epoch, now_ms, request.current_metadata_offset
        )
        caught_up = request.current_metadata_offset >= broker.broker_epoch
        records: list[MetadataRecord] = []
        delta = MetadataDelta(image)
        offline = frozenset(
            TopicIdPartition(r.topic_id, r.partition_id) for r in request.offline_replicas
        )
        known = self.replication.offline_replicas.get(broker_id, frozenset())
        if offline != known and request.offline_log_dirs:
            log.warning(
                "broker %d reports failed log directories %s (%d replicas offline)",
                broker_id,
                ", ".join(request.offline_log_dirs),
                len(offline),
            )
        # Every heartbeat: a failed log directory's replicas lose leadership and ISR
        # membership (records only for those that still have either).
        offline_records = self.replication.set_offline_replicas(delta, broker_id, offline)
        if offline_records:
            return ControllerResult(
                offline_records,
                BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=broker.fenced),
            )
        if broker.fenced:
            if request.want_shutdown:
                return ControllerResult(
                    [], BrokerHeartbeatResponse(is_caught_up=caught_up, should_shut_down=True)
                )
            if (
                request.want_fence
                or not caught_up
                or self.replication.unfence_waits_for_moves(broker_id, broker.broker_epoch)
            ):
                return ControllerResult([], BrokerHeartbeatResponse(is_caught_up=caught_up))
            unfence = UnfenceBrokerRecord(broker_id, broker.broker_epoch)
            delta.replay(unfence)
            records = [unfence, *self.replication.elect_for_unfenced(delta, broker_id)]
            # A coordinator waiting for a broker to host __consumer_offsets: now one can.
            records.extend(self.ensure_offsets_topic(delta))
            return ControllerResult(
                records, BrokerHeartbeatResponse(is_caught_up=True, is_fenced=False)
            )
        if broker.in_controlled_shutdown:
            # Controlled shutdown cannot be cancelled; it completes or the broker is fenced.
            done = self._controlled_shutdown_done(image, broker_id)
            return ControllerResult(
                [],
                BrokerHeartbeatResponse(
                    is_caught_up=caught_up, is_fenced=False, should_shut_down=done
                ),
            )
        if request.want_shutdown:
            change = BrokerRegistrationChangeRecord(
                broker_id, broker.broker_epoch, in_controlled_shutdown=True
            )
            delta.replay(change)
            records = [
                change,
                *self.replication.move_away_from(
                    delta, broker_id, limit=self.config.leader_moves_per_batch
                ),
            ]
            self.heartbeats.set_controlled_shutdown_offset(broker_id, image.offset + len(records))
            return ControllerResult(
                records, BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=False)
            )
        if request.want_fence:
            fence = FenceBrokerRecord(broker_id, broker.broker_epoch)
            delta.replay(fence)
            records = [
                fence,
                *self.replication.move_away_from(
                    delta, broker_id, limit=self.config.leader_moves_per_batch
                ),
            ]
            return ControllerResult(records, BrokerHeartbeatResponse(is_caught_up=caught_up))
        return ControllerResult(
            [], BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=False)
        )

    def unregister_broker(
        self, image: MetadataImage, request: UnregisterBrokerRequest
    ) -> ControllerResult[UnregisterBrokerResponse]:
        """Remove a broker's registration, which scaling the cluster down does: refused while
        the broker still holds replicas (they must be reassigned first, or the partitions
        would stay under-replicated); its leaderships and ISR memberships go first."""
        broker = image.broker(request.broker_id)
        if broker is None:
            return ControllerResult(
                [],
                UnregisterBrokerResponse(
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                    f"Broker {request.broker_id} is not registered",
                ),
            )
        held = image.replicas_of(broker.broker_id)
        if held:
            example = min(held)
            name = image.topic_name(example.topic_id) or example.topic_id
            return ControllerResult(
                [],
                UnregisterBrokerResponse(
                    ErrorCode.INVALID_REQUEST,
                    f"Broker {broker.broker_id} still holds replicas of {len(held)} partitions "
                    f"(e.g. {name}-{example.partition_id}): reassign them first "
                    "(highwater partitions reassign)",
                ),
            )
        delta = MetadataDelta(image)
        records: list[MetadataRecord] = []
        if not broker.fenced:
            fence = FenceBrokerRecord(broker.broker_id, broker.broker_epoch)
            delta.replay(fence)
            records.append(fence)
        records.extend(self.replication.move_away_from(delta, broker.broker_id))
        records.append(UnregisterBrokerRecord(broker.broker_id, broker.broker_epoch))
        self.heartbeats.remove(broker.broker_id)
        return ControllerResult(records, UnregisterBrokerResponse())

    def _check_cluster_id(self, cluster_id: str) -> None:
        if self.config.cluster_id and cluster_id and cluster_id != self.config.cluster_id:
            raise refuse(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"Expected cluster id {self.config.cluster_id}, got {cluster_id}",
            )

    def _controlled_shutdown_done(self, image: MetadataImage, broker_id: int) -> bool:
        if image.partitions_led_by(broker_id):
            return False
        session = self.heartbeats.session(broker_id)
        if session is None:
            return False
        if session.controlled_shutdown_offset is None:
            # Entered controlled shutdown under an earlier controller: its records are in.
            session.controlled_shutdown_offset = image.offset
        others = [b.broker_id for b in image.active_brokers() if b.broker_id != broker_id]
        lowest = self.heartbeats.lowest_active_offset(others)
        return lowest is None or lowest >= session.controlled_shutdown_offset

    # --- Coordinators ------------------------------------------------------------------

    def register_coordinator(
        self, image: MetadataImage, request: RegisterCoordinatorRequest, now_ms: int
    ) -> ControllerResult[RegisterCoordinatorResponse]:
        """Register a group coordinator (a fresh session) and rebalance the partitions of
        ``__consumer_offsets`` over the registered coordinators, creating the topic first
        if it is missing and brokers can host it. A new incarnation gets new coordinator
        epochs for the partitions it keeps; a retry of the same registration gets the same
        registration epoch and writes nothing new."""
        try:
            self._check_cluster_id(request.cluster_id)
            if request.coordinator_id < 0:
                raise refuse(
                    ErrorCode.INVALID_REQUEST, f"Invalid coordinator id {request.coordinator_id}"
                )
            if not request.incarnation_id:
                raise refuse(
                    ErrorCode.INVALID_REQUEST, "A coordinator registration needs an incarnation id"
                )
        except ControllerApiError as e:
            return ControllerResult([], RegisterCoordinatorResponse(e.code, e.message))
        delta = MetadataDelta(image)
        records: list[MetadataRecord] = []
        existing = image.coordinator(request.coordinator_id)
        restarted: set[int] = set()
        if (
            existing is not None
            and existing.incarnation_id == request.incarnation_id
            and existing.listeners == request.listeners
            and existing.rack == request.rack
        ):
            epoch = existing.registration_epoch
            self.coordinator_sessions.touch(request.coordinator_id, epoch, now_ms, -1)
        else:
            # The registration epoch is this record's offset: it comes first in the batch.
            epoch = image.offset + 1
            if existing is not None:
                epoch = max(epoch, existing.registration_epoch + 1)
                if existing.incarnation_id != request.incarnation_id:
                    restarted.add(request.coordinator_id)
            record = RegisterCoordinatorRecord(
                request.coordinator_id,
                request.incarnation_id,
                epoch,
                request.listeners,
                request.rack,
            )
            delta.replay(record)
            records.append(record)
            self.coordinator_sessions.register(request.coordinator_id, epoch, now_ms)
        records.extend(self._create_offsets_topic(delta))
        records.extend(self._coordinator_assignments(delta, restarted))
        return ControllerResult(records, RegisterCoordinatorResponse(registration_epoch=epoch))

    def coordinator_heartbeat(
        self, image: MetadataImage, request: CoordinatorHeartbeatRequest, now_ms: int
    ) -> ControllerResult[CoordinatorHeartbeatResponse]:
        """Keep a coordinator's session alive, or let it go (``want_shutdown``: it is
        unregistered and its partitions move in the same batch).

        A heartbeat of a registration that is gone (expired, unregistered, replaced by a
        newer one) is answered BROKER_ID_NOT_REGISTERED or STALE_BROKER_EPOCH with
        ``is_fenced``: the coordinator must register again. One that wants to shut down
        is told it may, and nothing is written.
        """
        coordinator = image.coordinator(request.coordinator_id)
        if coordinator is None or coordinator.registration_epoch != request.registration_epoch:
            if request.want_shutdown:
                return ControllerResult(
                    [], CoordinatorHeartbeatResponse(is_fenced=True, should_shut_down=True)
                )
            if coordinator is None:
                code = ErrorCode.BROKER_ID_NOT_REGISTERED
                message = f"Coordinator {request.coordinator_id} is not registered"
            else:
                code = ErrorCode.STALE_BROKER_EPOCH
                message = (
                    f"Coordinator {request.coordinator_id} has registration epoch "
                    f"{coordinator.registration_epoch}, not {request.registration_epoch}"
                )
            return ControllerResult([], CoordinatorHeartbeatResponse(code, message, True))
        if request.want_shutdown:
            records = self._unregister_coordinator(MetadataDelta(image), coordinator.coordinator_id)
            return ControllerResult(
                records, CoordinatorHeartbeatResponse(is_fenced=True, should_shut_down=True)
            )
        self.coordinator_sessions.touch(
            coordinator.coordinator_id,
            coordinator.registration_epoch,
            now_ms,
            request.metadata_offset,
        )
        # Partitions being taken from this coordinator that its image shows revoked (it
        # serves them no more) go to their next owners now.
        self.note_revocations(image)
        released = {
            partition_id
            for partition_id, epoch in revoked_from(
                coordinator.coordinator_id, image.coordinators.assignments
            ).items()
            if request.metadata_offset >= self.revocations[partition_id, epoch]
        }
        records = (
            self._coordinator_assignments(MetadataDelta(image), set(), released) if released else []
        )
        return ControllerResult(records, CoordinatorHeartbeatResponse(is_fenced=False))

    def note_revocations(self, image: MetadataImage) -> None:
        """Note an offset for each revocation in ``image`` not noted yet: ``image.offset``,
        at or past the revocation record since ``image`` has it (the exact offset is not in
        the image, and a bound a little late only delays the handover by a heartbeat).
        Forgets the revocations that are over."""
        self.revocations = {
            (partition_id, assignment.coordinator_epoch): self.revocations.get(
                (partition_id, assignment.coordinator_epoch), image.offset
            )
            for partition_id, assignment in image.coordinators.assignments.items()
            if assignment.revoked_from is not None
        }

    def unregister_coordinator(
        self, image: MetadataImage, request: UnregisterCoordinatorRequest
    ) -> ControllerResult[UnregisterCoordinatorResponse]:
        """Remove a coordinator (of the given registration epoch, if one is given); its
        partitions move to the others in the same batch."""
        existing = image.coordinator(request.coordinator_id)
        if existing is None:
            return ControllerResult(
                [],
                UnregisterCoordinatorResponse(
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                    f"Coordinator {request.coordinator_id} is not registered",
                ),
            )
        if (
            request.registration_epoch is not None
            and request.registration_epoch != existing.registration_epoch
        ):
            return ControllerResult(
                [],
                UnregisterCoordinatorResponse(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"Coordinator {request.coordinator_id} has registration epoch "
                    f"{existing.registration_epoch}, not {request.registration_epoch}",
                ),
            )
        records = self._unregister_coordinator(MetadataDelta(image), existing.coordinator_id)
        return ControllerResult(records, UnregisterCoordinatorResponse())

    def _unregister_coordinator(
        self, delta: MetadataDelta, coordinator_id: int
    ) -> list[MetadataRecord]:
        coordinator = delta.coordinator(coordinator_id)
        assert coordinator is not None
        record = UnregisterCoordinatorRecord(coordinator_id, coordinator.registration_epoch)
        delta.replay(record)
        self.coordinator_sessions.remove(coordinator_id)
        return [record, *self._coordinator_assignments(delta, set())]

    def expire_coordinators(
        self, delta: MetadataDelta, now_ms: int, records: list[MetadataRecord]
    ) -> list[int]:
        """Unregister every coordinator whose session expired and give its partitions to
        the live ones (with higher coordinator epochs), all in one batch; appends the
        records, returns the coordinators."""
        epochs = {c: r.registration_epoch for c, r in delta.coordinators().items()}
        expired = self.coordinator_sessions.expired_epochs(epochs, now_ms)
        for coordinator_id in expired:
            record = UnregisterCoordinatorRecord(coordinator_id, epochs[coordinator_id])
            delta.replay(record)
            records.append(record)
            self.coordinator_sessions.remove(coordinator_id)
        if expired:
            records.extend(self._coordinator_assignments(delta, set()))
        return expired

    def ensure_offsets_topic(self, delta: MetadataDelta) -> list[MetadataRecord]:
        """Create ``__consumer_offsets`` and assign its partitions, if a coordinator is
        registered, the topic is missing and a broker is active (replayed on ``delta``)."""
        records = self._create_offsets_topic(delta)
        if records:
            records.extend(self._coordinator_assignments(delta, set()))
        return records

    def reassign_coordinators(self, delta: MetadataDelta) -> list[MetadataRecord]:
        """Assignment records for the partitions ``__consumer_offsets`` has now (after it
        grew); replayed on ``delta``."""
        return self._coordinator_assignments(delta, set())

    def _create_offsets_topic(self, delta: MetadataDelta) -> list[MetadataRecord]:
        """Kafka creates ``__consumer_offsets`` on the first FindCoordinator; here the
        controller does, as soon as a coordinator is registered and
        ``offsets.topic.replication.factor`` brokers are active (as Kafka, it waits for
        them rather than create the topic with fewer replicas for good while brokers are
        still starting; a one-broker cluster sets the factor to 1, as ``highwater server``
        does): ``offsets.topic.num.partitions`` partitions, compacted."""
        if delta.topic_id(CONSUMER_OFFSETS_TOPIC) is not None or not delta.coordinators():
            return []
        active = sum(1 for b in delta.brokers().values() if b.is_active)
        factor = self.config.offsets_topic_replication_factor
        if active < factor:
            return []  # the broker whose unfencing makes enough brings it
        try:
            return self.replication.create_internal_topic(
                delta,
                CONSUMER_OFFSETS_TOPIC,
                self.config.offsets_topic_num_partitions,
                factor,
                offsets_topic_configs(self.config, factor),
            )
        except (InvalidReplicationFactorError, InvalidConfigError):
            log.exception("cannot create %s", CONSUMER_OFFSETS_TOPIC)
            return []

    def _coordinator_assignments(
        self, delta: MetadataDelta, restarted: set[int], released: set[int] | None = None
    ) -> list[MetadataRecord]:
        """Balance the partitions the offsets topic has (none before it exists);
        ``released``: revoked partitions whose old owner has let them go."""
        topic_id = delta.topic_id(CONSUMER_OFFSETS_TOPIC)
        num_partitions = 0 if topic_id is None else delta.partition_count(topic_id)
        records: list[MetadataRecord] = []
        for record in assign_coordinators(
            num_partitions,
            delta.coordinators(),
            delta.coordinator_assignments(),
            restarted=restarted,
            released=released or (),
        ):
            delta.replay(record)
            records.append(record)
        return records

    def fence_disconnected(
        self, image: MetadataImage, broker_id: int, broker_epoch: int
    ) -> ControllerResult[bool]:
        """Broker ``broker_id``'s liveness stream broke with its connection (its process
        died): fence that incarnation now, moving its leaderships and ISR memberships in
        the same batch, as a session expiry would. Nothing if that incarnation is no
        longer registered or already fenced; the response says whether it was fenced."""
        broker = image.broker(broker_id)
        if broker is None or broker.broker_epoch != broker_epoch or broker.fenced:
            return ControllerResult([], False)
        delta = MetadataDelta(image)
        fence = FenceBrokerRecord(broker_id, broker_epoch)
        delta.replay(fence)
        return ControllerResult(
            [
                fence,
                *self.replication.move_away_from(
                    delta, broker_id, limit=self.config.leader_moves_per_batch
                ),
            ],
            True,
        )

    def fence_expired(
        self, delta: MetadataDelta, now_ms: int, records: list[MetadataRecord]
    ) -> list[int]:
        """Fence every broker whose session expired, moving its leaderships and ISR
        memberships in the same batch; appends the records, returns the brokers.

        The brokers share one ``leader_moves_per_batch`` budget: when several expire
        together (a lost rack, or a controller that was starved), the batch stays bounded
        and the moves left go in the next ticks (:meth:`ReplicationControl.continue_moves`).
        """
        fenced = self.heartbeats.expired(delta.brokers(), now_ms)
        budget = self.config.leader_moves_per_batch
        for broker_id in fenced:
            broker = delta.broker(broker_id)
            assert broker is not None
            fence = FenceBrokerRecord(broker_id, broker.broker_epoch)
            delta.replay(fence)
            records.append(fence)
            moves = self.replication.move_away_from(delta, broker_id, limit=budget)
            records.extend(moves)
            budget = max(0, budget - len(moves))
        return fenced
