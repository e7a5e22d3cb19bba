"""Test harness for the quorum controller: an in-memory store, a fake clock, a broker fleet."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from highwater.controller import (
    ControllerConfig,
    ControllerResult,
    InMemoryMetadataStore,
    QuorumController,
)
from highwater.controller_api.messages import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    CreatableTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
)
from highwater.metadata import (
    NO_LEADER,
    BrokerEndpoint,
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicIdPartition,
    replay,
)
from highwater.v1.common_pb2 import ErrorCode

R = TypeVar("R")

NONE = ErrorCode.NONE


@dataclass
class FakeClock:
    now_ms: int = 1_000_000

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


@dataclass
class Harness:
    """A controller over an in-memory store that commits what is appended at once."""

    config: ControllerConfig = field(default_factory=ControllerConfig)
    seed: int = 0
    clock: FakeClock = field(default_factory=FakeClock)
    credit_stalls: bool = False
    """As the controller service runs (``QuorumController``'s ``credit_stalls``)."""

    def __post_init__(self) -> None:
        self.store = InMemoryMetadataStore()
        self.controller = QuorumController(
            self.store.latest_image, self.config, seed=self.seed, credit_stalls=self.credit_stalls
        )
        self.controller.activate(self.clock.now_ms)
        self.epochs: dict[int, int] = {}

    @property
    def image(self) -> MetadataImage:
        return self.store.latest_image()

    def commit(self, result: ControllerResult[R]) -> R:
        """Append the result's records (all at once) and return its response."""
        self.store.append(result.records)
        return result.response

    # Brokers ---------------------------------------------------------------------------

    def register(
        self, broker_id: int, rack: str | None = None, incarnation: str | None = None
    ) -> RegisterBrokerResponse:
        response = self.commit(
            self.controller.register_broker(
                RegisterBrokerRequest(
                    broker_id,
                    incarnation or f"incarnation-{broker_id}",
                    (BrokerEndpoint("PLAINTEXT", f"broker-{broker_id}", 9092),),
                    rack,
                ),
                self.clock.now_ms,
            )
        )
        if response.error == NONE:
            self.epochs[broker_id] = response.broker_epoch
        return response

    def heartbeat(
        self,
        broker_id: int,
        *,
        offset: int | None = None,
        want_fence: bool = False,
        want_shutdown: bool = False,
    ) -> BrokerHeartbeatResponse:
        """A heartbeat reporting ``offset`` (default: caught up with the store)."""
        return self.commit(
            self.controller.broker_heartbeat(
                BrokerHeartbeatRequest(
                    broker_id,
                    self.epochs[broker_id],
                    self.image.offset if offset is None else offset,
                    want_fence,
                    want_shutdown,
                ),
                self.clock.now_ms,
            )
        )

    def start_brokers(self, broker_ids: Iterable[int], racks: dict[int, str] | None = None) -> None:
        """Register brokers and unfence them."""
        ids = list(broker_ids)
        for broker_id in ids:
            assert self.register(broker_id, (racks or {}).get(broker_id)).error == NONE
        for broker_id in ids:
            response = self.heartbeat(broker_id)
            assert response.error == NONE and not response.is_fenced, response

    def heartbeat_all(self) -> None:
        for broker_id, broker in self.image.brokers.items():
            if not broker.fenced or broker_id in self.epochs:
                self.heartbeat(broker_id)

    def tick(self) -> None:
        self.commit(self.controller.tick(self.clock.now_ms))

    # Topics ----------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 1,
        configs: dict[str, str | None] | None = None,
    ) -> CreateTopicsResponse:
        return self.commit(
            self.controller.create_topics(
                CreateTopicsRequest(
                    (CreatableTopic(name, partitions, replication_factor, configs=configs or {}),)
                )
            )
        )

    def broker(self, broker_id: int) -> BrokerRegistration:
        broker = self.image.broker(broker_id)
        assert broker is not None, broker_id
        return broker

    def topic_id(self, name: str) -> str:
        topic = self.image.topic(name)
        assert topic is not None, name
        return topic.topic_id

    def partition(self, name: str, partition_id: int = 0) -> PartitionRegistration:
        partition = self.image.partition(self.topic_id(name), partition_id)
        assert partition is not None
        return partition

    def replayed(self) -> MetadataImage:
        """The image rebuilt from every record appended so far."""
        return replay(self.store.records, self.image.offset, self.image.epoch)


def check_invariants(image: MetadataImage) -> None:
    """What must hold of every image: leader in ISR, ISR in replicas, ISR not empty but
    when its last member moved to the ELR (KIP-966: then no leader, and the ELR or the last
    known ELR holds someone), a leader that is active whenever an active ISR member
    exists, replicas distinct; the ELR and the last known ELR are replicas, outside the
    ISR and apart from each other."""
    for key, partition in image.partitions():
        assert partition.replicas, key
        assert len(set(partition.replicas)) == len(partition.replicas), (key, partition)
        if not partition.isr:
            assert partition.leader == NO_LEADER, (key, partition)
            assert partition.elr or partition.last_known_elr, (key, partition)
        assert set(partition.isr) <= set(partition.replicas), (key, partition)
        assert len(set(partition.isr)) == len(partition.isr), (key, partition)
        active_isr = [b for b in partition.isr if image.is_active_broker(b)]
        if partition.leader != NO_LEADER:
            assert partition.leader in partition.isr, (key, partition)
        if active_isr:
            assert image.is_active_broker(partition.leader), (key, partition, active_isr)
        elr, last_known = set(partition.elr), set(partition.last_known_elr)
        assert elr <= set(partition.replicas) and not elr & set(partition.isr), (key, partition)
        assert last_known <= set(partition.replicas), (key, partition)
        assert not last_known & (elr | set(partition.isr)), (key, partition)


def epochs_of(image: MetadataImage) -> dict[TopicIdPartition, tuple[int, int]]:
    return {key: (p.leader_epoch, p.partition_epoch) for key, p in image.partitions()}
