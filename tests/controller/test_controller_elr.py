"""Eligible leader replicas (KIP-966): who joins and leaves the ELR, and clean elections
from it when the last ISR member fails.

The story each test tells: a topic with replication factor 3 and ``min.insync.replicas``
2, whose ISR shrinks to its leader alone (the high watermark then stops, so the replicas
that left hold every committed record); the leader dies. Before KIP-966 the partition
went offline, or an unclean election could lose acknowledged records; with it, a replica
of the ELR leads and nothing committed is lost.
"""

from __future__ import annotations

from controller_helpers import NONE, Harness, check_invariants
from highwater.controller import ControllerConfig
from highwater.controller_api.messages import (
    AlterPartitionItem,
    AlterPartitionRequest,
    BrokerEndpoint,
    CreatableTopic,
    CreateTopicsRequest,
    ElectionType,
    ElectLeadersRequest,
    RegisterBrokerRequest,
    ReplicaLogInfo,
    ReplicaLogInfoResponse,
    TopicPartitions,
)
from highwater.metadata import (
    NO_LEADER,
    PartitionRegistration,
    load_snapshot_values,
    snapshot_values,
)

SESSION = 9000
MIN_ISR_2 = {"min.insync.replicas": "2"}


def harness(
    assignment: tuple[int, ...] = (1, 2, 3),
    configs: dict[str, str | None] | None = None,
    config: ControllerConfig | None = None,
) -> Harness:
    h = Harness(config=config or ControllerConfig())
    h.start_brokers([1, 2, 3])
    topic = CreatableTopic(
        "t", assignments=(assignment,), configs=MIN_ISR_2 if configs is None else configs
    )
    created = h.commit(h.controller.create_topics(CreateTopicsRequest((topic,))))
    assert created.topics[0].error == NONE, created
    return h


def shrink(h: Harness, *isr: int) -> None:
    """The leader asks for ``isr`` (AlterPartition), and it is committed."""
    partition = h.partition("t")
    item = AlterPartitionItem(
        h.topic_id("t"), 0, partition.leader_epoch, partition.partition_epoch, isr
    )
    response = h.commit(
        h.controller.alter_partition(
            AlterPartitionRequest(partition.leader, h.epochs[partition.leader], (item,))
        )
    )
    assert response.partitions[0].error == NONE, response


def fence(h: Harness, broker_id: int) -> None:
    """``broker_id`` goes silent past its session; the others heartbeat."""
    h.clock.advance(SESSION)
    for other in h.epochs:
        if other != broker_id and not h.broker(other).fenced:
            h.heartbeat(other)
    h.tick()
    assert h.broker(broker_id).fenced


def restart(h: Harness, broker_id: int, *, clean: bool) -> None:
    """A new incarnation of ``broker_id`` registers (with its clean-shutdown epoch or
    without) and catches up. Without it, the old incarnation was killed: its session
    expires first."""
    if not clean:
        fence(h, broker_id)
    previous = h.epochs[broker_id] if clean else -1
    response = h.commit(
        h.controller.register_broker(
            RegisterBrokerRequest(
                broker_id,
                f"incarnation-{broker_id}-again",
                (BrokerEndpoint("PLAINTEXT", f"broker-{broker_id}", 9092),),
                previous_broker_epoch=previous,
            ),
            h.clock.now_ms,
        )
    )
    assert response.error == NONE, response
    h.epochs[broker_id] = response.broker_epoch
    h.heartbeat(broker_id)


def test_replicas_leaving_an_isr_at_min_isr_are_not_eligible() -> None:
    h = harness()
    shrink(h, 1, 2)  # the ISR is still at min.insync.replicas: the HW may pass broker 3
    partition = h.partition("t")
    assert partition.isr == (1, 2) and partition.elr == ()
    check_invariants(h.image)


def test_a_replica_leaving_an_isr_below_min_isr_joins_the_elr() -> None:
    h = harness()
    shrink(h, 1, 2)
    shrink(h, 1)
    partition = h.partition("t")
    assert partition.isr == (1,) and partition.elr == (2,)
    # Both leave at once from a full ISR: both held the HW, which cannot move any more.
    h = harness()
    shrink(h, 1)
    assert h.partition("t").elr == (2, 3)
    check_invariants(h.image)


def test_the_last_isr_member_fails_and_an_elr_member_leads_cleanly() -> None:
    h = harness()
    shrink(h, 1, 2)
    shrink(h, 1)
    before = h.partition("t")
    fence(h, 1)
    partition = h.partition("t")
    assert partition.leader == 2
    assert partition.isr == (2,)
    assert partition.elr == (1,)  # it held the HW as the last ISR member
    assert partition.leader_epoch == before.leader_epoch + 1
    check_invariants(h.image)


def test_without_an_elr_the_partition_goes_offline() -> None:
    h = harness(config=ControllerConfig(eligible_leader_replicas_enable=False))
    shrink(h, 1, 2)
    shrink(h, 1)
    assert h.partition("t").elr == ()
    fence(h, 1)
    partition = h.partition("t")
    assert partition.leader == NO_LEADER and partition.isr == (1,)
    check_invariants(h.image)


def test_min_isr_1_keeps_the_elr_empty() -> None:
    h = harness(configs={})
    shrink(h, 1)
    assert h.partition("t").elr == ()
    fence(h, 1)
    assert h.partition("t").leader == NO_LEADER


def test_the_isr_back_at_min_isr_empties_the_elr() -> None:
    h = harness()
    shrink(h, 1)
    assert h.partition("t").elr == (2, 3)
    shrink(h, 1, 3)  # 3 caught up: the HW moves again, so 2 no longer holds it
    partition = h.partition("t")
    assert partition.isr == (1, 3) and partition.elr == ()


def test_rejoining_the_isr_leaves_the_elr() -> None:
    config = ControllerConfig()
    h = harness(configs={"min.insync.replicas": "3"}, config=config)
    shrink(h, 1)
    assert h.partition("t").elr == (2, 3)
    shrink(h, 1, 2)  # still below 3: 2 is in the ISR now, 3 stays eligible
    partition = h.partition("t")
    assert partition.isr == (1, 2) and partition.elr == (3,)


def test_an_unclean_shutdown_takes_a_replica_out_of_the_elr() -> None:
    h = harness(assignment=(1, 3, 2))
    shrink(h, 1, 2)
    shrink(h, 1)
    assert h.partition("t").elr == (2,)
    restart(h, 2, clean=False)  # it may have lost what it had not flushed
    partition = h.partition("t")
    assert partition.elr == () and partition.last_known_elr == (2,)
    fence(h, 1)
    assert h.partition("t").leader == NO_LEADER  # no clean choice left
    check_invariants(h.image)
    # The operator's unclean election prefers the last known ELR to replica order.
    result = h.controller.elect_leaders(
        ElectLeadersRequest(ElectionType.UNCLEAN, (TopicPartitions("t", (0,)),))
    )
    h.commit(result)
    partition = h.partition("t")
    assert partition.leader == 2 and partition.isr == (2,)
    check_invariants(h.image)


def test_a_clean_restart_keeps_the_elr() -> None:
    h = harness()
    shrink(h, 1, 2)
    shrink(h, 1)
    restart(h, 2, clean=True)
    assert h.partition("t").elr == (2,)
    fence(h, 1)
    assert h.partition("t").leader == 2


def test_the_elr_survives_a_replay_and_a_snapshot() -> None:
    h = harness()
    shrink(h, 1, 2)
    shrink(h, 1)
    restart(h, 2, clean=False)
    expected = PartitionRegistration(
        replicas=(1, 2, 3),
        isr=(1,),
        leader=1,
        leader_epoch=0,
        partition_epoch=h.partition("t").partition_epoch,
        elr=(),
        last_known_elr=(2,),
    )
    assert h.partition("t") == expected
    replayed = h.replayed()
    assert replayed.partition(h.topic_id("t"), 0) == expected
    loaded = load_snapshot_values(snapshot_values(h.image), h.image.offset, h.image.epoch)
    assert loaded.partition(h.topic_id("t"), 0) == expected


# --- The last ISR member and unclean recovery (KIP-966) ------------------------------


def every_member_down(h: Harness) -> None:
    """The ISR shrinks to broker 1 (2 and 3 join the ELR), then 2, 3 and last 1 are
    fenced: the last ISR member leaves the ISR for the ELR, and nobody leads."""
    shrink(h, 1)
    fence(h, 2)
    fence(h, 3)
    fence(h, 1)
    partition = h.partition("t")
    assert partition.isr == () and partition.leader == NO_LEADER
    assert sorted(partition.elr) == [1, 2, 3] and partition.last_known_elr == ()
    check_invariants(h.image)


def answer(h: Harness, broker_id: int, last_epoch: int, end_offset: int) -> None:
    h.controller.replica_log_info(
        ReplicaLogInfoResponse(
            broker_id,
            h.epochs[broker_id],
            (ReplicaLogInfo(h.topic_id("t"), 0, last_epoch, end_offset),),
        )
    )


def asked(h: Harness) -> dict[int, tuple[tuple[str, int], ...]]:
    return {
        r.broker_id: r.partitions for r in h.controller.replica_log_info_requests(h.clock.now_ms)
    }


def test_the_last_isr_member_moves_to_the_elr_and_leads_again_after_a_clean_restart() -> None:
    h = harness()
    every_member_down(h)
    restart(h, 1, clean=True)
    partition = h.partition("t")
    assert partition.leader == 1 and partition.isr == (1,)
    check_invariants(h.image)


def test_the_last_isr_member_back_from_an_unclean_shutdown_is_not_elected() -> None:
    h = harness()
    every_member_down(h)
    restart(h, 1, clean=False)  # it may have lost records it had acknowledged
    partition = h.partition("t")
    assert partition.leader == NO_LEADER
    assert 1 not in partition.elr and partition.last_known_elr == (1,)
    restart(h, 2, clean=True)  # an ELR member that lost nothing leads, cleanly
    partition = h.partition("t")
    assert partition.leader == 2 and partition.isr == (2,)
    check_invariants(h.image)


def test_unclean_recovery_elects_the_longest_log_once_every_candidate_answered() -> None:
    h = harness()
    every_member_down(h)
    for broker in (1, 2, 3):
        restart(h, broker, clean=False)
    partition = h.partition("t")
    assert partition.isr == () and partition.elr == () and partition.leader == NO_LEADER
    assert sorted(partition.last_known_elr) == [1, 2, 3]
    tp = ((h.topic_id("t"), 0),)
    assert asked(h) == {1: tp, 2: tp, 3: tp}
    assert asked(h) == {}  # asked again only after a while
    answer(h, 1, 0, 100)
    answer(h, 3, 1, 90)  # a later epoch beats a longer log
    h.tick()
    assert h.partition("t").leader == NO_LEADER  # Balanced: broker 2 has not answered
    # An answer of another incarnation than the registered one is ignored.
    h.controller.replica_log_info(
        ReplicaLogInfoResponse(2, h.epochs[2] - 1, (ReplicaLogInfo(h.topic_id("t"), 0, 1, 500),))
    )
    h.tick()
    assert h.partition("t").leader == NO_LEADER
    h.clock.advance(1000)
    assert asked(h) == {2: tp}
    answer(h, 2, 1, 80)
    h.tick()
    partition = h.partition("t")
    assert partition.leader == 3 and partition.isr == (3,)
    check_invariants(h.image)


def test_aggressive_recovery_elects_on_the_first_answer_and_none_never_asks() -> None:
    h = harness(config=ControllerConfig(unclean_recovery_strategy="Aggressive"))
    every_member_down(h)
    for broker in (1, 2, 3):
        restart(h, broker, clean=False)
    answer(h, 2, 0, 10)
    h.tick()
    assert h.partition("t").leader == 2
    h = harness(config=ControllerConfig(unclean_recovery_strategy="None"))
    every_member_down(h)
    for broker in (1, 2, 3):
        restart(h, broker, clean=False)
    assert asked(h) == {}
    answer(h, 2, 0, 10)
    h.tick()
    assert h.partition("t").leader == NO_LEADER


def test_unclean_recovery_asks_every_replica_and_elects_one_outside_the_last_known_elr() -> None:
    """Seed 9700852 of the simulation: broker 3 leaves the ISR while it keeps
    ``min.insync.replicas`` members (it is not eligible), then 2 and last 1 are fenced
    and both come back from power losses (last known ELR [2, 1], ISR and ELR empty).
    Broker 3 runs on, unfenced, with the longest log: recovery asks it too, waits for
    its answer (an active replica answers at once) and elects it over the shorter logs
    of the last known ELR."""
    h = harness()
    fence(h, 3)
    partition = h.partition("t")
    assert partition.isr == (1, 2) and partition.elr == ()
    fence(h, 2)
    fence(h, 1)
    restart(h, 2, clean=False)
    restart(h, 1, clean=False)
    h.heartbeat(3)  # broker 3 reaches the controller again and is unfenced
    assert not h.broker(3).fenced
    partition = h.partition("t")
    assert partition.isr == () and partition.elr == () and partition.leader == NO_LEADER
    assert sorted(partition.last_known_elr) == [1, 2]
    tp = ((h.topic_id("t"), 0),)
    assert asked(h) == {1: tp, 2: tp, 3: tp}
    answer(h, 2, 0, 112)
    answer(h, 1, 0, 129)
    h.tick()
    assert h.partition("t").leader == NO_LEADER  # Balanced: active broker 3 has not answered
    answer(h, 3, 0, 133)
    h.tick()
    partition = h.partition("t")
    assert partition.leader == 3 and partition.isr == (3,)
    check_invariants(h.image)
