"""Several log directories per broker (JBOD): placement, identity, restart, the refusals at
start, and a failed directory taking only its own partitions offline."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from highwater.config.topic import LogConfig
from highwater.errors import KafkaStorageError
from highwater.storage.log_manager import (
    LogDirectory,
    LogManager,
    read_meta_properties,
)
from highwater.storage.topic_partition import TopicPartition
from storage_helpers import make_batch, read_all


def started(dirs: list[Path], **kwargs: object) -> LogManager:
    manager = LogManager(dirs, **kwargs)  # type: ignore[arg-type]
    manager.startup(cluster_id="c1", node_id=7)
    return manager


def holder(manager: LogManager, tp: TopicPartition) -> Path:
    directory = manager.directory_of(tp)
    assert directory is not None
    return directory.path


def test_new_partitions_go_to_the_directory_with_the_fewest(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    manager = started(dirs)
    placed = [
        holder(manager, manager.get_or_create_log(TopicPartition("t", i)).topic_partition)
        for i in range(5)
    ]
    # Fewest first, the first listed on a tie: a, b, c, a, b.
    assert placed == [dirs[0], dirs[1], dirs[2], dirs[0], dirs[1]]
    # A directory emptied by a deletion is the next one chosen.
    manager.delete_log(TopicPartition("t", 2))
    manager.delete_log(TopicPartition("t", 3))
    assert manager.next_dir().path == dirs[2]
    manager.shutdown()


def test_a_deleted_topics_logs_leave_every_checkpoint_and_a_new_topic_inherits_nothing(
    tmp_path: Path,
) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs)
    doomed = [TopicPartition("t", i) for i in range(6)]
    for tp in doomed:
        for _ in range(3):
            manager.get_or_create_log(tp).append_as_leader(make_batch([b"v"]), 0)
        manager.logs[tp].flush()
    manager.get_or_create_log(TopicPartition("kept", 0))
    manager.checkpoint_all()
    assert manager.delete_logs([*doomed, TopicPartition("never", 0)]) == 6
    for d in dirs:
        assert {p.name for p in d.iterdir() if p.is_dir()} <= {"kept-0"}
        lines = (d / "recovery-point-offset-checkpoint").read_text().splitlines()
        assert all(not line.startswith("t ") for line in lines[2:])
    # The topic created again under its name starts empty, after a restart too.
    manager.get_or_create_log(TopicPartition("t", 0))
    manager.shutdown()
    again = started(dirs)
    recreated = again.logs[TopicPartition("t", 0)]
    assert (recreated.log_end_offset, recreated.recovery_point) == (0, 0)
    again.shutdown()


def test_each_directory_has_its_identity_lock_and_checkpoints(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs)
    for i in range(4):
        manager.get_or_create_log(TopicPartition("t", i)).append_as_leader(make_batch([b"v"]), 0)
    ids = [read_meta_properties(d)["directory.id"] for d in dirs]
    assert len(set(ids)) == 2 and all(len(i) == 22 for i in ids)
    assert [d.directory_id for d in manager.log_dirs] == ids
    with pytest.raises(KafkaStorageError, match="in use by another process"):
        LogManager(dirs[1]).startup()
    manager.shutdown()
    # Each directory's checkpoint names only the partitions it holds.
    for d in dirs:
        lines = (d / "recovery-point-offset-checkpoint").read_text().splitlines()
        names = {line.split()[0] + "-" + line.split()[1] for line in lines[2:]}
        assert names == {p.name for p in d.iterdir() if p.is_dir()}
        assert len(names) == 2


def test_a_restart_finds_every_partition_in_whichever_directory_holds_it(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs)
    for i in range(4):
        partition_log = manager.get_or_create_log(TopicPartition("t", i))
        partition_log.append_as_leader(make_batch([f"r{i}".encode()]), 0)
    where = {tp: holder(manager, tp) for tp in manager.logs}
    ids = [d.directory_id for d in manager.log_dirs]
    manager.shutdown()

    # Listed in the other order: every partition is found where it is, ids unchanged.
    again = started(list(reversed(dirs)))
    assert again.had_clean_shutdown
    assert {tp: holder(again, tp) for tp in again.logs} == where
    assert [d.directory_id for d in again.log_dirs] == list(reversed(ids))
    for i in range(4):
        records = read_all(again.logs[TopicPartition("t", i)])
        assert [r.value for r in records] == [f"r{i}".encode()]
    again.shutdown(broker_epoch=42)

    # A directory added to log.dirs: still a clean restart; it takes the next partitions.
    grown = started([*dirs, tmp_path / "c"])
    assert grown.previous_broker_epoch == 42
    assert {tp: holder(grown, tp) for tp in grown.logs} == where
    assert holder(grown, grown.get_or_create_log(TopicPartition("u", 0)).topic_partition) == (
        tmp_path / "c"
    )
    grown.shutdown()


def test_a_partition_in_two_directories_is_refused_naming_both(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs)
    manager.get_or_create_log(TopicPartition("t", 0))
    manager.shutdown()
    shutil.copytree(dirs[0] / "t-0", dirs[1] / "t-0")
    with pytest.raises(KafkaStorageError) as refused:
        started(dirs)
    assert str(dirs[0] / "t-0") in str(refused.value)
    assert str(dirs[1] / "t-0") in str(refused.value)
    # Nothing stays locked: once the copy is gone the broker starts.
    shutil.rmtree(dirs[1] / "t-0")
    started(dirs).shutdown()


def test_bad_directory_lists_are_refused(tmp_path: Path) -> None:
    with pytest.raises(KafkaStorageError, match="listed twice"):
        LogManager([tmp_path / "a", tmp_path / "b", tmp_path / "a"])
    with pytest.raises(ValueError, match="at least one"):
        LogManager([])
    # A copied directory (same directory.id) is refused.
    started([tmp_path / "a"]).shutdown()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    with pytest.raises(KafkaStorageError, match=r"same directory\.id"):
        started([tmp_path / "a", tmp_path / "b"])


def replace_with_file(directory: Path) -> None:
    """The disk under ``directory`` is gone: the path now names a plain file."""
    shutil.rmtree(directory)
    directory.write_text("not a directory")


def test_a_failed_directory_takes_only_its_partitions_offline(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs)
    tps = [TopicPartition("t", i) for i in range(4)]
    for tp in tps:
        manager.get_or_create_log(tp).append_as_leader(make_batch([b"before"]), 0)
    on_a = {tp for tp in tps if holder(manager, tp) == dirs[0]}
    failed: list[LogDirectory] = []
    manager.add_failure_listener(failed.append)
    logs = manager.logs

    replace_with_file(dirs[0])
    assert [d.path for d in manager.probe_dirs()] == [dirs[0]]
    assert [d.path for d in failed] == [dirs[0]]
    assert manager.offline_partitions == on_a
    for tp in tps:
        if tp in on_a:
            with pytest.raises(KafkaStorageError, match="offline"):
                logs[tp].append_as_leader(make_batch([b"after"]), 0)
            with pytest.raises(KafkaStorageError, match="offline"):
                logs[tp].read(0, 1000)
            with pytest.raises(KafkaStorageError, match="offline"):
                manager.get_or_create_log(tp)
        else:
            logs[tp].append_as_leader(make_batch([b"after"]), 0)
            assert [r.value for r in read_all(logs[tp])] == [b"before", b"after"]
    # A partition not found while a directory is offline may be on it: not created.
    with pytest.raises(KafkaStorageError, match="may hold it"):
        manager.get_or_create_log(TopicPartition("new", 0))

    a, b = manager.describe()
    assert a.error is not None and a.total_bytes == -1 and a.replicas == ()
    assert b.error is None and b.total_bytes > 0 and 0 <= b.usable_bytes <= b.total_bytes
    assert {r.topic_partition for r in b.replicas} == set(tps) - on_a
    assert b.size_bytes == sum(logs[tp].size for tp in set(tps) - on_a)
    manager.shutdown()

    # On restart the failed directory is offline from the start; the other one serves.
    again = started(dirs)
    assert [d.online for d in again.log_dirs] == [False, True]
    assert set(again.logs) == set(tps) - on_a
    again.shutdown()
    dirs[0].unlink()
    dirs[0].write_text("")
    dirs[1].rename(tmp_path / "gone")
    (tmp_path / "b").write_text("")
    with pytest.raises(KafkaStorageError, match="no log directory can be used"):
        started(dirs)


def test_an_io_error_in_a_roll_takes_the_directory_offline(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs, default_config=LogConfig.from_properties({"segment.bytes": 300}))
    first = manager.get_or_create_log(TopicPartition("t", 0))  # in a
    second = manager.get_or_create_log(TopicPartition("t", 1))  # in b
    first.append_as_leader(make_batch([b"x" * 150]), 0)
    # The partition's directory vanishes under the open segment: the next roll fails.
    shutil.rmtree(dirs[0] / "t-0")
    with pytest.raises(KafkaStorageError):
        first.append_as_leader(make_batch([b"y" * 150]), 0)
    assert not manager.log_dirs[0].online and manager.log_dirs[1].online
    assert first.offline and not second.offline
    second.append_as_leader(make_batch([b"z" * 150]), 0)
    second.append_as_leader(make_batch([b"z" * 150]), 0)  # rolls in the healthy directory
    assert len(second.segments) == 2
    manager.shutdown()


def test_a_failed_disk_is_told_from_a_full_one_and_from_bad_data() -> None:
    from highwater.storage.log import is_io_failure

    assert not is_io_failure(OSError(28, "No space left on device"))
    assert is_io_failure(OSError(5, "Input/output error"))
    wrapped = KafkaStorageError("write failed")
    wrapped.__cause__ = OSError(30, "Read-only file system")
    assert is_io_failure(wrapped)
    assert not is_io_failure(KafkaStorageError("corrupt"))
