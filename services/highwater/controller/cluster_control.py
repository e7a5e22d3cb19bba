"""Broker and coordinator membership (Kafka's ``ClusterControlManager``): registration and liveness.

Brokers register (fenced, with the offset of their record as broker epoch), heartbeat,
are unfenced once they have replayed the log up to their registration, may ask to be
fenced or to shut down, and are fenced when their session expires. Each step that
takes a broker out of service moves its leaderships and ISR memberships in the same
batch (:meth:`ReplicationControl.move_away_from`); a broker coming back gets the
leaderless partitions it can lead. Coordinators register and share the partitions of
``__consumer_offsets`` (:func:`~highwater.controller.coordinators.assign_coordinators`).
"""

from __future__ import annotations

from highwater.controller.config import ControllerConfig
from highwater.controller.coordinators import assign_coordinators
from highwater.controller.heartbeats import BrokerHeartbeatManager
from highwater.controller.messages import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
    RegisterCoordinatorRequest,
    RegisterCoordinatorResponse,
    UnregisterBrokerRequest,
    UnregisterBrokerResponse,
    UnregisterCoordinatorRequest,
    UnregisterCoordinatorResponse,
)
from highwater.controller.replication_control import ReplicationControl
from highwater.controller.results import ControllerApiError, ControllerResult, refuse
from highwater.metadata.image import (
    MetadataDelta,
    MetadataImage,
)
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

CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"


class ClusterControl:
    """Membership decisions; keeps the broker sessions (soft state)."""

    def __init__(
        self,
        config: ControllerConfig,
        heartbeats: BrokerHeartbeatManager,
        replication: ReplicationControl,
    ) -> None:
        self.config = config
        self.heartbeats = heartbeats
        self.replication = replication

    def register_broker(
        self, image: MetadataImage, request: RegisterBrokerRequest, now_ms: int
    ) -> ControllerResult[RegisterBrokerResponse]:
        """Register a broker (or a new incarnation of it): fenced, with a new broker epoch.

        The epoch is the offset of the RegisterBrokerRecord, so it grows with every
        registration. A retry of the same registration gets the same epoch and no record.
        A new incarnation while the old one still has a session and did not shut down
        cleanly is a DUPLICATE_BROKER_REGISTRATION. The old incarnation's leaderships
        and ISR memberships (except as a last member) go in the same batch: it may have
        lost records it had not flushed.
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
        register = RegisterBrokerRecord(
            broker_id=request.broker_id,
            incarnation_id=request.incarnation_id,
            broker_epoch=epoch,
            listeners=request.listeners,
            rack=request.rack,
            fenced=True,
        )
        delta = MetadataDelta(image)
        delta.replay(register)
        records: list[MetadataRecord] = [register]
        records.extend(self.replication.move_away_from(delta, request.broker_id))
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
        if broker.fenced:
            if request.want_shutdown:
                return ControllerResult(
                    [], BrokerHeartbeatResponse(is_caught_up=caught_up, should_shut_down=True)
                )
            if request.want_fence or not caught_up:
                return ControllerResult([], BrokerHeartbeatResponse(is_caught_up=caught_up))
            unfence = UnfenceBrokerRecord(broker_id, broker.broker_epoch)
            delta.replay(unfence)
            records = [unfence, *self.replication.elect_for_unfenced(delta, broker_id)]
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
            records = [change, *self.replication.move_away_from(delta, broker_id)]
            self.heartbeats.set_controlled_shutdown_offset(broker_id, image.offset + len(records))
            return ControllerResult(
                records, BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=False)
            )
        if request.want_fence:
            fence = FenceBrokerRecord(broker_id, broker.broker_epoch)
            delta.replay(fence)
            records = [fence, *self.replication.move_away_from(delta, broker_id)]
            return ControllerResult(records, BrokerHeartbeatResponse(is_caught_up=caught_up))
        return ControllerResult(
            [], BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=False)
        )

    def unregister_broker(
        self, image: MetadataImage, request: UnregisterBrokerRequest
    ) -> ControllerResult[UnregisterBrokerResponse]:
        """Remove a broker's registration; its leaderships and ISR memberships go first."""
        broker = image.broker(request.broker_id)
        if broker is None:
            return ControllerResult(
                [],
                UnregisterBrokerResponse(
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                    f"Broker {request.broker_id} is not registered",
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

    def register_coordinator(
        self, image: MetadataImage, request: RegisterCoordinatorRequest
    ) -> ControllerResult[RegisterCoordinatorResponse]:
        """Register a group coordinator and rebalance ``__consumer_offsets`` partitions
        over the registered coordinators (a new incarnation gets new coordinator epochs
        for the partitions it keeps)."""
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
        else:
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
        records.extend(self._coordinator_assignments(delta, restarted))
        return ControllerResult(records, RegisterCoordinatorResponse(registration_epoch=epoch))

    def unregister_coordinator(
        self, image: MetadataImage, request: UnregisterCoordinatorRequest
    ) -> ControllerResult[UnregisterCoordinatorResponse]:
        """Remove a coordinator; its partitions move to the others."""
        existing = image.coordinator(request.coordinator_id)
        if existing is None:
            return ControllerResult(
                [],
                UnregisterCoordinatorResponse(
                    ErrorCode.INVALID_REQUEST,
                    f"Coordinator {request.coordinator_id} is not registered",
                ),
            )
        delta = MetadataDelta(image)
        record = UnregisterCoordinatorRecord(existing.coordinator_id, existing.registration_epoch)
        delta.replay(record)
        records: list[MetadataRecord] = [record, *self._coordinator_assignments(delta, set())]
        return ControllerResult(records, UnregisterCoordinatorResponse())

    def _coordinator_assignments(
        self, delta: MetadataDelta, restarted: set[int]
    ) -> list[MetadataRecord]:
        num_partitions = self.config.offsets_topic_num_partitions
        topic_id = delta.topic_id(CONSUMER_OFFSETS_TOPIC)
        if topic_id is not None:
            num_partitions = delta.partition_count(topic_id)
        current = {
            p: a
            for p in range(num_partitions)
            if (a := delta.coordinator_assignment(p)) is not None
        }
        records: list[MetadataRecord] = []
        for record in assign_coordinators(
            num_partitions, delta.coordinators(), current, restarted=restarted
        ):
            delta.replay(record)
            records.append(record)
        return records

    def fence_expired(
        self, delta: MetadataDelta, now_ms: int, records: list[MetadataRecord]
    ) -> list[int]:
        """Fence every broker whose session expired, moving its leaderships and ISR
        memberships in the same batch; appends the records, returns the brokers."""
        fenced = self.heartbeats.expired(delta.brokers(), now_ms)
        for broker_id in fenced:
            broker = delta.broker(broker_id)
            assert broker is not None
            fence = FenceBrokerRecord(broker_id, broker.broker_epoch)
            delta.replay(fence)
            records.append(fence)
            records.extend(self.replication.move_away_from(delta, broker_id))
        return fenced
