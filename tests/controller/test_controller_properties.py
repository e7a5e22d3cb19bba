"""Property tests: random sequences of controller requests keep the metadata invariants.

A hypothesis state machine registers, heartbeats, fences, shuts down and unregisters
brokers, creates, grows and deletes topics, alters ISRs and configs, elects leaders and
lets time pass, committing every result. After every step:

* leader in ISR, ISR a non-empty subset of replicas, no duplicates;
* no partition is led by an inactive broker while an active ISR member exists;
* leader epochs and partition epochs never go down;
* a refused request or item brings no records; a new topic's replicas and preferred
  leaders are balanced within one over the active brokers;
* the image equals the one replayed from the whole log and the one loaded from its snapshot.
"""

from __future__ import annotations

import hypothesis.strategies as st
from controller_helpers import NONE, Harness, check_invariants, epochs_of
from highwater.controller_api.messages import (
    AlterableConfig,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterPartitionItem,
    AlterPartitionRequest,
    BrokerHeartbeatRequest,
    CreatableTopic,
    CreatePartitionsRequest,
    CreatePartitionsTopic,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    ElectionType,
    ElectLeadersRequest,
    RegisterBrokerRequest,
    TopicPartitions,
    UnregisterBrokerRequest,
)
from highwater.metadata import (
    ConfigResourceType,
    PartitionRecord,
    TopicRecord,
    load_snapshot,
    snapshot_records,
)
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from replica_balance import replica_balance

BROKER_IDS = st.integers(0, 4)
TOPICS = st.sampled_from(["a", "b", "c", "d"])


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.incarnations = 0
        self.epochs = epochs_of(self.h.image)

    @initialize(brokers=st.integers(1, 5))
    def start(self, brokers: int) -> None:
        self.h.start_brokers(range(brokers))

    # --- Brokers -----------------------------------------------------------------------

    @rule(broker_id=BROKER_IDS, clean=st.booleans())
    def register(self, broker_id: int, clean: bool) -> None:
        self.incarnations += 1
        existing = self.h.image.broker(broker_id)
        previous = existing.broker_epoch if existing is not None and clean else -1
        result = self.h.controller.register_broker(
            RegisterBrokerRequest(
                broker_id, f"i{self.incarnations}", previous_broker_epoch=previous
            ),
            self.h.clock.now_ms,
        )
        if result.response.error != NONE:
            assert result.records == []
        self.h.commit(result)

    @rule(broker_id=BROKER_IDS, mode=st.sampled_from(["caught-up", "behind", "fence", "shutdown"]))
    def heartbeat(self, broker_id: int, mode: str) -> None:
        broker = self.h.image.broker(broker_id)
        if broker is None:
            return
        offset = broker.broker_epoch - 1 if mode == "behind" else self.h.image.offset
        result = self.h.controller.broker_heartbeat(
            BrokerHeartbeatRequest(
                broker_id, broker.broker_epoch, offset, mode == "fence", mode == "shutdown"
            ),
            self.h.clock.now_ms,
        )
        if result.response.should_shut_down and not result.response.is_fenced:
            event("a broker completed controlled shutdown")
        self.h.commit(result)

    @rule()
    def everyone_heartbeats(self) -> None:
        for broker_id, broker in sorted(self.h.image.brokers.items()):
            self.h.commit(
                self.h.controller.broker_heartbeat(
                    BrokerHeartbeatRequest(broker_id, broker.broker_epoch, self.h.image.offset),
                    self.h.clock.now_ms,
                )
            )

    @rule(ms=st.sampled_from([100, 2000, 4500, 9000, 300_000]))
    def time_passes(self, ms: int) -> None:
        self.h.clock.advance(ms)
        self.h.tick()

    @rule(broker_id=BROKER_IDS)
    def unregister(self, broker_id: int) -> None:
        result = self.h.controller.unregister_broker(UnregisterBrokerRequest(broker_id))
        if result.response.error != NONE:
            assert result.records == []
        self.h.commit(result)

    # --- Topics ------------------------------------------------------------------------

    @rule(name=TOPICS, partitions=st.integers(1, 7), factor=st.integers(1, 3))
    def create_topic(self, name: str, partitions: int, factor: int) -> None:
        image = self.h.image
        active = [b.broker_id for b in image.active_brokers()]
        result = self.h.controller.create_topics(
            CreateTopicsRequest((CreatableTopic(name, partitions, factor),))
        )
        topic = result.response.topics[0]
        if topic.error != NONE:
            assert result.records == []
            assert image.topic(name) is not None or factor > len(active)
        else:
            assert [r.name for r in result.records if isinstance(r, TopicRecord)] == [name]
            assignment = [r.replicas for r in result.records if isinstance(r, PartitionRecord)]
            assert len(assignment) == partitions
            assert all(set(replicas) <= set(active) for replicas in assignment)
            assert replica_balance(assignment, active) <= (1, 1)
            event(f"topic created with replication factor {factor}")
        self.h.commit(result)

    @rule(name=TOPICS)
    def delete_topic(self, name: str) -> None:
        self.h.commit(self.h.controller.delete_topics(DeleteTopicsRequest((name,))))

    @rule(name=TOPICS, more=st.integers(1, 3))
    def grow_topic(self, name: str, more: int) -> None:
        topic = self.h.image.topic(name)
        count = (len(topic.partitions) if topic is not None else 0) + more
        result = self.h.controller.create_partitions(
            CreatePartitionsRequest((CreatePartitionsTopic(name, count),))
        )
        if result.response.topics[0].error != NONE:
            assert result.records == []
        self.h.commit(result)

    @rule(name=TOPICS, enable=st.booleans())
    def set_unclean(self, name: str, enable: bool) -> None:
        change = AlterableConfig("unclean.leader.election.enable", value=str(enable).lower())
        result = self.h.controller.alter_configs(
            AlterConfigsRequest((AlterConfigsResource(ConfigResourceType.TOPIC, name, (change,)),))
        )
        if result.response.resources[0].error != NONE:
            assert result.records == []
        self.h.commit(result)

    # --- Partitions --------------------------------------------------------------------

    @rule(data=st.data(), stale=st.booleans())
    def alter_isr(self, data: st.DataObject, stale: bool) -> None:
        image = self.h.image
        keys = sorted(key for key, _ in image.partitions())
        if not keys:
            return
        key = data.draw(st.sampled_from(keys))
        partition = image.partition(key)
        assert partition is not None
        leader = image.broker(partition.leader) if partition.has_leader else None
        if leader is None:
            return
        others = data.draw(st.lists(st.sampled_from(partition.replicas), unique=True))
        new_isr = (partition.leader, *(b for b in others if b != partition.leader))
        item = AlterPartitionItem(
            key.topic_id,
            key.partition_id,
            partition.leader_epoch,
            partition.partition_epoch - (1 if stale and partition.partition_epoch else 0),
            new_isr,
        )
        result = self.h.controller.alter_partition(
            AlterPartitionRequest(leader.broker_id, leader.broker_epoch, (item,))
        )
        answer = result.response.partitions[0]
        if answer.error != NONE:
            assert result.records == []
        else:
            assert answer.isr == new_isr
            event("ISR altered")
        self.h.commit(result)

    @rule(name=TOPICS, unclean=st.booleans())
    def elect(self, name: str, unclean: bool) -> None:
        topic = self.h.image.topic(name)
        partitions = tuple(range(len(topic.partitions))) if topic is not None else (0,)
        election = ElectionType.UNCLEAN if unclean else ElectionType.PREFERRED
        result = self.h.controller.elect_leaders(
            ElectLeadersRequest(election, (TopicPartitions(name, partitions),))
        )
        assert len(result.records) == sum(1 for p in result.response.partitions if p.error == NONE)
        self.h.commit(result)

    # --- Invariants --------------------------------------------------------------------

    @invariant()
    def partitions_are_sound(self) -> None:
        image = self.h.image
        check_invariants(image)
        if image.partitions_without_leader():
            event("some partition offline")
        if any(p.leader_epoch > 0 for _, p in image.partitions()):
            event("some leader moved")
        if any(b.in_controlled_shutdown for b in image.brokers.values()):
            event("some broker in controlled shutdown")

    @invariant()
    def epochs_only_grow(self) -> None:
        epochs = epochs_of(self.h.image)
        for key, (leader_epoch, partition_epoch) in epochs.items():
            before = self.epochs.get(key)
            if before is not None:
                assert leader_epoch >= before[0] and partition_epoch >= before[1], key
        self.epochs = epochs

    def teardown(self) -> None:
        image = self.h.image
        assert self.h.replayed() == image
        assert load_snapshot(list(snapshot_records(image)), image.offset, image.epoch) == image


ControllerMachine.TestCase.settings = settings(
    # Examples: the profile's (tests/conftest.py); each runs up to 50 steps.
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_controller_machine = ControllerMachine.TestCase
