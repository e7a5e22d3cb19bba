"""The group clients of the simulations, and the invariants their answers must keep.

Both simulations that run group coordinators use these clients: :mod:`sim_groups` (two
coordinator cores beside a simulated ``__consumer_offsets``) and :mod:`sim_cluster` (the
coordinators inside the whole cluster: sessions with the real controller, offsets on the
real brokers). What differs between them is behind :class:`GroupHost`: how a request
reaches a coordinator and its answer comes back, how FindCoordinator is answered, what
"serving" means for a coordinator, and how the core's effects are carried out.

Per group, a committer (a member of the group: JoinGroup, SyncGroup as its leader, then
increasing offsets in its generation, one commit at a time; it rejoins when the
generation is refused) and fetchers (OffsetFetch), each caching the coordinator it found
and looking it up again on NOT_COORDINATOR or a timeout (and, with ``fresh_reader_rate``,
before some fetches: a new reader, such as a consumer starting or an admin describing the
group, finds the coordinator first); a connection delivers in order.

The invariant the clients check as answers arrive: an OffsetFetch answer is never older
than an offset acknowledged, or fetched, before the fetch was sent (committed offsets
never move back).

``LEASE_CHECKED = False`` puts the stale-coordinator bug back in both simulations (a
coordinator whose session lapsed keeps serving from its cache until the controller's
answer reaches it).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from highwater.coordinator.core import (
    CONSUMER_PROTOCOL_TYPE,
    CommitResult,
    GroupCoordinatorCore,
    JoinRequest,
    JoinResult,
    OffsetToCommit,
    SyncRequest,
    SyncResult,
)
from highwater.coordinator.group import Protocol as GroupProtocol
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

GROUPS = ("orders", "billing", "audit")
TP = TopicPartition("events", 0)
"""The partition whose offsets the groups commit (only a name: nothing reads it)."""
CLIENT_TIMEOUT_MS = 1_000
STALE_LOOKUP_RATE = 0.3
"""How often FindCoordinator is answered from metadata that lags: the previous owner."""


class GroupInvariantViolation(AssertionError):
    pass


class CoordinatorHandle(Protocol):
    node_id: int
    core: GroupCoordinatorCore
    pending: dict[object, Callable[[object], None]]
    """Requests waiting in the core (by token) → how to answer them."""


Reply = Callable[[object], None]


class GroupHost(Protocol):
    """What the clients need from the simulation they run in."""

    rng: random.Random

    @property
    def now(self) -> int: ...

    def at(self, delay: int, action: Callable[[], None]) -> None:
        """Run ``action`` (client side) ``delay`` ms from now."""

    def find(self, group: str) -> CoordinatorHandle | None:
        """FindCoordinator: the coordinator of ``group`` (None: none known right now)."""

    def request(
        self,
        client: str,
        c: CoordinatorHandle,
        serve: Callable[[Reply], None],
        answer: Callable[[object], None],
    ) -> None:
        """Send over ``client``'s in-order connection to ``c``: ``serve(reply)`` runs on
        ``c``; what it replies comes back to ``answer`` (or is lost with the connection)."""

    def serving(self, c: CoordinatorHandle) -> bool:
        """The edge's check before every request (CoordinatorServer.check_lease)."""

    def effects(self, c: CoordinatorHandle, effects: list[object]) -> None:
        """Carry out the core's effects (replies to ``c.pending``, writes)."""

    def act(self, c: CoordinatorHandle, partition: int, epoch: int) -> None:
        """``c`` acts as the owner of ``partition`` in coordinator ``epoch``."""

    def committing(self) -> bool:
        """Whether committers start new commits (False once the faults have healed)."""

    def note(self, text: str) -> None: ...

    def violation(self, text: str) -> AssertionError: ...


_REJOIN = frozenset(
    {ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.REBALANCE_IN_PROGRESS}
)


class GroupClients:
    """The committers and fetchers of :data:`GROUPS`, and what they have seen."""

    def __init__(
        self,
        host: GroupHost,
        partitions: int,
        *,
        fetchers: int = 2,
        fresh_reader_rate: float = 0.0,
    ) -> None:
        self.host = host
        self.partitions = partitions
        self.fetchers = fetchers
        self.fresh_reader_rate = fresh_reader_rate
        """How often a fetcher's next OffsetFetch is a new reader's, which looks its
        coordinator up first (else it keeps the one that answered)."""
        self.acked: dict[str, int] = dict.fromkeys(GROUPS, -1)
        self.fetched: dict[str, int] = dict.fromkeys(GROUPS, -1)
        self.position: dict[str, int] = dict.fromkeys(GROUPS, -1)
        self.membership: dict[str, tuple[str, int]] = dict.fromkeys(GROUPS, ("", -1))
        """group → (member id, generation) of its committer, a member of the group."""
        self.counts = {"commits": 0, "fetches": 0, "refused": 0}

    def names(self) -> list[str]:
        """Every client's connection name."""
        return [
            *(f"committer-{g}" for g in GROUPS),
            *(f"fetcher-{g}-{n}" for g in GROUPS for n in range(self.fetchers)),
        ]

    def start(self) -> None:
        rng = self.host.rng
        for group in GROUPS:
            self.host.at(rng.randint(0, 50), lambda g=group: self._join(g, None))
            for n in range(self.fetchers):
                self.host.at(rng.randint(0, 50), lambda g=group, n=n: self._fetch(g, n, None))

    def _later(self, action: Callable[[], None]) -> None:
        self.host.at(self.host.rng.randint(10, 80), action)

    def _request(
        self,
        client: str,
        c: CoordinatorHandle,
        serve: Callable[[Reply], None],
        answered: Callable[[object | None], None],
    ) -> None:
        """Send a request; ``answered(None)`` after the client's timeout if no answer came."""
        state = {"open": True}

        def answer(result: object | None) -> None:
            if state["open"]:
                state["open"] = False
                answered(result)

        self.host.request(client, c, serve, answer)
        self.host.at(CLIENT_TIMEOUT_MS, lambda: answer(None))

    def _join(self, group: str, c: CoordinatorHandle | None) -> None:
        """JoinGroup (twice the first time: MEMBER_ID_REQUIRED), SyncGroup as the group's
        only member and so its leader, then commits in the generation."""
        host = self.host
        c = c or host.find(group)
        if c is None:
            self._later(lambda: self._join(group, None))
            return
        coordinator = c
        member_id = self.membership[group][0]
        subscription = ConsumerProtocolSubscription(topics=[TP.topic]).SerializeToString()
        request = JoinRequest(
            group,
            member_id,
            None,
            CONSUMER_PROTOCOL_TYPE,
            (GroupProtocol("range", subscription),),
            10_000,
            10_000,
        )

        def serve(reply: Reply) -> None:
            if not host.serving(coordinator):
                reply(JoinResult(ErrorCode.NOT_COORDINATOR))
                return
            token = ("join", group, host.now, host.rng.random())
            coordinator.pending[token] = reply
            host.effects(coordinator, coordinator.core.join_group(token, request, host.now))

        def answered(result: object | None) -> None:
            if not isinstance(result, JoinResult):
                self._later(lambda: self._join(group, None))
            elif result.error == ErrorCode.MEMBER_ID_REQUIRED:
                self.membership[group] = (result.member_id, -1)
                self._join(group, coordinator)
            elif result.error != ErrorCode.NONE:
                if result.error == ErrorCode.UNKNOWN_MEMBER_ID:
                    self.membership[group] = ("", -1)
                self._later(lambda: self._join(group, None))
            else:
                self.membership[group] = (result.member_id, result.generation_id)
                self._sync(group, coordinator, result)

        self._request(f"committer-{group}", c, serve, answered)

    def _sync(self, group: str, c: CoordinatorHandle, joined: JoinResult) -> None:
        host = self.host
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

        def serve(reply: Reply) -> None:
            if not host.serving(c):
                reply(SyncResult(ErrorCode.NOT_COORDINATOR))
                return
            token = ("sync", group, host.now, host.rng.random())
            c.pending[token] = reply
            host.effects(c, c.core.sync_group(token, request, host.now))

        def answered(result: object | None) -> None:
            if isinstance(result, SyncResult) and result.error == ErrorCode.NONE:
                host.note(f"{group}: {joined.member_id} in generation {joined.generation_id}")
                self._commit(group, c)
            else:
                self._later(lambda: self._join(group, None))

        self._request(f"committer-{group}", c, serve, answered)

    def _commit(self, group: str, c: CoordinatorHandle | None) -> None:
        host = self.host
        if not host.committing():
            return
        c = c or host.find(group)
        if c is None:
            self._later(lambda: self._commit(group, None))
            return
        coordinator = c
        # A consumer's position only grows: each attempt commits past every earlier one
        # (acknowledged or not), so an answer older than any of them is a step back.
        offset = self.position[group] = self.position[group] + 1 + host.rng.randint(0, 3)
        sent = host.now

        def serve(reply: Reply) -> None:
            if not host.serving(coordinator):
                reply(ErrorCode.NOT_COORDINATOR)
                return
            token = ("commit", group, sent, host.rng.random())
            coordinator.pending[token] = reply
            member_id, generation = self.membership[group]
            effects = coordinator.core.commit_offsets(
                token, group, member_id, generation, None, [OffsetToCommit(TP, offset)], host.now
            )
            host.effects(coordinator, effects)

        def answered(result: object | None) -> None:
            ok = isinstance(result, CommitResult) and all(
                o.error == ErrorCode.NONE for o in result.errors.values()
            )
            if ok:
                self.counts["commits"] += 1
                self.acked[group] = max(self.acked[group], offset)
                host.note(f"{group}: commit {offset} acknowledged by {coordinator.node_id}")
                self._later(lambda: self._commit(group, coordinator))
            else:
                self.counts["refused"] += 1
                errors = (
                    {o.error for o in result.errors.values()}
                    if isinstance(result, CommitResult)
                    else set()
                )
                if errors & _REJOIN:
                    self._later(lambda: self._join(group, None))
                else:
                    self._later(lambda: self._commit(group, None))

        self._request(f"committer-{group}", c, serve, answered)

    def _fetch(self, group: str, n: int, c: CoordinatorHandle | None) -> None:
        host = self.host
        c = c or host.find(group)
        if c is None:
            self._later(lambda: self._fetch(group, n, None))
            return
        coordinator = c
        floor = max(self.acked[group], self.fetched[group])

        def serve(reply: Reply) -> None:
            if not host.serving(coordinator):
                reply(ErrorCode.NOT_COORDINATOR)
                return
            outcome, offsets = coordinator.core.fetch_offsets(group, [TP])
            if outcome.error != ErrorCode.NONE:
                reply(outcome.error)
                return
            reply(("offset", offsets[TP].offset))
            p = partition_for_group(group, self.partitions)
            host.act(coordinator, p, coordinator.core.owned[p])

        def answered(result: object | None) -> None:
            if isinstance(result, tuple):
                result = result[1]
                self.counts["fetches"] += 1
                if result < floor:
                    raise host.violation(
                        f"{group}: OffsetFetch from coordinator {coordinator.node_id} answered "
                        f"{result}, older than {floor} acknowledged or fetched before it was sent"
                    )
                self.fetched[group] = max(self.fetched[group], result)
                fresh = self.fresh_reader_rate and host.rng.random() < self.fresh_reader_rate
                self._later(lambda: self._fetch(group, n, None if fresh else coordinator))
            else:
                self._later(lambda: self._fetch(group, n, None))

        self._request(f"fetcher-{group}-{n}", c, serve, answered)
