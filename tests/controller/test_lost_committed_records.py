"""The chaos run that lost 98 acknowledged writes (docs/chaos.md), replayed in one process.

A replica whose log came back from a crash shorter than the high watermark it had
checkpointed has lost committed records. It was the last member of its partition's ISR,
so when it came back the controller elected it, and the followers, which held every
acknowledged record, truncated to its log end by leader epoch (``diverging epoch 0``).
The real storage engine recovers the torn log, the real replication rules decide the
truncation, the real controller decides the election; only the processes and the
network are left out.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller_helpers import NONE, Harness
from highwater.broker.partitions import PartitionManager
from highwater.broker.replication import (
    EpochEndOffset,
    FollowerReplicationState,
    find_diverging_epoch,
)
from highwater.controller_api.messages import BrokerHeartbeatRequest, OfflineReplica
from highwater.metadata import NO_LEADER, PartitionChangeRecord
from highwater.records import SimpleRecord, build_batch
from highwater.storage.log import PartitionLog
from highwater.storage.log_manager import LogManager
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode

SESSION = 9000
TP = TopicPartition("chaos", 0)
COMMITTED = 400  # the high watermark every replica had reached
TORN_AT = 277  # the first batch the crashed replica's log lost


def write_committed(logs: dict[int, PartitionLog], leader: int) -> None:
    """``leader`` writes one record a batch in epoch 0; the others copy each batch; every
    replica's high watermark reaches ``COMMITTED``."""
    for offset in range(COMMITTED):
        data = build_batch([SimpleRecord(value=f"p0-{offset}".encode())])
        logs[leader].append_as_leader(data, leader_epoch=0)
        copy = logs[leader].read(offset, 1 << 20).records
        for broker, log in logs.items():
            if broker != leader:
                log.append_as_follower(copy)
    for log in logs.values():
        log.update_high_watermark(COMMITTED)


def crash_tearing_the_tail(manager: LogManager, log: PartitionLog, at: int) -> None:
    """The broker dies (no clean-shutdown marker) after checkpointing its high watermark,
    with the batch at ``at`` half written: what a disk that filled mid-append left before
    the storage engine cut failed writes back (commit bc5bc31)."""
    manager.checkpoint_all()
    position = next(p for _, p, h in log.iter_batches(at) if h.base_offset == at)
    log.close()
    for directory in manager.log_dirs:
        directory.lock.release()
    with log.segments[-1].log_path.open("r+b") as segment_file:
        segment_file.truncate(position + 20)


def test_a_replica_that_lost_committed_records_is_not_elected_and_no_follower_truncates(
    tmp_path: Path,
) -> None:
    h = Harness()
    brokers = (100, 101, 102)
    h.start_brokers(brokers)
    h.create_topic("chaos", 1, 3, {"min.insync.replicas": "2"})
    managers = {b: LogManager(tmp_path / str(b)) for b in brokers}
    for broker, manager in managers.items():
        manager.startup(node_id=broker)
    logs = {b: managers[b].get_or_create_log(TP) for b in brokers}
    write_committed(logs, leader=h.partition("chaos").leader)

    # The ISR shrinks to broker 100 alone (in the run: as leader it could not read its
    # own torn batch, so its followers fell behind and it shrank them out).
    h.clock.advance(SESSION)
    h.heartbeat(100)
    h.tick()
    assert (h.partition("chaos").isr, h.partition("chaos").leader) == ((100,), 100)
    # Broker 100 stops; the last ISR member moves to the ELR (KIP-966), without a leader.
    h.heartbeat(100, want_shutdown=True)
    assert (h.partition("chaos").isr, h.partition("chaos").leader) == ((), NO_LEADER)
    assert 100 in h.partition("chaos").elr
    for broker in (101, 102):  # the others come back: not in the ISR, not leaders
        assert h.register(broker, incarnation=f"back-{broker}").error == NONE
        h.heartbeat(broker)
    assert h.partition("chaos").leader == NO_LEADER

    # Broker 100 died with its tail torn; recovery cuts its log at the torn batch, below
    # the high watermark it had checkpointed.
    crash_tearing_the_tail(managers[100], logs[100], TORN_AT)
    restarted = LogManager(tmp_path / "100")
    restarted.startup(node_id=100)
    recovered = restarted.get_or_create_log(TP)
    assert recovered.log_end_offset == TORN_AT
    assert recovered.lost_high_watermark == COMMITTED and recovered.missing_committed_records
    # It keeps knowing it through one more crash (the second run of the seed lost writes
    # when a restart rewrote the checkpoint with the shorter log's high watermark).
    restarted.checkpoint_all()
    recovered.close()
    for directory in restarted.log_dirs:
        directory.lock.release()
    restarted = LogManager(tmp_path / "100")
    restarted.startup(node_id=100)
    recovered = restarted.get_or_create_log(TP)
    assert recovered.log_end_offset == TORN_AT and recovered.lost_high_watermark == COMMITTED

    # Had it led epoch 2, the followers (whose last batches are of epoch 0) would have
    # been told that epoch 0 ends at 277, and truncated: the run's "diverging epoch 0".
    recovered.leader_epoch_cache.assign(2, recovered.log_end_offset)
    diverging = find_diverging_epoch(COMMITTED, 0, recovered.latest_epoch_end_offset)
    assert diverging == EpochEndOffset(0, TORN_AT)
    follower = FollowerReplicationState(101, 100, 2, COMMITTED, COMMITTED)
    decision = follower.on_diverging_epoch(diverging, logs[101].latest_epoch_end_offset)
    assert decision.offset == TORN_AT  # 123 committed records gone
    recovered.leader_epoch_cache.truncate_from_end(TORN_AT)

    # Its old session expires; it registers again, and its heartbeat reports the replica
    # that lost committed records.
    h.clock.advance(SESSION)
    for broker in (101, 102):
        h.heartbeat(broker)
    h.tick()
    assert h.register(100, incarnation="after-the-crash").error == NONE
    partitions = PartitionManager(100, restarted)
    partitions.apply_image(h.image)
    reported = partitions.missing_committed_records()
    assert reported == {TP: h.topic_id("chaos")}
    # What it answers unclean recovery (KIP-966's GetReplicaLogInfo): its log as it is.
    info = partitions.replica_log_info(h.topic_id("chaos"), 0)
    assert (info.error, info.last_leader_epoch, info.log_end_offset) == (NONE, 0, TORN_AT)
    missing = partitions.replica_log_info(h.topic_id("chaos"), 1)
    assert missing.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def heartbeat(offline: dict[TopicPartition, str]) -> BrokerHeartbeatRequest:
        return BrokerHeartbeatRequest(
            100,
            h.epochs[100],
            h.image.offset,
            offline_replicas=tuple(OfflineReplica(t, tp.partition) for tp, t in offline.items()),
        )

    # Without the report, the unfencing heartbeat elected broker 100 as the last ISR
    # member (what the run did); now its registration without a clean shutdown took it
    # out of the ELR, so that heartbeat elects nobody either.
    assert 100 not in h.partition("chaos").elr and 100 in h.partition("chaos").last_known_elr
    unreported = h.controller.broker_heartbeat(heartbeat({}), h.clock.now_ms)
    assert not any(
        isinstance(r, PartitionChangeRecord) and r.leader == 100 for r in unreported.records
    )
    # With it, broker 100 is unfenced but passed over: the partition waits without a
    # leader (unclean election is off) and no follower truncates anything.
    response = h.commit(h.controller.broker_heartbeat(heartbeat(reported), h.clock.now_ms))
    assert response.error == NONE and not response.is_fenced
    assert (h.partition("chaos").isr, h.partition("chaos").leader) == ((), NO_LEADER)
    for broker in (101, 102):
        assert logs[broker].log_end_offset == COMMITTED

    # Once the replica has fetched the records again it is whole: nothing to report.
    recovered.append_as_follower(logs[101].read(TORN_AT, 1 << 30).records)
    assert recovered.log_end_offset == COMMITTED
    assert recovered.lost_high_watermark is None and partitions.missing_committed_records() == {}
    restarted.shutdown()
    for broker in (101, 102):
        managers[broker].shutdown()


def test_a_truncated_follower_is_not_taken_for_one_that_lost_records(tmp_path: Path) -> None:
    """A truncation writes the lowered high watermark at once: after a crash the shorter
    log is what the leader asked for, not a loss."""
    manager = LogManager(tmp_path)
    manager.startup(node_id=1)
    log = manager.get_or_create_log(TP)
    write_committed({1: log}, leader=1)
    manager.checkpoint_all()
    assert asyncio.run(manager.truncate_to(TP, 300))
    assert log.high_watermark == 300
    log.close()
    for directory in manager.log_dirs:
        directory.lock.release()
    restarted = LogManager(tmp_path)
    restarted.startup(node_id=1)
    reopened = restarted.get_or_create_log(TP)
    assert reopened.log_end_offset == 300 and reopened.high_watermark == 300
    assert not reopened.missing_committed_records
    restarted.shutdown()
