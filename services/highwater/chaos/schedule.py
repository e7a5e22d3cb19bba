"""The seeded fault schedule: which fault hits which process when, from a seed alone.

A schedule is a list of :class:`FaultWindow`: a fault starts at ``start_s`` (seconds
after the workload starts), lasts ``duration_s``, and is healed; windows never overlap,
so at most one process (or one cut) is faulty at a time and, with replication factor 3
and ``min.insync.replicas`` 2, an ISR member always survives (DESIGN.md §4's premise).
The same seed, duration, fault kinds and process names give the same schedule: a failing
run reproduces from its seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

FAULT_KINDS = ("kill", "pause", "partition", "disk", "wipe")

#: A pause lasts longer than the brokers' and coordinators' session timeouts (9 s), so the
#: controller fences the paused process and it comes back a zombie.
PAUSE_S = (10.0, 13.0)
KILL_DOWN_S = (1.0, 6.0)
PARTITION_S = (6.0, 12.0)
DISK_FULL_S = (4.0, 8.0)
#: A wiped process is down as long as a killed one, then starts with an empty data
#: directory (a controller: a new incarnation, which must rejoin the quorum by itself).
WIPE_DOWN_S = KILL_DOWN_S
GAP_S = (2.0, 5.0)


@dataclass(frozen=True)
class FaultWindow:
    start_s: float
    duration_s: float
    kind: str
    targets: tuple[str, ...]
    """The process names the fault hits (a partition: the minority side, one or two
    processes, cut off from the rest; they still reach each other)."""

    def to_json(self) -> dict[str, object]:
        return {
            "start_s": self.start_s,
            "duration_s": self.duration_s,
            "kind": self.kind,
            "targets": list(self.targets),
        }


def parse_seeds(text: str) -> list[int]:
    """Seeds as ``make chaos`` takes them: comma-separated numbers and inclusive ranges,
    ``1-200`` or ``1,2,10-12``, in the order given. ``ValueError`` for anything else."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise ValueError(f"not a seed or a range of seeds: {part!r}") from None
        if high < low:
            raise ValueError(f"an empty range of seeds: {part!r}")
        seeds.extend(range(low, high + 1))
    if not seeds:
        raise ValueError("no seeds given")
    return seeds


def parse_faults(text: str) -> tuple[str, ...]:
    """``kill,pause`` -> ("kill", "pause"); ``""`` or ``none`` -> (); ValueError names an
    unknown kind."""
    if text.strip() == "none":
        return ()
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise ValueError(f"unknown fault kind {unknown[0]!r}; known: {', '.join(FAULT_KINDS)}")
    return kinds


def build_schedule(
    seed: int,
    duration_s: float,
    kinds: Sequence[str],
    processes: Sequence[str],
    *,
    brokers: Sequence[str] = (),
    disk_brokers: Sequence[str] = (),
    wipe_targets: Sequence[str] = (),
) -> list[FaultWindow]:
    """The fault windows of a run of ``duration_s`` seconds (see the module docstring).

    ``processes`` are every process a kill, pause or partition may hit; ``brokers`` the
    ones weighted up (faults on brokers test replication); ``disk_brokers`` the brokers
    whose data directory can be filled; ``wipe_targets`` the processes whose data
    directory may be deleted (the brokers, and the controllers of a dynamic quorum of
    three or more). A kind with
    no process to hit is left out, and leaves the others' draws as they were. No window
    runs past ``duration_s``.
    """
    rng = random.Random(seed)
    usable = [k for k in kinds if (k != "disk" or disk_brokers) and (k != "wipe" or wipe_targets)]
    windows: list[FaultWindow] = []
    if not usable or not processes:
        return windows
    weighted = list(processes) + list(brokers) * 2
    t = rng.uniform(*GAP_S)
    while True:
        kind = rng.choice(usable)
        if kind == "kill":
            length = rng.uniform(*KILL_DOWN_S)
            targets: tuple[str, ...] = (rng.choice(weighted),)
        elif kind == "pause":
            length = rng.uniform(*PAUSE_S)
            targets = (rng.choice(weighted),)
        elif kind == "partition":
            length = rng.uniform(*PARTITION_S)
            first = rng.choice(weighted)
            if len(processes) >= 5 and rng.random() < 0.4:
                # A minority of two, cut off together from the majority.
                second = rng.choice([p for p in processes if p != first])
                targets = (first, second)
            else:
                targets = (first,)
        elif kind == "disk":
            length = rng.uniform(*DISK_FULL_S)
            targets = (rng.choice(list(disk_brokers)),)
        else:
            length = rng.uniform(*WIPE_DOWN_S)
            targets = (rng.choice(list(wipe_targets)),)
        if t + length > duration_s:
            break
        windows.append(FaultWindow(round(t, 3), round(length, 3), kind, targets))
        t += length + rng.uniform(*GAP_S)
    return windows
