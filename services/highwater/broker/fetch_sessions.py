"""Incremental fetch sessions (KIP-227): a leader remembers what a fetcher fetches.

Shared by the two kinds of fetchers a broker answers: Kafka clients on the Kafka listener
(:mod:`highwater.broker.kafka_protocol.apis`) and follower brokers on the internal
``ReplicaFetch`` stream (:mod:`highwater.broker.replica_sessions`). A fetch names a
session id and an epoch:

* ``(0, -1)`` — no session: a full fetch, answered with session id 0;
* ``(0, 0)`` or ``(id, 0)`` — a new session (closing ``id``): a full fetch, answered with
  the new session's id (0 when the cache is full and no session may be evicted: see
  below), whose partitions the leader keeps;
* ``(id, n)``, ``n > 0`` — the next fetch of session ``id``: its partitions are added to or
  updated in the session, its forgotten partitions removed; the answer lists only the
  partitions that have records or whose high watermark, log start offset or error changed
  since the session's last answer. An unknown id (or one another fetcher owns) is
  FETCH_SESSION_ID_NOT_FOUND, an epoch other than the expected one
  INVALID_FETCH_SESSION_EPOCH; the fetcher then starts over with a full fetch;
* ``(id, -1)`` — close session ``id``, then a full fetch without a session.

Which partitions an incremental fetch reads is the leader's choice. The Kafka listener
reads every partition of the session (:attr:`SessionFetch.partitions`, Kafka's
``IncrementalFetchContext``) and trims the answer. Replica fetches read only what can have
something to say (``changed_only``): the partitions the request names, and those the
leader marked *changed* (:meth:`FetchSessionCache.mark_changed`: records appended, a high
watermark, log start offset or role that moved) since the session's last answer, so an
idle round costs what changed, not the session's size. The cache keeps an index from
partition to the sessions holding it, so a mark costs the sessions that hold the
partition, not a scan.

A high watermark that another follower's fetch moved is a weaker mark
(:meth:`FetchSessionCache.mark_high_watermark`): the partition is read with the session's
next read (the next fetch, a wake-up for another change, or the long poll's end), but it is
no reason to answer a parked fetch early, as Kafka's delayed follower fetch completes on new
records or its max wait, not on the high watermark. The follower's high watermark bounds
nothing on the leader (acks=all, ``min.insync.replicas`` and the ISR follow the followers'
log ends; consumers read from leaders only): it reaches the follower with the next records
or within ``replica.fetch.wait.max.ms``, which is all a follower that becomes leader needs
(its high watermark then only catches up, as Kafka's does).

The fetcher's side is :class:`FetchSessionHandler` (Kafka's ``FetchSessionHandler``): the
session id and next epoch, the partitions as the leader's session holds them, and what
the next fetch names: everything in a full fetch; in an incremental one the partitions
whose fetch state differs from the session's, and those no longer fetched (forgotten).

Pure: no I/O, no clock (``now_ms`` comes in: each caller passes its clock's time). The
cache holds at most ``max_sessions`` sessions (Kafka's
``max.incremental.fetch.session.cache.slots``, 1000) and, full, evicts as Kafka's
``FetchSessionCache.tryEvict`` does, never merely the least recently used: with more
fetchers than slots that would make every new session evict an active one, whose fetcher
then gets FETCH_SESSION_ID_NOT_FOUND and opens another with a full fetch, evicting the
next: a cascade of full fetches. A new session takes a slot

* from the least recently used session, if it has been idle for more than
  :data:`MIN_EVICTION_MS` (Kafka's ``min.incremental.fetch.session.eviction.ms``, a
  constant: 120 s);
* otherwise from the lowest-ranked evictable session, if the newcomer ranks higher. A
  session ranks by (privileged, number of partitions, id): a follower's session
  (*privileged*: it has an owner) outranks any consumer's, then more partitions outrank
  fewer. A session is evictable once its latest fetch came more than
  :data:`MIN_EVICTION_MS` after its creation (one created recently has had no chance to
  prove itself); for a follower's newcomer every consumer's session is evictable too.

Otherwise the newcomer gets no session: session id 0, its fetch answered in full without
error, as Kafka answers it; its fetcher keeps fetching in full, asking for a session each
time, which is correct, only costlier. :attr:`FetchSessionCache.evictions` counts the
sessions evicted (Kafka's ``IncrementalFetchSessionEvictionsPerSec``; the broker's telemetry
reports it, with the sessions and partitions held).

Finding the lowest-ranked session does not scan the cache: as Kafka keeps its sorted
``evictableByAll`` and ``evictableByPrivileged`` sets, the cache keeps two heaps of ranks,
updated when a session is created or fetched (when its rank and whether it competes can
change): the sessions any newcomer may evict (their latest fetch came more than
:data:`MIN_EVICTION_MS` after their creation), and those a follower's newcomer may (those,
and every consumer's). An entry whose session has since been fetched again, resized or
dropped is stale and skipped when it reaches the top; a heap grown to more than twice its
live entries is rebuilt. So a newcomer to a full cache costs O(log n), amortised.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "FETCH_SESSION_ID_NOT_FOUND",
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INVALID_FETCH_SESSION_EPOCH",
    "MIN_EVICTION_MS",
    "FetchPartitionState",
    "FetchSession",
    "FetchSessionCache",
    "FetchSessionHandler",
    "SessionFetch",
    "SessionRequest",
    "TopicPartitionKey",
    "next_epoch",
]

FETCH_SESSION_ID_NOT_FOUND: Final = 70
INVALID_FETCH_SESSION_EPOCH: Final = 71
INITIAL_EPOCH: Final = 0
"""A fetch that opens a session (full)."""
FINAL_EPOCH: Final = -1
"""A fetch without a session (full), closing the one it names."""
MIN_EVICTION_MS: Final = 120_000
"""How long a session must be idle to be evicted by any newcomer, and how long after its
creation it starts to compete on rank (Kafka's ``min.incremental.fetch.session.eviction.ms``)."""

TopicPartitionKey = tuple[str, int]


def next_epoch(epoch: int) -> int:
    """The session epoch after ``epoch`` (wrapping to 1, as Kafka's ``nextEpoch``)."""
    return epoch + 1 if epoch < 2**31 - 1 else 1


@dataclass(slots=True)
class FetchPartitionState:
    """What a fetch asks of one partition, and (in a session) what it was last told."""

    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    log_start_offset: int = -1
    answered: tuple[int, int, int] | None = None
    """(high watermark, log start offset, error) of the last answer that carried it."""


@dataclass(slots=True)
class FetchSession:
    """One session: its partitions as last fetched, the epoch its next fetch must carry,
    and (replica fetches) the partitions marked changed since its last answer."""

    session_id: int
    next_epoch: int
    partitions: dict[TopicPartitionKey, FetchPartitionState] = field(default_factory=dict)
    owner: int = -1
    """Who may use the session (a follower's broker id; -1: anyone)."""
    last_fetch_ms: int = 0
    """When its latest fetch arrived (``now_ms`` of :meth:`FetchSessionCache.resolve`)."""
    created_ms: int = 0
    """When its first (full) fetch arrived."""
    changed: set[TopicPartitionKey] = field(default_factory=set)
    """Partitions marked changed since the session's last answer (to read next; a parked
    fetch is woken for them)."""
    lagging: set[TopicPartitionKey] = field(default_factory=set)
    """Partitions whose high watermark alone moved since they were last read (read with the
    next read; no reason to wake a parked fetch)."""

    @property
    def privileged(self) -> bool:
        """A follower's session (it has an owner): it outranks a consumer's in eviction."""
        return self.owner >= 0

    def take_changed(self) -> list[tuple[TopicPartitionKey, FetchPartitionState]]:
        """The partitions marked changed or lagging, with their states; the marks are
        cleared."""
        keys, self.changed = self.changed, set()
        if self.lagging:
            keys |= self.lagging
            self.lagging = set()
        partitions = self.partitions
        return [(key, partitions[key]) for key in keys if key in partitions]

    def mark(self, key: TopicPartitionKey) -> None:
        """Read ``key`` again at the next fetch (its answer left records behind)."""
        if key in self.partitions:
            self.changed.add(key)


@dataclass(slots=True)
class SessionFetch:
    """One fetch resolved against the cache: the partitions to read, and how to trim the
    answer. ``error`` set: the fetch is refused as a whole."""

    session_id: int
    partitions: list[tuple[TopicPartitionKey, FetchPartitionState]]
    incremental: bool
    session: FetchSession | None = None
    error: int = 0

    def include(
        self,
        key: TopicPartitionKey,
        high_watermark: int,
        log_start: int,
        error: int,
        has_records: bool,
    ) -> bool:
        """Whether partition ``key``'s answer goes into the response (always in a full
        fetch; in an incremental one when something changed), remembering what was sent."""
        if self.session is None:
            return True
        state = self.session.partitions.get(key)
        if state is None:
            return True
        answered = (high_watermark, log_start, error)
        changed = state.answered != answered
        state.answered = answered
        return not self.incremental or has_records or changed or error != 0


class FetchSessionCache:
    """A leader's fetch sessions (see the module docstring)."""

    def __init__(self, max_sessions: int = 1000) -> None:
        self.max_sessions = max_sessions
        self.evictions = 0
        """Sessions evicted to make room for a new one."""
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._holding: dict[TopicPartitionKey, set[int]] = {}
        """Partition -> the ids of the sessions that hold it."""
        self._ids = itertools.count(1)
        self._by_all = _RankHeap()
        """The sessions any newcomer may evict, by rank."""
        self._by_privileged = _RankHeap()
        """The sessions a follower's newcomer may evict, by rank."""

    def __len__(self) -> int:
        return len(self._sessions)

    def partitions_cached(self) -> int:
        """The partitions the sessions hold, counted once per session holding one (Kafka's
        ``NumIncrementalFetchPartitionsCached``)."""
        return sum(len(ids) for ids in self._holding.values())

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def resolve(
        self,
        session_id: int,
        epoch: int,
        partitions: Iterable[tuple[TopicPartitionKey, FetchPartitionState]],
        forgotten: Iterable[TopicPartitionKey] = (),
        *,
        owner: int = -1,
        now_ms: int = 0,
        changed_only: bool = False,
        one_per_owner: bool = False,
    ) -> SessionFetch:
        """The fetch ``(session_id, epoch)`` with the request's partitions and forgotten
        partitions, as the module docstring says. ``owner``: who fetches (a session opened
        by another owner is not found); ``changed_only``: an incremental fetch reads the
        partitions it names and those marked changed, not the whole session;
        ``one_per_owner``: a new session closes the owner's others (a follower broker
        fetches from a leader over one session: the others are its earlier incarnations'
        or connections', abandoned)."""
        requested = list(partitions)
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id:
                known = self._sessions.get(session_id)
                if known is not None and known.owner == owner:
                    self._drop(session_id)
            if epoch == FINAL_EPOCH:
                return SessionFetch(0, requested, incremental=False)
            if one_per_owner:
                for other in [i for i, s in self._sessions.items() if s.owner == owner]:
                    self._drop(other)
            session = self._new_session(requested, owner, now_ms)
            return SessionFetch(
                0 if session is None else session.session_id,
                requested,
                incremental=False,
                session=session,
            )
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            return SessionFetch(0, [], False, error=FETCH_SESSION_ID_NOT_FOUND)
        if epoch != session.next_epoch:
            return SessionFetch(0, [], False, error=INVALID_FETCH_SESSION_EPOCH)
        self._sessions.move_to_end(session_id)
        session.next_epoch = next_epoch(epoch)
        session.last_fetch_ms = now_ms
        fetch = self._fetch_in(session, requested, forgotten, changed_only)
        self._rank(session)
        return fetch

    def _fetch_in(
        self,
        session: FetchSession,
        requested: list[tuple[TopicPartitionKey, FetchPartitionState]],
        forgotten: Iterable[TopicPartitionKey],
        changed_only: bool,
    ) -> SessionFetch:
        """An incremental fetch of ``session``: its partitions updated, what it reads."""
        session_id = session.session_id
        for key in forgotten:
            if session.partitions.pop(key, None) is not None:
                session.changed.discard(key)
                session.lagging.discard(key)
                self._unhold(key, session_id)
        for key, state in requested:
            previous = session.partitions.get(key)
            if previous is not None:
                state.answered = previous.answered
            else:
                self._holding.setdefault(key, set()).add(session_id)
            session.partitions[key] = state
        if not changed_only:
            read = list(session.partitions.items())
        else:
            named = {key for key, _ in requested}
            read = requested + [(k, s) for k, s in session.take_changed() if k not in named]
        return SessionFetch(session_id, read, incremental=True, session=session)

    def mark_changed(
        self, key: TopicPartitionKey, *, except_session: int = 0
    ) -> list[FetchSession]:
        """Partition ``key`` has something new to say: mark it in every session that holds
        it but ``except_session``. Returns the sessions in which it was not marked yet
        (those to wake)."""
        ids = self._holding.get(key)
        if not ids:
            return []
        woken = []
        for session_id in ids:
            session = self._sessions[session_id]
            if session_id != except_session and key not in session.changed:
                session.changed.add(key)
                woken.append(session)
        return woken

    def mark_high_watermark(self, key: TopicPartitionKey, *, except_session: int = 0) -> None:
        """Partition ``key``'s high watermark moved, and nothing else: every session that
        holds it but ``except_session`` reads it with its next read, none is woken (see
        the module docstring)."""
        for session_id in self._holding.get(key, ()):
            if session_id != except_session:
                self._sessions[session_id].lagging.add(key)

    def sessions_holding(self, key: TopicPartitionKey) -> list[FetchSession]:
        """The sessions that hold partition ``key``."""
        return [self._sessions[session_id] for session_id in self._holding.get(key, ())]

    def _new_session(
        self,
        partitions: list[tuple[TopicPartitionKey, FetchPartitionState]],
        owner: int,
        now_ms: int,
    ) -> FetchSession | None:
        held = dict(partitions)
        while len(self._sessions) >= self.max_sessions:
            if not self._evict_for(owner >= 0, len(held), now_ms):
                return None
        session_id = next(self._ids) & 0x7FFFFFFF or next(self._ids)
        session = FetchSession(
            session_id,
            next_epoch=1,
            partitions=held,
            owner=owner,
            last_fetch_ms=now_ms,
            created_ms=now_ms,
        )
        self._sessions[session_id] = session
        for key in session.partitions:
            self._holding.setdefault(key, set()).add(session_id)
        self._rank(session)
        return session

    def _rank(self, session: FetchSession) -> None:
        """Put ``session`` in the eviction heaps it belongs in now, at its rank now (after
        its creation or a fetch: Kafka's ``FetchSessionCache.touch``)."""
        rank = (session.privileged, len(session.partitions), session.session_id)
        competes = session.last_fetch_ms - session.created_ms > MIN_EVICTION_MS
        self._by_all.put(session.session_id, rank if competes else None, len(self._sessions))
        self._by_privileged.put(
            session.session_id,
            rank if competes or not session.privileged else None,
            len(self._sessions),
        )

    def _evict_for(self, privileged: bool, size: int, now_ms: int) -> bool:
        """Evict a session to make room for a new one (a follower's if ``privileged``, of
        ``size`` partitions), as the module docstring says; False if none may go."""
        sessions = self._sessions
        if not sessions:
            return False
        eviction_ms = MIN_EVICTION_MS
        # Ordered by latest fetch: the first is the least recently used.
        oldest = next(iter(sessions.values()))
        if now_ms - oldest.last_fetch_ms > eviction_ms:
            victim = oldest
        else:
            lowest = (self._by_privileged if privileged else self._by_all).lowest()
            if lowest is None or (privileged, size) <= lowest[:2]:
                return False
            victim = sessions[lowest[2]]
        self._drop(victim.session_id)
        self.evictions += 1
        return True

    def _drop(self, session_id: int) -> None:
        session = self._sessions.pop(session_id)
        self._by_all.put(session_id, None, len(self._sessions))
        self._by_privileged.put(session_id, None, len(self._sessions))
        for key in session.partitions:
            self._unhold(key, session_id)

    def _unhold(self, key: TopicPartitionKey, session_id: int) -> None:
        ids = self._holding.get(key)
        if ids is not None:
            ids.discard(session_id)
            if not ids:
                del self._holding[key]


_Rank = tuple[bool, int, int]
"""A session's rank in eviction: (privileged, number of partitions, id), lowest first."""


class _RankHeap:
    """Sessions by rank, the lowest first: a heap whose stale entries (a session's earlier
    ranks, or a session taken out) are skipped when they reach the top."""

    def __init__(self) -> None:
        self._heap: list[_Rank] = []
        self._current: dict[int, _Rank] = {}

    def put(self, session_id: int, rank: _Rank | None, sessions: int) -> None:
        """``session_id`` at ``rank`` (``None``: not in the heap); ``sessions``: how many
        the cache holds (the heap is rebuilt beyond twice as many entries)."""
        if rank is None:
            self._current.pop(session_id, None)
            return
        if self._current.get(session_id) == rank:
            return
        self._current[session_id] = rank
        heapq.heappush(self._heap, rank)
        if len(self._heap) > 2 * max(sessions, len(self._current)) + 16:
            self._heap = list(self._current.values())
            heapq.heapify(self._heap)

    def lowest(self) -> _Rank | None:
        heap = self._heap
        while heap and self._current.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)
        return heap[0] if heap else None


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """What a fetcher's next fetch carries: its session id and epoch, the partitions it
    names (with their fetch states) and those it forgets."""

    session_id: int
    epoch: int
    partitions: list[tuple[TopicPartitionKey, FetchPartitionState]]
    forgotten: list[TopicPartitionKey]

    @property
    def full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


class FetchSessionHandler:
    """The fetcher's side of a session with one leader (Kafka's ``FetchSessionHandler``).

    :meth:`build` the next fetch from the partitions fetched now, then :meth:`handle` the
    answer's session id and error, or :meth:`failed` when no answer came. A full fetch is
    sent when there is no session yet, after an answer with a session error (the session
    is closed and another opened) and after a failed fetch (whether the leader saw it is
    unknown); a leader that answers with session id 0 (no room, or no sessions at all)
    gets full fetches, each asking for a session again.
    """

    def __init__(self) -> None:
        self.session_id = 0
        self.epoch = INITIAL_EPOCH
        self.sent: dict[TopicPartitionKey, FetchPartitionState] = {}
        """The partitions as the leader's session holds them (after the fetch built)."""
        self._resend: set[TopicPartitionKey] = set()

    def build(
        self,
        fetched: Collection[TopicPartitionKey],
        state_of: Callable[[TopicPartitionKey], FetchPartitionState],
        candidates: Iterable[TopicPartitionKey] | None = None,
    ) -> SessionRequest:
        """The next fetch for the partitions ``fetched`` now, each fetch state given by
        ``state_of``. ``candidates``: the only partitions whose state may have changed since
        the last fetch (None: any of them, and some may be gone: what is fetched changed).
        An incremental fetch asks ``state_of`` for the candidates only."""
        if self.session_id == 0 or self.epoch == INITIAL_EPOCH:
            self._resend.clear()
            self.sent = {key: state_of(key) for key in fetched}
            return SessionRequest(self.session_id, INITIAL_EPOCH, list(self.sent.items()), [])
        sent = self.sent
        forgotten: list[TopicPartitionKey] = []
        resend, self._resend = self._resend, set()
        if candidates is None:
            candidates = fetched
            forgotten = [key for key in sent if key not in fetched]
            for key in forgotten:
                del sent[key]
        named = []
        for key in {*candidates, *resend}:
            if key not in fetched:
                continue
            state = state_of(key)
            if key in resend or sent.get(key) != state:
                sent[key] = state
                named.append((key, state))
        return SessionRequest(self.session_id, self.epoch, named, forgotten)

    def handle(self, request: SessionRequest, session_id: int, error: int) -> bool:
        """The leader's answer to ``request``: its session id and whole-fetch error. False
        if the fetch was refused (a session error): the next fetch is full."""
        if error:
            # Close the session the leader may still hold, and open another.
            self.session_id = 0 if error == FETCH_SESSION_ID_NOT_FOUND else request.session_id
            self.epoch = INITIAL_EPOCH
            return False
        if request.full:
            self.session_id = session_id
            self.epoch = 1 if session_id else INITIAL_EPOCH
        else:
            self.epoch = next_epoch(self.epoch)
        return True

    def failed(self) -> None:
        """No answer came: the next fetch closes the session and opens another."""
        self.epoch = INITIAL_EPOCH

    def forget(self, key: TopicPartitionKey) -> None:
        """Send ``key``'s fetch state again at the next fetch, changed or not (its last
        answer could not be applied: the leader would not send it again by itself)."""
        self._resend.add(key)
