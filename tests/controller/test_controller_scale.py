"""Scale: the controller's decisions on a cluster of 20,000 partitions, timed and printed.

Measures and prints; asserts correctness only, never time. The same decisions at 100,000
to 2,000,000 partitions are timed by ``python -m bench scale``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from controller_helpers import check_invariants
from highwater.controller import (
    ControllerConfig,
    ControllerResult,
    InMemoryMetadataStore,
    QuorumController,
)
from highwater.controller_api.messages import (
    AlterPartitionItem,
    AlterPartitionRequest,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    CreatableTopic,
    CreateTopicsRequest,
)
from highwater.metadata import (
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    replay,
)

R = TypeVar("R")

BROKERS = 10
TOPICS = 20
PARTITIONS_PER_TOPIC = 1000
SESSION = 9000


def cluster() -> list[MetadataRecord]:
    records: list[MetadataRecord] = []
    for broker_id in range(BROKERS):
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    for topic in range(TOPICS):
        topic_id = f"topic-id-{topic:013d}"
        records.append(TopicRecord(f"topic-{topic}", topic_id))
        for partition_id in range(PARTITIONS_PER_TOPIC):
            first = (topic + partition_id) % BROKERS
            replicas = tuple((first + i) % BROKERS for i in range(3))
            records.append(PartitionRecord(topic_id, partition_id, replicas, replicas, first))
    return records


@pytest.mark.slow
def test_controller_decisions_on_20000_partitions(capsys: pytest.CaptureFixture[str]) -> None:
    records = cluster()
    store = InMemoryMetadataStore(replay(records, len(records) - 1, 1), epoch=1)
    # Every move of a broker in one decision (not the default's batches of 1,000), so
    # that the figures time the whole of it.
    config = ControllerConfig(leader_moves_per_batch=TOPICS * PARTITIONS_PER_TOPIC)
    controller = QuorumController(store.latest_image, config, seed=1)
    now = 0
    controller.activate(now)
    figures: list[tuple[str, float, int]] = []

    def run(label: str, action: Callable[[], ControllerResult[R]]) -> ControllerResult[R]:
        start = time.perf_counter()
        result = action()
        elapsed = time.perf_counter() - start
        store.append(result.records)
        figures.append((label, elapsed, len(result.records)))
        return result

    def heartbeat(
        broker_id: int, *, want_shutdown: bool = False
    ) -> ControllerResult[BrokerHeartbeatResponse]:
        image = store.latest_image()
        epoch = image.brokers[broker_id].broker_epoch
        request = BrokerHeartbeatRequest(
            broker_id, epoch, image.offset, want_shutdown=want_shutdown
        )
        return controller.broker_heartbeat(request, now)

    start = time.perf_counter()
    first = store.latest_image()
    first.partitions_led_by(0), first.partitions_with_isr_member(0)
    figures.append(("index of leaders and ISRs (first use)", time.perf_counter() - start, 0))
    run("a heartbeat", lambda: heartbeat(1))
    # Broker 9 goes silent: one tick fences it and moves 2,000 leaderships.
    now += SESSION
    for broker_id in range(9):
        store.append(heartbeat(broker_id).records)
    tick = run("tick fencing one broker", lambda: controller.tick(now))
    assert tick.response.fenced_brokers == (9,)
    assert not store.latest_image().partitions_led_by(9)
    # Broker 8 shuts down in a controlled way: one heartbeat moves its leaderships.
    run("controlled shutdown heartbeat", lambda: heartbeat(8, want_shutdown=True))
    assert not store.latest_image().partitions_led_by(8)
    image = store.latest_image()
    topic = image.topic("topic-7")
    assert topic is not None
    key = next(
        p
        for p in range(PARTITIONS_PER_TOPIC)
        if topic.partitions[p].leader == 0 and len(topic.partitions[p].isr) > 1
    )
    partition = topic.partitions[key]
    shrink = AlterPartitionItem(
        topic.topic_id, key, partition.leader_epoch, partition.partition_epoch, (0,)
    )
    altered = run(
        "AlterPartition, one partition",
        lambda: controller.alter_partition(
            AlterPartitionRequest(0, image.brokers[0].broker_epoch, (shrink,))
        ),
    )
    assert altered.response.partitions[0].error == 0, altered.response
    run(
        "CreateTopics, 1,000 partitions x 3",
        lambda: controller.create_topics(CreateTopicsRequest((CreatableTopic("new", 1000, 3),))),
    )
    tick_now = run("a quiet tick", lambda: controller.tick(now))
    assert tick_now.records == []
    check_invariants(store.latest_image())
    assert all(isinstance(r, PartitionChangeRecord) for r in tick.records[1:])
    with capsys.disabled():
        print()
        print(f"  controller, {TOPICS * PARTITIONS_PER_TOPIC:,} partitions on {BROKERS} brokers:")
        for label, elapsed, count in figures:
            print(f"    {label:36s} {elapsed * 1e3:9.1f} ms  {count:7,} records")
