"""Reassignment plan files (Kafka's JSON) and the balanced plan ``--generate`` proposes."""

from __future__ import annotations

from collections import Counter

import pytest
from highwater.client.reassignment import (
    ReassignmentPlanError,
    format_plan,
    parse_plan,
    propose_plan,
)
from highwater.metadata.placement import PlacementBroker
from hypothesis import given
from hypothesis import strategies as st


def test_a_plan_round_trips_in_kafkas_format() -> None:
    plan = {("b", 1): (3, 1), ("a", 0): (1, 2, 3)}
    text = format_plan(plan)
    assert text == (
        '{"version": 1, "partitions": [{"topic": "a", "partition": 0, "replicas": [1, 2, 3]}, '
        '{"topic": "b", "partition": 1, "replicas": [3, 1]}]}'
    )
    assert parse_plan(text) == plan


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"version": 2, "partitions": []}', "version 2"),
        ('{"partitions": [7]}', r"partitions\[0\] is not an object"),
        ('{"partitions": [{"topic": "", "partition": 0, "replicas": [1]}]}', '"topic"'),
        ('{"partitions": [{"topic": "a", "partition": true, "replicas": [1]}]}', '"partition"'),
        ('{"partitions": [{"topic": "a", "partition": 0, "replicas": ["1"]}]}', '"replicas"'),
    ],
)
def test_malformed_plans_name_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ReassignmentPlanError, match=message):
        parse_plan(text)


def test_a_proposal_spreads_each_topic_over_the_broker_list_with_its_replication_factor() -> None:
    current = {("orders", p): (1, 2, 3) for p in range(6)} | {("audit", 0): (3,)}
    brokers = [PlacementBroker(b, None) for b in (1, 2, 4, 5)]
    plan = propose_plan(current, brokers)
    assert set(plan) == set(current)
    assert all(len(plan[("orders", p)]) == 3 for p in range(6)) and len(plan[("audit", 0)]) == 1
    used = Counter(b for replicas in plan.values() for b in replicas)
    assert set(used) <= {1, 2, 4, 5}
    leaders = Counter(plan[("orders", p)][0] for p in range(6))
    assert max(leaders.values()) - min(leaders.values()) <= 1 and len(leaders) == 4
    with pytest.raises(ReassignmentPlanError, match="only 2 brokers"):
        propose_plan(current, brokers[:2])


@given(
    partitions=st.integers(1, 40),
    factor=st.integers(1, 3),
    brokers=st.integers(3, 8),
    seed=st.integers(0, 1000),
)
def test_every_proposal_is_balanced_within_one(
    partitions: int, factor: int, brokers: int, seed: int
) -> None:
    current = {("t", p): tuple(range(factor)) for p in range(partitions)}
    plan = propose_plan(current, [PlacementBroker(b, None) for b in range(brokers)], seed=seed)
    counts = Counter(b for replicas in plan.values() for b in replicas)
    assert all(len(set(r)) == factor for r in plan.values())
    loads = [counts.get(b, 0) for b in range(brokers)]
    assert max(loads) - min(loads) <= 1
