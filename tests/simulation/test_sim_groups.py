"""Group coordinators in the simulation: seeds hold; the stale-coordinator bug is found."""

from __future__ import annotations

import group_clients
import pytest
import sim_groups
from sim_groups import GroupInvariantViolation, run_seed


@pytest.mark.parametrize("seed", [1, 2])
def test_committed_offsets_never_move_back_through_coordinator_faults(seed: int) -> None:
    counts = run_seed(seed)
    assert counts["commits"] > 100
    assert counts["fetches"] > 100
    assert counts["moves"] >= 1  # a coordinator lost its partitions at least once


def test_stale_coordinator_without_its_lease_is_found_within_a_few_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_clients, "LEASE_CHECKED", False)
    for seed in range(12):
        try:
            run_seed(seed)
        except GroupInvariantViolation as e:
            assert "OffsetFetch" in str(e)
            return
    pytest.fail("no seed of 12 found a paused coordinator serving a stale offset")


def test_a_schedule_replays_exactly() -> None:
    first = sim_groups.GroupSimulation(3, trace=True)
    second = sim_groups.GroupSimulation(3, trace=True)
    assert first.run() == second.run()
    assert first.trace == second.trace
