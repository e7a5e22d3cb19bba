"""Incremental fetch sessions (KIP-227): the broker remembers what a consumer fetches.

A fetch names a session id and an epoch:

* ``(0, -1)`` — no session: a full fetch, answered with session id 0;
* ``(0, 0)`` or ``(id, 0)`` — a new session (closing ``id``): a full fetch, answered with
  the new session's id (0 when the cache is full), whose partitions the broker keeps;
* ``(id, n)``, ``n > 0`` — the next fetch of session ``id``: its partitions are added to or
  updated in the session, its forgotten partitions removed, and the broker fetches every
  partition of the session; the answer lists only the partitions that have records or whose
  high watermark, log start offset or error changed since the session's last answer. An
  unknown id is FETCH_SESSION_ID_NOT_FOUND, an epoch other than the expected one
  INVALID_FETCH_SESSION_EPOCH;
* ``(id, -1)`` — close session ``id``, then a full fetch without a session.

Pure: no I/O; the cache holds at most ``max_sessions`` sessions and evicts the least
recently used (Kafka's ``max.incremental.fetch.session.cache.slots``, 1000).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "FETCH_SESSION_ID_NOT_FOUND",
    "INVALID_FETCH_SESSION_EPOCH",
    "FetchPartitionState",
    "FetchSessionCache",
    "SessionFetch",
]

FETCH_SESSION_ID_NOT_FOUND: Final = 70
INVALID_FETCH_SESSION_EPOCH: Final = 71
_INITIAL_EPOCH: Final = 0
_FINAL_EPOCH: Final = -1

TopicPartitionKey = tuple[str, int]


@dataclass(slots=True)
class FetchPartitionState:
    """What a fetch asks of one partition, and (in a session) what it was last told."""

    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    answered: tuple[int, int, int] | None = None
    """(high watermark, log start offset, error) of the last answer that carried it."""


@dataclass(slots=True)
class FetchSession:
    session_id: int
    next_epoch: int
    partitions: dict[TopicPartitionKey, FetchPartitionState] = field(default_factory=dict)


@dataclass(slots=True)
class SessionFetch:
    """One fetch resolved against the cache: the partitions to read, in order, and how to
    trim the answer. ``error`` set: the fetch is refused as a whole."""

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
    """The broker's fetch sessions (see the module docstring)."""

    def __init__(self, max_sessions: int = 1000) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._sessions)

    def resolve(
        self,
        session_id: int,
        epoch: int,
        partitions: Iterable[tuple[TopicPartitionKey, FetchPartitionState]],
        forgotten: Iterable[TopicPartitionKey] = (),
    ) -> SessionFetch:
        """The fetch ``(session_id, epoch)`` with the request's partitions and forgotten
        partitions, as the module docstring says."""
        requested = list(partitions)
        if epoch in (_INITIAL_EPOCH, _FINAL_EPOCH):
            if session_id:
                self._sessions.pop(session_id, None)
            if epoch == _FINAL_EPOCH:
                return SessionFetch(0, requested, incremental=False)
            session = self._new_session(requested)
            return SessionFetch(
                0 if session is None else session.session_id,
                requested,
                incremental=False,
                session=session,
            )
        session = self._sessions.get(session_id)
        if session is None:
            return SessionFetch(0, [], False, error=FETCH_SESSION_ID_NOT_FOUND)
        if epoch != session.next_epoch:
            return SessionFetch(0, [], False, error=INVALID_FETCH_SESSION_EPOCH)
        self._sessions.move_to_end(session_id)
        session.next_epoch = epoch + 1 if epoch < 2**31 - 1 else 1
        for key in forgotten:
            session.partitions.pop(key, None)
        for key, state in requested:
            known = session.partitions.get(key)
            if known is not None:
                state.answered = known.answered
            session.partitions[key] = state
        return SessionFetch(
            session_id, list(session.partitions.items()), incremental=True, session=session
        )

    def _new_session(
        self, partitions: list[tuple[TopicPartitionKey, FetchPartitionState]]
    ) -> FetchSession | None:
        if self.max_sessions <= 0:
            return None
        while len(self._sessions) >= self.max_sessions:
            self._sessions.popitem(last=False)
        session_id = next(self._ids) & 0x7FFFFFFF or next(self._ids)
        session = FetchSession(session_id, next_epoch=1, partitions=dict(partitions))
        self._sessions[session_id] = session
        return session
