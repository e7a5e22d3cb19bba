"""The Raft driver's own files: ``quorum-state`` and the snapshot files, including damaged ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from highwater.errors import KafkaStorageError
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.quorum_state_file import (
    QUORUM_STATE_FILE,
    CorruptQuorumStateError,
    QuorumStateData,
    QuorumStateFile,
)
from highwater.raft.snapshot import PositionOutOfRangeError, SnapshotNotFoundError
from highwater.raft.snapshot_files import (
    TRAILER,
    CorruptSnapshotError,
    FileSnapshotStore,
    parse_snapshot_file_name,
    snapshot_file_name,
)

# --- quorum-state ----------------------------------------------------------------------


def test_quorum_state_round_trip(tmp_path: Path) -> None:
    state_file = QuorumStateFile(tmp_path / QUORUM_STATE_FILE)
    assert state_file.read() is None
    state = QuorumStateData("abc", leader_epoch=7, voted_id=2, leader_id=3, voters=(1, 2, 3))
    state_file.write(state)
    assert state_file.read() == state
    assert not list(tmp_path.glob("*.tmp"))
    later = QuorumStateData("abc", leader_epoch=8)
    state_file.write(later)
    assert state_file.read() == later


def test_quorum_state_is_kafkas_json(tmp_path: Path) -> None:
    path = tmp_path / QUORUM_STATE_FILE
    QuorumStateFile(path).write(QuorumStateData("c1", 4, voted_id=-1, leader_id=2, voters=(1, 2)))
    assert json.loads(path.read_text()) == {
        "clusterId": "c1",
        "leaderId": 2,
        "leaderEpoch": 4,
        "votedId": -1,
        "appliedOffset": 0,
        "currentVoters": [{"voterId": 1}, {"voterId": 2}],
        "data_version": 0,
    }


@pytest.mark.parametrize(
    ("contents", "reason"),
    [
        (b"", "not a JSON document"),
        (b"\xff\xfe", "not a JSON document"),
        (b'{"clusterId": "c", "leaderEpoch": 1', "not a JSON document"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"clusterId": "c", "leaderEpoch": 1, "votedId": -1, "leaderId": -1}', "data_version"),
        (
            b'{"clusterId": "c", "leaderEpoch": 1, "votedId": -1, "leaderId": -1, '
            b'"data_version": 9}',
            "unsupported data_version 9",
        ),
        (
            b'{"clusterId": 5, "leaderEpoch": 1, "votedId": -1, "leaderId": -1, "data_version": 0}',
            "clusterId",
        ),
        (
            b'{"clusterId": "c", "leaderEpoch": "1", "votedId": -1, "leaderId": -1, '
            b'"data_version": 0}',
            "leaderEpoch",
        ),
        (
            b'{"clusterId": "c", "leaderEpoch": -4, "votedId": -1, "leaderId": -1, '
            b'"data_version": 0}',
            "leaderEpoch -4 is out of range",
        ),
        (
            b'{"clusterId": "c", "leaderEpoch": 1, "votedId": true, "leaderId": -1, '
            b'"data_version": 0}',
            "votedId",
        ),
        (
            b'{"clusterId": "c", "leaderEpoch": 1, "votedId": -1, "leaderId": -1, '
            b'"data_version": 0, "currentVoters": [{"id": 1}]}',
            "voterId",
        ),
    ],
)
def test_corrupt_quorum_state_names_the_file(tmp_path: Path, contents: bytes, reason: str) -> None:
    path = tmp_path / QUORUM_STATE_FILE
    path.write_bytes(contents)
    with pytest.raises(CorruptQuorumStateError, match=reason) as raised:
        QuorumStateFile(path).read()
    assert isinstance(raised.value, KafkaStorageError)
    assert raised.value.path == path
    assert str(path) in str(raised.value)


def test_quorum_state_leftover_tmp_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / QUORUM_STATE_FILE
    state_file = QuorumStateFile(path)
    state_file.write(QuorumStateData("c", 3))
    (tmp_path / (QUORUM_STATE_FILE + ".tmp")).write_bytes(b"half a wri")
    assert state_file.read() == QuorumStateData("c", 3)
    state_file.write(QuorumStateData("c", 4))
    assert state_file.read() == QuorumStateData("c", 4)


# --- snapshot files --------------------------------------------------------------------

S1 = OffsetAndEpoch(100, 2)
S2 = OffsetAndEpoch(250, 5)


def test_snapshot_file_names_are_kafkas() -> None:
    assert snapshot_file_name(S1) == "00000000000000000100-0000000002.checkpoint"
    assert parse_snapshot_file_name("00000000000000000100-0000000002.checkpoint") == S1
    assert parse_snapshot_file_name("00000000000000000100-0000000002.checkpoint.part") is None
    assert parse_snapshot_file_name("00000000000000000100.log") is None


def test_write_read_and_list(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    assert store.latest() is None
    store.write(S2, b"state at 250")
    store.write(S1, b"state at 100")
    assert store.snapshots() == [S1, S2]
    assert store.latest() == S2
    assert store.read(S1) == b"state at 100"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        snapshot_file_name(S1),
        snapshot_file_name(S2),
    ]
    reopened = FileSnapshotStore(tmp_path)
    assert reopened.snapshots() == [S1, S2]
    assert reopened.read(S2) == b"state at 250"
    with pytest.raises(SnapshotNotFoundError):
        reopened.read(OffsetAndEpoch(1, 1))


def test_read_chunk_serves_the_whole_file(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    payload = bytes(range(256)) * 10
    store.write(S1, payload)
    size = len(payload) + TRAILER.size
    chunk, total = store.read_chunk(S1, 0, 1000)
    assert (chunk, total) == (payload[:1000], size)
    tail, _ = store.read_chunk(S1, 2500, 1000)
    assert len(tail) == size - 2500
    assert store.read_chunk(S1, size, 10) == (b"", size)
    with pytest.raises(PositionOutOfRangeError):
        store.read_chunk(S1, size + 1, 10)
    with pytest.raises(SnapshotNotFoundError):
        store.read_chunk(S2, 0, 10)


def test_receive_in_chunks_from_a_leader(tmp_path: Path) -> None:
    leader = FileSnapshotStore(tmp_path / "leader")
    follower = FileSnapshotStore(tmp_path / "follower")
    leader.write(S2, b"x" * 5000)
    follower.begin_receive(S2)
    position = 0
    while True:
        chunk, size = leader.read_chunk(S2, position, 1024)
        if position == size:
            break
        follower.receive_chunk(position, chunk)
        position += len(chunk)
    assert follower.latest() is None  # not visible before it is finished
    with pytest.raises(PositionOutOfRangeError):
        follower.receive_chunk(0, b"again")
    assert follower.finish_receive() == S2
    assert follower.read(S2) == b"x" * 5000
    assert not list((tmp_path / "follower").glob("*.part"))


def test_a_corrupt_transfer_is_refused(tmp_path: Path) -> None:
    leader = FileSnapshotStore(tmp_path / "leader")
    follower = FileSnapshotStore(tmp_path / "follower")
    leader.write(S1, b"y" * 100)
    chunk, _ = leader.read_chunk(S1, 0, 1 << 20)
    damaged = bytearray(chunk)
    damaged[10] ^= 0xFF
    follower.begin_receive(S1)
    follower.receive_chunk(0, bytes(damaged))
    with pytest.raises(CorruptSnapshotError, match="CRC-32C"):
        follower.finish_receive()
    assert follower.snapshots() == []
    assert list((tmp_path / "follower").iterdir()) == []


def test_partial_files_are_removed_on_open(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    store.write(S1, b"kept")
    store.begin_receive(S2)
    store.receive_chunk(0, b"half")
    # Crash: the .part file stays behind.
    assert (tmp_path / (snapshot_file_name(S2) + ".part")).exists()
    reopened = FileSnapshotStore(tmp_path)
    assert reopened.snapshots() == [S1]
    assert not (tmp_path / (snapshot_file_name(S2) + ".part")).exists()
    store.close()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[:-1], "trailer"),
        (lambda data: data[:5], "shorter than"),
        (lambda data: b"Z" + data[1:], "CRC-32C"),
        (lambda data: data[:-16] + b"XXXX" + data[-12:], "magic"),
        (lambda data: b"extra" + data, "payload bytes"),
    ],
)
def test_a_corrupt_snapshot_is_ignored_for_an_older_one(
    tmp_path: Path, damage: object, reason: str
) -> None:
    store = FileSnapshotStore(tmp_path)
    store.write(S1, b"older state")
    store.write(S2, b"newer state")
    path = tmp_path / snapshot_file_name(S2)
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    reopened = FileSnapshotStore(tmp_path)
    assert reopened.latest() == S1
    assert reopened.read(S1) == b"older state"
    (problem,) = reopened.corrupt.values()
    assert isinstance(problem, KafkaStorageError)
    assert str(path) in str(problem) and reason in str(problem)
    assert path.exists()  # left for inspection
    # The leader's copy replaces it when it is fetched again.
    reopened.write(S2, b"newer state")
    assert reopened.latest() == S2
    assert reopened.corrupt == {}


def test_corruption_found_when_loading_raises_a_typed_error(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    store.write(S1, b"state")
    path = tmp_path / snapshot_file_name(S1)
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError) as raised:
        store.read(S1)
    assert raised.value.path == path


def test_delete_before(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    for snapshot_id in (OffsetAndEpoch(10, 1), S1, S2):
        store.write(snapshot_id, b"s")
    store.delete_before(S2)
    assert store.snapshots() == [S2]
    assert [p.name for p in tmp_path.iterdir()] == [snapshot_file_name(S2)]
    assert FileSnapshotStore(tmp_path).snapshots() == [S2]
