"""How evenly an assignment spreads replicas and preferred leaders over the brokers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


def replica_balance(
    assignment: Iterable[tuple[int, ...]], brokers: Iterable[int]
) -> tuple[int, int]:
    """(max - min) of replicas per broker and of preferred leaders per broker."""
    replicas: Counter[int] = Counter({b: 0 for b in brokers})
    leaders: Counter[int] = Counter({b: 0 for b in replicas})
    for replica_list in assignment:
        leaders[replica_list[0]] += 1
        for broker in replica_list:
            replicas[broker] += 1
    return (
        max(replicas.values()) - min(replicas.values()),
        max(leaders.values()) - min(leaders.values()),
    )
