"""Group coordinators inside the whole-cluster simulation: committed offsets on the real
brokers, sessions with the real controller; the stale-coordinator bug put back is found
(docs/simulation.md, "Group coordinators in the whole cluster")."""

from __future__ import annotations

from dataclasses import replace

import group_clients
import pytest
from highwater.controller import coordinators
from sim_cluster import Fault, Scenario, Simulation, SimulationFailure

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
"""The seed (its scenario, network and clients) of the balancing move off a paused, live
coordinator: issue 20's short seed 1190, with its story's two faults alone."""


def handover_scenario() -> Scenario:
    """g1 is killed (its partition moves to g2 once its session expires) and comes back
    while g2 is paused for less than its session, so g2 is live, holds both partitions and
    has requests queued; the controller, balancing, moves one to g1. Short seed 1190 told
    this story with g2's pause running past the heal, which the heal used to leave in
    force for what g2 had put off; a heal now ends every pause, so the story is planned
    here, within the faults."""
    scenario = Scenario.from_seed(HANDOVER_SEED, chaos_ms=5_000, groups=True)
    return replace(
        scenario,
        chaos_ms=8_000,
        faults=(
            Fault(2_000, "crash", ("g1",), 2_500, "kill"),
            Fault(4_200, "pause", ("g2",), 1_300),
        ),
    )


def test_a_partition_moved_off_a_paused_coordinator_waits_until_it_let_it_go() -> None:
    """Issue 20: g1 comes back while g2, paused with its lease still valid, owns the
    partition the controller moves to balance; the controller revokes it from g2 and gives
    it to g1 only once g2 has let it go or its session expired. Before, g1 got it at once
    and answered a newer offset while g2 resumed and answered a queued OffsetFetch from its
    cache (85 and 81 in short seed 1190)."""
    result = Simulation(HANDOVER_SEED, handover_scenario()).run()
    assert result.coordinator_revocations >= 1
    assert result.offset_fetches > 100


def test_finds_a_partition_moved_off_a_live_coordinator_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule taken out (a partition goes straight from a live coordinator to the next
    owner, as before the fix): the paused coordinator serves a stale offset."""
    monkeypatch.setattr(coordinators, "_leaves_at_once", lambda *_: True)
    with pytest.raises(SimulationFailure) as failure:
        Simulation(HANDOVER_SEED, handover_scenario()).run()
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
