"""Running whole-cluster schedules: one seed replayed, many seeds in turn, a failure shrunk.

``python -m tests.simulation --seed N [--trace] [--shrink]`` replays the schedule of seed
``N`` exactly (the scenario and faults come from the seed) and exits 1 on a violation;
``--seeds N [--first-seed S]`` runs N schedules and reports their throughput and every
failing seed; ``make simulate SEEDS=N`` is the latter. :func:`run_pool` runs many seeds in
a pool of worker processes, one per CPU (the suite's short schedules, ``--jobs``).

Shrinking (:func:`shrink`) keeps a failing schedule's scenario and drops its faults one at
a time, keeping each drop after which the schedule still fails, then shortens the
remaining faults; what is left is printed as the short schedule that still fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from itertools import repeat
from multiprocessing import get_context

from sim_cluster import (
    Fault,
    Scenario,
    Simulation,
    SimulationFailure,
    SimulationResult,
    plan_faults,
)


def fails(seed: int, scenario: Scenario) -> SimulationFailure | None:
    """The failure of ``seed`` under ``scenario``, None if it passes."""
    try:
        Simulation(seed, scenario).run()
    except SimulationFailure as failure:
        return failure
    return None


@dataclass(frozen=True)
class Outcome:
    """One schedule's end: its result, or the report of the invariant it broke."""

    seed: int
    result: SimulationResult | None
    failure: str | None


def run_one(seed: int, chaos_ms: int = Scenario.chaos_ms, groups: str = "off") -> Outcome:
    """The schedule of ``seed`` with ``chaos_ms`` of faults, run to its end. A failure comes
    back as its report (text crosses a process boundary; the exception's fields do not)."""
    try:
        scenario = Scenario.from_seed(seed, chaos_ms=chaos_ms, groups=with_groups(seed, groups))
        result = Simulation(seed, scenario).run()
    except SimulationFailure as failure:
        return Outcome(seed, None, str(failure))
    return Outcome(seed, result, None)


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_pool(
    seeds: Iterable[int],
    *,
    chaos_ms: int = Scenario.chaos_ms,
    groups: str = "off",
    jobs: int | None = None,
) -> list[Outcome]:
    """Every seed's outcome, in the seeds' order: :func:`iter_pool` to the end."""
    return list(iter_pool(seeds, chaos_ms=chaos_ms, groups=groups, jobs=jobs))


def iter_pool(
    seeds: Iterable[int],
    *,
    chaos_ms: int = Scenario.chaos_ms,
    groups: str = "off",
    jobs: int | None = None,
) -> Iterator[Outcome]:
    """Each seed's outcome in the seeds' order as it comes, the schedules run in ``jobs``
    worker processes (default: one per CPU; 1: in this process). A schedule is a pure
    function of its seed and ``chaos_ms``, so where it runs changes nothing in it. Workers
    are spawned, not forked: they start from a clean interpreter whatever threads the caller
    runs, and see no change the caller made in memory (a test that puts a bug back runs its
    seeds in-process)."""
    seeds = list(seeds)
    jobs = min(jobs or cpus(), len(seeds))
    if jobs <= 1:
        yield from (run_one(seed, chaos_ms, groups) for seed in seeds)
        return
    # Small chunks: the workers end within a schedule or two of each other (a chunk of
    # 16 left one worker idle for up to 16 schedules at the end).
    chunk = max(1, min(4, len(seeds) // (jobs * 8)))
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        yield from pool.map(run_one, seeds, repeat(chaos_ms), repeat(groups), chunksize=chunk)


def shrink(
    seed: int, scenario: Scenario, *, budget: int = 40
) -> tuple[Scenario, SimulationFailure]:
    """The smallest schedule found (at most ``budget`` runs) that still fails like
    ``seed``'s; raises ValueError if the schedule passes."""
    faults = list(plan_faults(seed, scenario))
    current = replace(scenario, faults=tuple(faults))
    failure = fails(seed, current)
    if failure is None:
        raise ValueError(f"seed {seed} passes: nothing to shrink")
    runs = 1
    index = 0
    while index < len(faults) and runs < budget:
        candidate = replace(current, faults=tuple(faults[:index] + faults[index + 1 :]))
        runs += 1
        found = fails(seed, candidate)
        if found is not None:
            faults.pop(index)
            current, failure = candidate, found
        else:
            index += 1
    for index, fault in enumerate(faults):
        if runs >= budget or fault.duration_ms <= 100:
            continue
        shorter: Fault = replace(fault, duration_ms=max(100, fault.duration_ms // 2))
        candidate = replace(current, faults=tuple([*faults[:index], shorter, *faults[index + 1 :]]))
        runs += 1
        found = fails(seed, candidate)
        if found is not None:
            faults[index] = shorter
            current, failure = candidate, found
    return current, failure


def with_groups(seed: int, groups: str) -> bool:
    """Whether ``seed``'s schedule runs the group coordinators: ``on``, ``off``, or
    ``half`` (the odd seeds)."""
    return groups == "on" or (groups == "half" and seed % 2 == 1)


def run_many(
    first_seed: int,
    count: int,
    *,
    chaos_ms: int = Scenario.chaos_ms,
    groups: str = "off",
    jobs: int = 1,
    out=sys.stdout,
) -> int:
    """Run ``count`` schedules from ``first_seed`` in ``jobs`` processes; the number that
    failed."""
    started = time.perf_counter()
    cpu_started = time.process_time()
    failed = 0
    acknowledged = 0
    expected_loss = 0
    dirs_failed = 0
    seeds = range(first_seed, first_seed + count)
    for outcome in iter_pool(seeds, chaos_ms=chaos_ms, groups=groups, jobs=jobs):
        if outcome.result is None:
            failed += 1
            print(f"FAILED {str(outcome.failure).splitlines()[0]}", file=out, flush=True)
            continue
        acknowledged += outcome.result.acknowledged
        expected_loss += outcome.result.expected_loss
        dirs_failed += outcome.result.dirs_failed
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    per_cpu = (
        f", {count / cpu:.2f} schedules per CPU-second" if jobs == 1 else f" in {jobs} processes"
    )
    print(
        f"{count} schedules, {failed} failed, {acknowledged} acknowledged writes, "
        f"{expected_loss} lost under unclean elections (expected), {dirs_failed} log "
        f"directories taken offline, {elapsed:.1f} s, "
        f"{count / elapsed:.2f} schedules/s{per_cpu}",
        file=out,
    )
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.simulation", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seed", type=int, help="replay this schedule")
    parser.add_argument("--trace", action="store_true", help="print every event of --seed")
    parser.add_argument(
        "--shrink", action="store_true", help="shrink --seed's schedule if it fails"
    )
    parser.add_argument(
        "--chaos-ms",
        type=int,
        default=Scenario.chaos_ms,
        help="simulated ms of faults before everything heals (the suite's short schedules: 5000)",
    )
    parser.add_argument(
        "--groups",
        choices=("off", "on", "half"),
        default="off",
        help="run the group coordinators and their clients too (half: in the odd seeds)",
    )
    parser.add_argument("--seeds", type=int, default=0, help="run this many schedules")
    parser.add_argument("--first-seed", type=int, default=0, help="the first of --seeds")
    parser.add_argument(
        "--jobs", type=int, default=1, help="run --seeds in this many processes (0: one per CPU)"
    )
    args = parser.parse_args(argv)
    if args.seed is not None:
        scenario = Scenario.from_seed(
            args.seed, chaos_ms=args.chaos_ms, groups=with_groups(args.seed, args.groups)
        )
        try:
            result = Simulation(args.seed, scenario, trace=args.trace).run()
        except SimulationFailure as failure:
            print(failure, file=sys.stderr)
            if args.shrink:
                shrunk, still = shrink(args.seed, scenario)
                print(f"\nshrunk to {len(shrunk.faults or ())} faults:", file=sys.stderr)
                for fault in shrunk.faults or ():
                    print(f"  {fault}", file=sys.stderr)
                print(f"which fails with: {still.reason}", file=sys.stderr)
            return 1
        print(result.summary())
        return 0
    if args.seeds:
        failed = run_many(
            args.first_seed,
            args.seeds,
            chaos_ms=args.chaos_ms,
            groups=args.groups,
            jobs=args.jobs or cpus(),
        )
        return 1 if failed else 0
    parser.error("give --seed N or --seeds N")
    return 2
