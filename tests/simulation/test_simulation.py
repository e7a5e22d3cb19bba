"""The whole-cluster simulation in the suite: a few seeds, exact replay, and the known bugs
put back one at a time, each found within a few seeds (docs/simulation.md).

The long mode is ``make simulate SEEDS=N``; a failing seed here reproduces with
``python -m tests.simulation --seed N --trace`` and shrinks with ``--shrink``.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import sim_cluster
from highwater.broker.partitions import Partition, PartitionManager
from highwater.errors import KafkaStorageError
from highwater.storage.segment import LogSegment
from sim_cluster import Scenario, Simulation, SimulationFailure
from sim_run import run_pool, shrink

SUITE_SEEDS = range(0, 3)
"""Whole schedules (12 s of faults) in the suite; ``make simulate`` runs thousands."""
SHORT_SEEDS = range(1000, 3000)
SHORT_CHAOS_MS = 5000
SHORT_JOBS = 2
"""Short schedules (5 s of faults, as many faults as a whole one: denser) in the suite, a
fixed range, in a pool of two worker processes (``sim_run.run_pool``; CI has two CPUs).
The 2,000 of 1000-2999 take about 3 minutes of a quiet 2-CPU machine (750 of them took
68 s there, 10.96 a second): the simulation's share of a suite that stays well inside
CI's 25 minutes (docs/simulation.md, "Throughput"); every seed of the range has run and
passed. A failure names its seed and how to replay it."""


def run_all(
    seeds: Iterable[int], *, chaos_ms: int = Scenario.chaos_ms, jobs: int | None = None
) -> tuple[int, int]:
    """Run every seed's schedule in a pool of worker processes; fail with every failing
    seed and the reports of the first few, else the acknowledged writes and the log
    directories the brokers took offline."""
    failures = []
    acknowledged = 0
    dirs_failed = 0
    for outcome in run_pool(seeds, chaos_ms=chaos_ms, jobs=jobs):
        if outcome.result is None:
            failures.append((outcome.seed, str(outcome.failure)))
            continue
        acknowledged += outcome.result.acknowledged
        dirs_failed += outcome.result.dirs_failed
        assert outcome.result.attempted > 0 and outcome.result.faults
    assert not failures, (
        f"{len(failures)} schedules failed, seeds {[seed for seed, _ in failures]}:\n\n"
        + "\n\n".join(report for _, report in failures[:3])
    )
    return acknowledged, dirs_failed


def first_failure(seeds: Iterable[int]) -> SimulationFailure | None:
    for seed in seeds:
        try:
            Simulation(seed).run()
        except SimulationFailure as failure:
            return failure
    return None


def test_schedules_keep_every_invariant() -> None:
    acknowledged, _ = run_all(SUITE_SEEDS)
    assert acknowledged > 100 * len(SUITE_SEEDS)


def test_short_schedules_keep_every_invariant() -> None:
    acknowledged, dirs_failed = run_all(SHORT_SEEDS, chaos_ms=SHORT_CHAOS_MS, jobs=SHORT_JOBS)
    assert acknowledged > 20 * len(SHORT_SEEDS)
    assert dirs_failed > 0, "no schedule failed a log directory (EIO)"


def test_the_last_isr_member_back_from_a_power_loss_is_not_elected_over_a_longer_log() -> None:
    """KIP-966 (docs/simulation.md, "Findings"): the last ISR member moves to the ELR when
    fenced and leaves it when it registers after a power loss cut its log. Seed 2043: an
    ELR member that was only paused is elected cleanly. Seeds 2188 and 2032: no ELR member
    is left, and unclean recovery asks the last known ELR for their logs and elects the
    longest. Before, the last member was elected and acknowledged writes were lost."""
    simulations = [
        Simulation(seed, Scenario.from_seed(seed, chaos_ms=SHORT_CHAOS_MS))
        for seed in (2043, 2188, 2032)
    ]
    for simulation in simulations:
        simulation.run()
    assert sum(s.unclean_recoveries for s in simulations) >= 2


def test_a_broker_restarted_with_every_log_directory_failed_waits_for_the_repair() -> None:
    """Seed 9500134: b4 comes back from a power loss while both its log directories fail
    every read and write. Its start finds no usable directory, so the broker stays down (a
    Kafka broker halts) until the disk is repaired, and then starts. Before, the start's
    KafkaStorageError ended the schedule as a failure of the cluster."""
    simulation = Simulation(9500134)
    simulation.run()
    assert simulation.refused_starts >= 1


def test_unclean_recovery_asks_a_replica_outside_the_last_known_elr() -> None:
    """Seed 9700852: b1 leaves p1's ISR while two members remain (it is not eligible),
    then b2 and b3 are fenced and come back from power losses (last known ELR [b2, b3]),
    b3 short of a committed batch. b1 ran on with the longest log. Unclean recovery asks
    every replica and elects b1 with nothing lost. Before, only b2 and b3 were asked; b3
    answered the longest log but could not lead, and p1 had no leader after healing."""
    simulation = Simulation(9700852)
    simulation.run()
    assert simulation.unclean_recoveries >= 1
    assert simulation.unclean_elections == 0


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


def test_a_leader_that_cannot_read_its_log_is_replaced_and_nothing_is_lost() -> None:
    """The leader's log directory fails its reads (EIO): the leader cannot serve its
    followers or consumers. It takes the directory offline and stops leading at once,
    reports the replica in its heartbeat, and the controller elects another ISR member
    and drops it from the ISR; once repaired and restarted it catches up, and no
    acknowledged write is lost (b3 leads the one partition of seed 5 at 3 s)."""
    fault = sim_cluster.Fault(3000, "dir-failed", ("b3",), 3000, "d0 read")
    scenario = Scenario(brokers=3, partitions=1, chaos_ms=8000, faults=(fault,))
    simulation = Simulation(5, scenario)
    result = simulation.run()
    assert result.dirs_failed == 1 and result.acknowledged > 100
    trace = list(simulation.trace)
    offline = next(i for i, line in enumerate(trace) if "b3: log directory d0 offline" in line)
    assert "events-0 stopped" in trace[offline]
    elected = next(line for line in trace[offline:] if "p0: leader" in line)
    assert "leader b3" not in elected and "3" not in elected.split("isr [")[1].split("]")[0], (
        elected
    )


def test_finds_a_leader_leading_on_over_its_failed_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The known problem put back: a broker whose log directory failed keeps its offline
    replicas' roles (no ``stop_offline``): the leader that cannot read its own log still
    leads in its process. The check after the failing event sees it."""
    monkeypatch.setattr(PartitionManager, "stop_offline", lambda self: [])
    fault = sim_cluster.Fault(3000, "dir-failed", ("b3",), 3000, "d0 read")
    scenario = Scenario(brokers=3, partitions=1, chaos_ms=8000, faults=(fault,))
    with pytest.raises(SimulationFailure) as found:
        Simulation(5, scenario).run()
    assert "its log directory is offline, yet it still leads" in found.value.reason


def test_healing_ends_a_pause_at_once() -> None:
    """A pause that outlasts the faults ends with them: what the paused broker put off
    (its ticks, the messages sent to it) runs at the heal, not at the pause's planned end,
    so the healed cluster converges long before it."""
    fault = sim_cluster.Fault(1500, "pause", ("b2",), 8000)
    scenario = Scenario(brokers=3, partitions=1, chaos_ms=2500, faults=(fault,))
    result = Simulation(5, scenario).run()
    assert result.acknowledged > 0
    assert result.simulated_ms < fault.at_ms + fault.duration_ms, result.summary()
