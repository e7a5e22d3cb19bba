"""How the etcd-mode controller turns a change's keys into transactions (pure): partition
states stamped with its epoch, one transaction while it fits etcd's ``--max-txn-ops``,
else the existing partitions' states first in several, and what must go together refused
when it cannot."""

from __future__ import annotations

import json

import pytest
from highwater.controller.etcd_controller import (
    MetadataWriteTooLargeError,
    WritePlan,
    plan_writes,
)
from highwater.etcd_metadata.connection import Delete, Put
from highwater.etcd_metadata.keys import KeyChanges, KeySpace

SPACE = KeySpace("/highwater/test/")
STATE = b'{"isr":[1],"leader":1}'


def states(count: int) -> dict[str, bytes]:
    return {SPACE.partition_state("t", p): STATE for p in range(count)}


def test_a_small_change_is_one_transaction_with_partition_states_stamped() -> None:
    changes = KeyChanges(
        states(2),
        {SPACE.topic("u"): b"{}", SPACE.partition_state("u", 0): STATE},
        frozenset({SPACE.topic("gone")}),
    )
    plan = plan_writes(changes, 7, 128)
    assert plan.chunks == []
    assert [type(op).__name__ for op in plan.final] == ["Put"] * 4 + ["Delete"]
    assert plan.final[-1] == Delete(SPACE.topic("gone"))
    stamped = [op for op in plan.final if isinstance(op, Put) and op.key.endswith("/state")]
    assert [json.loads(op.value)["controller_epoch"] for op in stamped] == [7, 7, 7]
    assert Put(SPACE.topic("u"), b"{}") in plan.final


def test_past_the_limit_existing_states_go_first_in_transactions_that_fit() -> None:
    plan = plan_writes(KeyChanges(states(300), {SPACE.topic("u"): b"{}"}, frozenset()), 1, 128)
    assert [len(chunk) for chunk in plan.chunks] == [126, 126, 48]
    assert plan.final == [Put(SPACE.topic("u"), b"{}")]
    assert sum(len(c) for c in plan.chunks) == 300


def test_what_must_be_written_together_beyond_one_transaction_is_refused() -> None:
    created = {SPACE.partition_state("big", p): STATE for p in range(126)}
    with pytest.raises(MetadataWriteTooLargeError, match="--max-txn-ops"):
        plan_writes(KeyChanges({}, created, frozenset()), 1, 128)
    assert isinstance(
        plan_writes(KeyChanges({}, dict(list(created.items())[:125]), frozenset()), 1, 128),
        WritePlan,
    )
