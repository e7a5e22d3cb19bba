"""The image's persistent collections against plain models: a list for ``PartitionMap``, a set
for ``PartitionSet``.

Hypothesis state machines update random versions (not only the newest) and check that each
update equals its model and shared every chunk or bucket it did not touch, that the version
it started from did not change, and at the end that every version made still equals its
model.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from highwater.metadata.persistent import (
    EMPTY_PARTITION_SET,
    PARTITION_CHUNK,
    SET_SPAN,
    PartitionMap,
    PartitionSet,
)
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

KEYS = st.integers(0, 3 * 3 * SET_SPAN - 1).map(
    lambda n: (("orders", "payments", "audit")[n % 3], n // 3)
)
"""Partition-like keys: (topic, partition), the partitions spanning three groups of a topic."""
PICK = st.integers(0, 1_000)
"""Which of the versions made so far a rule starts from (modulo their number)."""


class PartitionMapMachine(RuleBasedStateMachine):
    """``PartitionMap`` versions beside the lists they should equal."""

    def __init__(self) -> None:
        super().__init__()
        self.versions: list[tuple[PartitionMap[str], list[str]]] = []

    @initialize(size=st.integers(0, 3 * PARTITION_CHUNK + 5))
    def build(self, size: int) -> None:
        model = [f"v0-{i}" for i in range(size)]
        self.versions.append((PartitionMap(model), model))

    @rule(
        pick=PICK,
        changed=st.lists(st.integers(0, 4 * PARTITION_CHUNK), max_size=12),
        grown=st.integers(0, PARTITION_CHUNK + 3),
    )
    def update(self, pick: int, changed: list[int], grown: int) -> None:
        base, model = self.versions[pick % len(self.versions)]
        stamp = f"v{len(self.versions)}"
        changes = {p % len(model): f"{stamp}-{p % len(model)}" for p in changed if model}
        changes.update({p: f"{stamp}-{p}" for p in range(len(model), len(model) + grown)})
        updated = base.updated(changes)
        new_model = list(model)
        for p in sorted(changes):
            if p < len(new_model):
                new_model[p] = changes[p]
            else:
                new_model.append(changes[p])
        if not changes:
            assert updated is base
        touched = {p // PARTITION_CHUNK for p in changes}
        for index, chunk in enumerate(base._chunks):
            assert (updated._chunks[index] is chunk) == (index not in touched)
        check_map(updated, new_model)
        check_map(base, model)
        self.versions.append((updated, new_model))

    @rule(pick=PICK, gap=st.integers(1, PARTITION_CHUNK), also_existing=st.booleans())
    def update_leaving_a_hole(self, pick: int, gap: int, also_existing: bool) -> None:
        base, model = self.versions[pick % len(self.versions)]
        changes = {len(model) + gap: "hole"}
        if also_existing and model:
            changes[0] = "first"
        with pytest.raises(ValueError, match="densely"):
            base.updated(changes)

    @rule(pick=PICK, negative=st.integers(-PARTITION_CHUNK, -1))
    def update_below_zero(self, pick: int, negative: int) -> None:
        base, model = self.versions[pick % len(self.versions)]
        with pytest.raises(ValueError, match="densely"):
            base.updated({negative: "negative", len(model): "next"})

    def teardown(self) -> None:
        for partitions, model in self.versions:
            check_map(partitions, model)


def check_map(partitions: PartitionMap[str], model: list[str]) -> None:
    assert len(partitions) == len(model)
    assert list(partitions) == list(range(len(model)))
    assert list(partitions.registrations()) == model
    assert dict(partitions.items()) == dict(enumerate(model))
    for probe in (-1, len(model), len(model) + PARTITION_CHUNK):
        assert probe not in partitions
        assert partitions.get(probe) is None
        assert partitions.get(probe, "absent") == "absent"
        with pytest.raises(KeyError):
            partitions[probe]
    if model:
        last = len(model) - 1
        assert last in partitions and partitions[last] == partitions.get(last) == model[-1]
    assert "0" not in partitions


class PartitionSetMachine(RuleBasedStateMachine):
    """``PartitionSet`` versions beside the sets they should equal."""

    def __init__(self) -> None:
        super().__init__()
        self.versions: list[tuple[PartitionSet[tuple[str, int]], frozenset[tuple[str, int]]]] = []

    @initialize(keys=st.lists(KEYS, max_size=100))
    def build(self, keys: list[tuple[str, int]]) -> None:
        self.versions.append((PartitionSet(keys), frozenset(keys)))

    @rule(pick=PICK, added=st.lists(KEYS, max_size=25), removed=st.lists(KEYS, max_size=25))
    def update(
        self, pick: int, added: list[tuple[str, int]], removed: list[tuple[str, int]]
    ) -> None:
        base, model = self.versions[pick % len(self.versions)]
        updated = base.updated(added, removed)
        if not added and not removed:
            assert updated is base
        touched = {(topic, partition // SET_SPAN) for topic, partition in (*added, *removed)}
        for topic in ("orders", "payments", "audit"):
            for span in range(3):
                if (topic, span) not in touched:
                    assert updated.group(topic, span) is base.group(topic, span)
        # A key both added and removed ends up in the set: additions win.
        new_model = (model - frozenset(removed)) | frozenset(added)
        check_set(updated, new_model)
        check_set(base, model)
        self.versions.append((updated, new_model))

    def teardown(self) -> None:
        for keys, model in self.versions:
            check_set(keys, model)


def check_set(keys: PartitionSet[tuple[str, int]], model: frozenset[tuple[str, int]]) -> None:
    assert len(keys) == len(model)
    assert set(keys) == model
    assert keys == model  # the Set ABC's equality, against a frozenset
    for key in list(model)[:20]:
        assert key in keys
    assert ("orders", 3 * SET_SPAN) not in keys
    assert ["unhashable"] not in keys


TestPartitionMap = PartitionMapMachine.TestCase
TestPartitionMap.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)
TestPartitionSet = PartitionSetMachine.TestCase
TestPartitionSet.settings = settings(max_examples=60, stateful_step_count=15, deadline=None)


def test_the_empty_set_is_shared_and_updates_into_a_new_one() -> None:
    assert len(EMPTY_PARTITION_SET) == 0 and not EMPTY_PARTITION_SET
    grown = EMPTY_PARTITION_SET.updated([("orders", 1)], [])
    assert set(grown) == {("orders", 1)} and len(EMPTY_PARTITION_SET) == 0
    assert grown.updated([], [("orders", 1)]) == EMPTY_PARTITION_SET
