"""ACLs in the metadata: records replayed into the image, its authorizer, snapshots."""

from __future__ import annotations

import pytest
from highwater.metadata.delta import MetadataReplayError, replay
from highwater.metadata.records import (
    AccessControlEntryRecord,
    NoOpRecord,
    RemoveAccessControlEntryRecord,
    decode_record,
    encode_record,
)
from highwater.metadata.snapshot import load_snapshot, snapshot_records
from highwater.security import AclOperation, Decision, ResourceType

ALLOW, DENY = 3, 2
TOPIC, LITERAL, PREFIXED = 2, 3, 4
READ, WRITE = 3, 4


def entry(acl_id: str, name: str, operation: int = READ, **kw: object) -> AccessControlEntryRecord:
    fields = {
        "resource_type": TOPIC,
        "resource_name": name,
        "pattern_type": LITERAL,
        "principal": "User:alice",
        "host": "*",
        "operation": operation,
        "permission_type": ALLOW,
        **kw,
    }
    return AccessControlEntryRecord(acl_id, **fields)  # type: ignore[arg-type]


def test_acls_replay_into_the_image_and_its_authorizer() -> None:
    image = replay([entry("a1", "orders"), entry("a2", "logs-", WRITE, pattern_type=PREFIXED)], 1)
    assert len(image.acls) == 2
    authorizer = image.acls.authorizer()
    decide = authorizer.authorize
    assert decide("User:alice", "h", AclOperation.READ, ResourceType.TOPIC, "orders") is (
        Decision.ALLOWED
    )
    assert decide("User:alice", "h", AclOperation.WRITE, ResourceType.TOPIC, "logs-a") is (
        Decision.ALLOWED
    )
    assert decide("User:bob", "h", AclOperation.READ, ResourceType.TOPIC, "orders") is (
        Decision.DENIED
    )
    # Records that leave the ACLs alone keep the image's ACLs, and its built authorizer.
    later = replay([NoOpRecord()], 2, image=image)
    assert later.acls is image.acls
    assert later.acls.authorizer() is authorizer
    # Removing one changes the decision.
    removed = replay([RemoveAccessControlEntryRecord("a1")], 3, image=later)
    assert (
        removed.acls.authorizer().authorize(
            "User:alice", "h", AclOperation.READ, ResourceType.TOPIC, "orders"
        )
        is Decision.DENIED
    )
    assert image.acls.authorizer() is authorizer  # the older image is unchanged


def test_duplicate_unknown_and_invalid_entries_do_not_replay() -> None:
    image = replay([entry("a1", "orders")], 1)
    with pytest.raises(MetadataReplayError, match="exists"):
        replay([entry("a1", "other")], 2, image=image)
    with pytest.raises(MetadataReplayError, match="does not exist"):
        replay([RemoveAccessControlEntryRecord("nope")], 2, image=image)
    with pytest.raises(MetadataReplayError, match="not valid"):
        replay([entry("a2", "orders", operation=99)], 2, image=image)
    with pytest.raises(MetadataReplayError, match="not valid"):
        replay([entry("a3", "orders", principal="alice")], 2, image=image)


def test_acls_survive_a_snapshot_and_the_wire() -> None:
    record = entry("a2", "payments", WRITE, permission_type=DENY, host="10.0.0.1")
    assert decode_record(encode_record(record)) == record
    image = replay([entry("a1", "orders"), record], 7)
    loaded = load_snapshot(list(snapshot_records(image)), 7, image.epoch)
    assert dict(loaded.acls.by_id) == dict(image.acls.by_id)
