"""The MigrationStateRecord of the etcd → KRaft migration: replayed into the image (the
copy's offset found from its batch), kept by snapshots, an unknown state refused."""

from __future__ import annotations

import pytest
from highwater.metadata.delta import MetadataDelta, MetadataReplayError
from highwater.metadata.image import MetadataImage, MigrationImage
from highwater.metadata.records import (
    MigrationStateRecord,
    NoOpRecord,
    decode_record,
    encode_record,
)
from highwater.metadata.snapshot import load_snapshot_values, snapshot_values


def replay(image: MetadataImage, records: list, offset: int) -> MetadataImage:  # type: ignore[type-arg]
    delta = MetadataDelta(image)
    for record in records:
        delta.replay(record)
    return delta.apply(offset)


def test_the_copy_batch_marks_where_it_is_and_the_end_keeps_it() -> None:
    assert MetadataImage.empty().migration == MigrationImage(0, 0, -1)
    copied = replay(
        MetadataImage.empty(),
        [NoOpRecord(), MigrationStateRecord(MigrationStateRecord.MIGRATING, 41)],
        7,
    )
    assert copied.migration == MigrationImage(MigrationStateRecord.MIGRATING, 41, 7)
    later = replay(copied, [NoOpRecord()], 9)
    assert later.migration == copied.migration
    ended = replay(later, [MigrationStateRecord(MigrationStateRecord.ENDED, 41, 7)], 12)
    assert ended.migration == MigrationImage(MigrationStateRecord.ENDED, 41, 7)


def test_a_snapshot_keeps_the_migration_state() -> None:
    copied = replay(
        MetadataImage.empty(), [MigrationStateRecord(MigrationStateRecord.MIGRATING, 41)], 7
    )
    reloaded = load_snapshot_values(snapshot_values(copied), 30, 2)
    assert reloaded.migration == MigrationImage(MigrationStateRecord.MIGRATING, 41, 7)
    assert snapshot_values(MetadataImage.empty()) == []


def test_the_record_round_trips_and_an_unknown_state_is_refused() -> None:
    record = MigrationStateRecord(MigrationStateRecord.ENDED, 41, 7)
    assert decode_record(encode_record(record)) == record
    with pytest.raises(MetadataReplayError, match="unknown state 9"):
        replay(MetadataImage.empty(), [MigrationStateRecord(9)], 1)
