"""Group coordinators in the simulation: two real coordinator cores, their leases, committers.

Two :class:`~highwater.coordinator.core.GroupCoordinatorCore` instances (the real pure
core) own the partitions of a two-partition ``__consumer_offsets``; each guards them with
the real :class:`~highwater.coordinator.lease.SessionLease`. What the service edge and the
controller do around them is simulated here, over a millisecond clock and one seeded
random source:

- the controller's side of coordinator sessions: heartbeats every ``HEARTBEAT_MS``; a
  coordinator not heard from for ``SESSION_MS`` loses its partitions to the other live
  coordinator with the coordinator epoch + 1 (and learns it when its next heartbeat is
  answered as stale);
- ``__consumer_offsets`` as one durable log per partition with the broker's producer-epoch
  fencing: an append of an epoch lower than one already appended is refused (the data
  path under it is the rest of the simulation's business);
- taking a partition over: the epoch marker appended, the partition read back and loaded;
- clients: per group a committer (a member of the group: JoinGroup, SyncGroup as its
  leader, then increasing offsets in its generation, one commit at a time; it rejoins when
  the generation is refused) and fetchers (OffsetFetch), each caching the coordinator it
  found and looking it up again on NOT_COORDINATOR or a timeout; a connection delivers in
  order.

Faults (from the seed): a coordinator paused past its session (requests queued for it
run when it resumes: the stale-coordinator story), a coordinator crashed and restarted
(its cache gone), clients cut from a coordinator.

Invariants, checked as the answers arrive:

- an OffsetFetch answer is never older than an offset acknowledged, or fetched, before the
  fetch was sent (committed offsets never move back);
- every acknowledged commit was appended by its partition's current owner (a deposed
  coordinator's appends are refused), and each coordinator epoch is acted on by one
  coordinator only.

``LEASE_CHECKED = False`` puts the stale-coordinator bug back (a coordinator whose session
lapsed keeps serving from its cache until the controller's answer reaches it).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from highwater.coordinator.core import (
    CONSUMER_PROTOCOL_TYPE,
    CommitResult,
    GroupCoordinatorCore,
    GroupCoordinatorSettings,
    JoinRequest,
    JoinResult,
    OffsetToCommit,
    Reply,
    SyncRequest,
    SyncResult,
    Write,
)
from highwater.coordinator.group import Protocol
from highwater.coordinator.lease import SessionLease
from highwater.coordinator.records import KeyValue, decode_record, encode_epoch_marker
from highwater.metadata.consumer_offsets import partition_for_group
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode
from highwater.v1.consumer_protocol_pb2 import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    ConsumerProtocolTopicPartitions,
)

LEASE_CHECKED = True
"""Mutation switch: False serves requests without checking the session lease."""

PARTITIONS = 2
SESSION_MS = 3_000
HEARTBEAT_MS = 500
CLIENT_TIMEOUT_MS = 1_000
GROUPS = ("orders", "billing", "audit")
TP = TopicPartition("events", 0)
STALE_LOOKUP_RATE = 0.3
FAULTS_MS = 12_000
SETTLE_MS = 6_000


class GroupInvariantViolation(AssertionError):
    pass


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
        self.acked: dict[str, int] = dict.fromkeys(GROUPS, -1)
        self.fetched: dict[str, int] = dict.fromkeys(GROUPS, -1)
        self.position: dict[str, int] = dict.fromkeys(GROUPS, -1)
        self.membership: dict[str, tuple[str, int]] = dict.fromkeys(GROUPS, ("", -1))
        """group → (member id, generation) of its committer, a member of the group."""
        self.cut: set[int] = set()
        self.connection_free: dict[tuple[str, int], int] = {}
        self.counts = {"commits": 0, "fetches": 0, "refused": 0, "faults": 0, "moves": 0}
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
        for group in GROUPS:
            self.at(self.rng.randint(0, 50), lambda g=group: self._join(g, None))
            for f in range(2):
                self.at(self.rng.randint(0, 50), lambda g=group, f=f: self._fetch(g, f, None))
        self._plan_faults()
        end = FAULTS_MS + SETTLE_MS
        while self._events and self._events[0][0] <= end:
            self.now, _, action = heapq.heappop(self._events)
            action()
        return self.counts

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

    def _serving(self, c: Coordinator) -> bool:
        """The edge's check before every request (CoordinatorServer.check_lease)."""
        if LEASE_CHECKED and c.lease.lapse(self.now):
            self.note(f"coordinator {c.node_id}: lease lapsed; unloading")
            for p in list(c.core.owned):
                self._effects(c, c.core.unload(p))
        return not (LEASE_CHECKED and c.lease.lapsed)

    def _tick(self, c: Coordinator) -> None:
        if not (LEASE_CHECKED and c.lease.lapsed):
            self._effects(c, c.core.tick(self.now))
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
        self._serving(c)
        # The controller's answer carries the assignment: drop what moved away, load what
        # is ours (a lapsed lease's partitions are loaded again once renewed).
        for p in list(c.core.owned) + list(c.core.loading):
            node, epoch = self.owner[p]
            if node != c.node_id or c.core.owned.get(p, epoch) != epoch:
                self.note(f"coordinator {c.node_id}: partition {p} moved away")
                self._effects(c, c.core.unload(p))
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
            self._act(c, p, epoch)
            records = [decode_record(k, v) for _, (k, v) in self.logs[p].records]
            c.core.load(p, epoch, records, self.now)
            self.note(f"coordinator {c.node_id}: loaded partition {p} in epoch {epoch}")

        self.at(self.rng.randint(1, 100), self.on(c, load))

    def _act(self, c: Coordinator, p: int, epoch: int) -> None:
        actor = self.epoch_actor.setdefault((p, epoch), c.node_id)
        if actor != c.node_id:
            raise self._violation(
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

    def _effects(self, c: Coordinator, effects: list[object]) -> None:
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
                self._act(c, write.partition, epoch)
                self.note(f"coordinator {c.node_id}: appended in epoch {epoch}")
            else:
                self.note(f"coordinator {c.node_id}: append in epoch {epoch} fenced")

            def done() -> None:
                error = ErrorCode.NONE if ok else ErrorCode.INVALID_PRODUCER_EPOCH
                self._effects(c, c.core.write_completed(write.write_id, error, self.now))

            self.at(self._delay(), self.on(c, done))

        self.at(self._delay(), append)

    # -- clients ----------------------------------------------------------------------------

    def _delay(self) -> int:
        return self.rng.randint(1, 30)

    def _send(self, client: str, c: Coordinator, action: Callable[[], None]) -> None:
        """One in-order connection from ``client`` to ``c``; cut while ``c`` is cut off."""
        if c.node_id in self.cut:
            return
        key = (client, c.node_id)
        when = max(self.connection_free.get(key, 0), self.now + self._delay())
        self.connection_free[key] = when
        self.at(when - self.now, self.on(c, action))

    def _find(self, group: str) -> Coordinator:
        """FindCoordinator, answered by a broker whose metadata may lag: now and then the
        partition's previous owner."""
        p = partition_for_group(group, PARTITIONS)
        node = self.owner[p][0]
        if p in self.previous_owner and self.rng.random() < STALE_LOOKUP_RATE:
            node = self.previous_owner[p]
        return self.coordinators[node]

    def _request(
        self,
        client: str,
        c: Coordinator,
        serve: Callable[[Callable[[object], None]], None],
        answered: Callable[[object | None], None],
    ) -> None:
        """Send a request; ``answered(None)`` after the client's timeout if no answer came."""
        state = {"open": True}

        def answer(result: object | None) -> None:
            if state["open"]:
                state["open"] = False
                answered(result)

        def deliver_answer(result: object) -> None:
            if c.node_id not in self.cut:
                self.at(self._delay(), lambda: answer(result))

        self._send(client, c, lambda: serve(deliver_answer))
        self.at(CLIENT_TIMEOUT_MS, lambda: answer(None))

    def _join(self, group: str, c: Coordinator | None) -> None:
        """JoinGroup (twice the first time: MEMBER_ID_REQUIRED), SyncGroup as the group's
        only member and so its leader, then commits in the generation."""
        c = c or self._find(group)
        member_id = self.membership[group][0]
        subscription = ConsumerProtocolSubscription(topics=[TP.topic]).SerializeToString()
        request = JoinRequest(
            group,
            member_id,
            None,
            CONSUMER_PROTOCOL_TYPE,
            (Protocol("range", subscription),),
            10_000,
            10_000,
        )

        def serve(reply: Callable[[object], None]) -> None:
            if not self._serving(c):
                reply(JoinResult(ErrorCode.NOT_COORDINATOR))
                return
            token = ("join", group, self.now, self.rng.random())
            c.pending[token] = reply
            self._effects(c, c.core.join_group(token, request, self.now))

        def answered(result: object | None) -> None:
            if not isinstance(result, JoinResult):
                self.at(self.rng.randint(10, 80), lambda: self._join(group, None))
            elif result.error == ErrorCode.MEMBER_ID_REQUIRED:
                self.membership[group] = (result.member_id, -1)
                self._join(group, c)
            elif result.error != ErrorCode.NONE:
                if result.error == ErrorCode.UNKNOWN_MEMBER_ID:
                    self.membership[group] = ("", -1)
                self.at(self.rng.randint(10, 80), lambda: self._join(group, None))
            else:
                self.membership[group] = (result.member_id, result.generation_id)
                self._sync(group, c, result)

        self._request(f"committer-{group}", c, serve, answered)

    def _sync(self, group: str, c: Coordinator, joined: JoinResult) -> None:
        assignment = ConsumerProtocolAssignment(
            assigned_partitions=[
                ConsumerProtocolTopicPartitions(topic=TP.topic, partitions=[TP.partition])
            ]
        ).SerializeToString()
        request = SyncRequest(
            group,
            joined.generation_id,
            joined.member_id,
            None,
            CONSUMER_PROTOCOL_TYPE,
            joined.protocol_name,
            {joined.member_id: assignment} if joined.leader == joined.member_id else {},
        )

        def serve(reply: Callable[[object], None]) -> None:
            if not self._serving(c):
                reply(SyncResult(ErrorCode.NOT_COORDINATOR))
                return
            token = ("sync", group, self.now, self.rng.random())
            c.pending[token] = reply
            self._effects(c, c.core.sync_group(token, request, self.now))

        def answered(result: object | None) -> None:
            if isinstance(result, SyncResult) and result.error == ErrorCode.NONE:
                self.note(f"{group}: {joined.member_id} in generation {joined.generation_id}")
                self._commit(group, c)
            else:
                self.at(self.rng.randint(10, 80), lambda: self._join(group, None))

        self._request(f"committer-{group}", c, serve, answered)

    def _commit(self, group: str, c: Coordinator | None) -> None:
        c = c or self._find(group)
        # A consumer's position only grows: each attempt commits past every earlier one
        # (acknowledged or not), so an answer older than any of them is a step back.
        offset = self.position[group] = self.position[group] + 1 + self.rng.randint(0, 3)
        sent = self.now

        def serve(reply: Callable[[object], None]) -> None:
            if not self._serving(c):
                reply(ErrorCode.NOT_COORDINATOR)
                return
            token = ("commit", group, sent, self.rng.random())
            c.pending[token] = reply
            member_id, generation = self.membership[group]
            effects = c.core.commit_offsets(
                token, group, member_id, generation, None, [OffsetToCommit(TP, offset)], self.now
            )
            self._effects(c, effects)

        def answered(result: object | None) -> None:
            ok = isinstance(result, CommitResult) and all(
                o.error == ErrorCode.NONE for o in result.errors.values()
            )
            if ok:
                self.counts["commits"] += 1
                self.acked[group] = max(self.acked[group], offset)
                self.note(f"{group}: commit {offset} acknowledged by {c.node_id}")
                self.at(self.rng.randint(10, 80), lambda: self._commit(group, c))
            else:
                self.counts["refused"] += 1
                errors = (
                    {o.error for o in result.errors.values()}
                    if isinstance(result, CommitResult)
                    else set()
                )
                if errors & _REJOIN:
                    self.at(self.rng.randint(10, 80), lambda: self._join(group, None))
                else:
                    self.at(self.rng.randint(10, 80), lambda: self._commit(group, None))

        self._request(f"committer-{group}", c, serve, answered)

    def _fetch(self, group: str, n: int, c: Coordinator | None) -> None:
        c = c or self._find(group)
        floor = max(self.acked[group], self.fetched[group])

        def serve(reply: Callable[[object], None]) -> None:
            if not self._serving(c):
                reply(ErrorCode.NOT_COORDINATOR)
                return
            outcome, offsets = c.core.fetch_offsets(group, [TP])
            reply(offsets[TP].offset if outcome.error == ErrorCode.NONE else outcome.error)
            if outcome.error == ErrorCode.NONE:
                p = partition_for_group(group, PARTITIONS)
                self._act(c, p, c.core.owned[p])

        def answered(result: object | None) -> None:
            if isinstance(result, int) and result >= -1 and result not in _ERRORS:
                self.counts["fetches"] += 1
                if result < floor:
                    raise self._violation(
                        f"{group}: OffsetFetch from coordinator {c.node_id} answered {result}, "
                        f"older than {floor} acknowledged or fetched before it was sent"
                    )
                self.fetched[group] = max(self.fetched[group], result)
                self.at(self.rng.randint(10, 80), lambda: self._fetch(group, n, c))
            else:
                self.at(self.rng.randint(10, 80), lambda: self._fetch(group, n, None))

        self._request(f"fetcher-{group}-{n}", c, serve, answered)

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

    def _violation(self, text: str) -> GroupInvariantViolation:
        return GroupInvariantViolation(f"seed {self.seed}: {text}\n" + "\n".join(self.trace[-30:]))


_REJOIN = frozenset(
    {ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.REBALANCE_IN_PROGRESS}
)
_ERRORS = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})


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
