"""The active controller's decisions (Kafka's ``QuorumController``): requests in, records out.

:class:`QuorumController` is pure: no sockets, files, clocks or threads. Each request
method validates the request against the current :class:`MetadataImage` (from the
``image_supplier``: the image of every record written so far) and returns a
:class:`ControllerResult`: the records to append to the metadata log, as one atomic
batch, and the response to send once they are committed. A request, or each item of a
multi-item request (a topic of CreateTopics, a partition of AlterPartition...), yields
either all of its records or an error and none. Time comes in as ``now_ms``.

The work is split as in Kafka: membership and liveness in
:class:`~highwater.controller.cluster_control.ClusterControl`, topics, ISRs and
elections in :class:`~highwater.controller.replication_control.ReplicationControl`,
dynamic configs in :class:`~highwater.controller.config_control.ConfigurationControl`;
producer-id blocks and the periodic :meth:`QuorumController.tick` here.

The only state kept besides the image is soft: broker and coordinator sessions
(:class:`~highwater.controller.heartbeats.BrokerHeartbeatManager`), the seeded random
source of replica placement and topic ids, and when leader imbalance was last checked.
Call :meth:`QuorumController.activate` when this node becomes the active controller.

Broker lifecycle (KIP-631): a broker registers (fenced), heartbeats, and is unfenced
once its heartbeat shows it has replayed the log up to its own registration. A broker
not heard from within ``broker.session.timeout.ms`` is fenced by :meth:`tick`, and in
the same batch its leaderships move to other ISR members and it leaves every ISR where
it is not the last member. A broker whose liveness stream broke with its connection (its
process died) is fenced the same way at once (:meth:`broker_disconnected`). A broker that
asks to shut down (``want_shutdown``) enters controlled shutdown the same way, and is
told ``should_shut_down`` once it leads nothing and every active broker has replayed the
records that moved its leaderships.

Coordinator lifecycle: a group coordinator registers (its record's offset is its
registration epoch) and heartbeats; one not heard from within
``coordinator.session.timeout.ms`` is unregistered by :meth:`tick`, and in the same
batch its ``__consumer_offsets`` partitions go to the live coordinators with higher
coordinator epochs. The controller creates ``__consumer_offsets`` once a coordinator is
registered and a broker is active.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any, Final

from highwater.config.definition import LONG_MAX
from highwater.controller.acl_control import AclControl
from highwater.controller.client_quota_control import ClientQuotaControl
from highwater.controller.cluster_control import ClusterControl
from highwater.controller.config import PRODUCER_ID_BLOCK_SIZE, ControllerConfig
from highwater.controller.config_control import ConfigurationControl
from highwater.controller.heartbeats import BrokerHeartbeatManager
from highwater.controller.replication_control import ReplicationControl
from highwater.controller.results import ControllerResult
from highwater.controller.scram_control import ScramControl
from highwater.controller_api import codec
from highwater.controller_api.messages import (
    AllocateProducerIdsRequest,
    AllocateProducerIdsResponse,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    AlterPartitionRequest,
    AlterPartitionResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    CoordinatorHeartbeatRequest,
    CoordinatorHeartbeatResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
    RegisterCoordinatorRequest,
    RegisterCoordinatorResponse,
    ReplicaLogInfoRequest,
    ReplicaLogInfoResponse,
    TickResult,
    UnregisterBrokerRequest,
    UnregisterBrokerResponse,
    UnregisterCoordinatorRequest,
    UnregisterCoordinatorResponse,
)
from highwater.metadata.consumer_offsets import CONSUMER_OFFSETS_TOPIC
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage, TopicIdPartition
from highwater.metadata.records import NO_LEADER, MetadataRecord, ProducerIdsRecord
from highwater.v1.common_pb2 import ErrorCode


class QuorumController:
    """The quorum controller's logic: one method per request, plus :meth:`tick`.

    ``image_supplier`` returns the image of every record written so far (the store's
    ``latest_image``); the caller appends each result's records before calling again.
    ``seed`` makes replica placement and topic ids deterministic.
    """

    def __init__(
        self,
        image_supplier: Callable[[], MetadataImage],
        config: ControllerConfig | None = None,
        *,
        seed: int = 0,
        credit_stalls: bool = False,
        view_supplier: Callable[[], MetadataImage | MetadataDelta] | None = None,
    ) -> None:
        """``credit_stalls``: a gap between two ticks longer than the heartbeat interval
        is time this controller could not listen (its loop blocked or starved), and
        sessions do not count the excess (:mod:`~highwater.controller.heartbeats`); the
        services, which tick every 100 ms, run so. Without it every millisecond between
        ticks counts, for callers that drive the clock in jumps without ticking.

        ``view_supplier``: the same state as ``image_supplier``, as an image or as a
        delta over one (the store's ``latest_view``: a group's staged records replayed,
        the image not built), for the requests that only read it (AlterConfigs): a
        group of them builds no image per request."""
        self._image = image_supplier
        self._view = image_supplier if view_supplier is None else view_supplier
        self.config = config if config is not None else ControllerConfig()
        self.heartbeats = BrokerHeartbeatManager(
            self.config.broker_session_timeout_ms,
            self.config.broker_heartbeat_interval_ms if credit_stalls else None,
        )
        self.coordinator_sessions = BrokerHeartbeatManager(
            self.config.coordinator_session_timeout_ms,
            self.config.coordinator_heartbeat_interval_ms if credit_stalls else None,
        )
        self.replication = ReplicationControl(self.config, random.Random(seed))
        self.cluster = ClusterControl(
            self.config, self.heartbeats, self.replication, self.coordinator_sessions
        )
        self.configs = ConfigurationControl(self.config)
        self.acls = AclControl(random.Random(seed + 1))
        self.scram = ScramControl()
        self.client_quotas = ClientQuotaControl()
        self._next_imbalance_check_ms: int | None = None
        self._quiet: (
            tuple[
                MetadataImage,
                ConfigurationControl,
                ReplicationControl,
                dict[int, frozenset[TopicIdPartition]],
            ]
            | None
        ) = None
        """The image of the last tick that wrote nothing, the parts that decided, and the
        replicas known offline then: a tick on that image, with them unchanged, decides as
        it did (see :meth:`tick`)."""

    def prepare_standby(self) -> None:
        """Build the per-broker leader, ISR and ELR indexes the active controller's
        decisions read, on the image this controller follows now. Every later image derives them
        by its own changes, so a standby that calls this once (seconds at a million
        partitions) activates without building them, as Kafka's standbys keep their state
        hot: a failover does not wait for them."""
        image = self._image()
        image.partitions_led_by(NO_LEADER)
        image.partitions_with_isr_member(NO_LEADER)
        image.partitions_with_elr_member(NO_LEADER)

    def activate(self, now_ms: int) -> None:
        """This node became the active controller at ``now_ms``: fresh sessions for all,
        no replica known offline until the brokers' heartbeats say so again, and the
        per-broker indexes its decisions read built (already, on a prepared standby's
        image: :meth:`prepare_standby`)."""
        image = self._image()
        # Built now, if this image has none, rather than by the first fence: a broker's
        # failover does not wait for them.
        self.prepare_standby()
        self.heartbeats.reset(image.brokers.values(), now_ms)
        self.replication.offline_replicas.clear()
        self.replication.log_infos.clear()
        # Leader moves a former controller left half-written are finished by the ticks.
        self.replication.resume_moves(image)
        self.coordinator_sessions.reset_epochs(
            {c: r.registration_epoch for c, r in image.cluster.coordinators.items()}, now_ms
        )
        self.cluster.revocations.clear()
        self.cluster.note_revocations(image)
        self._next_imbalance_check_ms = now_ms + self.config.leader_imbalance_check_interval_ms
        self._quiet = None

    # --- Brokers and coordinators ----------------------------------------------------

    def register_broker(
        self, request: RegisterBrokerRequest, now_ms: int, *, principal: str = ""
    ) -> ControllerResult[RegisterBrokerResponse]:
        """Register a broker (or a new incarnation): fenced, its record's offset as epoch;
        ``principal``, the caller's with the ACL checks on, is recorded as the node's."""
        return self.cluster.register_broker(self._image(), request, now_ms, principal=principal)

    def broker_heartbeat(
        self, request: BrokerHeartbeatRequest, now_ms: int
    ) -> ControllerResult[BrokerHeartbeatResponse]:
        """Liveness; unfence a caught-up broker; fence or shut down a broker that asks."""
        return self.cluster.broker_heartbeat(self._image(), request, now_ms)

    def broker_disconnected(self, broker_id: int, broker_epoch: int) -> ControllerResult[bool]:
        """The broker's liveness stream broke with its connection: fence it at once."""
        return self.cluster.fence_disconnected(self._image(), broker_id, broker_epoch)

    def unregister_broker(
        self, request: UnregisterBrokerRequest
    ) -> ControllerResult[UnregisterBrokerResponse]:
        """Remove a broker's registration, after moving its leaderships and ISR memberships."""
        return self.cluster.unregister_broker(self._image(), request)

    def register_coordinator(
        self, request: RegisterCoordinatorRequest, now_ms: int
    ) -> ControllerResult[RegisterCoordinatorResponse]:
        """Register a group coordinator (a fresh session) and rebalance ``__consumer_offsets``
        over coordinators, creating the topic if brokers can host it."""
        return self.cluster.register_coordinator(self._image(), request, now_ms)

    def coordinator_heartbeat(
        self, request: CoordinatorHeartbeatRequest, now_ms: int
    ) -> ControllerResult[CoordinatorHeartbeatResponse]:
        """A coordinator's liveness; one that asks to shut down is unregistered."""
        return self.cluster.coordinator_heartbeat(self._image(), request, now_ms)

    def unregister_coordinator(
        self, request: UnregisterCoordinatorRequest
    ) -> ControllerResult[UnregisterCoordinatorResponse]:
        """Remove a coordinator; its ``__consumer_offsets`` partitions move to the others."""
        return self.cluster.unregister_coordinator(self._image(), request)

    # --- Topics and partitions -------------------------------------------------------

    def create_topics(self, request: CreateTopicsRequest) -> ControllerResult[CreateTopicsResponse]:
        """Create topics: names, counts, factors and configs validated; replicas placed."""
        return self.replication.create_topics(self._image(), request)

    def delete_topics(self, request: DeleteTopicsRequest) -> ControllerResult[DeleteTopicsResponse]:
        """Delete topics by name or id, with their partitions and configs."""
        return self.replication.delete_topics(self._image(), request)

    def create_partitions(
        self, request: CreatePartitionsRequest
    ) -> ControllerResult[CreatePartitionsResponse]:
        """Grow topics to new partition counts, placing the new partitions' replicas (the
        new partitions of ``__consumer_offsets`` get coordinators in the same batch)."""
        image = self._image()
        result = self.replication.create_partitions(image, request)
        if result.records and any(t.name == CONSUMER_OFFSETS_TOPIC for t in request.topics):
            delta = MetadataDelta(image).replay_all(result.records)
            assignments = self.cluster.reassign_coordinators(delta)
            return ControllerResult([*result.records, *assignments], result.response)
        return result

    def alter_partition(
        self, request: AlterPartitionRequest
    ) -> ControllerResult[AlterPartitionResponse]:
        """ISR changes from partition leaders, guarded by leader and partition epochs."""
        return self.replication.alter_partition(self._image(), request)

    def elect_leaders(self, request: ElectLeadersRequest) -> ControllerResult[ElectLeadersResponse]:
        """Preferred or unclean leader elections for the named partitions, or all."""
        return self.replication.elect_leaders(self._image(), request)

    def alter_partition_reassignments(
        self, request: AlterPartitionReassignmentsRequest
    ) -> ControllerResult[AlterPartitionReassignmentsResponse]:
        """Move partitions to other brokers, or cancel a move (see :mod:`.reassignment`)."""
        return self.replication.alter_partition_reassignments(self._image(), request)

    def list_partition_reassignments(
        self, request: ListPartitionReassignmentsRequest
    ) -> ControllerResult[ListPartitionReassignmentsResponse]:
        """The partitions whose reassignment is in progress (no records)."""
        return ControllerResult(
            [], self.replication.list_partition_reassignments(self._image(), request)
        )

    def replica_log_info_requests(self, now_ms: int) -> list[ReplicaLogInfoRequest]:
        """Unclean recovery's questions (KIP-966's GetReplicaLogInfo): the caller sends each
        to its broker and hands the answers to :meth:`replica_log_info`; :meth:`tick`
        elects once the candidates answered."""
        return self.replication.replica_log_info_requests(self._image(), now_ms)

    def replica_log_info(self, response: ReplicaLogInfoResponse) -> None:
        """A broker's answer to :meth:`replica_log_info_requests` (soft state, no records)."""
        self.replication.replica_log_info(self._image(), response)

    # --- Configs ---------------------------------------------------------------------

    def alter_configs(self, request: AlterConfigsRequest) -> ControllerResult[AlterConfigsResponse]:
        """Incremental config changes of topics and brokers, validated by their definitions."""
        return self.configs.alter_configs(self._view(), request)

    def describe_configs(
        self, request: DescribeConfigsRequest
    ) -> ControllerResult[DescribeConfigsResponse]:
        """The configs of topics and brokers with their values and sources (no records)."""
        return self.configs.describe_configs(self._image(), request)

    # --- ACLs ------------------------------------------------------------------------

    def create_acls(self, request: CreateAclsRequest) -> ControllerResult[CreateAclsResponse]:
        """ACLs written as AccessControlEntryRecords (existing ones are left as they are)."""
        return self.acls.create_acls(self._image(), request)

    def describe_acls(self, request: DescribeAclsRequest) -> ControllerResult[DescribeAclsResponse]:
        """The ACLs a filter matches (no records)."""
        return self.acls.describe_acls(self._image(), request)

    def delete_acls(self, request: DeleteAclsRequest) -> ControllerResult[DeleteAclsResponse]:
        """The ACLs each filter matches, removed."""
        return self.acls.delete_acls(self._image(), request)

    # --- SCRAM credentials -------------------------------------------------------------

    def alter_user_scram_credentials(
        self, request: AlterUserScramCredentialsRequest
    ) -> ControllerResult[AlterUserScramCredentialsResponse]:
        """Credentials set (from salted passwords) and removed, as records."""
        return self.scram.alter(self._image(), request)

    def describe_user_scram_credentials(
        self, request: DescribeUserScramCredentialsRequest
    ) -> ControllerResult[DescribeUserScramCredentialsResponse]:
        """Each user's mechanisms and iteration counts (no records)."""
        return self.scram.describe(self._image(), request)

    # --- Client quotas ---------------------------------------------------------------

    def alter_client_quotas(
        self, request: AlterClientQuotasRequest
    ) -> ControllerResult[AlterClientQuotasResponse]:
        """Quota keys set and removed per entity, as records."""
        return self.client_quotas.alter(self._image(), request)

    def describe_client_quotas(
        self, request: DescribeClientQuotasRequest
    ) -> ControllerResult[DescribeClientQuotasResponse]:
        """The entities a filter matches and their values (no records)."""
        return self.client_quotas.describe(self._image(), request)

    # --- Producer ids ----------------------------------------------------------------

    def allocate_producer_ids(
        self, request: AllocateProducerIdsRequest
    ) -> ControllerResult[AllocateProducerIdsResponse]:
        """The next block of :data:`PRODUCER_ID_BLOCK_SIZE` producer ids for a registered broker."""
        image = self._image()
        broker = image.broker(request.broker_id)
        if broker is None or broker.broker_epoch != request.broker_epoch:
            return ControllerResult(
                [],
                AllocateProducerIdsResponse(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"Broker {request.broker_id} of epoch {request.broker_epoch} is not registered",
                ),
            )
        start = image.next_producer_id
        if start > LONG_MAX - PRODUCER_ID_BLOCK_SIZE:
            return ControllerResult(
                [],
                AllocateProducerIdsResponse(
                    ErrorCode.UNKNOWN_SERVER_ERROR, "Exhausted all producer ids"
                ),
            )
        record = ProducerIdsRecord(
            request.broker_id, request.broker_epoch, start + PRODUCER_ID_BLOCK_SIZE
        )
        return ControllerResult(
            [record],
            AllocateProducerIdsResponse(
                producer_id_start=start, producer_id_len=PRODUCER_ID_BLOCK_SIZE
            ),
        )

    # --- Periodic work ---------------------------------------------------------------

    def tick(self, now_ms: int) -> ControllerResult[TickResult]:
        """Periodic work: keep the metadata's static cluster defaults equal to this
        controller's config file, fence expired brokers (moving their leaderships in the same
        batch), unregister expired coordinators (moving their ``__consumer_offsets``
        partitions), create ``__consumer_offsets`` if it is due and missing, elect unclean
        leaders where topics now allow it, elect by unclean recovery where the candidates
        answered, and, every
        ``leader.imbalance.check.interval.seconds``, preferred leaders where a broker's
        imbalance passes ``leader.imbalance.per.broker.percentage``.

        Most ticks change nothing. The decisions that read only the image (the static
        defaults, unclean elections) and the replicas known offline are not taken again on
        the image of the last tick that wrote nothing, while those replicas are as they
        were, no answer for unclean recovery waits and the timed decisions write nothing
        either: they would come out empty again."""
        image = self._image()
        replication = self.replication
        last = self._quiet
        quiet = (
            last is not None
            and last[0] is image
            and last[1] is self.configs
            and last[2] is replication
            and last[3] == replication.offline_replicas
            and not replication.log_infos
        )
        delta = MetadataDelta(image)
        # The static cluster defaults first: what this tick decides already sees them.
        records: list[MetadataRecord] = [] if quiet else self.configs.sync_static_defaults(delta)
        fenced = self.cluster.fence_expired(delta, now_ms, records)
        # Leader moves of brokers taken out of service that did not fit their first batch.
        budget = self.config.leader_moves_per_batch - len(records)
        moved = self.replication.continue_moves(delta, max(0, budget))
        records.extend(moved)
        expired = self.cluster.expire_coordinators(delta, now_ms, records)
        # Revocations of earlier batches, for the heartbeats that will show them applied.
        self.cluster.note_revocations(delta.image)
        # Normally created when its last precondition came about; this catches the rest.
        offsets_topic = self.cluster.ensure_offsets_topic(delta)
        records.extend(offsets_topic)
        # Quiet and nothing written so far: the delta is the image the last quiet tick
        # found nothing to elect in.
        skip = quiet and not records
        unclean = [] if skip else replication.unclean_elections(delta)
        records.extend(unclean)
        recovered = [] if skip else replication.unclean_recoveries(delta)
        records.extend(recovered)
        preferred: list[MetadataRecord] = []
        if self.config.auto_leader_rebalance_enable:
            interval = self.config.leader_imbalance_check_interval_ms
            if self._next_imbalance_check_ms is None:
                self._next_imbalance_check_ms = now_ms + interval
            elif now_ms >= self._next_imbalance_check_ms and not records:
                # Only on a quiet tick: the check reads the image, not this batch.
                self._next_imbalance_check_ms = now_ms + interval
                preferred = self.replication.rebalance_leaders(delta)
                records.extend(preferred)
        self._quiet = (
            None
            if records
            else (image, self.configs, replication, dict(replication.offline_replicas))
        )
        return ControllerResult(
            records,
            TickResult(
                fenced_brokers=tuple(fenced),
                preferred_elections=len(preferred),
                unclean_elections=len(unclean),
                leader_moves=len(moved),
                expired_coordinators=tuple(expired),
                created_offsets_topic=bool(offsets_topic),
                unclean_recoveries=len(recovered),
            ),
        )


ControllerCall = Callable[[QuorumController, Any, int], ControllerResult[Any]]
"""One RPC run on the controller: ``(controller, request, now_ms) -> result``."""

CONTROLLER_CALLS: Final[Mapping[str, ControllerCall]] = {
    "RegisterBroker": lambda c, r, now: c.register_broker(r, now),
    "BrokerHeartbeat": lambda c, r, now: c.broker_heartbeat(r, now),
    "UnregisterBroker": lambda c, r, now: c.unregister_broker(r),
    "AlterPartition": lambda c, r, now: c.alter_partition(r),
    "CreateTopics": lambda c, r, now: c.create_topics(r),
    "DeleteTopics": lambda c, r, now: c.delete_topics(r),
    "CreatePartitions": lambda c, r, now: c.create_partitions(r),
    "ElectLeaders": lambda c, r, now: c.elect_leaders(r),
    "AlterPartitionReassignments": lambda c, r, now: c.alter_partition_reassignments(r),
    "ListPartitionReassignments": lambda c, r, now: c.list_partition_reassignments(r),
    "AlterConfigs": lambda c, r, now: c.alter_configs(r),
    "DescribeConfigs": lambda c, r, now: c.describe_configs(r),
    "AllocateProducerIds": lambda c, r, now: c.allocate_producer_ids(r),
    "RegisterCoordinator": lambda c, r, now: c.register_coordinator(r, now),
    "CoordinatorHeartbeat": lambda c, r, now: c.coordinator_heartbeat(r, now),
    "UnregisterCoordinator": lambda c, r, now: c.unregister_coordinator(r),
    "CreateAcls": lambda c, r, now: c.create_acls(r),
    "DescribeAcls": lambda c, r, now: c.describe_acls(r),
    "DeleteAcls": lambda c, r, now: c.delete_acls(r),
    "AlterUserScramCredentials": lambda c, r, now: c.alter_user_scram_credentials(r),
    "DescribeUserScramCredentials": lambda c, r, now: c.describe_user_scram_credentials(r),
    "AlterClientQuotas": lambda c, r, now: c.alter_client_quotas(r),
    "DescribeClientQuotas": lambda c, r, now: c.describe_client_quotas(r),
}
"""How each Controller RPC runs on the controller, by name: the gRPC service and the etcd
mode's candidate both dispatch through it."""

assert set(CONTROLLER_CALLS) == set(codec.RPCS)
