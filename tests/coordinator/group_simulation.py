"""A seeded simulation of the pure group coordinator core: consumers, a clock, faults, invariants.

:class:`Simulation` drives :class:`~highwater.coordinator.core.GroupCoordinatorCore` with
simulated consumers that follow Kafka's classic consumer protocol: they join (twice, the
first time for a member id), the leader assigns the topic's partitions round-robin, all
sync, heartbeat every third of their session, commit the offsets of what they were
assigned, and rejoin when told to. Requests and replies take random network delays, so
they cross and reorder. Faults: consumers leave and come back, stall (stop sending anything
for longer than their session, then resume with what they knew, as a zombie does), restart
(a static member under its ``group.instance.id``, a dynamic one as a new member), writes to
``__consumer_offsets`` fail or lag, and the coordinator fails over (the old core is fenced
and unloads, a new one loads the partition from the log, which may or may not hold the
writes that were in flight). Stale probes send a heartbeat or a commit with the generation
before the consumer's, as a consumer that missed a rebalance would. Time is a simulated
clock; the core's :meth:`~highwater.coordinator.core.GroupCoordinatorCore.tick` runs every
:data:`TICK_MS`. Everything random comes from one seed.

After every event it checks:

* the group's state moves only along Kafka's transitions (``Empty``, ``PreparingRebalance``,
  ``CompletingRebalance``, ``Stable``, ``Dead``), every transition observed as it happens;
* within one generation no partition is assigned to two members;
* a heartbeat or commit with a generation other than the group's is refused with
  ILLEGAL_GENERATION (UNKNOWN_MEMBER_ID from a member the group does not know), and stores
  nothing; a commit in ``CompletingRebalance`` gets REBALANCE_IN_PROGRESS;
* an offset is acknowledged only to a member of the group's current generation, is in the
  log when acknowledged, and the core's offsets equal the log's whenever no write is in
  flight (so a new coordinator loads exactly what was acknowledged);
* a member that stops heartbeating is gone after its session timeout, and the group has
  rebalanced to a later generation within a rebalance timeout more; a rebalance timeout
  more each time the join phase ends while a silent static member still holds its place
  and no consumer could have rejoined (Kafka's join phase waits again when no member
  rejoined at all).

Once the faults stop, every consumer still running must end up in one ``Stable`` generation
whose assignment covers every partition. A failure raises :class:`SimulationFailure` with the
seed and the transcript of the last events; it replays alone with
``HIGHWATER_GROUP_SEED=N pytest tests/coordinator/test_group_simulation.py -k traced -s``.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import random
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from highwater.coordinator.core import (
    CommitResult,
    Effect,
    GroupCoordinatorCore,
    GroupCoordinatorSettings,
    JoinRequest,
    JoinResult,
    OffsetToCommit,
    Outcome,
    RebalanceCompleted,
    Reply,
    SyncRequest,
    SyncResult,
    Write,
)
from highwater.coordinator.group import CommittedOffset, Group, GroupState, Protocol
from highwater.coordinator.records import KeyValue, OffsetCommitRecord, decode_record
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode
from highwater.v1.consumer_protocol_pb2 import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    ConsumerProtocolTopicPartitions,
)

GROUP = "sim-group"
TOPIC = "events"
OFFSETS_PARTITION = 0
TICK_MS = 100

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD

KAFKA_TRANSITIONS = {
    EMPTY: {PREPARING, DEAD},
    PREPARING: {COMPLETING, EMPTY, DEAD},
    COMPLETING: {PREPARING, STABLE, DEAD},
    STABLE: {PREPARING, DEAD},
    DEAD: {DEAD},
}
"""Kafka's ``GroupMetadata`` state machine: the states each state may move to."""

COORDINATOR_MOVED = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
}
"""Errors after which a consumer finds the coordinator again and retries."""


def subscription(incarnation: int) -> bytes:
    """A consumer's subscription metadata. Its assignor data differs from one incarnation to
    the next (a restarted client has lost what its assignor kept, as the sticky assignors'
    previous assignment and generation), so a restarted static member joins with metadata
    other than its former incarnation's, and takes its place back all the same."""
    metadata = ConsumerProtocolSubscription(topics=[TOPIC], user_data=b"%d" % incarnation)
    return metadata.SerializeToString()


class SimulationFailure(AssertionError):
    """An invariant broke: names the seed and carries the transcript of the last events."""

    def __init__(self, seed: int, reason: str, trace: Sequence[str]) -> None:
        self.seed = seed
        self.reason = reason
        tail = "\n".join(trace[-60:])
        super().__init__(
            f"seed {seed}: {reason}\n"
            f"replay: HIGHWATER_GROUP_SEED={seed} pytest "
            f"tests/coordinator/test_group_simulation.py -k traced -s\n"
            f"last events:\n{tail}"
        )


@dataclass(frozen=True)
class Scenario:
    """What one schedule exercises; :meth:`from_seed` picks it from the seed."""

    consumers: int = 3
    static_consumers: int = 0
    partitions: int = 6
    session_ms: int = 600
    rebalance_ms: int = 900
    initial_delay_ms: int = 0
    commit_interval_ms: int = 250
    max_delay_ms: int = 20
    max_write_delay_ms: int = 30
    write_failure_rate: float = 0.0
    stale_probe_rate: float = 0.1
    leaves: int = 1
    stalls: int = 1
    restarts: int = 1
    failovers: int = 1
    chaos_ms: int = 4_000

    @classmethod
    def from_seed(cls, seed: int, **overrides: Any) -> Scenario:
        rng = random.Random(f"group-scenario-{seed}")
        consumers = rng.randint(1, 5)
        scenario = cls(
            consumers=consumers,
            static_consumers=rng.choice((0, 0, rng.randint(0, consumers))),
            partitions=rng.randint(1, 8),
            session_ms=rng.choice((300, 600, 1_000)),
            rebalance_ms=rng.choice((400, 900, 1_500)),
            initial_delay_ms=rng.choice((0, 0, 150)),
            commit_interval_ms=rng.choice((150, 400, 800)),
            max_delay_ms=rng.choice((1, 20, 80)),
            max_write_delay_ms=rng.choice((1, 30, 400)),
            write_failure_rate=rng.choice((0.0, 0.0, 0.1, 0.3)),
            stale_probe_rate=rng.choice((0.0, 0.1, 0.3)),
            leaves=rng.randint(0, 3),
            stalls=rng.randint(0, 3),
            restarts=rng.randint(0, 2),
            failovers=rng.choice((0, 1, 1, 2)),
        )
        return cls(**{**scenario.__dict__, **overrides})

    @property
    def longest_stall_ms(self) -> int:
        return 2 * self.session_ms + self.rebalance_ms

    @property
    def quiet_ms(self) -> int:
        """How long after the faults stop the group has to settle (a stall may outlast them)."""
        return (
            self.longest_stall_ms
            + 2 * (self.session_ms + self.rebalance_ms)
            + self.initial_delay_ms
            + 500
        )


@dataclass
class Consumer:
    """One simulated consumer process (an incarnation of it: a restart makes a new one)."""

    name: str
    instance_id: str | None
    incarnation: int = 0
    phase: str = "out"
    """out, joining, syncing, stable, left, or stopped (fenced: another holds its instance)."""
    member_id: str = ""
    generation: int = -1
    assignment: frozenset[int] = frozenset()
    request: object = None
    """The token of the JoinGroup or SyncGroup the consumer waits on."""
    stalled_until: int | None = None
    next_offset: int = 0
    loop: int = 0
    """Bumped whenever the consumer enters a generation: older heartbeat and commit loops end."""

    @property
    def identity(self) -> str:
        """Who holds an assignment: the instance of a static member, else the member id."""
        return self.instance_id or self.member_id


@dataclass
class Stall:
    """A consumer that stopped talking at ``since`` while a member of ``generation``."""

    member_id: str
    generation: int
    since: int
    consumer: str


@dataclass(frozen=True)
class Waiting:
    """A request awaiting its reply: who sent it, in which generation, as whom."""

    consumer: Consumer
    incarnation: int
    kind: str
    generation: int
    identity: str


@dataclass
class SimulationResult:
    seed: int
    scenario: Scenario
    events: int
    simulated_ms: int
    generation: int
    counts: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        return (
            f"seed {self.seed}: {self.scenario.consumers} consumers "
            f"({self.scenario.static_consumers} static), {self.scenario.partitions} partitions, "
            f"{self.events} events, {self.simulated_ms} ms simulated, "
            f"final generation {self.generation}; {counts}"
        )


class Simulation:
    """A seeded run of one group through faults; :meth:`run` returns or raises
    :class:`SimulationFailure`."""

    def __init__(self, seed: int, scenario: Scenario | None = None, *, trace: bool = False) -> None:
        self.seed = seed
        self.scenario = scenario or Scenario.from_seed(seed)
        self.rng = random.Random(seed)
        self.print_trace = trace
        self.settings = GroupCoordinatorSettings(
            group_min_session_timeout_ms=100,
            group_initial_rebalance_delay_ms=self.scenario.initial_delay_ms,
        )
        self.now = 0
        self.events = 0
        self.trace: deque[str] = deque(maxlen=300)
        self.counts: Counter[str] = Counter()
        self._queue: list[tuple[int, int, str, Any]] = []
        self._seq = 0
        self._tokens = 0
        self._member_ids = 0
        # The coordinator: its core, which incarnation it is, its writes in flight.
        self.coordinator_epoch = 0
        self.core = self._new_core()
        self.core.load(OFFSETS_PARTITION, 0, [], 0)
        self.loaded_at = 0
        self.log: list[KeyValue] = []
        self.logged_offsets: dict[TopicPartition, CommittedOffset] = {}
        """The group's offsets as the log holds them (the last commit of each partition)."""
        self.writes: deque[Write] = deque()
        """The core's writes not yet completed, appended in the order issued, as the service
        edge does (the core relies on it: a later generation's metadata must not land before
        an earlier one's): those queued while a batch is being appended go together in the
        next batch, as the edge's appends do."""
        self.writing = 0
        """How many of :attr:`writes` the batch being appended holds (0: none)."""
        # The consumers, and who waits on which token.
        self.consumers = [
            Consumer(f"c{i}", f"static-{i}" if i < self.scenario.static_consumers else None)
            for i in range(self.scenario.consumers)
        ]
        self.waiting: dict[object, Waiting] = {}
        # What has been observed.
        self.assigned: dict[int, dict[int, str]] = {}
        """generation -> partition -> the identity it was delivered to."""
        self.leader_assignments: dict[int, dict[str, bytes]] = {}
        """generation -> identity -> the assignment its leader made."""
        self.stalls: list[Stall] = []
        # Every stall of each consumer, (since, until), for the rebalance bound of _check.
        self.stall_history: dict[str, list[tuple[int, int]]] = {}
        self.faults_over = False
        self._checked_stable: tuple[int, int, GroupState] | None = None
        self._loading = False
        """While a new coordinator restores groups from the log (built, not transitioned)."""

    # --- Running -------------------------------------------------------------------------

    def run(self) -> SimulationResult:
        scenario = self.scenario
        for consumer in self.consumers:
            self._schedule(self.rng.randint(0, 300), "start", (consumer, consumer.incarnation))
        self._plan_faults()
        end = scenario.chaos_ms + scenario.quiet_ms
        self._schedule(scenario.chaos_ms, "faults-over", None)
        self._schedule(TICK_MS, "tick", None)
        with self._observe_transitions():
            while self._queue:
                at, _, kind, payload = heapq.heappop(self._queue)
                if at > end:
                    break
                self.now = at
                self.events += 1
                self._dispatch(kind, payload)
                self._check(kind)
            self._check_settled()
        return SimulationResult(
            self.seed, scenario, self.events, self.now, self._group_generation(), self.counts
        )

    def _schedule(self, delay_ms: int, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay_ms, self._seq, kind, payload))

    def _plan_faults(self) -> None:
        scenario = self.scenario
        for kind, count in (
            ("leave", scenario.leaves),
            ("stall", scenario.stalls),
            ("restart", scenario.restarts),
        ):
            for _ in range(count):
                consumer = self.rng.choice(self.consumers)
                at = self.rng.randint(500, scenario.chaos_ms - 500)
                self._schedule(at, kind, consumer.name)
        for _ in range(scenario.failovers):
            self._schedule(self.rng.randint(500, scenario.chaos_ms - 500), "failover", None)

    def _dispatch(self, kind: str, payload: Any) -> None:
        handlers: dict[str, Callable[[Any], None]] = {
            "tick": self._tick,
            "start": self._start,
            "request": self._deliver_request,
            "reply": self._deliver_reply,
            "heartbeat": self._heartbeat_due,
            "commit": self._commit_due,
            "write": self._write_done,
            "leave": self._leave,
            "stall": self._stall,
            "resume": self._resume,
            "restart": self._restart,
            "failover": self._failover,
            "load": self._load,
            "faults-over": self._faults_over,
        }
        handlers[kind](payload)

    def _faults_over(self, _: None) -> None:
        self.faults_over = True
        self._note("faults stop")

    # --- The coordinator ----------------------------------------------------------------

    def _new_core(self) -> GroupCoordinatorCore:
        def new_member_id(prefix: str) -> str:
            self._member_ids += 1
            return f"{prefix or 'm'}-{self._member_ids}"

        return GroupCoordinatorCore(
            self.settings, lambda _group_id: OFFSETS_PARTITION, new_member_id=new_member_id
        )

    def _tick(self, _: None) -> None:
        self._effects(self.core.tick(self.now))
        self._schedule(TICK_MS, "tick", None)

    def _effects(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Reply):
                if isinstance(effect.result, CommitResult):
                    self._check_committed(effect.result)
                self._schedule(self._delay(), "reply", (effect.token, effect.result))
            elif isinstance(effect, Write):
                self.writes.append(effect)
                self._next_write()
            elif isinstance(effect, RebalanceCompleted):
                self.counts["rebalances"] += 1
                self._note(f"rebalance to generation {effect.generation} completed")

    def _next_write(self) -> None:
        if self.writes and not self.writing:
            self.writing = len(self.writes)
            delay = self.rng.randint(0, self.scenario.max_write_delay_ms)
            self._schedule(delay, "write", self.coordinator_epoch)

    def _write_done(self, epoch: int) -> None:
        if epoch != self.coordinator_epoch:
            return  # issued by a coordinator since fenced
        batch = [self.writes.popleft() for _ in range(self.writing)]
        self.writing = 0
        failed = not self.faults_over and self.rng.random() < self.scenario.write_failure_rate
        if failed:
            self.counts["failed writes"] += 1
            self._note(f"writes {[w.write_id for w in batch]} failed")
            error = self.rng.choice((ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS))
        else:
            error = ErrorCode.NONE
        for write in batch:  # each appended, then answered, in turn
            if error == ErrorCode.NONE:
                self._append(write.records)
            self._effects(self.core.write_completed(write.write_id, error, self.now))
        self._next_write()

    def _append(self, records: Sequence[KeyValue]) -> None:
        self.log.extend(records)
        for key, value in records:
            record = decode_record(key, value)
            if isinstance(record, OffsetCommitRecord) and record.offset is not None:
                self.logged_offsets[record.topic_partition] = record.offset

    def _failover(self, _: None) -> None:
        """The coordinator is fenced: some of the writes it had queued reached the log (the
        first ones), and a new coordinator loads the partition from the log."""
        self.counts["failovers"] += 1
        reached_log = self.rng.randint(0, len(self.writes))
        for write in list(self.writes)[:reached_log]:
            self._append(write.records)
        self.writes.clear()
        self.writing = 0
        old = self.core
        self.coordinator_epoch += 1
        self.core = self._new_core()
        self.core.begin_loading(OFFSETS_PARTITION)
        self._note(f"coordinator fails over to epoch {self.coordinator_epoch}; loading")
        self._effects(old.unload(OFFSETS_PARTITION))
        self._schedule(self.rng.randint(1, 300), "load", self.coordinator_epoch)

    def _load(self, epoch: int) -> None:
        if epoch != self.coordinator_epoch:
            return
        records = [decode_record(k, v) for k, v in self.log]
        self._loading = True
        try:
            self.core.load(OFFSETS_PARTITION, epoch, records, self.now)
        finally:
            self._loading = False
        self.loaded_at = self.now
        group = self.core.groups.get(GROUP)
        state = "no group" if group is None else f"{group.state.value} gen {group.generation_id}"
        self._note(f"coordinator {epoch} loaded {len(records)} records: {state}")

    # --- Consumers: requests --------------------------------------------------------------

    def _delay(self) -> int:
        return self.rng.randint(0, self.scenario.max_delay_ms)

    def _token(self, consumer: Consumer, kind: str, *, incarnation: int | None = None) -> int:
        self._tokens += 1
        self.waiting[self._tokens] = Waiting(
            consumer,
            consumer.incarnation if incarnation is None else incarnation,
            kind,
            consumer.generation,
            consumer.identity,
        )
        return self._tokens

    def _send(self, consumer: Consumer, kind: str, **request: Any) -> None:
        self._schedule(self._delay(), "request", (consumer, consumer.incarnation, kind, request))

    def _start(self, payload: tuple[Consumer, int]) -> None:
        consumer, incarnation = payload
        if incarnation == consumer.incarnation and consumer.phase in ("out", "left"):
            self._join(consumer)

    def _join(self, consumer: Consumer) -> None:
        consumer.phase = "joining"
        consumer.request = token = self._token(consumer, "join")
        self._send(consumer, "join", token=token, member_id=consumer.member_id)

    def _deliver_request(self, payload: tuple[Consumer, int, str, dict[str, Any]]) -> None:
        consumer, incarnation, kind, request = payload
        core, now = self.core, self.now
        name = f"{consumer.name}.{incarnation}"
        if kind == "join":
            member_id = request["member_id"]
            self._note(f"{name} -> JoinGroup member={member_id or '-'}")
            join = JoinRequest(
                GROUP,
                member_id,
                consumer.instance_id,
                "consumer",
                (Protocol("roundrobin", subscription(incarnation)),),
                self.scenario.session_ms,
                self.scenario.rebalance_ms,
                client_id=consumer.name,
            )
            self._effects(core.join_group(request["token"], join, now))
        elif kind == "sync":
            self._note(
                f"{name} -> SyncGroup member={request['member_id']} gen={request['generation']} "
                f"assignments={len(request['assignments'])}"
            )
            sync = SyncRequest(
                GROUP,
                request["generation"],
                request["member_id"],
                consumer.instance_id,
                "consumer",
                "roundrobin",
                request["assignments"],
            )
            self._effects(core.sync_group(request["token"], sync, now))
        elif kind == "heartbeat":
            self._deliver_heartbeat(consumer, incarnation, request)
        elif kind == "commit":
            self._deliver_commit(consumer, incarnation, request)
        elif kind == "leave":
            self._note(f"{name} -> LeaveGroup member={request['member_id']}")
            outcomes, effects = core.leave_group(
                GROUP, [(request["member_id"], consumer.instance_id)], now
            )
            self._note(f"{name} <- LeaveGroup {_error(outcomes[0].error)}")
            self._effects(effects)

    def _expected_refusal(self, member_id: str, instance_id: str | None) -> int | None:
        """The error a heartbeat or commit must get whatever its generation (coordinator or
        membership), or None if the member is one of the group's."""
        core = self.core
        if OFFSETS_PARTITION in core.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if OFFSETS_PARTITION not in core.owned:
            return ErrorCode.NOT_COORDINATOR
        group = core.groups.get(GROUP)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if instance_id is not None:
            holder = group.static_members.get(instance_id)
            if holder is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if holder != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    def _deliver_heartbeat(
        self, consumer: Consumer, incarnation: int, request: dict[str, Any]
    ) -> None:
        member_id, generation = request["member_id"], request["generation"]
        probe = request["probe"]
        expected = self._expected_refusal(member_id, consumer.instance_id)
        if expected == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            expected = ErrorCode.NONE  # as Kafka's: the group is loading, answer blindly
        group = self.core.groups.get(GROUP)
        current = group.generation_id if group is not None else None
        outcome: Outcome = self.core.heartbeat(
            GROUP, member_id, generation, consumer.instance_id, self.now
        )
        what = "stale probe " if probe else ""
        self._note(
            f"{consumer.name}.{incarnation} -> {what}Heartbeat member={member_id} gen={generation} "
            f"<- {_error(outcome.error)} (group at {current})"
        )
        if expected is None:
            assert group is not None
            if generation != current:
                expected = ErrorCode.ILLEGAL_GENERATION
            elif group.is_in(PREPARING):
                expected = ErrorCode.REBALANCE_IN_PROGRESS
            else:
                expected = ErrorCode.NONE
        if outcome.error != expected:
            self._fail(
                f"heartbeat of {member_id} at generation {generation} (group at {current}) got "
                f"{_error(outcome.error)}, expected {_error(expected)}"
            )
        if generation != current and outcome.error == ErrorCode.ILLEGAL_GENERATION:
            self.counts["stale generations refused"] += 1
        if not probe:
            token = ("heartbeat", consumer, incarnation, generation)
            self._schedule(self._delay(), "reply", (token, outcome))

    def _deliver_commit(
        self, consumer: Consumer, incarnation: int, request: dict[str, Any]
    ) -> None:
        member_id, generation = request["member_id"], request["generation"]
        offsets: dict[int, int] = request["offsets"]
        probe = request["probe"]
        expected = self._expected_refusal(member_id, consumer.instance_id)
        group = self.core.groups.get(GROUP)
        current = group.generation_id if group is not None else None
        if expected is None:
            assert group is not None
            if generation != current:
                expected = ErrorCode.ILLEGAL_GENERATION
            elif group.is_in(COMPLETING):
                expected = ErrorCode.REBALANCE_IN_PROGRESS
        # A probe is a zombie's request: nobody acts on its answer.
        token = self._token(consumer, "commit", incarnation=-1 if probe else incarnation)
        items = [OffsetToCommit(TopicPartition(TOPIC, p), o) for p, o in sorted(offsets.items())]
        what = "stale probe " if probe else ""
        self._note(
            f"{consumer.name}.{incarnation} -> {what}OffsetCommit member={member_id} "
            f"gen={generation} {offsets} (group at {current})"
        )
        effects = self.core.commit_offsets(
            token, GROUP, member_id, generation, consumer.instance_id, items, self.now
        )
        if expected is not None:
            # Refused at once: one reply, every partition with the same error, no write.
            reply = effects[0] if len(effects) == 1 else None
            if not isinstance(reply, Reply) or not isinstance(reply.result, CommitResult):
                self._fail(
                    f"commit of {member_id} at generation {generation} (group at {current}) "
                    f"must get {_error(expected)}, the core answered {effects}"
                )
            errors = {o.error for o in reply.result.errors.values()}
            if errors != {expected}:
                self._fail(
                    f"commit of {member_id} at generation {generation} (group at {current}) got "
                    f"{sorted(_error(e) for e in errors)}, expected {_error(expected)}"
                )
            if expected == ErrorCode.ILLEGAL_GENERATION:
                self.counts["stale generations refused"] += 1
        else:
            # Accepted from a member of the current generation: what it may commit is its share.
            self.counts["commits accepted"] += 1
        self._effects(effects)

    # --- Consumers: replies ---------------------------------------------------------------

    def _deliver_reply(self, payload: tuple[object, object]) -> None:
        token, result = payload
        if isinstance(token, tuple):  # a heartbeat's outcome
            _, consumer, incarnation, generation = token
            current = incarnation == consumer.incarnation and generation == consumer.generation
            if current and consumer.stalled_until is None:
                assert isinstance(result, Outcome)
                self._on_heartbeat(consumer, result)
            return
        waiting = self.waiting.pop(token)
        consumer, incarnation = waiting.consumer, waiting.incarnation
        if waiting.kind == "commit":
            assert isinstance(result, CommitResult)
            self._on_commit_result(waiting, result)
            return
        current = incarnation == consumer.incarnation and token == consumer.request
        if isinstance(result, JoinResult):
            self._note(
                f"{consumer.name}.{incarnation} <- JoinGroup {_error(result.error)} "
                f"member={result.member_id or '-'} gen={result.generation_id} "
                f"leader={result.leader or '-'}" + ("" if current else " (ignored: stale)")
            )
            if current and consumer.stalled_until is None:
                self._on_join(consumer, result)
        else:
            assert isinstance(result, SyncResult)
            if result.error == ErrorCode.NONE:
                self._check_assignment(waiting, result)
            self._note(
                f"{consumer.name}.{incarnation} <- SyncGroup {_error(result.error)} "
                f"{sorted(_decode(result.assignment))}" + ("" if current else " (ignored: stale)")
            )
            if current and consumer.stalled_until is None:
                self._on_sync(consumer, result)

    def _on_join(self, consumer: Consumer, result: JoinResult) -> None:
        error = result.error
        if error == ErrorCode.MEMBER_ID_REQUIRED:
            consumer.member_id = result.member_id
            self._join(consumer)
        elif error == ErrorCode.NONE:
            consumer.member_id = result.member_id
            consumer.generation = result.generation_id
            consumer.phase = "syncing"
            assignments: dict[str, bytes] = {}
            if result.leader == result.member_id and not result.skip_assignment:
                assignments = self._assign(sorted(m.member_id for m in result.members))
                self.leader_assignments[result.generation_id] = {
                    m.group_instance_id or m.member_id: assignments[m.member_id]
                    for m in result.members
                }
            consumer.request = token = self._token(consumer, "sync")
            consumer.loop += 1
            self._schedule(self.scenario.session_ms // 3, "heartbeat", (consumer, consumer.loop))
            self._send(
                consumer,
                "sync",
                token=token,
                member_id=consumer.member_id,
                generation=consumer.generation,
                assignments=assignments,
            )
        else:
            self._rejoin_after(consumer, error)

    def _on_sync(self, consumer: Consumer, result: SyncResult) -> None:
        if result.error == ErrorCode.NONE:
            consumer.phase = "stable"
            consumer.assignment = frozenset(_decode(result.assignment))
            self._schedule(self.scenario.commit_interval_ms, "commit", (consumer, consumer.loop))
        else:
            self._rejoin_after(consumer, result.error)

    def _on_heartbeat(self, consumer: Consumer, outcome: Outcome) -> None:
        if outcome.error == ErrorCode.NONE or consumer.phase not in ("syncing", "stable"):
            return
        if outcome.error == ErrorCode.REBALANCE_IN_PROGRESS and consumer.phase == "syncing":
            return  # its SyncGroup will be answered with the same news
        self._rejoin_after(consumer, outcome.error)

    def _on_commit_result(self, waiting: Waiting, result: CommitResult) -> None:
        consumer, incarnation = waiting.consumer, waiting.incarnation
        acknowledged = {
            tp.partition for tp, outcome in result.errors.items() if outcome.error == ErrorCode.NONE
        }
        errors = {o.error for o in result.errors.values()} - {ErrorCode.NONE}
        self._note(
            f"{consumer.name}.{incarnation} <- OffsetCommit acknowledged {sorted(acknowledged)}"
            + (f" refused {sorted(_error(e) for e in errors)}" if errors else "")
        )
        if incarnation != consumer.incarnation or waiting.generation != consumer.generation:
            return
        if consumer.phase != "stable" or consumer.stalled_until is not None:
            return
        membership = errors & {
            ErrorCode.ILLEGAL_GENERATION,
            ErrorCode.UNKNOWN_MEMBER_ID,
            ErrorCode.REBALANCE_IN_PROGRESS,
            ErrorCode.FENCED_INSTANCE_ID,
        }
        if membership:
            self._rejoin_after(consumer, min(membership))

    def _rejoin_after(self, consumer: Consumer, error: int) -> None:
        """What a consumer does when told it is no longer in step with the group."""
        if error == ErrorCode.FENCED_INSTANCE_ID:
            self._note(f"{consumer.name}.{consumer.incarnation} is fenced and stops")
            consumer.phase = "stopped"
            return
        if error == ErrorCode.UNKNOWN_MEMBER_ID:
            consumer.member_id = ""
        elif error not in COORDINATOR_MOVED | {
            ErrorCode.ILLEGAL_GENERATION,
            ErrorCode.REBALANCE_IN_PROGRESS,
        }:
            self._fail(f"{consumer.name} got an error no consumer expects: {_error(error)}")
        consumer.phase = "out"
        consumer.generation = -1
        consumer.assignment = frozenset()
        backoff = self.rng.randint(20, 100) if error in COORDINATOR_MOVED else 0
        self._schedule(backoff, "start", (consumer, consumer.incarnation))

    def _assign(self, member_ids: list[str]) -> dict[str, bytes]:
        """The leader's round-robin assignment of the topic's partitions."""
        shares: dict[str, list[int]] = {m: [] for m in member_ids}
        for partition in range(self.scenario.partitions):
            shares[member_ids[partition % len(member_ids)]].append(partition)
        return {
            member_id: ConsumerProtocolAssignment(
                assigned_partitions=[ConsumerProtocolTopicPartitions(topic=TOPIC, partitions=ps)]
            ).SerializeToString()
            for member_id, ps in shares.items()
        }

    # --- Consumers: periodic work ---------------------------------------------------------

    def _heartbeat_due(self, payload: tuple[Consumer, int]) -> None:
        consumer, loop = payload
        if loop != consumer.loop or consumer.phase not in ("syncing", "stable"):
            return
        self._schedule(self.scenario.session_ms // 3, "heartbeat", payload)
        if consumer.stalled_until is not None:
            return
        self._send(
            consumer,
            "heartbeat",
            member_id=consumer.member_id,
            generation=consumer.generation,
            probe=False,
        )
        if consumer.generation > 0 and self.rng.random() < self.scenario.stale_probe_rate:
            self._send(
                consumer,
                "heartbeat",
                member_id=consumer.member_id,
                generation=consumer.generation - 1,
                probe=True,
            )

    def _commit_due(self, payload: tuple[Consumer, int]) -> None:
        consumer, loop = payload
        if loop != consumer.loop or consumer.phase != "stable":
            return
        self._schedule(self.scenario.commit_interval_ms, "commit", payload)
        if consumer.stalled_until is not None or not consumer.assignment:
            return
        consumer.next_offset += self.rng.randint(1, 50)
        offsets = dict.fromkeys(consumer.assignment, consumer.next_offset)
        probe = consumer.generation > 0 and self.rng.random() < self.scenario.stale_probe_rate
        generation = consumer.generation - 1 if probe else consumer.generation
        self._send(
            consumer,
            "commit",
            member_id=consumer.member_id,
            generation=generation,
            offsets=offsets,
            probe=probe,
        )

    # --- Faults ---------------------------------------------------------------------------

    def _consumer(self, name: str) -> Consumer:
        return next(c for c in self.consumers if c.name == name)

    def _leave(self, name: str) -> None:
        consumer = self._consumer(name)
        if consumer.phase not in ("syncing", "stable") or consumer.stalled_until is not None:
            return
        self.counts["leaves"] += 1
        self._send(consumer, "leave", member_id=consumer.member_id)
        consumer.phase = "left"
        consumer.request = None
        consumer.generation = -1
        consumer.assignment = frozenset()
        consumer.member_id = ""
        self._schedule(self.rng.randint(100, 1_500), "start", (consumer, consumer.incarnation))

    def _stall(self, name: str) -> None:
        consumer = self._consumer(name)
        if consumer.phase != "stable" or consumer.stalled_until is not None:
            return
        self.counts["stalls"] += 1
        duration = self.rng.randint(self.scenario.session_ms // 2, self.scenario.longest_stall_ms)
        consumer.stalled_until = self.now + duration
        self.stalls.append(Stall(consumer.member_id, consumer.generation, self.now, consumer.name))
        self.stall_history.setdefault(consumer.name, []).append((self.now, self.now + duration))
        self._note(f"{consumer.name}.{consumer.incarnation} stalls for {duration} ms")
        self._schedule(duration, "resume", consumer)

    def _resume(self, consumer: Consumer) -> None:
        """The consumer talks again, with the member id and generation it had: from now on
        the core may keep it (if its session had not expired) or refuse it."""
        consumer.stalled_until = None
        self.stalls = [s for s in self.stalls if s.consumer != consumer.name]
        self._note(
            f"{consumer.name}.{consumer.incarnation} resumes at generation {consumer.generation}"
        )

    def _restart(self, name: str) -> None:
        """The process dies and starts again: a static member rejoins as its instance."""
        consumer = self._consumer(name)
        if consumer.stalled_until is not None:
            return
        self.counts["restarts"] += 1
        if consumer.phase == "stable" and consumer.instance_id is None:
            # The old member is never heard from again: its session must expire.
            self.stalls.append(Stall(consumer.member_id, consumer.generation, self.now, ""))
        consumer.incarnation += 1
        consumer.phase = "out"
        consumer.member_id = ""
        consumer.generation = -1
        consumer.assignment = frozenset()
        consumer.request = None
        self._note(f"{consumer.name} restarts as incarnation {consumer.incarnation}")
        self._schedule(self.rng.randint(1, 200), "start", (consumer, consumer.incarnation))

    # --- Checks ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _observe_transitions(self) -> Iterator[None]:
        """Check every state change of a group as it happens, against Kafka's transitions.

        A group being restored from the log is built in its state, not moved into it."""
        original = Group.transition
        simulation = self

        def transition(group: Group, state: GroupState, now: int) -> None:
            if not simulation._loading:
                simulation.counts[f"{group.state.value} -> {state.value}"] += 1
                if state not in KAFKA_TRANSITIONS[group.state]:
                    simulation._fail(
                        f"group {group.group_id} moved from {group.state.value} to {state.value}"
                    )
            original(group, state, now)

        Group.transition = transition  # type: ignore[method-assign]
        try:
            yield
        finally:
            Group.transition = original  # type: ignore[method-assign]

    def _check_assignment(self, waiting: Waiting, result: SyncResult) -> None:
        """A member gets the share its generation's leader gave it; within one generation no
        partition is delivered to two members."""
        generation, identity = waiting.generation, waiting.identity
        made = self.leader_assignments.get(generation)
        if made is not None and made.get(identity, b"") != result.assignment:
            self._fail(
                f"{identity} got {list(_decode(result.assignment))} in generation {generation}, "
                f"its leader gave it {list(_decode(made.get(identity, b'')))}"
            )
        owners = self.assigned.setdefault(generation, {})
        for partition in _decode(result.assignment):
            owner = owners.setdefault(partition, identity)
            if owner != identity:
                self._fail(
                    f"partition {partition} assigned to {owner} and to {identity} "
                    f"in generation {generation}"
                )

    def _check_committed(self, result: CommitResult) -> None:
        """An offset is acknowledged once it is in the log (and in the core's offsets)."""
        group = self.core.groups.get(GROUP)
        for tp, outcome in result.errors.items():
            if outcome.error != ErrorCode.NONE:
                continue
            committed = group.offsets.get(tp) if group is not None else None
            if committed is None or self.logged_offsets.get(tp) != committed:
                self._fail(
                    f"offset {committed} of {tp} acknowledged, the log's last is "
                    f"{self.logged_offsets.get(tp)}"
                )

    def _check(self, kind: str) -> None:
        core = self.core
        group = core.groups.get(GROUP)
        if group is None or OFFSETS_PARTITION not in core.owned:
            return
        # The core's offsets are the log's whenever no write is in flight.
        if kind in ("write", "load") and not self.writes and (group.offsets != self.logged_offsets):
            self._fail(f"offsets in memory {group.offsets} are not the log's {self.logged_offsets}")
        # Members that stopped talking are gone after their session, and the group rebalanced.
        for stall in self.stalls:
            heard = max(stall.since + self.scenario.max_delay_ms, self.loaded_at)
            removed_by = heard + self.scenario.session_ms + TICK_MS
            if self.now > removed_by and stall.member_id in group.members:
                self._fail(
                    f"member {stall.member_id} silent since {stall.since} is still in the group"
                )
            rebalanced_by = removed_by + self.scenario.rebalance_ms + TICK_MS
            # A join phase that ends with no member rejoined waits another rebalance
            # timeout, and again (Kafka's onCompleteJoin): while a deadline finds a silent
            # static member holding its place and no consumer able to have rejoined, the
            # next one is the bound.
            while self._join_may_wait_at(rebalanced_by - TICK_MS):
                rebalanced_by += self.scenario.rebalance_ms
            if self.now > rebalanced_by and group.generation_id <= stall.generation:
                self._fail(
                    f"the group is still at generation {group.generation_id}, "
                    f"{stall.member_id} stalled in {stall.generation} at {stall.since}"
                )
        stable = (id(group), group.generation_id, group.state)
        if group.is_in(STABLE) and stable != self._checked_stable:
            # The members' assignments in force are disjoint (checked once per Stable period).
            self._checked_stable = stable
            seen: dict[int, str] = {}
            for member in group.members.values():
                identity = member.group_instance_id or member.member_id
                for partition in _decode(member.assignment):
                    if seen.setdefault(partition, identity) != identity:
                        self._fail(f"partition {partition} is assigned twice in a Stable group")

    def _join_may_wait_at(self, at: int) -> bool:
        """Whether Kafka's join phase may rightly go on past a deadline at ``at``: a static
        member that stopped talking may still hold its place there (its session not over;
        a dynamic member that did not rejoin is dropped at the deadline, and the next
        generation forms, even an empty one), and no consumer talked throughout the
        heartbeat interval before it (and the time a JoinGroup takes to arrive), so none
        could have learnt of the rebalance and rejoined by then."""
        scenario = self.scenario
        window = scenario.session_ms // 3 + 2 * scenario.max_delay_ms + TICK_MS
        session_end = scenario.session_ms + scenario.max_delay_ms + TICK_MS

        def stalls(consumer: Consumer) -> list[tuple[int, int]]:
            return self.stall_history.get(consumer.name, [])

        held = any(
            consumer.instance_id is not None
            and any(
                since < at < min(until, since + session_end) for since, until in stalls(consumer)
            )
            for consumer in self.consumers
        )
        none_could_rejoin = all(
            any(since < at and until > at - window for since, until in stalls(consumer))
            for consumer in self.consumers
        )
        return held and none_could_rejoin

    def _check_settled(self) -> None:
        """Without faults, every running consumer ends up in one Stable generation that
        covers every partition."""
        group = self.core.groups.get(GROUP)
        running = [c for c in self.consumers if c.phase != "stopped"]
        if not running:
            return
        if group is None or not group.is_in(STABLE):
            state = "no group" if group is None else group.state.value
            self._fail(f"the group did not settle: {state}")
        members = {c.member_id for c in running}
        if set(group.members) != members or any(c.phase != "stable" for c in running):
            self._fail(
                f"the group's members {sorted(group.members)} are not the running consumers "
                f"{[(c.name, c.member_id, c.phase) for c in running]}"
            )
        generations = {c.generation for c in running}
        if generations != {group.generation_id}:
            self._fail(
                f"consumers at generations {generations}, the group at {group.generation_id}"
            )
        covered = sorted(p for c in running for p in c.assignment)
        if covered != list(range(self.scenario.partitions)):
            self._fail(f"the assignment covers {covered} of {self.scenario.partitions} partitions")

    def _group_generation(self) -> int:
        group = self.core.groups.get(GROUP)
        return -1 if group is None else group.generation_id

    # --- Diagnostics ----------------------------------------------------------------------

    def _note(self, text: str) -> None:
        line = f"{self.now:>6} {text}"
        self.trace.append(line)
        if self.print_trace:
            print(line)

    def _fail(self, reason: str) -> NoReturn:
        group = self.core.groups.get(GROUP)
        if group is not None:
            self._note(
                f"group: {group.state.value} gen {group.generation_id} leader {group.leader_id} "
                f"members {sorted(group.members)} pending {sorted(group.pending_members)}"
            )
        for c in self.consumers:
            self._note(
                f"consumer {c.name}.{c.incarnation}: {c.phase} member={c.member_id or '-'} "
                f"gen={c.generation} owns {sorted(c.assignment)} stalled_until={c.stalled_until}"
            )
        raise SimulationFailure(self.seed, reason, list(self.trace))


@functools.lru_cache(maxsize=1024)
def _decode(assignment: bytes) -> tuple[int, ...]:
    decoded = ConsumerProtocolAssignment.FromString(assignment)
    return tuple(p for entry in decoded.assigned_partitions for p in entry.partitions)


def _error(code: int) -> str:
    return ErrorCode.Name(code)  # type: ignore[arg-type]


def run_schedule(seed: int, *, trace: bool = False, **overrides: Any) -> SimulationResult:
    """Run the schedule of ``seed`` (its scenario adjusted by ``overrides``)."""
    return Simulation(seed, Scenario.from_seed(seed, **overrides), trace=trace).run()
