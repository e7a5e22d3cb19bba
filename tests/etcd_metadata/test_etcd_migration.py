"""The etcd → KRaft migration driver: waiting for brokers, the claim before the copy, the copy
as one batch keeping the cluster id and the partitions' epochs, dual write fenced by the
claimed epoch, and the end once the last broker moved (all pure)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from highwater.etcd_metadata.keys import KeySpace, image_keys, partition_state_value
from highwater.etcd_metadata.migration import (
    ClaimEtcdController,
    EtcdSnapshot,
    MigrationDriver,
    MigrationError,
    MigrationState,
    ProposeMigrationBatch,
    ProposeMigrationEnd,
    PushImage,
    WriteEtcdState,
)
from highwater.metadata.image import MetadataImage, MigrationImage
from highwater.metadata.records import (
    BrokerEndpoint,
    MetadataRecord,
    MigrationStateRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from highwater.metadata.snapshot import load_snapshot

SPACE = KeySpace("/highwater/prod/")
TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


def etcd_records() -> list[MetadataRecord]:
    return [
        *(
            RegisterBrokerRecord(b, f"inc-{b}", b, (BrokerEndpoint("PLAINTEXT", "h", 9090 + b),))
            for b in (1, 2, 3)
        ),
        TopicRecord("orders", TOPIC_ID),
        PartitionRecord(TOPIC_ID, 0, (1, 2, 3), (1, 2, 3), 1, 6, 9),
        PartitionRecord(TOPIC_ID, 1, (2, 3, 1), (2, 3), 2, 3, 4),
    ]


def etcd_keys(epoch: int = 4, live: tuple[int, ...] = (1, 2, 3)) -> dict[str, bytes]:
    keys = image_keys(load_snapshot(etcd_records(), 30, 0), SPACE)
    keys = {
        k: partition_state_value(v, epoch) if k.endswith("/state") else v for k, v in keys.items()
    }
    keys[SPACE.cluster_id] = b"etcd-cluster-7"
    keys[SPACE.controller_epoch] = str(epoch).encode()
    keys[SPACE.metadata_offset] = b"41"
    for broker in live:
        keys[SPACE.broker_id(broker)] = b'{"listeners": []}'
    return keys


def snapshot(epoch: int = 4, live: tuple[int, ...] = (1, 2, 3)) -> EtcdSnapshot:
    return EtcdSnapshot(etcd_keys(epoch, live), revision=100)


def leader_driver() -> MigrationDriver:
    driver = MigrationDriver(SPACE)
    assert driver.leadership_changed(True) == []
    assert driver.state is MigrationState.WAITING_FOR_BROKERS
    return driver


def migrated() -> tuple[MigrationDriver, MetadataImage]:
    """A driver in dual write, with the image its committed batch made."""
    driver = leader_driver()
    assert driver.etcd_read(snapshot()) == [ClaimEtcdController(expected=4, epoch=5)]
    (batch,) = driver.claim_result(True, snapshot(epoch=5))
    assert isinstance(batch, ProposeMigrationBatch)
    image = load_snapshot(batch.records, 0, 1)
    effects = driver.batch_committed(image)
    assert [type(e) for e in effects] == [PushImage]
    return driver, image


def test_nothing_happens_until_this_controller_leads() -> None:
    driver = MigrationDriver(SPACE)
    assert driver.etcd_read(snapshot()) == []
    assert driver.state is MigrationState.WAITING_FOR_LEADER


def test_the_claim_waits_for_every_registered_broker_to_be_alive() -> None:
    driver = leader_driver()
    assert driver.etcd_read(snapshot(live=(1, 3))) == []
    assert driver.state is MigrationState.WAITING_FOR_BROKERS
    assert driver.etcd_read(snapshot()) == [ClaimEtcdController(expected=4, epoch=5)]
    assert driver.state is MigrationState.CLAIMING


def test_a_store_without_a_cluster_id_is_refused() -> None:
    keys = etcd_keys()
    del keys[SPACE.cluster_id]
    with pytest.raises(MigrationError, match="cluster_id"):
        leader_driver().etcd_read(EtcdSnapshot(keys, 1))


def test_a_lost_claim_is_retried_above_the_newer_epoch() -> None:
    driver = leader_driver()
    driver.etcd_read(snapshot())
    # An etcd-mode candidate won an election in between (epoch 5): claim 6.
    assert driver.claim_result(False, snapshot(epoch=5)) == [
        ClaimEtcdController(expected=5, epoch=6)
    ]


def test_the_copy_is_one_batch_keeping_the_cluster_id_and_the_partition_epochs() -> None:
    driver = leader_driver()
    driver.etcd_read(snapshot())
    (batch,) = driver.claim_result(True, snapshot(epoch=5))
    assert isinstance(batch, ProposeMigrationBatch)
    assert batch.cluster_id == "etcd-cluster-7"
    assert driver.controller_epoch == 5
    partitions = [r for r in batch.records if isinstance(r, PartitionRecord)]
    assert [(p.leader, p.leader_epoch, p.isr, p.partition_epoch) for p in partitions] == [
        (1, 6, (1, 2, 3), 9),
        (2, 3, (2, 3), 4),
    ]
    # The batch ends with the record that says it is the copy, and of which etcd offset.
    assert batch.records[-1] == MigrationStateRecord(MigrationStateRecord.MIGRATING, 41)
    image = load_snapshot(batch.records, 12, 1)
    assert sorted(image.brokers) == [1, 2, 3]
    assert image.migration == MigrationImage(MigrationStateRecord.MIGRATING, 41, 12)
    assert MigrationDriver.end_record(image) == MigrationStateRecord(
        MigrationStateRecord.ENDED, 41, 12
    )


def test_a_broken_key_stops_the_copy_naming_it() -> None:
    keys = etcd_keys(epoch=5)
    keys[SPACE.partition_state("orders", 1)] = b'{"leader": 1, "isr": [2, 3]}'
    driver = leader_driver()
    driver.etcd_read(snapshot())
    with pytest.raises(MigrationError, match="partitions/1/state"):
        driver.claim_result(True, EtcdSnapshot(keys, 2))


def test_dual_write_mirrors_a_leader_change_to_etcd_fenced_by_the_claimed_epoch() -> None:
    driver, image = migrated()
    # Nothing changed since the copy: nothing to write.
    assert [type(e) for e in driver.image_committed(image)] == [PushImage]
    changed = load_snapshot(
        [
            *etcd_records()[:5],
            PartitionRecord(TOPIC_ID, 1, (2, 3, 1), (3,), 3, 4, 5),
        ],
        40,
        1,
    )
    write, push = driver.image_committed(changed)
    assert isinstance(write, WriteEtcdState) and isinstance(push, PushImage)
    assert write.controller_epoch == 5 and write.deletes == frozenset()
    assert list(write.puts) == [SPACE.partition_state("orders", 1)]
    state = json.loads(write.puts[SPACE.partition_state("orders", 1)])
    assert (state["leader"], state["leader_epoch"], state["isr"]) == (3, 4, [3])
    assert push.brokers == frozenset({1, 2, 3}) and push.controller_epoch == 5


def test_brokers_move_one_at_a_time_and_the_last_one_ends_the_migration() -> None:
    driver, image = migrated()
    assert driver.broker_registered(2) == []
    (push,) = driver.image_committed(image)
    assert isinstance(push, PushImage) and push.brokers == frozenset({1, 3})
    assert driver.broker_registered(1) == []
    assert driver.broker_registered(3) == [ProposeMigrationEnd()]
    assert driver.state is MigrationState.ENDING
    assert driver.end_committed() == []
    assert not driver.writes_etcd
    # After the end etcd is never written again, whatever changes.
    changed = dataclasses.replace(image, offset=image.offset + 1)
    assert driver.image_committed(changed) == []


def test_a_new_leader_after_the_copy_claims_again_but_does_not_copy_twice() -> None:
    driver = MigrationDriver(SPACE)
    driver.log_replayed(migrated=True, ended=False)
    driver.leadership_changed(True)
    assert driver.etcd_read(snapshot(epoch=5)) == [ClaimEtcdController(expected=5, epoch=6)]
    assert driver.claim_result(True, snapshot(epoch=6)) == []
    assert driver.state is MigrationState.DUAL_WRITE
    # It writes only what differs from etcd (not every key: etcd's --max-txn-ops).
    changed = load_snapshot(
        [*etcd_records()[:5], PartitionRecord(TOPIC_ID, 1, (2, 3, 1), (3,), 3, 4, 5)], 40, 1
    )
    write, _ = driver.image_committed(changed)
    assert isinstance(write, WriteEtcdState) and write.controller_epoch == 6
    assert list(write.puts) == [SPACE.partition_state("orders", 1)] and not write.deletes


def test_losing_leadership_stops_dual_write() -> None:
    driver, image = migrated()
    driver.leadership_changed(False)
    assert driver.state is MigrationState.WAITING_FOR_LEADER
    assert driver.image_committed(image) == []


def test_an_ended_migration_stays_ended_on_a_new_leader() -> None:
    driver = MigrationDriver(SPACE)
    driver.log_replayed(migrated=True, ended=True)
    assert driver.leadership_changed(True) == []
    assert driver.etcd_read(snapshot()) == []
    assert driver.state is MigrationState.ENDED


def test_brokers_that_moved_during_the_copy_end_the_migration_once_it_commits() -> None:
    driver = leader_driver()
    driver.etcd_read(snapshot())
    (batch,) = driver.claim_result(True, snapshot(epoch=5))
    assert isinstance(batch, ProposeMigrationBatch)
    for broker in (1, 2, 3):
        assert driver.broker_registered(broker) == []
    effects = driver.batch_committed(load_snapshot(batch.records, 0, 1))
    assert effects == [ProposeMigrationEnd()]


def test_after_a_broker_moved_a_claim_lost_or_fenced_is_made_again_without_waiting_for_it() -> None:
    """A moved broker's ``brokers/ids`` key is gone for good (it runs with
    ``--controllers``) while its registration stays in etcd (dual write): claiming again,
    after a lost claim, a fenced write or a new active controller, must not wait for it."""
    driver, _ = migrated()
    assert driver.broker_registered(2) == []
    driver.leadership_changed(False)  # what EtcdMigration's step back does
    driver.log_replayed(migrated=True, ended=False)
    driver.leadership_changed(True)
    assert driver.etcd_read(snapshot(epoch=6, live=(1, 3))) == [
        ClaimEtcdController(expected=6, epoch=7)
    ]
    # A new active controller, knowing nothing of the moves but what the log says.
    fresh = MigrationDriver(SPACE)
    fresh.log_replayed(migrated=True, ended=False)
    fresh.leadership_changed(True)
    assert fresh.etcd_read(snapshot(epoch=6, live=(1, 3))) == [
        ClaimEtcdController(expected=6, epoch=7)
    ]
