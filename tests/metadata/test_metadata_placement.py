"""Replica placement: Kafka's rack-alternating order, rack diversity, balance within one."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import pytest
from highwater.metadata.placement import (
    InvalidReplicationFactorError,
    PlacementBroker,
    place_replicas,
    rack_alternated,
)
from hypothesis import given
from replica_balance import replica_balance


def test_rack_alternated_order_matches_kafka() -> None:
    # Kafka's AdminUtils example: racks rack1 (0, 1, 2), rack2 (3), rack3 (4, 5).
    brokers = [
        PlacementBroker(0, "rack1"),
        PlacementBroker(1, "rack1"),
        PlacementBroker(2, "rack1"),
        PlacementBroker(3, "rack2"),
        PlacementBroker(4, "rack3"),
        PlacementBroker(5, "rack3"),
    ]
    assert rack_alternated(brokers) == [0, 3, 4, 1, 5, 2]


def test_errors() -> None:
    brokers = [PlacementBroker(1), PlacementBroker(2)]
    with pytest.raises(InvalidReplicationFactorError, match="larger than 0"):
        place_replicas(brokers, 1, 0, random.Random(0))
    with pytest.raises(InvalidReplicationFactorError, match="only 2 broker"):
        place_replicas(brokers, 1, 3, random.Random(0))
    assert place_replicas(brokers, 0, 2, random.Random(0)) == []


@given(
    brokers=st.integers(1, 9),
    racks=st.integers(0, 3),
    partitions=st.integers(1, 40),
    factor=st.integers(1, 9),
    seed=st.integers(0, 2**32),
)
def test_balanced_within_one_and_rack_diverse(
    brokers: int, racks: int, partitions: int, factor: int, seed: int
) -> None:
    """With no racks, or racks of equal size, replicas and preferred leaders per broker are
    within one of each other; replicas of a partition span as many racks as they can."""
    if racks:
        brokers = max(racks, brokers - brokers % racks)  # racks of equal size
    factor = min(factor, brokers)
    fleet = [PlacementBroker(b, f"r{b % racks}" if racks else None) for b in range(brokers)]
    assignment = place_replicas(fleet, partitions, factor, random.Random(seed))
    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(replicas) == factor == len(set(replicas))
        if racks:
            assert len({b % racks for b in replicas}) == min(factor, racks)
    assert replica_balance(assignment, range(brokers)) <= (1, 1)
    assert place_replicas(fleet, partitions, factor, random.Random(seed)) == assignment


@given(
    brokers=st.integers(2, 8),
    first=st.integers(1, 12),
    more=st.integers(1, 12),
    factor=st.integers(1, 3),
    seed=st.integers(0, 1000),
)
def test_growing_a_topic_keeps_its_balance(
    brokers: int, first: int, more: int, factor: int, seed: int
) -> None:
    factor = min(factor, brokers)
    fleet = [PlacementBroker(b) for b in range(brokers)]
    rng = random.Random(seed)
    existing = place_replicas(fleet, first, factor, rng)
    grown = existing + place_replicas(fleet, more, factor, rng, existing=existing)
    assert replica_balance(grown, range(brokers)) <= (1, 1)


def test_uneven_racks_keep_rack_diversity() -> None:
    fleet = [PlacementBroker(0, "a"), PlacementBroker(1, "a"), PlacementBroker(2, "a")]
    fleet.append(PlacementBroker(3, "b"))
    assignment = place_replicas(fleet, 8, 2, random.Random(1))
    for replicas in assignment:
        assert 3 in replicas  # the only broker of rack b is in every partition
