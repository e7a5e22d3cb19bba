"""The quorum's voter set as KIP-853 keeps it: voters as records, changed one at a time.

A voter is a node id *and* a directory id (a uuid made once per data directory): the pair
is the voter's key, so a node whose disk was wiped and which comes back with a new
directory id is a different voter, one that has lost whatever it had voted for or
acknowledged. Such a node must not be counted in place of the old incarnation; the old
key is removed and the new one added, each as its own change.

The voter set lives in the log as a ``voters`` control record (Kafka's ``VotersRecord``:
version, and per voter its id, directory id and endpoint). The set a replica uses is the
one of the latest such record in its log, committed or not: a leader that appended a change
counts majorities with the new set at once. That is safe because each change adds or
removes exactly one voter, so every majority of the old set and every majority of the new
one share a member (:meth:`VoterSet.majorities_overlap`), and because a second change is
refused while the first is uncommitted.

This module is pure: the checks a leader runs on AddRaftVoter, RemoveRaftVoter and
UpdateRaftVoter (:func:`check_add_voter`, :func:`check_remove_voter`,
:func:`check_update_voter`) take what the leader knows as arguments and return the new set
or raise a typed error with the code the reply carries. The directory id file is at the
edge, in :func:`load_or_create_directory_id`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from highwater.errors import HighwaterError, InvalidRecordError, KafkaStorageError
from highwater.storage.checkpoint import write_atomically
from highwater.v1.common_pb2 import ErrorCode

DIRECTORY_ID_FILE: Final = "directory-id"
VOTERS_RECORD_VERSION: Final = 0
NO_DIRECTORY_ID: Final = uuid.UUID(int=0)
"""The nil directory id (Kafka's ``ZERO_UUID``): a static quorum's voters have it, and a
request naming a voter without a directory id names it, which no dynamic voter has."""


class MembershipChangeError(HighwaterError):
    """A voter change the leader refuses; the message says why and what to do."""

    code = ErrorCode.INVALID_REQUEST


class ChangeInProgressError(MembershipChangeError):
    """A second change while the first is uncommitted (KIP-853 answers REQUEST_TIMED_OUT)."""

    code = ErrorCode.REQUEST_TIMED_OUT


class NotCaughtUpError(MembershipChangeError):
    """The node to add has not fetched up to the leader's end within the bound."""

    code = ErrorCode.REQUEST_TIMED_OUT


class DuplicateVoterError(MembershipChangeError):
    """The node id is already a voter (perhaps with another directory id)."""


class VoterNotFoundError(MembershipChangeError):
    """No voter has this id and directory id."""


class LastVoterError(MembershipChangeError):
    """Removing the only voter would leave a quorum nobody can elect a leader in."""


class NotAControllerError(MembershipChangeError):
    """The node to add follows the quorum as an observer only (a broker or a coordinator):
    it announces no controller endpoint (KIP-853 answers INVALID_REQUEST)."""


class InvalidVoterError(MembershipChangeError):
    """A voter description that does not parse (id, endpoint or directory id)."""


@dataclass(frozen=True, slots=True)
class Voter:
    """One voter: its key (``node_id``, ``directory_id``) and where it listens."""

    node_id: int
    directory_id: uuid.UUID
    endpoint: str

    @property
    def key(self) -> tuple[int, uuid.UUID]:
        return self.node_id, self.directory_id


@dataclass(frozen=True, slots=True)
class VoterSet:
    """An immutable set of voters, at most one per node id."""

    voters: Mapping[int, Voter]

    @classmethod
    def of(cls, voters: Iterable[Voter]) -> VoterSet:
        by_id: dict[int, Voter] = {}
        for voter in voters:
            if voter.node_id in by_id:
                raise DuplicateVoterError(f"node {voter.node_id} is listed twice as a voter")
            by_id[voter.node_id] = voter
        if not by_id:
            raise InvalidVoterError("a voter set needs at least one voter")
        return cls(dict(sorted(by_id.items())))

    def __iter__(self) -> Iterator[Voter]:
        return iter(self.voters.values())

    def __len__(self) -> int:
        return len(self.voters)

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(self.voters)

    def get(self, node_id: int) -> Voter | None:
        return self.voters.get(node_id)

    def is_voter(self, node_id: int, directory_id: uuid.UUID | None) -> bool:
        """Whether the node is a voter; a known directory id must match the voter's key."""
        voter = self.voters.get(node_id)
        if voter is None:
            return False
        return directory_id is None or voter.directory_id == directory_id

    def is_majority(self, node_ids: Iterable[int]) -> bool:
        """Whether ``node_ids`` hold more than half of this set's voters."""
        return 2 * len(self.ids & set(node_ids)) > len(self.voters)

    def majorities_overlap(self, other: VoterSet) -> bool:
        """Whether every majority of this set meets every majority of ``other``.

        Two majorities are disjoint only if a majority of one fits outside a majority of
        the other; the smallest majorities are the worst case, so the sets overlap iff the
        smallest majority of each, drawn from the voters the other does not share, cannot
        both fit: ``m1 + m2 > |union|`` with the shared voters counted once.
        """
        shared = len(self.ids & other.ids)
        only_self = len(self.ids - other.ids)
        only_other = len(other.ids - self.ids)
        m_self = len(self) // 2 + 1
        m_other = len(other) // 2 + 1
        # A majority of self placed as far from other as possible uses only_self voters
        # first; what it needs beyond them comes from the shared ones, and likewise for
        # other. They are disjoint iff those two needs fit in the shared voters together.
        need_self = max(0, m_self - only_self)
        need_other = max(0, m_other - only_other)
        return need_self + need_other > shared

    def with_voter(self, voter: Voter) -> VoterSet:
        return VoterSet({**self.voters, voter.node_id: voter})

    def without(self, node_id: int) -> VoterSet:
        return VoterSet({k: v for k, v in self.voters.items() if k != node_id})


# --- The VotersRecord ------------------------------------------------------------------


def encode_voters_record(voters: VoterSet) -> bytes:
    """The value of the ``voters`` control record that sets the quorum's voters."""
    return json.dumps(
        {
            "type": "voters",
            "version": VOTERS_RECORD_VERSION,
            "voters": [
                {"id": v.node_id, "directory_id": str(v.directory_id), "endpoint": v.endpoint}
                for v in voters
            ],
        },
        separators=(",", ":"),
    ).encode()


def decode_voters_record(value: bytes) -> VoterSet:
    """The voter set a ``voters`` control record holds; a malformed record is an error."""
    try:
        message = json.loads(value)
        if message.get("type") != "voters":
            raise InvalidRecordError(f"not a voters control record: {value!r}")
        if message.get("version") != VOTERS_RECORD_VERSION:
            raise InvalidRecordError(f"unknown voters record version: {message.get('version')!r}")
        return VoterSet.of(
            Voter(int(v["id"]), uuid.UUID(v["directory_id"]), str(v["endpoint"]))
            for v in message["voters"]
        )
    except (ValueError, KeyError, TypeError, AttributeError, MembershipChangeError) as exc:
        raise InvalidRecordError(f"malformed voters control record: {exc}") from exc


def is_voters_record(value: bytes) -> bool:
    """Whether a control record's value is a ``voters`` record (cheap prefix test)."""
    return value.startswith(b'{"type":"voters"')


# --- Bootstrap -------------------------------------------------------------------------


def parse_initial_controllers(text: str) -> VoterSet:
    """The voters of ``--initial-controllers id@host:port:directory-id,...`` (as Kafka's).

    Raises :class:`InvalidVoterError` naming the entry that does not parse.
    """
    voters = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        node, at, rest = entry.partition("@")
        host_port, colon, directory = rest.rpartition(":")
        host, _, port = host_port.rpartition(":")
        try:
            if not at or not colon or not host or not port:
                raise ValueError("expected id@host:port:directory-id")
            node_id = int(node)
            if node_id < 0:
                raise ValueError("the node id must not be negative")
            port_number = int(port)
            if not 0 < port_number < 65536:
                raise ValueError(f"port {port_number} out of range")
            directory_id = uuid.UUID(directory)
        except ValueError as exc:
            raise InvalidVoterError(f"bad --initial-controllers entry {entry!r}: {exc}") from exc
        voters.append(Voter(node_id, directory_id, f"{host}:{port_number}"))
    return VoterSet.of(voters)


def standalone_voters(node_id: int, directory_id: uuid.UUID, endpoint: str) -> VoterSet:
    """The voter set of a quorum bootstrapped as this single node (``--standalone``)."""
    return VoterSet.of([Voter(node_id, directory_id, endpoint)])


def load_or_create_directory_id(data_dir: Path) -> uuid.UUID:
    """The data directory's id: read from ``directory-id``, or made and written once.

    A wiped directory gets a new id, which is what makes its node a new voter.
    """
    path = Path(data_dir) / DIRECTORY_ID_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        directory_id = uuid.uuid4()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, f"{directory_id}\n".encode())
        return directory_id
    try:
        return uuid.UUID(text.strip())
    except ValueError as exc:
        raise KafkaStorageError(f"{path}: not a directory id: {text[:60]!r}") from exc


# --- The leader's checks ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaderView:
    """What the leader knows when it checks a voter change.

    ``pending_change`` is true while the latest ``voters`` record is above the high
    watermark; ``committed_in_epoch`` is whether the high watermark has reached the
    leader's own epoch (KIP-853 refuses changes before that: the current set may not be
    the committed one yet).
    """

    voters: VoterSet
    leader_id: int
    log_end_offset: int
    pending_change: bool
    committed_in_epoch: bool


def _check_can_change(view: LeaderView) -> None:
    if view.pending_change:
        raise ChangeInProgressError(
            "another voter change is not committed yet; retry once it is (one change at a time)"
        )
    if not view.committed_in_epoch:
        raise ChangeInProgressError(
            "the leader has not committed an offset in its epoch yet; retry shortly"
        )


def check_add_voter(
    view: LeaderView,
    voter: Voter,
    *,
    observer_caught_up_ms: int | None,
    observer_directory_id: uuid.UUID | None,
    observer_endpoint: str | None,
    now_ms: int,
    catch_up_ms: int,
) -> VoterSet:
    """The voter set after adding ``voter``, or a typed refusal.

    The node must be an observer whose fetch last reached the leader's log end offset
    (``observer_caught_up_ms``, None if never) no longer than ``catch_up_ms`` ago, and
    whose fetches carry ``voter``'s directory id (``observer_directory_id``: KIP-853 keys
    a replica by id and directory id, so a voter added under another one would be no
    replica at all, and the node itself a stale incarnation of it). Its id must not be a
    voter (a reused id with a new directory id is refused until the old voter is removed).

    Only a controller can be added: an observer whose fetches carry a directory id but
    announce no controller endpoint (``observer_endpoint`` empty; None: never heard from)
    is a broker's or a coordinator's metadata replica, which would lead the quorum with no
    controller behind it. Kafka's leader refuses a voter without a controller listener
    with INVALID_REQUEST, and so does this one (:class:`NotAControllerError`), whatever
    endpoint the request names.
    """
    _check_can_change(view)
    existing = view.voters.get(voter.node_id)
    if existing is not None:
        if existing.directory_id != voter.directory_id:
            raise DuplicateVoterError(
                f"node {voter.node_id} is a voter with directory {existing.directory_id}; "
                f"directory {voter.directory_id} is a new incarnation: remove the old voter "
                "first"
            )
        raise DuplicateVoterError(f"node {voter.node_id} is already a voter")
    if observer_directory_id is not None and observer_endpoint == "":
        raise NotAControllerError(
            f"node {voter.node_id} is not a controller: it follows the metadata quorum as an "
            "observer only (a broker or a coordinator) and announces no controller endpoint; "
            "only a controller (highwater controller --bootstrap-controllers) can become a voter"
        )
    if observer_caught_up_ms is None or now_ms - observer_caught_up_ms > catch_up_ms:
        have = (
            "it never reached the leader's log end"
            if observer_caught_up_ms is None
            else f"it last reached the leader's log end {now_ms - observer_caught_up_ms} ms ago"
        )
        raise NotCaughtUpError(
            f"node {voter.node_id} is not a caught-up observer ({have}, the bound is "
            f"{catch_up_ms} ms; the leader's end is {view.log_end_offset}): start it as an "
            "observer (--bootstrap-controllers) and retry"
        )
    if observer_directory_id != voter.directory_id:
        fetches = (
            "names no directory id"
            if observer_directory_id is None
            else f"fetches with directory {observer_directory_id}"
        )
        raise NotCaughtUpError(
            f"node {voter.node_id} {fetches}, not {voter.directory_id}: add it under the "
            "directory id its observer fetches with (highwater quorum describe --status "
            "lists it)"
        )
    return view.voters.with_voter(voter)


@dataclass(frozen=True, slots=True)
class Removal:
    """A checked removal: the new set, and whether the leader resigns once it commits."""

    voters: VoterSet
    leader_resigns: bool


def check_remove_voter(view: LeaderView, node_id: int, directory_id: uuid.UUID | None) -> Removal:
    """The voter set after removing the voter ``(node_id, directory_id)``, or a refusal.

    ``directory_id`` None matches the voter with that id whatever its directory (callers
    inside the process; a RemoveRaftVoter request without one names
    :data:`NO_DIRECTORY_ID`, which matches no voter of a dynamic quorum). The last voter
    is never removed. Removing the leader is allowed: it keeps leading until the record
    commits (counted by the new set, without itself) and then resigns.
    """
    _check_can_change(view)
    if not view.voters.is_voter(node_id, directory_id):
        current = view.voters.get(node_id)
        if current is None:
            raise VoterNotFoundError(f"no voter {node_id}")
        named = (
            "without a directory id: a voter is removed by its id and directory id"
            if directory_id == NO_DIRECTORY_ID
            else f"with directory {directory_id}"
        )
        raise VoterNotFoundError(
            f"no voter {node_id} {named} (its voter has directory {current.directory_id})"
        )
    if len(view.voters) == 1:
        raise LastVoterError(f"node {node_id} is the last voter; a quorum needs one")
    return Removal(view.voters.without(node_id), leader_resigns=node_id == view.leader_id)


def check_update_voter(view: LeaderView, voter: Voter) -> VoterSet:
    """The voter set with ``voter``'s endpoint replaced; its key must be a voter's."""
    _check_can_change(view)
    if not view.voters.is_voter(voter.node_id, voter.directory_id):
        raise VoterNotFoundError(
            f"no voter {voter.node_id} with directory {voter.directory_id} to update"
        )
    return view.voters.with_voter(voter)


# --- The history of voter sets along the log -------------------------------------------


class VoterSetHistory:
    """The voter sets a replica's log holds, by offset (Kafka's ``VoterSetHistory``).

    The set in use is the latest one (:meth:`latest`), committed or not. A follower that
    truncates its log drops the sets above the truncation point (:meth:`truncate_to`) and
    falls back to the set before them; a snapshot at offset S keeps only the last set
    below S, which the snapshot carries (:meth:`forget_before`). ``pending_change`` tells
    the leader whether a change is still above the high watermark.
    """

    def __init__(self, bootstrap: VoterSet, offset: int = -1) -> None:
        # (offset of the voters record, set); the bootstrap set is at offset -1, or at
        # the offset of the committed record it was kept from.
        self._entries: list[tuple[int, VoterSet]] = [(offset, bootstrap)]

    def add_at(self, offset: int, voters: VoterSet) -> None:
        """Record the voters record appended or fetched at ``offset``."""
        last = self._entries[-1][0]
        if offset <= last:
            raise ValueError(f"voters record at {offset} is not above the last one at {last}")
        self._entries.append((offset, voters))

    def latest(self) -> VoterSet:
        return self._entries[-1][1]

    def latest_offset(self) -> int:
        return self._entries[-1][0]

    def committed(self, high_watermark: int) -> VoterSet:
        """The latest set whose record is below ``high_watermark``."""
        return self.committed_entry(high_watermark)[1]

    def committed_entry(self, high_watermark: int) -> tuple[int, VoterSet]:
        """The latest ``(offset, set)`` whose record is below ``high_watermark``."""
        for offset, voters in reversed(self._entries):
            if offset < high_watermark:
                return offset, voters
        return self._entries[0]

    def pending_change(self, high_watermark: int) -> bool:
        return self._entries[-1][0] >= high_watermark

    def offsets_between(self, start: int, end: int) -> list[int]:
        """The offsets of the ``voters`` records this history holds from ``start`` to
        ``end - 1``."""
        return [offset for offset, _ in self._entries if start <= offset < end]

    def truncate_to(self, offset: int) -> None:
        """Drop the sets whose records are at or above ``offset`` (the log was cut there)."""
        while len(self._entries) > 1 and self._entries[-1][0] >= offset:
            self._entries.pop()

    def forget_before(self, offset: int) -> None:
        """Keep only the last set below ``offset`` and those after (a snapshot at ``offset``)."""
        keep = 0
        for index, (entry_offset, _) in enumerate(self._entries):
            if entry_offset < offset:
                keep = index
        del self._entries[:keep]
