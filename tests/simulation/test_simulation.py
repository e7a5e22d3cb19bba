"""The whole-cluster simulation in the suite: a few seeds, exact replay, and the known bugs
put back one at a time, each found within a few seeds (docs/simulation.md).

The long mode is ``make simulate SEEDS=N``; a failing seed here reproduces with
``python -m tests.simulation --seed N --trace`` and shrinks with ``--shrink``.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import sim_cluster
from highwater.broker.partitions import Partition
from highwater.errors import KafkaStorageError
from highwater.storage.segment import LogSegment
from sim_cluster import Scenario, Simulation, SimulationFailure
from sim_run import shrink

SUITE_SEEDS = range(0, 3)
"""Whole schedules (12 s of faults) in the suite; ``make simulate`` runs thousands."""
SHORT_SEEDS = range(1000, 1040)
SHORT_CHAOS_MS = 5000
"""Short schedules (5 s of faults, as many faults as a whole one: denser) in the suite,
about 0.3 s of CPU each. Together with :data:`SUITE_SEEDS` about 15 s of an idle machine."""


def run_all(simulations: Iterable[Simulation]) -> int:
    """Run every schedule; fail with every failure's report, else the acknowledged writes."""
    failures = []
    acknowledged = 0
    for simulation in simulations:
        try:
            result = simulation.run()
        except SimulationFailure as failure:
            failures.append(str(failure))
            continue
        acknowledged += result.acknowledged
        assert result.attempted > 0 and result.faults
    assert not failures, "\n\n".join(failures)
    return acknowledged


def first_failure(seeds: Iterable[int]) -> SimulationFailure | None:
    for seed in seeds:
        try:
            Simulation(seed).run()
        except SimulationFailure as failure:
            return failure
    return None


def test_schedules_keep_every_invariant() -> None:
    acknowledged = run_all(Simulation(seed) for seed in SUITE_SEEDS)
    assert acknowledged > 100 * len(SUITE_SEEDS)


def test_short_schedules_keep_every_invariant() -> None:
    acknowledged = run_all(
        Simulation(seed, Scenario.from_seed(seed, chaos_ms=SHORT_CHAOS_MS)) for seed in SHORT_SEEDS
    )
    assert acknowledged > 20 * len(SHORT_SEEDS)


def test_a_schedule_replays_exactly() -> None:
    scenario = Scenario.from_seed(7, chaos_ms=4000)
    first = Simulation(7, scenario)
    first_result = first.run()
    again = Simulation(7, scenario)
    again_result = again.run()
    assert first.history == again.history
    assert (first_result.events, first_result.simulated_ms) == (
        again_result.events,
        again_result.simulated_ms,
    )
    assert first_result.acknowledged > 0


# --- Mutation tests: each known bug, put back, is found -------------------------------------


def test_finds_the_torn_batch_kept_after_a_full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails half-way on a full disk leaves its torn bytes in the segment
    (docs/chaos.md): the next append lands after them, reads meet a corrupt batch."""

    def keep_torn_bytes(self: LogSegment, size: int, error: OSError) -> None:
        raise KafkaStorageError(f"{self.log_path}: write failed: {error}") from error

    monkeypatch.setattr(LogSegment, "_undo_partial_write", keep_torn_bytes)
    failure = first_failure(range(2, 5))
    assert failure is not None, "the torn batch went unnoticed in 3 seeds"
    assert "corrupt" in failure.reason.lower() or "after healing" in failure.reason


def test_finds_a_restarted_leader_acting_on_stale_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker that takes the roles of the metadata it replays after a restart, before its
    new registration is in it, leads again in its old epoch with the log a power loss cut;
    its followers truncate to it and acknowledged writes are lost."""
    monkeypatch.setattr(sim_cluster, "APPLY_BEFORE_REGISTRATION", True)
    failure = first_failure(range(48, 51))
    assert failure is not None, "the stale leader went unnoticed in 3 seeds"
    assert any(
        text in failure.reason
        for text in ("lacks the committed batch", "below committed batches", "lost-write")
    )


def test_finds_a_follower_truncating_to_its_high_watermark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first high-watermark story of the seeds (Kafka before KIP-101): a follower that
    truncates its log to its own high watermark when it starts following a leader (a new
    leader epoch) cuts records that are committed, since its HW lags the leader's by a
    fetch; a second failure then loses them. The simulation sees the committed batch cut."""
    follow = Partition._follow

    def follow_truncating_to_high_watermark(self: Partition, registration: object) -> None:
        state = self.follower_state
        if state is None or registration.leader_epoch > state.leader_epoch:  # type: ignore[attr-defined]
            self.log.truncate_to(self.log.high_watermark)
            if state is not None:
                state.on_truncated(self.log.log_end_offset)
        follow(self, registration)  # type: ignore[arg-type]

    monkeypatch.setattr(Partition, "_follow", follow_truncating_to_high_watermark)
    failure = first_failure(range(2, 5))
    assert failure is not None, "the truncation to the high watermark went unnoticed in 3 seeds"
    assert any(
        text in failure.reason
        for text in ("below committed batches", "lacks the committed batch", "lost-write")
    )


def test_a_failing_schedule_shrinks_to_fewer_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_cluster, "APPLY_BEFORE_REGISTRATION", True)
    scenario = Scenario.from_seed(48)
    planned = sim_cluster.plan_faults(48, scenario)
    shrunk, failure = shrink(48, scenario, budget=3)
    assert shrunk.faults is not None
    assert len(shrunk.faults) < len(planned)
    assert set(shrunk.faults) <= set(planned)
    assert failure.seed == 48
