"""Tests of checkpoint files (offset and leader-epoch formats), atomic writes and TopicPartition."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from highwater.errors import (
    CorruptCheckpointError,
    InvalidTopicError,
    KafkaStorageError,
    StrayFileError,
)
from highwater.storage import checkpoint as checkpoint_module
from highwater.storage.checkpoint import (
    EpochEntry,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
    write_atomically,
)
from highwater.storage.topic_partition import TopicPartition, validate_topic_name
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import given
from hypothesis import strategies as st

# --- Topic names and partition directories ---------------------------------------------


@pytest.mark.parametrize(
    "name", ["a", "orders", "my-topic", "my_topic.v2", "__consumer_offsets", "-", "...", "a" * 249]
)
def test_legal_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "empty"),
        (".", '"."'),
        ("..", '"."'),
        ("a" * 250, "longer than 249"),
        ("my topic", "character"),
        ("tópico", "character"),
        ("a/b", "character"),
        ("a\n", "character"),
        ("a:b", "character"),
    ],
)
def test_illegal_topic_names(name: str, why: str) -> None:
    with pytest.raises(InvalidTopicError, match=why) as info:
        validate_topic_name(name)
    assert info.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION


def test_topic_partition_str_and_dir_name() -> None:
    tp = TopicPartition("orders", 3)
    assert str(tp) == "orders-3"
    assert tp.dir_name == "orders-3"
    assert tp == ("orders", 3)
    assert TopicPartition.parse_dir_name(str(tp)) == tp


@pytest.mark.parametrize(
    ("name", "tp"),
    [
        ("orders-0", ("orders", 0)),
        ("my-topic-12", ("my-topic", 12)),
        ("a-b-c-2147483647", ("a-b-c", 2147483647)),
        ("__cluster_metadata-0", ("__cluster_metadata", 0)),
        ("trailing--1", ("trailing-", 1)),
    ],
)
def test_parse_dir_name(name: str, tp: tuple[str, int]) -> None:
    parsed = TopicPartition.parse_dir_name(name)
    assert parsed == tp
    assert isinstance(parsed, TopicPartition)
    assert str(parsed) == name


@pytest.mark.parametrize(
    "name",
    [
        "orders",
        "orders-",
        "-0",
        "orders-x",
        "orders-01",
        "orders-+1",
        "orders-1.5",
        "orders- 1",
        "orders-2147483648",
        "my topic-0",
        "..-0",
        "a" * 250 + "-0",
        "orders-0.deleted",
        "",
    ],
)
def test_parse_dir_name_rejects_stray_directories(name: str) -> None:
    with pytest.raises(StrayFileError) as info:
        TopicPartition.parse_dir_name(name)
    assert repr(name) in str(info.value)


@given(
    st.text(alphabet="abcXYZ019._-", min_size=1, max_size=249).filter(
        lambda t: t not in (".", "..")
    ),
    st.integers(0, 2**31 - 1),
)
def test_dir_names_round_trip(topic: str, partition: int) -> None:
    tp = TopicPartition(topic, partition)
    assert TopicPartition.parse_dir_name(str(tp)) == tp


# --- Offset checkpoints ----------------------------------------------------------------


def test_missing_file_reads_empty(tmp_path: Path) -> None:
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read() == {}
    assert LeaderEpochCheckpointFile(tmp_path / "leader-epoch-checkpoint").read() == []


def test_offset_checkpoint_format(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    checkpoint = OffsetCheckpointFile(path)
    checkpoint.write(
        {
            TopicPartition("orders", 1): 42,
            TopicPartition("orders", 0): 7,
            TopicPartition("a-b", 0): 0,
        }
    )
    assert path.read_text() == "0\n3\na-b 0 0\norders 0 7\norders 1 42\n"
    assert checkpoint.read() == {
        TopicPartition("a-b", 0): 0,
        TopicPartition("orders", 0): 7,
        TopicPartition("orders", 1): 42,
    }
    assert checkpoint.path == path


def test_offset_checkpoint_overwrite_and_empty(tmp_path: Path) -> None:
    checkpoint = OffsetCheckpointFile(tmp_path / "cp")
    checkpoint.write({TopicPartition("t", 0): 5})
    checkpoint.write({})
    assert (tmp_path / "cp").read_text() == "0\n0\n"
    assert checkpoint.read() == {}
    assert sorted(os.listdir(tmp_path)) == ["cp"]


def test_reads_files_kafka_wrote(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_bytes(b"0\r\n2\r\norders  0\t12\r\n__consumer_offsets 49 3\r\n")
    assert OffsetCheckpointFile(path).read() == {
        TopicPartition("orders", 0): 12,
        TopicPartition("__consumer_offsets", 49): 3,
    }
    path.write_bytes(b"0\n1\nt 0 9")  # no final newline
    assert OffsetCheckpointFile(path).read() == {TopicPartition("t", 0): 9}
    path.write_bytes(b"")  # Kafka reads an empty file as no entries
    assert OffsetCheckpointFile(path).read() == {}


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        (b"1\n0\n", 1, "unsupported version 1"),
        (b"x\n0\n", 1, "not an integer"),
        (b"\n0\n", 1, "not an integer"),
        (b"0\n", 2, "missing the entry count"),
        (b"0\n-1\n", 2, "out of range"),
        (b"0\ntwo\n", 2, "not an integer"),
        (b"0\n2\nt 0 1\n", 4, "ends after 1 of the 2 entries"),
        (b"0\n1\nt 0 1\nt 1 2\n", 4, "more entries than the 1"),
        (b"0\n1\nt 0\n", 3, "expected 3 space-separated fields"),
        (b"0\n1\nt 0 1 2\n", 3, "expected 3 space-separated fields"),
        (b"0\n1\n\n", 3, "expected 3"),
        (b"0\n1\nt 0 x\n", 3, "offset 'x' is not an integer"),
        (b"0\n1\nt 0 1.5\n", 3, "not an integer"),
        (b"0\n1\nt 0 9223372036854775808\n", 3, "out of range"),
        (b"0\n1\nt -1 0\n", 3, "partition -1 is out of range"),
        (b"0\n1\nt x 0\n", 3, "partition 'x'"),
        (b"0\n1\nt* 0 0\n", 3, "Topic name"),
        (b"0\n2\nt 0 1\nt 0 2\n", 4, "t-0 appears twice"),
        (b"0\n2\nt 0 1\n\xff 0 2\n", 4, "not UTF-8"),
    ],
)
def test_corrupt_offset_checkpoints(tmp_path: Path, content: bytes, line: int, reason: str) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpointError) as info:
        OffsetCheckpointFile(path).read()
    message = str(info.value)
    assert str(path) in message
    assert f"line {line}:" in message
    assert reason in message
    assert info.value.code == ErrorCode.KAFKA_STORAGE_ERROR


def test_write_refuses_entries_it_could_not_read_back(tmp_path: Path) -> None:
    checkpoint = OffsetCheckpointFile(tmp_path / "cp")
    with pytest.raises(InvalidTopicError):
        checkpoint.write({TopicPartition("bad topic", 0): 1})
    with pytest.raises(ValueError, match="partition"):
        checkpoint.write({TopicPartition("t", -1): 1})
    with pytest.raises(ValueError, match="offset"):
        checkpoint.write({TopicPartition("t", 0): 2**63})
    assert not (tmp_path / "cp").exists()


def test_io_failures_are_storage_errors(tmp_path: Path) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir()
    with pytest.raises(KafkaStorageError, match="cannot read"):
        OffsetCheckpointFile(directory).read()
    with pytest.raises(KafkaStorageError, match="cannot write"):
        OffsetCheckpointFile(tmp_path / "missing-dir" / "cp").write({})
    with pytest.raises(KafkaStorageError, match="cannot write"):
        LeaderEpochCheckpointFile(directory).write([])


offsets = st.dictionaries(
    st.builds(
        TopicPartition,
        st.text(alphabet="ab._-", min_size=1, max_size=5).filter(lambda t: t not in (".", "..")),
        st.integers(0, 2**31 - 1),
    ),
    st.integers(-(2**63), 2**63 - 1),
    max_size=20,
)


@given(offsets)
def test_offset_checkpoint_round_trips(values: dict[TopicPartition, int]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = OffsetCheckpointFile(Path(directory) / "cp")
        checkpoint.write(values)
        assert checkpoint.read() == values


# --- Atomic writes ---------------------------------------------------------------------


def test_stale_tmp_from_a_crash_does_not_affect_read_or_write(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    checkpoint = OffsetCheckpointFile(path)
    checkpoint.write({TopicPartition("t", 0): 1})
    # A crash between writing the temporary file and renaming it leaves a torn .tmp.
    tmp = tmp_path / "recovery-point-offset-checkpoint.tmp"
    tmp.write_bytes(b"0\n5\nt 0 9")
    assert checkpoint.read() == {TopicPartition("t", 0): 1}
    checkpoint.write({TopicPartition("t", 0): 2})
    assert checkpoint.read() == {TopicPartition("t", 0): 2}
    assert not tmp.exists()


def test_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cp"
    checkpoint = OffsetCheckpointFile(path)
    checkpoint.write({TopicPartition("t", 0): 1})

    def crash(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module.os, "replace", crash)
    with pytest.raises(KafkaStorageError, match="No space left"):
        checkpoint.write({TopicPartition("t", 0): 2})
    monkeypatch.undo()
    assert checkpoint.read() == {TopicPartition("t", 0): 1}
    assert sorted(os.listdir(tmp_path)) == ["cp"]  # the temporary file was removed


def test_failed_fsync_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    checkpoint = LeaderEpochCheckpointFile(path)
    checkpoint.write([EpochEntry(0, 0)])

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(checkpoint_module.os, "fsync", failing_fsync)
    with pytest.raises(KafkaStorageError, match="Input/output error"):
        checkpoint.write([EpochEntry(0, 0), EpochEntry(1, 5)])
    monkeypatch.undo()
    assert checkpoint.read() == [EpochEntry(0, 0)]


def test_write_order_is_tmp_fsync_rename_dir_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        assert Path(src).read_bytes() == b"new"  # the data is complete before the rename
        events.append(f"replace {Path(src).name} -> {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint_module.os, "replace", replace)
    write_atomically(tmp_path / "target", b"new")
    if not os.path.isdir("/proc/self/fd"):  # pragma: no cover - not Linux
        events = [e.replace("fsync-dir", "fsync-file") for e in events]
    assert events[:2] == ["fsync-file", "replace target.tmp -> target"]
    assert events[2] in ("fsync-dir", "fsync-file")
    assert len(events) == 3
    assert (tmp_path / "target").read_bytes() == b"new"


def test_write_atomically_replaces_whole_contents(tmp_path: Path) -> None:
    target = tmp_path / "target"
    write_atomically(target, b"a much longer first version\n")
    write_atomically(str(target), b"short\n")
    assert target.read_bytes() == b"short\n"


# --- Leader epoch checkpoints ----------------------------------------------------------


def test_leader_epoch_checkpoint_format(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    checkpoint = LeaderEpochCheckpointFile(path)
    entries = [EpochEntry(0, 0), EpochEntry(1, 300), EpochEntry(2, 500)]
    checkpoint.write(entries)
    # The example in the seed article: epoch 0 from 0, epoch 1 from 300, epoch 2 from 500.
    assert path.read_text() == "0\n3\n0 0\n1 300\n2 500\n"
    assert checkpoint.read() == entries
    checkpoint.write(iter([]))
    assert checkpoint.read() == []


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        (b"1\n0\n", 1, "unsupported version"),
        (b"0\n1\n0 0 0\n", 3, "expected 2 space-separated fields"),
        (b"0\n1\n-1 0\n", 3, "epoch -1 is out of range"),
        (b"0\n1\n0 -5\n", 3, "start offset -5 is out of range"),
        (b"0\n1\n2147483648 0\n", 3, "out of range"),
        (b"0\n3\n0 0\n1 300\n", 5, "ends after 2 of the 3"),
    ],
)
def test_corrupt_leader_epoch_checkpoints(
    tmp_path: Path, content: bytes, line: int, reason: str
) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpointError) as info:
        LeaderEpochCheckpointFile(path).read()
    assert str(path) in str(info.value)
    assert f"line {line}:" in str(info.value)
    assert reason in str(info.value)


def test_leader_epoch_checkpoint_refuses_negative_entries(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LeaderEpochCheckpointFile(tmp_path / "x").write([EpochEntry(-1, 0)])


def test_epoch_entry() -> None:
    entry = EpochEntry(3, 17)
    assert entry.epoch == 3
    assert entry.start_offset == 17
    assert str(entry) == "EpochEntry(epoch=3, start_offset=17)"
    assert repr(OffsetCheckpointFile("/x/cp")) == "OffsetCheckpointFile('/x/cp')"
