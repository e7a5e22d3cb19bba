"""The seeded group simulation: hundreds of schedules of consumers and faults against the core.

Each schedule checks, after every event, Kafka's group state transitions, one owner per
partition in each generation, the refusal of stale generations and of commits from outside
the current generation, that acknowledged offsets are in the log, and that a silent member's
session expires into a rebalance; once the faults stop, the group must settle (see
``group_simulation``). A failure prints its seed and transcript;
``HIGHWATER_GROUP_SEED=N pytest tests/coordinator/test_group_simulation.py -k traced -s``
replays that seed alone, printing every event.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from group_simulation import Scenario, SimulationFailure, run_schedule

SCHEDULES = int(os.environ.get("HIGHWATER_GROUP_SCHEDULES", "300"))
CHUNK = 50


@pytest.mark.parametrize("first_seed", range(0, SCHEDULES, CHUNK))
def test_random_schedules(first_seed: int) -> None:
    failures: list[SimulationFailure] = []
    for seed in range(first_seed, min(first_seed + CHUNK, SCHEDULES)):
        try:
            run_schedule(seed)
        except SimulationFailure as failure:
            failures.append(failure)
    assert not failures, f"{len(failures)} failing schedules; the first:\n{failures[0]}"


def test_one_schedule_traced() -> None:
    """Replays ``HIGHWATER_GROUP_SEED`` (default 0), printing every event: how a failing seed
    is studied."""
    result = run_schedule(int(os.environ.get("HIGHWATER_GROUP_SEED", "0")), trace=True)
    print(result.summary())


def test_a_schedule_replays_identically_from_its_seed() -> None:
    first, second = run_schedule(7), run_schedule(7)
    assert first == second


def test_the_schedules_exercise_what_they_check() -> None:
    """The invariants are not checked in vain: across seeds, stale generations are refused,
    sessions expire, coordinators fail over, static members restart, writes fail."""
    totals: Counter[str] = Counter()
    for seed in range(60):
        totals.update(run_schedule(seed).counts)
    for what in (
        "rebalances",
        "commits accepted",
        "stale generations refused",
        "stalls",
        "restarts",
        "leaves",
        "failovers",
        "failed writes",
        "Stable -> PreparingRebalance",
        "CompletingRebalance -> PreparingRebalance",
        "PreparingRebalance -> Empty",
        "Stable -> Dead",
    ):
        assert totals[what] > 0, f"no schedule had {what}: {sorted(totals.items())}"
    scenarios = [Scenario.from_seed(seed) for seed in range(60)]
    assert sum(s.static_consumers > 0 for s in scenarios) > 5


def test_a_join_phase_no_member_rejoined_by_waits_another_rebalance_timeout() -> None:
    """Seed 27012: three static members stall one after another, each past its session.
    At the join deadline after the first one's session ends no member has rejoined (the
    other two are silent as well), so the join phase waits another rebalance timeout, as
    Kafka's ``onCompleteJoin`` does, and the next generation forms at the deadline after a
    resumed member rejoins. The checker's bound allows that wait only while a static
    member may still hold its place and no consumer could have rejoined; the schedule
    still ends with the group settled in a later generation."""
    result = run_schedule(27012)
    assert result.scenario.static_consumers == result.scenario.consumers == 3
    assert result.counts["stalls"] == 3
    assert result.generation > 1
