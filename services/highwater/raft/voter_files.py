"""Where a dynamic quorum's voter set survives outside the log: the ``quorum-voters`` file and
the voters section of a snapshot.

A ``voters`` control record may be cut out of the log by a snapshot, yet a replica that
restarts must know the set in force there. Two copies keep it, as Kafka keeps its
``VotersRecord`` in the bootstrap checkpoint and in every snapshot:

* ``quorum-voters`` beside ``quorum-state``: the latest *committed* set and the offset of
  its record (-1 for the bootstrap set of ``--initial-controllers`` or the set an observer
  learned at its first start), replaced atomically each time the committed set changes
  (:class:`CommittedVotersFile`);
* a snapshot of a dynamic quorum starts with a voters section (:func:`wrap_snapshot`):
  the set committed at the snapshot's offset, so that a replica that installs the
  leader's snapshot takes the leader's set (:func:`read_snapshot_voters`). A snapshot
  without the section (a static quorum's, or one written before) reads as before.

Both hold the set as the ``voters`` control record's JSON (:mod:`highwater.raft.voter_set`).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Final, Protocol

from highwater.errors import InvalidRecordError, KafkaStorageError
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.voter_set import VoterSet, decode_voters_record, encode_voters_record
from highwater.storage.checkpoint import write_atomically
from highwater.storage.log_loader import QUORUM_VOTERS

__all__ = [
    "COMMITTED_VOTERS_FILE",
    "CommittedVotersFile",
    "read_snapshot_voters",
    "unwrap_snapshot",
    "wrap_snapshot",
]

COMMITTED_VOTERS_FILE: Final = QUORUM_VOTERS
_SECTION_MAGIC: Final = b"HWVOTERS"
_SECTION_HEADER = struct.Struct(">8sqI")  # magic, offset of the voters record, JSON length
_SECTION_MAX_BYTES: Final = 1 << 20

VotersEntry = tuple[int, VoterSet]
"""A voter set and the offset of the record it came from (-1: the bootstrap set)."""


class CommittedVotersFile:
    """Reads and atomically replaces one ``quorum-voters`` file. Blocking: run off the loop."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> VotersEntry | None:
        """The kept ``(offset, set)``, or ``None`` when the file does not exist."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise KafkaStorageError(f"cannot read {self.path}: {e}") from e
        try:
            document = json.loads(data)
            offset = document["offset"]
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1:
                raise ValueError(f"offset {offset!r} is not an offset")
            voters = decode_voters_record(json.dumps(document["voters"]).encode())
        except (ValueError, KeyError, TypeError, InvalidRecordError) as e:
            raise KafkaStorageError(f"{self.path}: not a kept voter set: {e}") from None
        return offset, voters

    def write(self, entry: VotersEntry) -> None:
        """Replace the file with ``entry``, durably (fsync of the file and its directory)."""
        offset, voters = entry
        document = {"offset": offset, "voters": json.loads(encode_voters_record(voters))}
        try:
            write_atomically(self.path, json.dumps(document, separators=(",", ":")).encode())
        except OSError as e:
            raise KafkaStorageError(f"cannot write {self.path}: {e}") from e


def wrap_snapshot(entry: VotersEntry, data: bytes) -> bytes:
    """The snapshot's bytes with the voters section ahead of the state machine's ``data``."""
    offset, voters = entry
    record = encode_voters_record(voters)
    return _SECTION_HEADER.pack(_SECTION_MAGIC, offset, len(record)) + record + data


def unwrap_snapshot(data: bytes) -> tuple[VotersEntry | None, bytes]:
    """The voters section of a snapshot (``None`` if it has none) and the state machine's
    bytes. Raises :class:`~highwater.errors.InvalidRecordError` on a broken section."""
    if not data.startswith(_SECTION_MAGIC):
        return None, data
    if len(data) < _SECTION_HEADER.size:
        raise InvalidRecordError("the snapshot's voters section is cut short")
    _, offset, length = _SECTION_HEADER.unpack_from(data)
    end = _SECTION_HEADER.size + length
    if length > _SECTION_MAX_BYTES or len(data) < end:
        raise InvalidRecordError(f"the snapshot's voters section claims {length} bytes")
    return (offset, decode_voters_record(data[_SECTION_HEADER.size : end])), data[end:]


class _ChunkReader(Protocol):
    def read_chunk(
        self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int
    ) -> tuple[bytes, int]: ...


def read_snapshot_voters(store: _ChunkReader, snapshot_id: OffsetAndEpoch) -> VotersEntry | None:
    """The voters section of a stored snapshot, read from its first bytes only."""
    head, _ = store.read_chunk(snapshot_id, 0, _SECTION_HEADER.size)
    if not head.startswith(_SECTION_MAGIC) or len(head) < _SECTION_HEADER.size:
        return None
    _, _, length = _SECTION_HEADER.unpack(head)
    if length > _SECTION_MAX_BYTES:
        raise InvalidRecordError(f"the snapshot's voters section claims {length} bytes")
    whole, _ = store.read_chunk(snapshot_id, 0, _SECTION_HEADER.size + length)
    entry, _ = unwrap_snapshot(whole)
    return entry
