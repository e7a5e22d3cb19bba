"""Group coordinators inside the whole-cluster simulation: committed offsets on the real
brokers, sessions with the real controller; the stale-coordinator bug put back is found
(docs/simulation.md, "Group coordinators in the whole cluster")."""

from __future__ import annotations

import group_clients
import pytest
from highwater.controller import coordinators
from sim_cluster import Scenario, Simulation, SimulationFailure

GROUP_SEEDS = (1, 3)
"""Whole schedules with groups in the suite (``make simulate`` runs them in the odd seeds)."""


def test_coordinators_in_the_cluster_keep_every_invariant() -> None:
    commits = fetches = moves = 0
    for seed in GROUP_SEEDS:
        simulation = Simulation(seed, Scenario.from_seed(seed, groups=True))
        result = simulation.run()
        assert result.acknowledged > 100
        commits += result.commits
        fetches += result.offset_fetches
        moves += result.coordinator_moves
    assert commits > 100
    assert fetches > 500
    assert moves >= 2  # the controller moved partitions between coordinators


def test_a_coordinator_whose_lease_lapsed_takes_its_partition_back_in_a_new_epoch() -> None:
    """Issue 20, short seed 1118: g2 is paused past its session while the controllers lose
    and elect a leader (the new active controller starts every session afresh), so nobody
    expires it; its lease lapses and it stops serving partition 1, still its own in epoch
    0. Taking it over again in epoch 0 restarted the producer sequence at 0 and the broker
    refused it for good; g2 registers as a new incarnation and serves it in epoch 1."""
    seed = 1118
    result = Simulation(seed, Scenario.from_seed(seed, chaos_ms=5_000, groups=True)).run()
    assert result.reincarnations >= 1
    assert result.commits > 0


HANDOVER_SEED = 1190
"""Short seed (5 s of faults) of the balancing move off a paused, live coordinator."""


def test_a_partition_moved_off_a_paused_coordinator_waits_until_it_let_it_go() -> None:
    """Issue 20, short seed 1190: g1 comes back as a new incarnation while g2, paused with
    its lease still valid, owns partition 1; the controller, balancing, revokes partition 1
    from g2 and gives it to g1 only once g2 has let it go or its session expired. Before,
    g1 got it at once and answered 85 while g2 resumed and answered a queued OffsetFetch
    from its cache: 81."""
    simulation = Simulation(
        HANDOVER_SEED, Scenario.from_seed(HANDOVER_SEED, chaos_ms=5_000, groups=True)
    )
    result = simulation.run()
    assert result.coordinator_revocations >= 1
    assert result.offset_fetches > 100


def test_finds_a_partition_moved_off_a_live_coordinator_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule taken out (a partition goes straight from a live coordinator to the next
    owner, as before the fix): the paused coordinator of seed 1190 serves a stale offset."""
    monkeypatch.setattr(coordinators, "_leaves_at_once", lambda *_: True)
    with pytest.raises(SimulationFailure) as failure:
        Simulation(
            HANDOVER_SEED, Scenario.from_seed(HANDOVER_SEED, chaos_ms=5_000, groups=True)
        ).run()
    assert "OffsetFetch" in failure.value.reason


def test_finds_a_deposed_coordinator_serving_from_its_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stale-coordinator story put back: a coordinator paused past its session keeps
    serving OffsetFetch from its cache when it resumes, before the metadata tells it its
    partitions moved; the new owner has acknowledged newer commits meanwhile."""
    monkeypatch.setattr(group_clients, "LEASE_CHECKED", False)
    for seed in range(0, 4):
        try:
            Simulation(seed, Scenario.from_seed(seed, groups=True)).run()
        except SimulationFailure as failure:
            assert "OffsetFetch" in failure.reason
            assert "--groups on" in str(failure)
            return
    pytest.fail("no seed of 4 found a paused coordinator serving a stale offset")
