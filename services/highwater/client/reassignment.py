"""Reassignment plans: Kafka's JSON file of target replicas, and a balanced plan for a broker list.

The plan file is the one ``kafka-reassign-partitions`` reads and writes::

    {"version": 1, "partitions": [{"topic": "orders", "partition": 0, "replicas": [101, 102, 104]}]}

:func:`propose_plan` spreads each topic's partitions over the brokers given, keeping its
replication factor, with the controller's rack-aware placement (preferred leaders round
robin, followers on other racks first), as ``kafka-reassign-partitions --generate`` does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from highwater.errors import HighwaterError
from highwater.metadata.placement import PlacementBroker, place_replicas
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "Assignment",
    "ReassignmentPlanError",
    "format_plan",
    "parse_plan",
    "propose_plan",
]

Assignment = dict[tuple[str, int], tuple[int, ...]]
"""``(topic, partition)`` -> replicas, preferred leader first."""

PLAN_VERSION = 1


class ReassignmentPlanError(HighwaterError):
    """A plan file that is not a reassignment plan, or a plan that cannot be made."""

    code = ErrorCode.INVALID_REQUEST


def parse_plan(text: str) -> Assignment:
    """The assignment a plan file holds; :class:`ReassignmentPlanError` naming what is
    wrong (not JSON, a missing or mistyped field, a partition twice, no replicas)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReassignmentPlanError(f"the plan is not JSON: {e}") from None
    if not isinstance(document, dict) or not isinstance(document.get("partitions"), list):
        raise ReassignmentPlanError('the plan needs a "partitions" list')
    version = document.get("version", PLAN_VERSION)
    if version != PLAN_VERSION:
        raise ReassignmentPlanError(f"plan version {version!r} is not {PLAN_VERSION}")
    plan: Assignment = {}
    for index, entry in enumerate(document["partitions"]):
        where = f"partitions[{index}]"
        if not isinstance(entry, dict):
            raise ReassignmentPlanError(f"{where} is not an object")
        topic, partition, replicas = (entry.get(k) for k in ("topic", "partition", "replicas"))
        if not isinstance(topic, str) or not topic:
            raise ReassignmentPlanError(f'{where}: "topic" must be a topic name')
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise ReassignmentPlanError(f'{where}: "partition" must be a partition number')
        if (
            not isinstance(replicas, list)
            or not replicas
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in replicas)
        ):
            raise ReassignmentPlanError(f'{where}: "replicas" must be a list of broker ids')
        if len(set(replicas)) != len(replicas):
            raise ReassignmentPlanError(f"{where}: broker ids {replicas} repeat")
        if (topic, partition) in plan:
            raise ReassignmentPlanError(f"{where}: {topic}-{partition} is in the plan twice")
        plan[(topic, partition)] = tuple(replicas)
    return plan


def format_plan(assignment: Mapping[tuple[str, int], Sequence[int]]) -> str:
    """``assignment`` as a plan file, partitions in order."""
    entries: list[dict[str, Any]] = [
        {"topic": topic, "partition": partition, "replicas": list(replicas)}
        for (topic, partition), replicas in sorted(assignment.items())
    ]
    return json.dumps({"version": PLAN_VERSION, "partitions": entries})


def propose_plan(
    current: Mapping[tuple[str, int], Sequence[int]],
    brokers: Iterable[PlacementBroker],
    *,
    seed: int = 0,
) -> Assignment:
    """Each topic of ``current`` laid out anew over ``brokers`` with its replication
    factor (:class:`ReassignmentPlanError` when a topic has more replicas than brokers)."""
    pool = sorted(brokers, key=lambda b: b.broker_id)
    if not pool:
        raise ReassignmentPlanError("the broker list is empty")
    by_topic: dict[str, list[int]] = {}
    for topic, partition in current:
        by_topic.setdefault(topic, []).append(partition)
    rng = random.Random(seed)
    plan: Assignment = {}
    for topic in sorted(by_topic):
        partitions = sorted(by_topic[topic])
        factor = len(current[(topic, partitions[0])])
        if factor > len(pool):
            raise ReassignmentPlanError(
                f"{topic} has {factor} replicas per partition and the broker list only "
                f"{len(pool)} brokers"
            )
        placed = place_replicas(pool, len(partitions), factor, rng)
        plan.update({(topic, p): replicas for p, replicas in zip(partitions, placed, strict=True)})
    return plan
