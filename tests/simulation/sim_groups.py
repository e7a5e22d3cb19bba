"""Group coordinators beside the cluster: two real coordinator cores, their leases, clients.

Two :class:`~highwater.coordinator.core.GroupCoordinatorCore` instances (the real pure
core) own the partitions of a two-partition ``__consumer_offsets``; each guards them with
the real :class:`~highwater.coordinator.lease.SessionLease`. What the service edge and the
controller do around them is simulated here, over a millisecond clock and one seeded
random source (the whole-cluster simulation, :mod:`sim_cluster`, runs the same cores
with the real controller and brokers instead; this one is small and fast):

- the controller's side of coordinator sessions: heartbeats every ``HEARTBEAT_MS``; a
  coordinator not heard from for ``SESSION_MS`` loses its partitions to the other live
  coordinator with the coordinator epoch + 1 (and learns it when its next heartbeat is
  answered as stale);
- ``__consumer_offsets`` as one durable log per partition with the broker's producer-epoch
  fencing: an append of an epoch lower than one already appended is refused;
- taking a partition over: the epoch marker appended, the partition read back and loaded;
- the clients of :mod:`group_clients` (a committer and fetchers per group), each
  connection in order.

Faults (from the seed): a coordinator paused past its session (requests queued for it
run when it resumes: the stale-coordinator story), a coordinator crashed and restarted
(its cache gone), clients cut from a coordinator.

Invariants, checked as the answers arrive: those of :mod:`group_clients` (committed
offsets never move back), and every acknowledged commit was appended by its partition's
current owner (a deposed coordinator's appends are refused), each coordinator epoch
acted on by one coordinator only.

``group_clients.LEASE_CHECKED = False`` puts the stale-coordinator bug back.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import group_clients
from group_clients import STALE_LOOKUP_RATE, GroupClients, GroupInvariantViolation
from highwater.coordinator.core import (
    GroupCoordinatorCore,
    GroupCoordinatorSettings,
    Reply,
    Write,
)
from highwater.coordinator.lease import SessionLease
from highwater.coordinator.records import KeyValue, decode_record, encode_epoch_marker
from highwater.metadata.consumer_offsets import partition_for_group
from highwater.v1.common_pb2 import ErrorCode

PARTITIONS = 2
SESSION_MS = 3_000
HEARTBEAT_MS = 500
FAULTS_MS = 12_000
SETTLE_MS = 6_000

__all__ = ["GroupInvariantViolation", "GroupSimulation", "run_seed"]


@dataclass
class Coordinator:
    node_id: int
    core: GroupCoordinatorCore
    lease: SessionLease
    incarnation: int = 0
    paused_until: int = 0
    crashed: bool = False
    queued: list[Callable[[], None]] = field(default_factory=list)
    registered_epoch: int = 0
    """-1 once the controller expired its session (the next heartbeat answer says so)."""
    pending: dict[object, Callable[[object], None]] = field(default_factory=dict)
    """Requests waiting in the core (by token) → how to answer them."""


@dataclass
class OffsetsLog:
    records: list[tuple[int, KeyValue]] = field(default_factory=list)
    fence: int = 0

    def append(self, epoch: int, records: tuple[KeyValue, ...]) -> bool:
        if epoch < self.fence:
            return False
        self.fence = epoch
        self.records += [(epoch, r) for r in records]
        return True


class GroupSimulation:
    def __init__(self, seed: int, *, trace: bool = False) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.now = 0
        self.trace: list[str] = []
        self.keep_trace = trace
        self._events: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self.logs = [OffsetsLog() for _ in range(PARTITIONS)]
        self.coordinators = {n: self._new_coordinator(n, 0) for n in (1, 2)}
        self.owner = {p: (1 + p % 2, 1) for p in range(PARTITIONS)}
        """partition → (coordinator id, coordinator epoch): the controller's assignment."""
        self.last_heartbeat = {n: 0 for n in self.coordinators}
        self.previous_owner: dict[int, int] = {}
        self.epoch_actor: dict[tuple[int, int], int] = {}
        self.clients = GroupClients(self, PARTITIONS)
        self.cut: set[int] = set()
        self.connection_free: dict[tuple[str, int], int] = {}
        self.counts = {"faults": 0, "moves": 0}
        for p, (node, epoch) in self.owner.items():
            self._take_over(self.coordinators[node], p, epoch)

    # -- the event loop ---------------------------------------------------------------------

    def at(self, delay: int, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now + delay, self._seq, action))

    def on(self, coordinator: Coordinator, action: Callable[[], None]) -> Callable[[], None]:
        """``action`` run by ``coordinator``: queued while it is paused, lost if it crashed
        or restarted since."""
        incarnation = coordinator.incarnation

        def run() -> None:
            if coordinator.crashed or coordinator.incarnation != incarnation:
                return
            if self.now < coordinator.paused_until:
                coordinator.queued.append(run)
                return
            action()

        return run

    def note(self, text: str) -> None:
        if self.keep_trace:
            self.trace.append(f"{self.now:>6} {text}")

    def run(self) -> dict[str, int]:
        for n in self.coordinators:
            self._heartbeat(self.coordinators[n])
            self._tick(self.coordinators[n])
        self.at(100, self._controller_tick)
        self.clients.start()
        self._plan_faults()
        end = FAULTS_MS + SETTLE_MS
        while self._events and self._events[0][0] <= end:
            self.now, _, action = heapq.heappop(self._events)
            action()
        return {**self.clients.counts, **self.counts}

    # -- coordinators -----------------------------------------------------------------------

    def _new_coordinator(self, node_id: int, incarnation: int) -> Coordinator:
        core = GroupCoordinatorCore(
            GroupCoordinatorSettings(group_initial_rebalance_delay_ms=0),
            lambda g: partition_for_group(g, PARTITIONS),
            new_member_id=lambda prefix: f"{prefix}-{self.rng.getrandbits(32):08x}",
        )
        lease = SessionLease(SESSION_MS)
        lease.renew(self.now)
        return Coordinator(node_id, core, lease, incarnation)

    def serving(self, c: Coordinator) -> bool:
        """The edge's check before every request (CoordinatorServer.check_lease)."""
        if group_clients.LEASE_CHECKED and c.lease.lapse(self.now):
            self.note(f"coordinator {c.node_id}: lease lapsed; unloading")
            for p in list(c.core.owned):
                self.effects(c, c.core.unload(p))
        return not (group_clients.LEASE_CHECKED and c.lease.lapsed)

    def _tick(self, c: Coordinator) -> None:
        if not (group_clients.LEASE_CHECKED and c.lease.lapsed):
            self.effects(c, c.core.tick(self.now))
        self.at(100, self.on(c, lambda: self._tick(c)))

    def _heartbeat(self, c: Coordinator) -> None:
        sent = self.now

        def at_controller() -> None:
            self.last_heartbeat[c.node_id] = self.now
            stale = c.registered_epoch < 0
            self.at(self._delay(), self.on(c, lambda: self._heartbeat_answered(c, sent, stale)))

        self.at(self._delay(), at_controller)
        self.at(HEARTBEAT_MS, self.on(c, lambda: self._heartbeat(c)))

    def _heartbeat_answered(self, c: Coordinator, sent: int, stale: bool) -> None:
        self.serving(c)
        # The controller's answer carries the assignment: drop what moved away, load what
        # is ours (a lapsed lease's partitions are loaded again once renewed).
        for p in list(c.core.owned) + list(c.core.loading):
            node, epoch = self.owner[p]
            if node != c.node_id or c.core.owned.get(p, epoch) != epoch:
                self.note(f"coordinator {c.node_id}: partition {p} moved away")
                self.effects(c, c.core.unload(p))
        c.registered_epoch = 0
        c.lease.renew(sent)
        for p, (node, epoch) in self.owner.items():
            if node == c.node_id and p not in c.core.owned and p not in c.core.loading:
                self._take_over(c, p, epoch)

    def _take_over(self, c: Coordinator, p: int, epoch: int) -> None:
        c.core.begin_loading(p)

        def load() -> None:
            if self.owner[p] != (c.node_id, epoch):
                c.core.loading.discard(p)
                return
            if not self.logs[p].append(epoch, (encode_epoch_marker(c.node_id, epoch),)):
                c.core.loading.discard(p)
                return
            self.act(c, p, epoch)
            records = [decode_record(k, v) for _, (k, v) in self.logs[p].records]
            c.core.load(p, epoch, records, self.now)
            self.note(f"coordinator {c.node_id}: loaded partition {p} in epoch {epoch}")

        self.at(self.rng.randint(1, 100), self.on(c, load))

    def act(self, c: Coordinator, p: int, epoch: int) -> None:
        actor = self.epoch_actor.setdefault((p, epoch), c.node_id)
        if actor != c.node_id:
            raise self.violation(
                f"coordinators {actor} and {c.node_id} both act in epoch {epoch} of partition {p}"
            )

    def _controller_tick(self) -> None:
        for p, (node, epoch) in self.owner.items():
            if self.now - self.last_heartbeat[node] >= SESSION_MS:
                other = 3 - node
                if self.now - self.last_heartbeat[other] < SESSION_MS:
                    self.owner[p] = (other, epoch + 1)
                    self.previous_owner[p] = node
                    self.coordinators[node].registered_epoch = -1
                    self.counts["moves"] += 1
                    self.note(f"controller: partition {p} to {other} in epoch {epoch + 1}")
        self.at(100, self._controller_tick)

    def effects(self, c: Coordinator, effects: list[object]) -> None:
        for effect in effects:
            if isinstance(effect, Reply):
                reply = c.pending.pop(effect.token, None)
                if reply is not None:
                    reply(effect.result)
            elif isinstance(effect, Write):
                self._write(c, effect)

    def _write(self, c: Coordinator, write: Write) -> None:
        epoch = c.core.owned.get(write.partition, -1)

        def append() -> None:
            ok = self.logs[write.partition].append(epoch, write.records)
            if ok:
                self.act(c, write.partition, epoch)
                self.note(f"coordinator {c.node_id}: appended in epoch {epoch}")
            else:
                self.note(f"coordinator {c.node_id}: append in epoch {epoch} fenced")

            def done() -> None:
                error = ErrorCode.NONE if ok else ErrorCode.INVALID_PRODUCER_EPOCH
                self.effects(c, c.core.write_completed(write.write_id, error, self.now))

            self.at(self._delay(), self.on(c, done))

        self.at(self._delay(), append)

    # -- the clients' side (group_clients.GroupHost) -------------------------------------

    def _delay(self) -> int:
        return self.rng.randint(1, 30)

    def request(
        self,
        client: str,
        c: Coordinator,
        serve: Callable[[Callable[[object], None]], None],
        answer: Callable[[object], None],
    ) -> None:
        """One in-order connection from ``client`` to ``c``; cut while ``c`` is cut off."""
        if c.node_id in self.cut:
            return

        def deliver_answer(result: object) -> None:
            if c.node_id not in self.cut:
                self.at(self._delay(), lambda: answer(result))

        key = (client, c.node_id)
        when = max(self.connection_free.get(key, 0), self.now + self._delay())
        self.connection_free[key] = when
        self.at(when - self.now, self.on(c, lambda: serve(deliver_answer)))

    def find(self, group: str) -> Coordinator:
        """FindCoordinator, answered by a broker whose metadata may lag: now and then the
        partition's previous owner."""
        p = partition_for_group(group, PARTITIONS)
        node = self.owner[p][0]
        if p in self.previous_owner and self.rng.random() < STALE_LOOKUP_RATE:
            node = self.previous_owner[p]
        return self.coordinators[node]

    def committing(self) -> bool:
        return True

    def violation(self, text: str) -> GroupInvariantViolation:
        return GroupInvariantViolation(f"seed {self.seed}: {text}\n" + "\n".join(self.trace[-30:]))

    # -- faults -----------------------------------------------------------------------------

    def _plan_faults(self) -> None:
        t = 500
        while t < FAULTS_MS:
            t += self.rng.randint(500, 2_500)
            kind = self.rng.choice(("pause", "pause", "crash", "cut"))
            node = self.rng.choice((1, 2))
            length = self.rng.randint(SESSION_MS + 500, SESSION_MS + 3_000)
            self.at(t, lambda k=kind, n=node, d=length: self._fault(k, n, d))
            t += length

    def _fault(self, kind: str, node: int, length: int) -> None:
        self.counts["faults"] += 1
        c = self.coordinators[node]
        self.note(f"fault: {kind} coordinator {node} for {length} ms")
        if kind == "pause":
            c.paused_until = self.now + length

            def resume() -> None:
                queued, c.queued = c.queued, []
                for action in queued:
                    action()

            self.at(length, resume)
        elif kind == "crash":
            c.crashed = True

            def restart() -> None:
                fresh = self._new_coordinator(node, c.incarnation + 1)
                self.coordinators[node] = fresh
                self._heartbeat(fresh)
                self._tick(fresh)

            self.at(length, restart)
        else:
            self.cut.add(node)
            self.at(length, lambda: self.cut.discard(node))


def run_seed(seed: int, *, trace: bool = False) -> dict[str, int]:
    """Run one schedule; raises :class:`GroupInvariantViolation` (with the trace's tail)."""
    return GroupSimulation(seed, trace=trace).run()


def main(argv: list[str] | None = None) -> int:
    """``python tests/simulation/sim_groups.py --seeds 200 [--first-seed 0] [--trace]``."""
    import argparse
    import time

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    failures = 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        try:
            counts = run_seed(seed, trace=args.trace)
        except GroupInvariantViolation as e:
            failures += 1
            print(e)
        else:
            if args.seeds == 1:
                print(f"seed {seed}: {counts}")
    elapsed = time.monotonic() - started
    print(f"{args.seeds} schedules in {elapsed:.1f} s, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
