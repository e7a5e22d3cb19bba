"""The ``quorum-state`` file: a voter's durable election state (epoch, vote, leader), as KRaft's.

Raft's safety rests on two facts surviving a crash: the highest epoch a node has seen and
whom it voted for in it. The driver writes them here, and fsyncs, before it sends any
message that depends on them.

Format: one JSON object, Kafka's ``QuorumStateData`` (``FileQuorumStateStore``), version 0::

    {"clusterId": "...", "leaderId": 1, "leaderEpoch": 7, "votedId": -1,
     "appliedOffset": 0, "currentVoters": [{"voterId": 1}, {"voterId": 2}],
     "data_version": 0}

``leaderId`` and ``votedId`` are ``-1`` when there is none. The file is replaced with
:func:`~highwater.storage.checkpoint.write_atomically` (temporary file, fsync, rename,
directory fsync), so a crash leaves the old or the new state, never a mix. A missing file
reads as ``None`` (a node that never voted); a file that does not parse raises
:class:`CorruptQuorumStateError` naming the file: the node must not start with a guessed
epoch or vote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from highwater.errors import KafkaStorageError
from highwater.storage.checkpoint import write_atomically

QUORUM_STATE_FILE: Final = "quorum-state"
QUORUM_STATE_VERSION: Final = 0
NO_ID: Final = -1

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class CorruptQuorumStateError(KafkaStorageError):
    """A ``quorum-state`` file that does not hold a valid election state."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"quorum state file {path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class QuorumStateData:
    """What the file holds: the cluster, the election state and the voters it was kept for."""

    cluster_id: str
    leader_epoch: int
    voted_id: int = NO_ID
    leader_id: int = NO_ID
    voters: tuple[int, ...] = ()

    def to_json(self) -> bytes:
        document = {
            "clusterId": self.cluster_id,
            "leaderId": self.leader_id,
            "leaderEpoch": self.leader_epoch,
            "votedId": self.voted_id,
            "appliedOffset": 0,
            "currentVoters": [{"voterId": voter} for voter in self.voters],
            "data_version": QUORUM_STATE_VERSION,
        }
        return json.dumps(document, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, path: Path, data: bytes) -> QuorumStateData:
        """Parse the file's bytes; ``path`` names the file in the error if they are invalid."""
        try:
            document: Any = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptQuorumStateError(path, f"not a JSON document: {e}") from None
        if not isinstance(document, dict):
            raise CorruptQuorumStateError(path, "not a JSON object")
        version = _integer(path, document, "data_version", 0, _INT32_MAX)
        if version != QUORUM_STATE_VERSION:
            raise CorruptQuorumStateError(
                path, f"unsupported data_version {version}, expected {QUORUM_STATE_VERSION}"
            )
        cluster_id = document.get("clusterId")
        if not isinstance(cluster_id, str):
            raise CorruptQuorumStateError(path, "clusterId is missing or not a string")
        voters_field = document.get("currentVoters", [])
        if not isinstance(voters_field, list):
            raise CorruptQuorumStateError(path, "currentVoters is not a list")
        voters = []
        for entry in voters_field:
            if not isinstance(entry, dict):
                raise CorruptQuorumStateError(path, f"voter entry {entry!r} is not an object")
            voters.append(_integer(path, entry, "voterId", 0, _INT32_MAX))
        return cls(
            cluster_id=cluster_id,
            leader_epoch=_integer(path, document, "leaderEpoch", 0, _INT32_MAX),
            voted_id=_integer(path, document, "votedId", NO_ID, _INT32_MAX),
            leader_id=_integer(path, document, "leaderId", NO_ID, _INT32_MAX),
            voters=tuple(voters),
        )


def _integer(path: Path, document: dict[str, Any], key: str, low: int, high: int) -> int:
    value = document.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CorruptQuorumStateError(path, f"{key} is missing or not an integer")
    if not low <= value <= high:
        raise CorruptQuorumStateError(path, f"{key} {value} is out of range [{low}, {high}]")
    return value


class QuorumStateFile:
    """Reads and atomically replaces one ``quorum-state`` file. Blocking: run off the loop."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> QuorumStateData | None:
        """The stored state, or ``None`` when the file does not exist."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise KafkaStorageError(f"cannot read quorum state file {self.path}: {e}") from e
        return QuorumStateData.from_json(self.path, data)

    def write(self, state: QuorumStateData) -> None:
        """Replace the file with ``state``, durably (fsync of the file and its directory)."""
        try:
            write_atomically(self.path, state.to_json())
        except OSError as e:
            raise KafkaStorageError(f"cannot write quorum state file {self.path}: {e}") from e

    def __repr__(self) -> str:
        return f"QuorumStateFile({str(self.path)!r})"
