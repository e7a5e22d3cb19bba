"""KIP-227's fetch sessions, pure: the leader's cache with changed-partition marks, and the
fetcher's side (what each fetch names), through full → incremental → forgotten → epoch
mismatch → fallback to a full fetch; and the caches' metrics."""

from __future__ import annotations

import random
from typing import Any

import pytest
from highwater.broker.fetch_sessions import (
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH,
    FetchPartitionState,
    FetchSessionCache,
    FetchSessionHandler,
    TopicPartitionKey,
)
from highwater.broker.telemetry import REPLICA, FetchSessionMetrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

A, B, C = ("t", 0), ("t", 1), ("u", 0)
FOLLOWER = 2
EVICTION_MS = 120_000  # Kafka's min.incremental.fetch.session.eviction.ms
(REPLICA_KEY,) = REPLICA


def state(offset: int, leader_epoch: int = 3) -> FetchPartitionState:
    return FetchPartitionState(
        fetch_offset=offset, partition_max_bytes=1 << 20, current_leader_epoch=leader_epoch
    )


def keys(partitions: list[tuple[TopicPartitionKey, FetchPartitionState]]) -> set[TopicPartitionKey]:
    return {key for key, _ in partitions}


def test_a_replica_session_reads_what_it_names_and_what_was_marked_changed() -> None:
    cache = FetchSessionCache()
    full = cache.resolve(0, 0, [(A, state(0)), (B, state(0)), (C, state(5))], owner=FOLLOWER)
    assert full.session_id > 0 and not full.incremental
    assert keys(full.partitions) == {A, B, C}
    session = full.session
    assert session is not None and session.owner == FOLLOWER

    idle = cache.resolve(full.session_id, 1, [], owner=FOLLOWER, now_ms=500, changed_only=True)
    assert idle.incremental and idle.partitions == []  # nothing changed: nothing to read
    assert session.last_fetch_ms == 500

    assert cache.mark_changed(B) == [session]
    assert cache.mark_changed(B) == []  # marked already: nobody to wake again
    assert cache.mark_changed(("t", 9)) == []  # held by no session
    moved = cache.resolve(full.session_id, 2, [(A, state(4))], owner=FOLLOWER, changed_only=True)
    assert keys(moved.partitions) == {A, B}
    assert session.partitions[A].fetch_offset == 4 and not session.changed

    # The session trims its answer: B told once, then only when something moved.
    assert moved.include(B, 10, 0, 0, has_records=True)
    assert not cache.resolve(full.session_id, 3, [], owner=FOLLOWER, changed_only=True).include(
        B, 10, 0, 0, has_records=False
    )


def test_a_high_watermark_alone_is_read_with_the_next_read_and_wakes_nobody() -> None:
    cache = FetchSessionCache()
    mover = cache.resolve(0, 0, [(A, state(0))], owner=FOLLOWER).session
    other = cache.resolve(0, 0, [(A, state(0)), (B, state(0))], owner=3).session
    assert mover is not None and other is not None
    cache.mark_high_watermark(A, except_session=mover.session_id)
    assert not other.changed and not mover.lagging  # nothing to wake, the mover told already
    # An append after it still wakes the session (the weaker mark does not hide it) ...
    woken = cache.mark_changed(A)
    assert sorted(s.session_id for s in woken) == sorted([mover.session_id, other.session_id])
    assert {key for key, _ in other.take_changed()} == {A}
    # ... and without one the partition is read with the session's next read.
    cache.mark_high_watermark(A, except_session=mover.session_id)
    fetch = cache.resolve(other.session_id, 1, [], owner=3, changed_only=True)
    assert keys(fetch.partitions) == {A} and not other.lagging
    assert fetch.include(A, 7, 0, 0, has_records=False)  # the new high watermark is answered
    # A forgotten partition's weaker mark goes with it.
    cache.mark_high_watermark(A)
    assert cache.resolve(other.session_id, 2, [], [A], owner=3, changed_only=True).partitions == []


def test_a_forgotten_partition_leaves_the_session_and_its_index() -> None:
    cache = FetchSessionCache()
    session_id = cache.resolve(0, 0, [(A, state(0)), (B, state(0))], owner=FOLLOWER).session_id
    cache.mark_changed(B)
    fetch = cache.resolve(session_id, 1, [], [B], owner=FOLLOWER, changed_only=True)
    assert fetch.partitions == []  # B's mark went with it
    assert cache.mark_changed(B) == []
    assert cache.sessions_holding(A) == [fetch.session]


def test_session_errors_and_who_may_use_a_session() -> None:
    cache = FetchSessionCache()
    session_id = cache.resolve(0, 0, [(A, state(0))], owner=FOLLOWER).session_id
    assert cache.resolve(session_id, 7, [], owner=FOLLOWER).error == INVALID_FETCH_SESSION_EPOCH
    assert cache.resolve(session_id, 1, [], owner=3).error == FETCH_SESSION_ID_NOT_FOUND
    assert cache.resolve(session_id, 1, [], owner=FOLLOWER).error == 0
    # Another owner cannot close it either.
    cache.resolve(session_id, 0, [], owner=3)
    assert cache.resolve(session_id, 2, [], owner=FOLLOWER).error == 0


def test_an_evicted_session_drops_out_of_the_partition_index() -> None:
    cache = FetchSessionCache(max_sessions=1)
    first = cache.resolve(0, 0, [(A, state(0))], owner=FOLLOWER).session_id
    second = cache.resolve(0, 0, [(B, state(0))], owner=3, now_ms=EVICTION_MS + 1)
    assert cache.resolve(first, 1, [], owner=FOLLOWER).error == FETCH_SESSION_ID_NOT_FOUND
    assert cache.mark_changed(A) == []
    assert cache.mark_changed(B) == [second.session]


def test_a_full_cache_of_active_sessions_keeps_them_and_opens_none() -> None:
    cache = FetchSessionCache(max_sessions=1)
    active = cache.resolve(0, 0, [(A, state(0))], now_ms=0).session_id
    newcomer = cache.resolve(0, 0, [(B, state(0))], now_ms=1_000)
    # No session: the fetch is answered in full, with session id 0 and no error.
    assert (newcomer.session_id, newcomer.session, newcomer.error) == (0, None, 0)
    assert not newcomer.incremental and keys(newcomer.partitions) == {B}
    assert cache.resolve(active, 1, [], now_ms=1_000).error == 0


def test_a_session_idle_past_the_eviction_time_makes_room_least_recently_used_first() -> None:
    cache = FetchSessionCache(max_sessions=2)
    idle = cache.resolve(0, 0, [(A, state(0))], now_ms=0).session_id
    used = cache.resolve(0, 0, [(A, state(0))], now_ms=0).session_id
    cache.resolve(used, 1, [], now_ms=60_000)
    # Idle for exactly the eviction time is not stale yet.
    assert cache.resolve(0, 0, [(B, state(0))], now_ms=EVICTION_MS).session_id == 0
    newcomer = cache.resolve(0, 0, [(B, state(0))], now_ms=EVICTION_MS + 1)
    assert newcomer.session_id > 0
    assert cache.resolve(idle, 1, [], now_ms=EVICTION_MS + 1).error == FETCH_SESSION_ID_NOT_FOUND
    assert cache.resolve(used, 2, [], now_ms=EVICTION_MS + 1).error == 0
    assert cache.evictions == 1


def test_a_higher_ranked_newcomer_evicts_the_lowest_ranked_session_not_created_recently() -> None:
    cache = FetchSessionCache(max_sessions=2)
    small = cache.resolve(0, 0, [(A, state(0))], now_ms=0).session_id
    big = cache.resolve(0, 0, [(A, state(0)), (B, state(0)), (C, state(0))], now_ms=0).session_id
    now = 200_000  # both still fetching, created more than the eviction time ago
    cache.resolve(small, 1, [], now_ms=now)
    cache.resolve(big, 1, [], now_ms=now)
    # A consumer's session with more partitions than the smallest takes its slot.
    pair = cache.resolve(0, 0, [(A, state(0)), (B, state(0))], now_ms=now + 1).session_id
    assert pair > 0
    assert cache.resolve(small, 2, [], now_ms=now + 1).error == FETCH_SESSION_ID_NOT_FOUND
    # Another of that size: the recent session is not evictable, the bigger one outranks it.
    assert cache.resolve(0, 0, [(A, state(0)), (B, state(0))], now_ms=now + 2).session_id == 0
    # A follower's session outranks any consumer's, however recent or large.
    first = cache.resolve(0, 0, [(A, state(0))], owner=FOLLOWER, now_ms=now + 3).session_id
    assert first > 0 and cache.resolve(pair, 1, [], now_ms=now + 3).error != 0
    second = cache.resolve(0, 0, [(A, state(0))], owner=3, now_ms=now + 4).session_id
    assert second > 0 and cache.resolve(big, 2, [], now_ms=now + 4).error != 0
    # But not a follower's session created within the eviction time.
    third = cache.resolve(0, 0, [(A, state(0)), (B, state(0))], owner=4, now_ms=now + 5)
    assert third.session_id == 0 and (len(cache), cache.evictions) == (2, 3)


def test_the_fetcher_names_everything_once_then_only_what_changed() -> None:
    handler = FetchSessionHandler()
    fetched = {A: state(0), B: state(0), C: state(5)}
    asked: list[TopicPartitionKey] = []

    def state_of(key: TopicPartitionKey) -> FetchPartitionState:
        asked.append(key)
        return fetched[key]

    full = handler.build(fetched.keys(), state_of)
    assert (full.session_id, full.epoch, keys(full.partitions)) == (0, 0, {A, B, C})
    assert handler.handle(full, session_id=42, error=0)

    asked.clear()
    unchanged = handler.build(fetched.keys(), state_of, candidates=[A])
    assert (unchanged.session_id, unchanged.epoch, unchanged.partitions) == (42, 1, [])
    assert asked == [A]  # only the candidate's state was looked at
    assert handler.handle(unchanged, 42, 0)

    fetched[A] = state(3)
    moved = handler.build(fetched.keys(), state_of, candidates=[A])
    assert (moved.epoch, moved.partitions) == (2, [(A, state(3))])
    handler.handle(moved, 42, 0)

    # B is no longer fetched (its leader changed): forgotten; C's epoch moved: named.
    del fetched[B]
    fetched[C] = state(5, leader_epoch=4)
    roles = handler.build(fetched.keys(), state_of, candidates=None)
    assert (roles.epoch, roles.forgotten, keys(roles.partitions)) == (3, [B], {C})
    handler.handle(roles, 42, 0)

    # An answer that could not be applied: named again though its state is the same.
    handler.forget(A)
    again = handler.build(fetched.keys(), state_of, candidates=[])
    assert again.partitions == [(A, state(3))]


def test_the_fetcher_falls_back_to_a_full_fetch() -> None:
    handler = FetchSessionHandler()
    fetched = {A: state(0), B: state(0)}
    handler.handle(handler.build(fetched.keys(), fetched.__getitem__), 42, 0)

    # The leader lost count of the epoch: the session is closed and another opened.
    stale = handler.build(fetched.keys(), fetched.__getitem__, candidates=[])
    assert not handler.handle(stale, 0, INVALID_FETCH_SESSION_EPOCH)
    reopen = handler.build(fetched.keys(), fetched.__getitem__, candidates=[])
    assert (reopen.session_id, reopen.epoch, keys(reopen.partitions)) == (42, 0, {A, B})
    handler.handle(reopen, 43, 0)

    # The leader evicted it: a new session, with nothing to close.
    evicted = handler.build(fetched.keys(), fetched.__getitem__, candidates=[])
    assert not handler.handle(evicted, 0, FETCH_SESSION_ID_NOT_FOUND)
    assert handler.build(fetched.keys(), fetched.__getitem__).session_id == 0

    # No answer: whether the leader saw the fetch is unknown, so the next one is full.
    handler.handle(handler.build(fetched.keys(), fetched.__getitem__), 44, 0)
    handler.failed()
    assert handler.build(fetched.keys(), fetched.__getitem__, candidates=[]).full

    # A leader without sessions (or room for one) answers with id 0: full every time.
    handler = FetchSessionHandler()
    for _ in range(2):
        request = handler.build(fetched.keys(), fetched.__getitem__, candidates=[])
        assert request.full and keys(request.partitions) == {A, B}
        handler.handle(request, 0, 0)


def test_a_cache_and_a_handler_agree_round_after_round() -> None:
    """The fetcher's view of the session (``sent``) is the leader's, fetch after fetch."""
    cache = FetchSessionCache()
    handler = FetchSessionHandler()
    fetched = {A: state(0), B: state(0), C: state(0)}
    for offset in range(1, 6):
        request = handler.build(fetched.keys(), fetched.__getitem__, candidates=[A])
        answer = cache.resolve(
            request.session_id,
            request.epoch,
            request.partitions,
            request.forgotten,
            owner=FOLLOWER,
            changed_only=True,
        )
        assert handler.handle(request, answer.session_id, answer.error)
        assert answer.session is not None
        assert answer.session.partitions == handler.sent
        fetched[A] = state(offset)


def test_a_followers_new_session_closes_its_earlier_ones() -> None:
    cache = FetchSessionCache()
    first = cache.resolve(0, 0, [(A, state(0))], owner=FOLLOWER, one_per_owner=True)
    other = cache.resolve(0, 0, [(A, state(0))], owner=3, one_per_owner=True)
    again = cache.resolve(0, 0, [(A, state(0))], owner=FOLLOWER, one_per_owner=True)
    assert cache.resolve(first.session_id, 1, [], owner=FOLLOWER).error == (
        FETCH_SESSION_ID_NOT_FOUND
    )
    assert {s.session_id for s in cache.sessions_holding(A)} == {
        other.session_id,
        again.session_id,
    }


def test_the_broker_reports_its_fetch_sessions_partitions_and_evictions() -> None:
    """Kafka's NumIncrementalFetchSessions, NumIncrementalFetchPartitionsCached and
    IncrementalFetchSessionEvictionsPerSec, per cache: followers' sessions
    (highwater.fetch.replica=true) and consumers' (false). No metric counted them."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics = FetchSessionMetrics(provider.get_meter("fetch-sessions"))
    followers, consumers = FetchSessionCache(max_sessions=4), FetchSessionCache(max_sessions=1)
    metrics.watch(followers, replica=True)
    metrics.watch(consumers, replica=False)
    followers.resolve(0, 0, [(A, state(0)), (B, state(0))], owner=FOLLOWER)
    followers.resolve(0, 0, [(A, state(0))], owner=3)
    consumers.resolve(0, 0, [(C, state(0))], now_ms=0)
    consumers.resolve(0, 0, [(A, state(0)), (B, state(0))], now_ms=EVICTION_MS + 1)

    def read() -> dict[tuple[str, bool], int]:
        data = reader.get_metrics_data()
        assert data is not None
        return {
            (metric.name.removeprefix("highwater.broker."), point.attributes[REPLICA_KEY]): (
                point.value
            )
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            for point in metric.data.data_points
        }

    assert read() == {
        ("fetch_session_count", True): 2,
        ("fetch_session_count", False): 1,
        ("fetch_session_partition_count", True): 3,
        ("fetch_session_partition_count", False): 2,
        ("fetch_session.evictions", True): 0,
        ("fetch_session.evictions", False): 1,
    }
    provider.shutdown()


class ScanningModel:
    """The eviction rule written as a scan of every session (the module docstring's words),
    to hold the cache's heaps to: the same sessions evicted, the same newcomers refused."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        # id -> [owner, created_ms, last_fetch_ms, partitions], least recently used first
        self.sessions: dict[int, list[Any]] = {}

    def new_session_allowed(self, owner: int, size: int, now: int) -> bool:
        while len(self.sessions) >= self.max_sessions:
            oldest_id, oldest = next(iter(self.sessions.items()))
            if now - oldest[2] > EVICTION_MS:
                del self.sessions[oldest_id]
                continue
            privileged = owner >= 0
            candidates = [
                ((o >= 0, len(p), i), i)
                for i, (o, created, last, p) in self.sessions.items()
                if last - created > EVICTION_MS or (privileged and o < 0)
            ]
            if not candidates or (privileged, size) <= min(candidates)[0][:2]:
                return False
            del self.sessions[min(candidates)[1]]
        return True

    def fetched(self, session_id: int, now: int, partitions: set[TopicPartitionKey]) -> None:
        session = self.sessions.pop(session_id)
        session[2], session[3] = now, partitions
        self.sessions[session_id] = session


@pytest.mark.parametrize("seed", range(40))
def test_the_heaps_choose_the_session_a_scan_of_the_cache_would(seed: int) -> None:
    """A full cache finds the session to evict in O(log n), in heaps of ranks kept as
    sessions are created, fetched (resized, forgotten from) and closed, as Kafka keeps
    sorted sets, rather than scanning every session per newcomer: over random rounds it
    evicts and refuses exactly as the scan does."""
    rng = random.Random(seed)
    cache, model = FetchSessionCache(max_sessions=6), ScanningModel(6)
    universe = [("t", p) for p in range(8)]
    epochs: dict[int, int] = {}
    now = 0
    for _ in range(400):
        now += rng.choice([0, 1, 1_000, 30_000, 90_000])
        roll = rng.random()
        if roll < 0.4 or not model.sessions:
            owner = rng.choice([-1, -1, 2, 3])
            partitions = rng.sample(universe, rng.randint(1, 5))
            allowed = model.new_session_allowed(owner, len(partitions), now)
            opened = cache.resolve(0, 0, [(k, state(0)) for k in partitions], owner=owner,
                                   now_ms=now)  # fmt: skip
            assert (opened.session_id > 0) == allowed
            if allowed:
                model.sessions[opened.session_id] = [owner, now, now, set(partitions)]
                epochs[opened.session_id] = 1
        elif roll < 0.9:
            session_id = rng.choice(list(model.sessions))
            owner, _, _, held = model.sessions[session_id]
            added = set(rng.sample(universe, rng.randint(0, 2)))
            forgotten = set(rng.sample(sorted(held), rng.randint(0, len(held) - 1))) - added
            fetch = cache.resolve(session_id, epochs[session_id],
                                  [(k, state(1)) for k in added], sorted(forgotten),
                                  owner=owner, now_ms=now)  # fmt: skip
            assert fetch.error == 0
            epochs[session_id] += 1
            model.fetched(session_id, now, (held | added) - forgotten)
        else:
            session_id = rng.choice(list(model.sessions))
            cache.resolve(session_id, -1, [], owner=model.sessions.pop(session_id)[0], now_ms=now)
        assert {i: len(p) for i, (_, _, _, p) in model.sessions.items()} == {
            i: len(cache.get(i).partitions) for i in model.sessions if cache.get(i) is not None
        }
        assert len(cache) == len(model.sessions)
