"""The deterministic cluster simulation: thousands of seeded fault schedules, targeted scenarios.

Every schedule checks, after every event: at most one leader per epoch; one vote per node
id and epoch (a wiped replica's new incarnation included); a new leader holds
every committed entry; a committed entry is durable on a majority of voters when it is
first reported committed, and never changes on any replica that holds it; replicas agree
up to their high watermarks; state machines (and the snapshots they load) hold exactly the
committed values; acknowledged proposals are committed where they were acknowledged. Once
the faults stop (every replica up, no loss, no partition) a leader must be elected and a
new proposal committed within a bounded simulated time, and every replica, the observer
included, must then catch up.

A failure names its seed: ``python -m tests.raft.simulation --seed N --trace`` replays it,
and so does ``HIGHWATER_RAFT_SEED=N pytest tests/raft/test_raft_simulation.py``.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
from highwater.raft.node import JoinRequest, RaftNode
from highwater.raft.state import LeaderState, Role
from highwater.raft.voter_set import Voter, VoterSet
from simulation import Scenario, Simulation, SimulationFailure, run_schedule

SCHEDULES = int(os.environ.get("HIGHWATER_RAFT_SCHEDULES", "2000"))
CHUNK = 100


@pytest.mark.parametrize("first_seed", range(0, SCHEDULES, CHUNK))
def test_random_fault_schedules(first_seed: int) -> None:
    failures: list[SimulationFailure] = []
    for seed in range(first_seed, min(first_seed + CHUNK, SCHEDULES)):
        try:
            run_schedule(seed)
        except SimulationFailure as failure:
            failures.append(failure)
    assert not failures, f"{len(failures)} failing schedules; the first:\n{failures[0]}"


def test_one_schedule_traced() -> None:
    """Replays ``HIGHWATER_RAFT_SEED`` (default 0) with a trace: how a failing seed is studied."""
    result = run_schedule(int(os.environ.get("HIGHWATER_RAFT_SEED", "0")), trace=True)
    print(result.summary())


def test_the_random_schedules_cover_the_scenarios_asked_for() -> None:
    scenarios = [Scenario.from_seed(seed) for seed in range(SCHEDULES)]
    voters = Counter(s.voters for s in scenarios)
    assert voters[3] > SCHEDULES // 3 and voters[5] > SCHEDULES // 5
    assert sum(s.snapshots for s in scenarios) > SCHEDULES // 3
    assert sum(s.late_observer_ms > 0 for s in scenarios) > SCHEDULES // 5
    assert sum(s.outages > 0 for s in scenarios) > SCHEDULES // 3
    assert sum(s.drop_rate > 0 and s.duplicate_rate > 0 for s in scenarios) > SCHEDULES // 3
    assert sum(s.membership_changes > 0 for s in scenarios) > SCHEDULES // 3
    assert sum(s.wipes > 0 for s in scenarios) > SCHEDULES // 5


def test_a_schedule_replays_identically_from_its_seed() -> None:
    first, second = run_schedule(7), run_schedule(7)
    assert first == second


def quiet(**overrides: object) -> Scenario:
    """No faults at all, unless asked for."""
    base = Scenario(
        drop_rate=0.0,
        duplicate_rate=0.0,
        crashes=0,
        outages=0,
        partitions=0,
        resigns=0,
        max_delay_ms=5,
    )
    return Scenario(**{**base.__dict__, **overrides})


@pytest.mark.parametrize("voters", [1, 3, 5])
def test_without_faults_one_leader_is_elected_and_every_proposal_commits(voters: int) -> None:
    result = Simulation(11, quiet(voters=voters, proposal_interval_ms=20)).run()
    assert len(result.leaders) == 1
    assert result.acknowledged >= 50
    assert result.recovery_ms < 200


def test_lagging_voter_and_new_observer_catch_up_through_fetch_snapshot() -> None:
    scenario = quiet(
        snapshots=True,
        snapshot_every=5,
        late_observer_ms=1000,
        proposal_interval_ms=10,
        snapshot_chunk_bytes=64,
    )
    simulation = Simulation(3, scenario)
    simulation.isolate([3], 0, 1400)  # voter 3 sees nothing until the logs are cleaned
    result = simulation.run()
    lagging, observer = simulation.nodes[3], simulation.nodes[100]
    assert lagging.snapshot_loads >= 1
    assert observer.snapshot_loads >= 1
    assert result.messages["FetchSnapshotRequest"] >= 2
    leader_id = next(iter(result.leaders.values()))
    assert leader_id != 3
    leader = simulation.nodes[leader_id]
    assert leader.log.start_offset > 0  # its log was cleaned up to a snapshot
    final = simulation.final_ack
    assert final is not None
    for node in (lagging, observer):
        committed = {o: v for o, v in leader.applied.items() if o <= final.offset}
        assert {o: v for o, v in node.applied.items() if o <= final.offset} == committed
    # The voter that was cut off campaigned alone (pre-vote) but never bumped the epoch.
    assert list(result.leaders) == [1]


@pytest.mark.parametrize("voters", [3, 5])
def test_a_partitioned_leader_resigns_and_the_majority_elects_another(voters: int) -> None:
    simulation = Simulation(5, quiet(voters=voters, proposal_interval_ms=10))
    simulation.isolate("leader", 500, 1400)
    result = simulation.run()
    first, *later = sorted(result.leaders)
    old_leader = result.leaders[first]
    assert later, "the majority side elected no new leader"
    assert all(result.leaders[epoch] != old_leader for epoch in later[:1])
    assert result.acknowledged > 0


# --- Dynamic membership (KIP-853) ------------------------------------------------------


def test_membership_changes_under_faults_keep_one_leader_per_epoch() -> None:
    """Many changes (adds, removes, the leader removing itself) amid loss, partitions and
    crashes: every check above holds, and changes both land and get refused."""
    changes, refusals = 0, Counter[str]()
    for seed in range(20):
        result = run_schedule(seed, membership_changes=6)
        changes += result.membership_changes
        refusals += result.membership_refusals
    assert changes >= 20
    assert refusals["ChangeInProgressError"] > 0
    assert refusals["NotCaughtUpError"] > 0


def test_a_brokers_metadata_replica_is_never_added_as_a_voter() -> None:
    """Brokers' metadata replicas fetch as observers under a directory id and announce no
    controller endpoint. Random changes under loss, partitions and crashes ask to add them
    too: every such request is refused as NOT a controller, while controllers' observers
    are still added, and no voter set on any replica ever names a broker (checked after
    every event)."""
    refusals, changes = Counter[str](), 0
    for seed in range(12):
        simulation = Simulation(
            seed, Scenario.from_seed(seed, membership_changes=6, broker_observers=2)
        )
        result = simulation.run()
        refusals += result.membership_refusals
        changes += result.membership_changes
        for sim_node in simulation.nodes.values():
            assert sim_node.node is not None
            assert not sim_node.node.voter_set.ids & {200, 201}
    assert refusals["NotAControllerError"] > 0
    assert changes > 0
    # A planned one, at a quiet moment: the broker has caught up, and is still refused.
    simulation = Simulation(21, quiet(dynamic=True, broker_observers=1))
    simulation.change_membership(800, add=200)
    simulation.change_membership(900, add=100)
    result = simulation.run()
    assert result.membership_refusals == Counter({"NotAControllerError": 1})
    assert simulation.nodes[1].node.voter_set.ids == {1, 2, 3, 100}  # type: ignore[union-attr]


def test_a_voter_is_replaced_by_an_observer_while_proposals_commit() -> None:
    simulation = Simulation(21, quiet(dynamic=True, proposal_interval_ms=10))
    simulation.change_membership(400, remove=3)
    simulation.change_membership(800, add=100)
    result = simulation.run()
    assert result.membership_changes == 2
    assert len(result.leaders) == 1
    for node_id, sim_node in simulation.nodes.items():
        assert sim_node.node is not None
        assert sim_node.node.voter_set.ids == {1, 2, 100}, node_id
        assert sim_node.node.is_voter == (node_id != 3)
    # The new voter is counted: its directory id is the one it was added with.
    voter = simulation.nodes[1].node.voter_set.get(100)  # type: ignore[union-attr]
    assert voter is not None and voter.directory_id == simulation.directory_ids[100]
    assert result.acknowledged > 50


def test_a_leader_that_removes_itself_leads_until_the_change_commits_then_resigns() -> None:
    simulation = Simulation(22, quiet(dynamic=True, proposal_interval_ms=10))
    simulation.change_membership(500, remove=0)
    result = simulation.run()
    first_epoch, *later = sorted(result.leaders)
    old_leader = result.leaders[first_epoch]
    assert later and all(result.leaders[epoch] != old_leader for epoch in later)
    node = simulation.nodes[old_leader].node
    assert node is not None
    assert not node.is_voter and node.role is not Role.LEADER
    assert old_leader not in simulation.nodes[result.leaders[later[-1]]].node.voter_set.ids  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", [5, 24, 37, 42])  # 5, 37, 42: told that it leads
def test_a_wiped_leader_comes_back_as_a_new_incarnation_and_is_replaced(seed: int) -> None:
    """The leader's data directory is lost: it comes back empty under a new directory id,
    perhaps before the others notice, who then tell it that it leads their epoch (its
    former incarnation did). Its new incarnation neither votes nor is counted as the
    voter; once the faults stop the operator removes the former key, and it catches up
    as an observer. Every check of the schedule holds throughout."""
    simulation = Simulation(seed, quiet(dynamic=True, proposal_interval_ms=10))
    simulation.wipe(400)
    result = simulation.run()
    assert simulation.wipes == 1
    wiped = result.leaders[min(result.leaders)]
    current = simulation.nodes[result.leaders[max(result.leaders)]].node
    assert current is not None and wiped not in current.voter_set.ids
    node = simulation.nodes[wiped].node
    assert node is not None and not node.is_voter
    assert node.directory_id == simulation.directory_ids[wiped]  # its new one
    assert len(result.leaders) >= 2


def test_the_operator_removes_a_former_key_again_when_its_removal_was_truncated() -> None:
    """Seed 837,580: the leader appended the wiped node 5's removal, which a later leader
    truncated; the operator, who had seen the removal in the leader's set, had stopped,
    and the former key stayed in the committed set for good. The operator now goes on
    until no committed set names a former key, as ``remove-controller`` waits for the
    commit."""
    seed = 837_580
    simulation = Simulation(seed, Scenario.from_seed(seed))
    result = simulation.run()
    assert simulation.wipes >= 1 and not simulation.scenario.auto_join
    leader = simulation.nodes[result.leaders[max(result.leaders)]].node
    assert leader is not None
    assert not any(simulation._is_former(v) for v in leader.committed_voter_set())


@pytest.mark.parametrize("seed", [5, 24, 37])
def test_with_auto_join_a_wiped_leader_replaces_its_former_key_and_an_observer_joins(
    seed: int,
) -> None:
    """``controller.quorum.auto.join.enable``: the leader's disk is lost and it comes back
    empty under a new directory id. With no operator, it asks the leader the others elect
    to remove its former key, then to add it; the observer (a controller too) asks to be
    added. In the end every controller is a voter under the directory it runs with."""
    simulation = Simulation(seed, quiet(dynamic=True, auto_join=True, proposal_interval_ms=10))
    simulation.wipe(400)
    result = simulation.run()
    assert simulation.wipes == 1
    assert simulation.auto_joins["removed"] == 1
    assert simulation.auto_joins["added"] == 2  # the wiped node and observer 100
    leader = simulation.nodes[result.leaders[max(result.leaders)]].node
    assert leader is not None
    assert leader.committed_voter_set() == VoterSet.of(
        Voter(i, simulation.directory_ids[i], f"node-{i}") for i in (1, 2, 3, 100)
    )
    assert result.acknowledged > 50


def test_the_checks_fail_an_auto_join_that_never_removes_the_former_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wiped controller that asks to be added while its former key is still a voter is
    refused (its node id is a voter): without the removal first, the schedule ends with
    a voter that no replica holds, and the liveness check names it."""
    wanted = RaftNode._wanted_join

    def add_only(self: RaftNode, state: Any) -> JoinRequest | None:
        join = wanted(self, state)
        if join is None or join.add or self.directory_id is None:
            return join
        return JoinRequest(join.leader_id, True, Voter(self.node_id, self.directory_id, "x"))

    monkeypatch.setattr(RaftNode, "_wanted_join", add_only)
    simulation = Simulation(24, quiet(dynamic=True, auto_join=True, proposal_interval_ms=10))
    simulation.wipe(400)
    with pytest.raises(SimulationFailure, match="voters not replaced"):
        simulation.run()


def test_the_checks_fail_a_leader_that_counts_a_removed_voter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader that goes on counting a voter its latest set removed commits entries a
    majority of that set does not hold: the durability check, by the latest set in the
    leader's log, fails the schedule (seeds 3 and 9)."""
    set_voters = LeaderState.set_voters

    def keep_removed(self: LeaderState, voters: frozenset[int]) -> bool:
        return set_voters(self, voters | self.voters if len(voters) < len(self.voters) else voters)

    monkeypatch.setattr(LeaderState, "set_voters", keep_removed)
    with pytest.raises(SimulationFailure, match="durable on only"):
        for seed in range(10):
            run_schedule(seed, membership_changes=6, wipes=2)


def test_the_checks_fail_a_leader_that_counts_a_wiped_voters_new_incarnation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the leader's check of the fetcher's directory id, a wiped voter's new
    incarnation is counted as the voter: entries commit that a majority of the set's keys
    does not hold (seeds 5 and 9)."""
    monkeypatch.setattr(RaftNode, "_is_other_incarnation", lambda *_: False)
    with pytest.raises(SimulationFailure, match="durable on only"):
        for seed in range(10):
            run_schedule(seed, membership_changes=6, wipes=2)


def test_refused_changes_a_lagging_observer_two_at_once_and_a_static_quorum() -> None:
    simulation = Simulation(23, quiet(dynamic=True))
    simulation.isolate([100], 0, 1400)  # the observer cannot catch up
    simulation.change_membership(600, add=100)
    simulation.change_membership(700, remove=2)
    simulation.change_membership(700, remove=3)  # the first is not committed yet
    result = simulation.run()
    assert result.membership_refusals["NotCaughtUpError"] == 1
    assert result.membership_refusals["ChangeInProgressError"] == 1
    assert simulation.nodes[1].node.voter_set.ids == {1, 3}  # type: ignore[union-attr]

    static = Simulation(23, quiet())
    static.change_membership(600, remove=2)
    assert static.run().membership_refusals == Counter({"StaticQuorumError": 1})
