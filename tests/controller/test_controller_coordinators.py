"""Producer-id blocks and group-coordinator registration with ``__consumer_offsets`` assignment."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
from controller_helpers import NONE, Harness
from highwater.controller import ControllerConfig, ControllerResult, assign_coordinators
from highwater.controller.messages import (
    AllocateProducerIdsRequest,
    RegisterCoordinatorRequest,
    RegisterCoordinatorResponse,
    UnregisterCoordinatorRequest,
)
from highwater.metadata import (
    CoordinatorAssignment,
    CoordinatorAssignmentRecord,
    ProducerIdsRecord,
    RegisterCoordinatorRecord,
)
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import given


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
        RegisterCoordinatorRequest(coordinator_id, f"{incarnation}-{coordinator_id}")
    )


def owners(h: Harness) -> Counter[int]:
    return Counter(a.coordinator_id for a in h.image.coordinators.assignments.values())


def test_coordinators_share_the_offsets_partitions() -> None:
    h = Harness(ControllerConfig(offsets_topic_num_partitions=10))
    first = register(h, 1)
    assert isinstance(first.records[0], RegisterCoordinatorRecord)
    assert first.response.registration_epoch == 0
    assignments = [r for r in first.records if isinstance(r, CoordinatorAssignmentRecord)]
    assert assignments == [CoordinatorAssignmentRecord(p, 1, 0) for p in range(10)]
    h.commit(first)
    h.commit(register(h, 2))
    assert owners(h) == {1: 5, 2: 5}
    moved = [p for p, a in h.image.coordinators.assignments.items() if a.coordinator_id == 2]
    assert all(h.image.coordinators.assignments[p].coordinator_epoch == 1 for p in moved)
    h.commit(register(h, 3))
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
    assert missing.response.error == ErrorCode.INVALID_REQUEST


def test_the_offsets_topic_decides_the_partition_count() -> None:
    h = Harness(ControllerConfig(offsets_topic_num_partitions=10))
    h.start_brokers([1])
    h.create_topic("__consumer_offsets", 4, 1)
    h.commit(register(h, 1))
    assert sorted(h.image.coordinators.assignments) == [0, 1, 2, 3]


def test_coordinator_registration_errors() -> None:
    h = Harness(ControllerConfig(cluster_id="c"))
    bad = h.controller.register_coordinator(RegisterCoordinatorRequest(1, "i", cluster_id="d"))
    assert bad.response.error == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert h.controller.register_coordinator(
        RegisterCoordinatorRequest(-1, "i")
    ).response.error == (ErrorCode.INVALID_REQUEST)
    assert h.controller.register_coordinator(RegisterCoordinatorRequest(1, "")).response.error == (
        ErrorCode.INVALID_REQUEST
    )
    assert register(h, 1).response.error == NONE


@given(
    st.integers(1, 60),
    st.lists(st.integers(0, 6), max_size=5, unique=True),
    st.dictionaries(st.integers(0, 59), st.tuples(st.integers(-1, 8), st.integers(0, 3))),
)
def test_assignment_is_balanced_sticky_and_fencing(
    partitions: int, coordinators: list[int], current_raw: dict[int, tuple[int, int]]
) -> None:
    current = {
        p: CoordinatorAssignment(owner, epoch)
        for p, (owner, epoch) in current_raw.items()
        if p < partitions
    }
    records = assign_coordinators(partitions, coordinators, current)
    result = dict(current)
    for record in records:
        previous = current.get(record.partition_id)
        expected_epoch = 0 if previous is None else previous.coordinator_epoch + 1
        assert record.coordinator_epoch == expected_epoch
        result[record.partition_id] = CoordinatorAssignment(
            record.coordinator_id, record.coordinator_epoch
        )
    if not coordinators:
        assert all(a.coordinator_id == -1 for a in result.values())
        return
    assert sorted(result) == list(range(partitions))
    counts = Counter(a.coordinator_id for a in result.values())
    assert set(counts) <= set(coordinators)
    loads = [counts.get(c, 0) for c in coordinators]
    assert max(loads) - min(loads) <= 1
    # Sticky: a partition kept by a live owner whose share allowed it is not moved.
    for record in records:
        previous = current.get(record.partition_id)
        if previous is not None and previous.coordinator_id in coordinators:
            assert counts[previous.coordinator_id] >= partitions // len(coordinators)
