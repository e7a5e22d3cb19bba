"""Producer-id blocks; group coordinators: registration, heartbeats, session expiry, and
the ``__consumer_offsets`` topic and its assignment."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
from controller_helpers import NONE, Harness, check_invariants
from highwater.controller import (
    ControllerConfig,
    ControllerResult,
    QuorumController,
    assign_coordinators,
)
from highwater.controller_api.messages import (
    AllocateProducerIdsRequest,
    CoordinatorHeartbeatRequest,
    CoordinatorHeartbeatResponse,
    CreatePartitionsRequest,
    CreatePartitionsTopic,
    DeleteTopicsRequest,
    RegisterCoordinatorRequest,
    RegisterCoordinatorResponse,
    UnregisterCoordinatorRequest,
)
from highwater.metadata import (
    CONSUMER_OFFSETS_TOPIC,
    NO_LEADER,
    BrokerEndpoint,
    CoordinatorAssignment,
    CoordinatorAssignmentRecord,
    ProducerIdsRecord,
    RegisterCoordinatorRecord,
    UnregisterCoordinatorRecord,
    load_snapshot,
    snapshot_records,
)
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import example, given


def test_producer_ids_come_in_blocks_of_1000() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    first = h.controller.allocate_producer_ids(AllocateProducerIdsRequest(1, h.epochs[1]))
    assert first.records == [ProducerIdsRecord(1, h.epochs[1], 1000)]
    assert (first.response.producer_id_start, first.response.producer_id_len) == (0, 1000)
    h.commit(first)
    second = h.commit(
        h.controller.allocate_producer_ids(AllocateProducerIdsRequest(2, h.epochs[2]))
    )
    assert second.producer_id_start == 1000
    assert h.image.next_producer_id == 2000
    stale = h.controller.allocate_producer_ids(AllocateProducerIdsRequest(2, h.epochs[2] + 1))
    assert stale.response.error == ErrorCode.STALE_BROKER_EPOCH and not stale.records
    unknown = h.controller.allocate_producer_ids(AllocateProducerIdsRequest(9, 0))
    assert unknown.response.error == ErrorCode.STALE_BROKER_EPOCH


def register(
    h: Harness, coordinator_id: int, incarnation: str = "a"
) -> ControllerResult[RegisterCoordinatorResponse]:
    return h.controller.register_coordinator(
        RegisterCoordinatorRequest(
            coordinator_id,
            f"{incarnation}-{coordinator_id}",
            (BrokerEndpoint("PLAINTEXT", f"coordinator-{coordinator_id}", 9094),),
        ),
        h.clock.now_ms,
    )


def owners(h: Harness) -> Counter[int]:
    return Counter(a.coordinator_id for a in h.image.coordinators.assignments.values())


def hand_over(h: Harness) -> None:
    """Every registered coordinator heartbeats with the store's offset (its image has every
    record): the partitions revoked from it go to their next owners."""
    for c, registration in sorted(h.image.cluster.coordinators.items()):
        beat(h, c, registration.registration_epoch)


def test_coordinators_share_the_offsets_partitions() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=10, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    first = register(h, 1)
    assert isinstance(first.records[0], RegisterCoordinatorRecord)
    assert first.response.registration_epoch == h.image.offset + 1
    assignments = [r for r in first.records if isinstance(r, CoordinatorAssignmentRecord)]
    assert assignments == [CoordinatorAssignmentRecord(p, 1, 0) for p in range(10)]
    h.commit(first)
    # Balancing takes partitions from the live coordinator 1: revoked first (epoch 1),
    # given to 2 (epoch 2) once 1's heartbeat shows its image has the revocation.
    h.commit(register(h, 2))
    assert owners(h) == {1: 5, NO_LEADER: 5}
    revoked = [p for p, a in h.image.coordinators.assignments.items() if a.revoked_from == 1]
    assert len(revoked) == 5
    hand_over(h)
    assert owners(h) == {1: 5, 2: 5}
    assert all(h.image.coordinators.assignments[p].coordinator_epoch == 2 for p in revoked)
    h.commit(register(h, 3))
    hand_over(h)
    assert sorted(owners(h).values()) == [3, 3, 4]
    # A retried registration changes nothing.
    assert register(h, 3).records == []
    # A new incarnation keeps its partitions with a new coordinator epoch.
    before = dict(h.image.coordinators.assignments)
    restart = register(h, 3, incarnation="b")
    h.commit(restart)
    for p, assignment in h.image.coordinators.assignments.items():
        if assignment.coordinator_id == 3:
            assert assignment.coordinator_epoch == before[p].coordinator_epoch + 1
        else:
            assert assignment == before[p]
    # Unregistering moves its partitions to the others.
    h.commit(h.controller.unregister_coordinator(UnregisterCoordinatorRequest(3)))
    assert h.image.coordinator(3) is None
    assert owners(h) == {1: 5, 2: 5}
    missing = h.controller.unregister_coordinator(UnregisterCoordinatorRequest(3))
    assert missing.response.error == ErrorCode.BROKER_ID_NOT_REGISTERED and not missing.records
    # The last one leaving leaves the partitions unassigned, with new epochs.
    h.commit(h.controller.unregister_coordinator(UnregisterCoordinatorRequest(1)))
    h.commit(h.controller.unregister_coordinator(UnregisterCoordinatorRequest(2)))
    assert set(owners(h)) == {NO_LEADER}
    assert h.replayed() == h.image


def test_unregister_checks_the_registration_epoch() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=4, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    old = h.commit(register(h, 1)).registration_epoch
    new = h.commit(register(h, 1, incarnation="b")).registration_epoch
    assert new > old
    late = h.controller.unregister_coordinator(UnregisterCoordinatorRequest(1, old))
    assert late.response.error == ErrorCode.STALE_BROKER_EPOCH and not late.records
    h.commit(h.controller.unregister_coordinator(UnregisterCoordinatorRequest(1, new)))
    assert h.image.coordinator(1) is None


def offsets_topic(h: Harness) -> tuple[int, int, dict[str, str]]:
    """(partitions, replication factor, configs) of __consumer_offsets."""
    topic = h.image.topic(CONSUMER_OFFSETS_TOPIC)
    assert topic is not None
    factors = {len(p.replicas) for p in topic.partitions.registrations()}
    assert len(factors) == 1
    return len(topic.partitions), factors.pop(), dict(h.image.topic_config(CONSUMER_OFFSETS_TOPIC))


def test_the_offsets_topic_is_created_with_the_first_coordinator_one_broker() -> None:
    h = Harness(ControllerConfig(offsets_topic_replication_factor=1))
    h.start_brokers([1])
    result = register(h, 1)
    kinds = [type(r).__name__ for r in result.records]
    assert kinds[:2] == ["RegisterCoordinatorRecord", "TopicRecord"]
    h.commit(result)
    assert offsets_topic(h) == (
        50,
        1,
        {"cleanup.policy": "compact", "segment.bytes": "104857600", "min.insync.replicas": "1"},
    )
    assert h.image.log_config(CONSUMER_OFFSETS_TOPIC).cleanup_policy == ("compact",)
    assert sorted(h.image.coordinators.assignments) == list(range(50))
    assert owners(h) == {1: 50}
    check_invariants(h.image)


def test_the_offsets_topic_waits_for_enough_brokers_for_its_replication_factor() -> None:
    """Created with fewer replicas while brokers are still starting, it would keep them."""
    h = Harness()  # offsets.topic.replication.factor 3
    h.start_brokers([1, 2])
    h.commit(register(h, 1))
    h.tick()
    assert h.image.topic(CONSUMER_OFFSETS_TOPIC) is None
    assert not h.image.coordinators.assignments
    h.register(3)
    assert not h.heartbeat(3).is_fenced
    assert offsets_topic(h)[:2] == (50, 3)
    assert owners(h) == {1: 50}


def test_the_offsets_topic_with_three_and_five_brokers() -> None:
    for brokers, factor in ((3, 3), (5, 3)):
        h = Harness(seed=brokers)
        h.start_brokers(range(1, brokers + 1))
        h.commit(register(h, 1))
        partitions, rf, configs = offsets_topic(h)
        assert (partitions, rf, configs["min.insync.replicas"]) == (50, factor, "2")
        replicas = Counter(
            b
            for p in h.image.topic(CONSUMER_OFFSETS_TOPIC).partitions.registrations()  # type: ignore[union-attr]
            for b in p.replicas
        )
        assert max(replicas.values()) - min(replicas.values()) <= 1
    h = Harness(
        ControllerConfig(
            offsets_topic_num_partitions=6,
            offsets_topic_replication_factor=2,
            offsets_topic_segment_bytes=1 << 20,
        )
    )
    h.start_brokers([1, 2, 3])
    h.commit(register(h, 1))
    assert offsets_topic(h) == (
        6,
        2,
        {"cleanup.policy": "compact", "segment.bytes": "1048576", "min.insync.replicas": "2"},
    )


def test_the_offsets_topic_waits_for_an_active_broker() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=5, offsets_topic_replication_factor=1)
    )
    h.commit(register(h, 1))
    h.commit(register(h, 2))
    assert h.image.topic(CONSUMER_OFFSETS_TOPIC) is None
    assert not h.image.coordinators.assignments
    h.tick()
    assert h.image.topic(CONSUMER_OFFSETS_TOPIC) is None
    h.register(7)  # registered, still fenced: cannot host it yet
    assert h.image.topic(CONSUMER_OFFSETS_TOPIC) is None
    offset = h.image.offset
    assert not h.heartbeat(7).is_fenced
    # Unfencing, the topic and its assignment: one batch.
    assert h.store.batches[-1][0] == offset + 1
    assert offsets_topic(h)[:2] == (5, 1)
    assert owners(h) == {1: 3, 2: 2} or owners(h) == {1: 2, 2: 3}
    assert all(a.coordinator_epoch == 0 for a in h.image.coordinators.assignments.values())
    # Brokers alone do not make it.
    other = Harness()
    other.start_brokers([1, 2])
    other.tick()
    assert other.image.topic(CONSUMER_OFFSETS_TOPIC) is None


def test_tick_creates_a_missing_offsets_topic() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=3, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    # Written without the controller (as an older version would have): no topic.
    h.store.append([RegisterCoordinatorRecord(4, "c", h.image.offset + 1, (), None)])
    created = h.controller.tick(h.clock.now_ms)
    assert created.response.created_offsets_topic
    h.commit(created)
    assert offsets_topic(h)[:2] == (3, 1)
    assert owners(h) == {4: 3}
    quiet = h.controller.tick(h.clock.now_ms)  # nothing more to do
    assert not quiet.records and not quiet.response.created_offsets_topic


def test_users_cannot_create_or_delete_the_offsets_topic() -> None:
    h = Harness(ControllerConfig(offsets_topic_replication_factor=1))
    h.start_brokers([1])
    for name in (CONSUMER_OFFSETS_TOPIC, "__cluster_metadata"):
        refused = h.create_topic(name)
        assert refused.topics[0].error == ErrorCode.INVALID_REQUEST, refused
    clash = h.create_topic("__consumer.offsets")
    assert clash.topics[0].error == ErrorCode.INVALID_TOPIC_EXCEPTION
    h.commit(register(h, 1))
    topic_id = h.topic_id(CONSUMER_OFFSETS_TOPIC)
    for request in (
        DeleteTopicsRequest(names=(CONSUMER_OFFSETS_TOPIC,)),
        DeleteTopicsRequest(topic_ids=(topic_id,)),
    ):
        result = h.controller.delete_topics(request)
        assert result.response.topics[0].error == ErrorCode.INVALID_REQUEST
        assert not result.records
    assert h.image.topic(CONSUMER_OFFSETS_TOPIC) is not None


def test_assignment_follows_the_topics_partition_count() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=4, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    h.commit(register(h, 1))
    h.commit(register(h, 2))
    hand_over(h)
    assert sorted(h.image.coordinators.assignments) == [0, 1, 2, 3]
    # Growing the topic assigns the new partitions in the same batch.
    grown = h.controller.create_partitions(
        CreatePartitionsRequest((CreatePartitionsTopic(CONSUMER_OFFSETS_TOPIC, 6),))
    )
    assert grown.response.topics[0].error == NONE
    h.commit(grown)
    assert sorted(h.image.coordinators.assignments) == list(range(6))
    assert owners(h) == {1: 3, 2: 3}
    # Assignments past the topic's partitions (a topic smaller than they say) are dropped.
    h.store.append([CoordinatorAssignmentRecord(9, 1, 0)])
    h.commit(register(h, 3))
    hand_over(h)
    assert h.image.coordinator_assignment(9) == CoordinatorAssignment(NO_LEADER, 1)
    assert sorted(Counter(owners(h)).values()) == [1, 2, 2, 2]  # -1 holds partition 9


def test_coordinator_registration_errors() -> None:
    h = Harness(ControllerConfig(cluster_id="c"))
    now = h.clock.now_ms
    bad = h.controller.register_coordinator(RegisterCoordinatorRequest(1, "i", cluster_id="d"), now)
    assert bad.response.error == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert h.controller.register_coordinator(
        RegisterCoordinatorRequest(-1, "i"), now
    ).response.error == (ErrorCode.INVALID_REQUEST)
    assert h.controller.register_coordinator(
        RegisterCoordinatorRequest(1, ""), now
    ).response.error == (ErrorCode.INVALID_REQUEST)
    assert register(h, 1).response.error == NONE


# --- Coordinator liveness ----------------------------------------------------------------


def beat(
    h: Harness,
    coordinator_id: int,
    epoch: int,
    *,
    want_shutdown: bool = False,
    metadata_offset: int | None = None,
) -> CoordinatorHeartbeatResponse:
    """A heartbeat reporting ``metadata_offset`` (default: the store's, caught up)."""
    offset = h.image.offset if metadata_offset is None else metadata_offset
    return h.commit(
        h.controller.coordinator_heartbeat(
            CoordinatorHeartbeatRequest(coordinator_id, epoch, want_shutdown, offset),
            h.clock.now_ms,
        )
    )


def test_an_expired_coordinator_loses_its_partitions_to_the_live_ones() -> None:
    config = ControllerConfig(
        offsets_topic_num_partitions=12,
        offsets_topic_replication_factor=1,
        coordinator_session_timeout_ms=9000,
    )
    h = Harness(config)
    h.start_brokers([1])
    epochs = {c: h.commit(register(h, c)).registration_epoch for c in (1, 2, 3)}
    hand_over(h)
    assert owners(h) == {1: 4, 2: 4, 3: 4}
    before = dict(h.image.coordinators.assignments)
    for _ in range(4):
        h.clock.advance(2000)
        h.heartbeat_all()
        for c in (1, 2):
            response = beat(h, c, epochs[c])
            assert (response.error, response.is_fenced) == (NONE, False)
        h.tick()
    assert h.image.coordinator(3) is not None  # 8 s: not yet
    h.clock.advance(1000)
    h.heartbeat_all()
    beat(h, 1, epochs[1])
    beat(h, 2, epochs[2])
    result = h.controller.tick(h.clock.now_ms)
    assert result.response.expired_coordinators == (3,)
    assert result.records[0] == UnregisterCoordinatorRecord(3, epochs[3])
    h.commit(result)
    assert h.image.coordinator(3) is None
    assert owners(h) == {1: 6, 2: 6}
    for p, assignment in h.image.coordinators.assignments.items():
        if before[p].coordinator_id == 3:
            assert assignment.coordinator_epoch == before[p].coordinator_epoch + 1
        else:
            assert assignment == before[p]
    # Its next heartbeat tells it to register again.
    late = beat(h, 3, epochs[3])
    assert (late.error, late.is_fenced) == (ErrorCode.BROKER_ID_NOT_REGISTERED, True)
    # The same process registers again: a new registration epoch, a share of the
    # partitions back, each with a higher coordinator epoch than any it had.
    again = h.commit(register(h, 3))
    assert again.registration_epoch > epochs[3]
    hand_over(h)
    assert owners(h) == {1: 4, 2: 4, 3: 4}
    for p, assignment in h.image.coordinators.assignments.items():
        if assignment.coordinator_id == 3:
            assert assignment.coordinator_epoch > before[p].coordinator_epoch
    assert beat(h, 3, again.registration_epoch).error == NONE
    # The log replays, and a snapshot recreates the image.
    assert h.replayed() == h.image
    assert load_snapshot(list(snapshot_records(h.image)), h.image.offset, 0) == h.image


def test_coordinators_dying_together_move_their_partitions_once() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=9, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    epochs = {c: h.commit(register(h, c)).registration_epoch for c in (1, 2, 3)}
    h.clock.advance(9000)
    beat(h, 1, epochs[1])
    result = h.controller.tick(h.clock.now_ms)
    assert result.response.expired_coordinators == (2, 3)
    moved = [r for r in result.records if isinstance(r, CoordinatorAssignmentRecord)]
    assert len(moved) == 6 and len({r.partition_id for r in moved}) == 6
    h.commit(result)
    assert owners(h) == {1: 9}
    # With every coordinator gone, the partitions are unassigned.
    h.clock.advance(9000)
    h.tick()
    assert set(owners(h)) == {NO_LEADER}
    assert h.image.topic(CONSUMER_OFFSETS_TOPIC) is not None


def test_heartbeats_of_a_stale_registration_epoch() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=4, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    old = h.commit(register(h, 1)).registration_epoch
    new = h.commit(register(h, 1, incarnation="b")).registration_epoch
    stale = h.controller.coordinator_heartbeat(CoordinatorHeartbeatRequest(1, old), h.clock.now_ms)
    assert stale.response.error == ErrorCode.STALE_BROKER_EPOCH and stale.response.is_fenced
    assert not stale.records
    # The old incarnation's heartbeats do not keep the new one alive.
    h.clock.advance(5000)
    beat(h, 1, new)
    h.clock.advance(5000)
    beat(h, 1, old)
    h.tick()
    assert h.image.coordinator(1) is not None
    h.clock.advance(4000)
    beat(h, 1, old)
    h.tick()
    assert h.image.coordinator(1) is None
    unknown = beat(h, 9, 0)
    assert unknown.error == ErrorCode.BROKER_ID_NOT_REGISTERED and unknown.is_fenced


def test_a_coordinator_that_asks_to_shut_down_is_let_go() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=4, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    epochs = {c: h.commit(register(h, c)).registration_epoch for c in (1, 2)}
    result = h.controller.coordinator_heartbeat(
        CoordinatorHeartbeatRequest(2, epochs[2], want_shutdown=True), h.clock.now_ms
    )
    assert result.response == CoordinatorHeartbeatResponse(is_fenced=True, should_shut_down=True)
    assert result.records[0] == UnregisterCoordinatorRecord(2, epochs[2])
    h.commit(result)
    assert owners(h) == {1: 4}
    # A retry, or an old incarnation stopping, writes nothing and may stop.
    retry = h.controller.coordinator_heartbeat(
        CoordinatorHeartbeatRequest(2, epochs[2], want_shutdown=True), h.clock.now_ms
    )
    assert retry.response.should_shut_down and retry.response.error == NONE
    assert not retry.records
    stale = h.controller.coordinator_heartbeat(
        CoordinatorHeartbeatRequest(1, epochs[1] - 1, want_shutdown=True), h.clock.now_ms
    )
    assert stale.response.should_shut_down and not stale.records
    assert h.image.coordinator(1) is not None


def test_a_new_active_controller_gives_every_coordinator_a_full_session() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=4, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    h.commit(register(h, 1))
    h.clock.advance(60_000)
    # Another controller takes over the same log.
    successor = QuorumController(h.store.latest_image, h.config, seed=1)
    successor.activate(h.clock.now_ms)
    h.heartbeat_all()
    assert not successor.tick(h.clock.now_ms).response.expired_coordinators
    h.clock.advance(9000)
    assert successor.tick(h.clock.now_ms).response.expired_coordinators == (1,)


# --- Moving a partition off a live coordinator: revoke first, assign after -------------


def revocations(h: Harness) -> dict[int, int]:
    """partition -> the coordinator it is being taken from."""
    return {
        p: a.revoked_from
        for p, a in h.image.coordinators.assignments.items()
        if a.revoked_from is not None
    }


def test_a_partition_leaves_a_live_coordinator_only_after_it_let_it_go() -> None:
    """Issue 20, seed 1190: a coordinator paused with a request queued keeps its lease
    (and answers from its cache) until a session after its last heartbeat. A partition
    balanced off it while it lives is revoked, and gets its next owner only once the old
    owner's heartbeat shows an image with the revocation; expiry still moves at once."""
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=4, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    epochs = {1: h.commit(register(h, 1)).registration_epoch}
    before_move = h.image.offset
    second = register(h, 2)
    epochs[2] = second.response.registration_epoch
    moves = [r for r in second.records if isinstance(r, CoordinatorAssignmentRecord)]
    # Nobody is named the new owner yet: the partitions are revoked from 1, epochs + 1.
    assert {(r.coordinator_id, r.coordinator_epoch, r.revoked_from) for r in moves} == {
        (NO_LEADER, 1, 1)
    }
    h.commit(second)
    revoked = sorted(revocations(h))
    assert len(revoked) == 2
    h.tick()
    # Neither the new owner's heartbeat nor one of 1 from before the revocation moves them.
    beat(h, 2, epochs[2])
    beat(h, 1, epochs[1], metadata_offset=before_move)
    assert sorted(revocations(h)) == revoked
    # 1's image has the revocation: it serves them no more, and 2 gets them.
    release = h.controller.coordinator_heartbeat(
        CoordinatorHeartbeatRequest(1, epochs[1], metadata_offset=h.image.offset),
        h.clock.now_ms,
    )
    assert release.records == [CoordinatorAssignmentRecord(p, 2, 2) for p in revoked]
    h.commit(release)
    assert owners(h) == {1: 2, 2: 2}
    # A third coordinator: one partition is revoked from 1 or 2. Its old owner goes
    # silent; at the end of its session it is unregistered and the partition moves in the
    # same batch, with the others of the expired coordinator.
    epochs[3] = h.commit(register(h, 3)).registration_epoch
    ((partition, silent),) = revocations(h).items()
    alive = 3 - silent
    for _ in range(5):
        h.clock.advance(2_000)
        beat(h, alive, epochs[alive], metadata_offset=-1)
        beat(h, 3, epochs[3])
        h.tick()
    assert h.image.coordinator(silent) is None
    assert partition not in revocations(h)
    assert h.image.coordinator_assignment(partition).coordinator_id in (alive, 3)
    assert set(owners(h)) == {alive, 3}
    assert h.replayed() == h.image


def test_a_new_active_controller_hands_over_the_revocations_in_flight() -> None:
    h = Harness(
        ControllerConfig(offsets_topic_num_partitions=4, offsets_topic_replication_factor=1)
    )
    h.start_brokers([1])
    first = h.commit(register(h, 1)).registration_epoch
    h.commit(register(h, 2))
    revoked = revocations(h)
    assert revoked and set(revoked.values()) == {1}
    # The snapshot keeps them; a controller taking over the log notes them from its image.
    assert load_snapshot(list(snapshot_records(h.image)), h.image.offset, 0) == h.image
    successor = QuorumController(h.store.latest_image, h.config, seed=1)
    successor.activate(h.clock.now_ms)
    early = successor.coordinator_heartbeat(
        CoordinatorHeartbeatRequest(1, first, metadata_offset=h.image.offset - 1), h.clock.now_ms
    )
    assert not early.records
    late = successor.coordinator_heartbeat(
        CoordinatorHeartbeatRequest(1, first, metadata_offset=h.image.offset), h.clock.now_ms
    )
    h.commit(late)
    assert not revocations(h) and owners(h) == {1: 2, 2: 2}


def _applied(
    current: dict[int, CoordinatorAssignment], records: list[CoordinatorAssignmentRecord]
) -> dict[int, CoordinatorAssignment]:
    """``records`` applied to ``current``, each with the epoch one higher (0 for a new one)."""
    result = dict(current)
    for record in records:
        previous = result.get(record.partition_id)
        assert record.coordinator_epoch == (
            0 if previous is None else previous.coordinator_epoch + 1
        )
        assert record.revoked_from is None or record.coordinator_id == NO_LEADER
        result[record.partition_id] = CoordinatorAssignment(
            record.coordinator_id, record.coordinator_epoch, record.revoked_from
        )
    return result


@given(
    st.integers(1, 60),
    st.lists(st.integers(0, 6), max_size=5, unique=True),
    st.dictionaries(
        st.integers(0, 59), st.tuples(st.integers(-1, 8), st.integers(0, 3), st.booleans())
    ),
    st.lists(st.integers(0, 6), max_size=2, unique=True),
)
@example(2, [0, 1], {0: (0, 0, False), 1: (0, 0, False)}, [])  # a move off a live owner
@example(3, [1, 2], {0: (1, 0, False), 1: (1, 1, True), 2: (1, 0, False)}, [])  # revoking
def test_assignment_is_balanced_sticky_and_fencing(
    partitions: int,
    coordinators: list[int],
    current_raw: dict[int, tuple[int, int, bool]],
    restarted_raw: list[int],
) -> None:
    current = {
        p: (
            CoordinatorAssignment(NO_LEADER, epoch, revoked_from=owner)
            if revoking and owner >= 0
            else CoordinatorAssignment(owner, epoch)
        )
        for p, (owner, epoch, revoking) in current_raw.items()
        if p < partitions
    }
    restarted = [c for c in restarted_raw if c in coordinators]
    records = assign_coordinators(partitions, coordinators, current, restarted=restarted)
    revoked = _applied(current, records)
    # Revoke first: no record names a new owner for a partition that a live coordinator
    # (the same incarnation) holds or has not let go yet.
    for record in records:
        before = current.get(record.partition_id)
        if before is None or record.coordinator_id == NO_LEADER:
            continue
        holder = before.coordinator_id if before.revoked_from is None else before.revoked_from
        if holder in coordinators and holder not in restarted:
            assert record.coordinator_id == holder
    # Every old owner lets its revoked partitions go: then they are assigned.
    released = {p for p, a in revoked.items() if a.revoked_from is not None}
    handed_over = assign_coordinators(partitions, coordinators, revoked, released=released)
    result = _applied(revoked, handed_over)
    if not coordinators:
        assert all(a.coordinator_id == -1 for a in result.values())
        return
    assert sorted(result) == list(range(partitions))
    assert not any(a.revoked_from is not None for a in result.values())
    counts = Counter(a.coordinator_id for a in result.values())
    assert set(counts) <= set(coordinators)
    loads = [counts.get(c, 0) for c in coordinators]
    assert max(loads) - min(loads) <= 1
    # Sticky: a partition kept by a live owner whose share allowed it is not moved.
    for p, before in current.items():
        if before.coordinator_id in coordinators and result[p].coordinator_id != (
            before.coordinator_id
        ):
            assert counts[before.coordinator_id] >= partitions // len(coordinators)
