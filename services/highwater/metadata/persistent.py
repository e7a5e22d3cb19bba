"""Persistent collections the metadata image is built from: a chunked vector and a bucketed set.

Both are immutable; an update returns a new collection that shares every part it did not
touch (copy-on-write by chunk, or by hash bucket), so an update costs the size of the
change, not of the collection. The image keeps a topic's partitions in a
:class:`PartitionMap` and each broker's entry of a per-broker index in a
:class:`PartitionSet`. The collections are generic in what they hold, so they sit below
the image (:mod:`highwater.metadata.image`) and know nothing of it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Final, TypeVar

PARTITION_CHUNK: Final = 512
"""Entries per chunk of a :class:`PartitionMap`: the unit of copy-on-write."""

SET_BUCKETS: Final = 64
"""Hash buckets of a :class:`PartitionSet`: the unit of copy-on-write of the broker index."""

_V = TypeVar("_V")
_K = TypeVar("_K", bound=Hashable)


class PartitionMap(Mapping[int, _V]):
    """A topic's partitions ``0..n-1`` as an immutable, chunked vector.

    :meth:`updated` returns a new map that shares every chunk it did not touch, so a
    change costs a chunk copy plus the chunk directory, whatever the topic's size.
    """

    __slots__ = ("_chunks", "_size")

    def __init__(self, partitions: Iterable[_V] = ()) -> None:
        flat = tuple(partitions)
        self._size = len(flat)
        self._chunks: tuple[tuple[_V, ...], ...] = tuple(
            flat[i : i + PARTITION_CHUNK] for i in range(0, len(flat), PARTITION_CHUNK)
        )

    @classmethod
    def _of(cls, chunks: tuple[tuple[_V, ...], ...], size: int) -> PartitionMap[_V]:
        new = cls.__new__(cls)
        new._chunks = chunks
        new._size = size
        return new

    def __getitem__(self, partition_id: int) -> _V:
        if not isinstance(partition_id, int) or not 0 <= partition_id < self._size:
            raise KeyError(partition_id)
        return self._chunks[partition_id // PARTITION_CHUNK][partition_id % PARTITION_CHUNK]

    def get(self, partition_id: int, default: object = None) -> _V | None:  # type: ignore[override]
        if 0 <= partition_id < self._size:
            return self._chunks[partition_id // PARTITION_CHUNK][partition_id % PARTITION_CHUNK]
        return default  # type: ignore[return-value]

    def __contains__(self, partition_id: object) -> bool:
        return isinstance(partition_id, int) and 0 <= partition_id < self._size

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._size))

    def registrations(self) -> Iterator[_V]:
        """Every partition's registration, in partition order."""
        for chunk in self._chunks:
            yield from chunk

    def updated(self, changes: Mapping[int, _V]) -> PartitionMap[_V]:
        """This map with ``changes`` applied; new partitions must extend ``0..n-1`` densely
        (:class:`ValueError` otherwise: the vector has no holes)."""
        if not changes:
            return self
        size = self._size
        new_size = max(size, max(changes) + 1)
        if len([p for p in changes if p >= size]) != new_size - size or min(changes) < 0:
            raise ValueError(
                f"partitions {sorted(changes)} do not extend partitions 0..{size - 1} densely"
            )
        chunks = list(self._chunks)
        by_chunk: dict[int, list[tuple[int, _V]]] = {}
        for partition_id, registration in changes.items():
            by_chunk.setdefault(partition_id // PARTITION_CHUNK, []).append(
                (partition_id % PARTITION_CHUNK, registration)
            )
        for index in sorted(by_chunk):
            if index < len(chunks):
                chunk = list(chunks[index])
            else:
                chunk = []
                chunks.append(())
            for slot, registration in sorted(by_chunk[index], key=lambda item: item[0]):
                if slot < len(chunk):
                    chunk[slot] = registration
                else:
                    chunk.append(registration)
            chunks[index] = tuple(chunk)
        return PartitionMap._of(tuple(chunks), new_size)

    def __repr__(self) -> str:
        return f"PartitionMap({self._size} partitions)"


class PartitionSet(AbstractSet[_K]):
    """An immutable set of partitions kept in hash buckets.

    :meth:`updated` copies only the buckets it touches, so adding or removing a few
    partitions of a broker that hosts 30,000 costs a few hundred entries, not 30,000.
    """

    __slots__ = ("_buckets", "_size")

    def __init__(self, keys: Iterable[_K] = ()) -> None:
        grouped: list[list[_K]] = [[] for _ in range(SET_BUCKETS)]
        for key in keys:
            grouped[hash(key) % SET_BUCKETS].append(key)
        self._buckets: tuple[frozenset[_K], ...] = tuple(
            frozenset(bucket) if bucket else _NO_KEYS for bucket in grouped
        )
        self._size = sum(len(bucket) for bucket in self._buckets)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._buckets[hash(key) % SET_BUCKETS]
        except TypeError:
            return False

    def __iter__(self) -> Iterator[_K]:
        for bucket in self._buckets:
            yield from bucket

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"PartitionSet({sorted(self)!r})"  # type: ignore[type-var]

    def updated(self, added: Iterable[_K], removed: Iterable[_K]) -> PartitionSet[_K]:
        """This set with ``added`` and without ``removed``; untouched buckets are shared."""
        changes: dict[int, tuple[set[_K], set[_K]]] = {}
        for key in added:
            changes.setdefault(hash(key) % SET_BUCKETS, (set(), set()))[0].add(key)
        for key in removed:
            changes.setdefault(hash(key) % SET_BUCKETS, (set(), set()))[1].add(key)
        if not changes:
            return self
        buckets = list(self._buckets)
        size = self._size
        for index, (adds, removes) in changes.items():
            old = buckets[index]
            new = (old - removes) | adds
            size += len(new) - len(old)
            buckets[index] = frozenset(new) if new else _NO_KEYS
        result: PartitionSet[_K] = PartitionSet.__new__(PartitionSet)
        result._buckets = tuple(buckets)
        result._size = size
        return result


_NO_KEYS: Final[frozenset[Any]] = frozenset()
EMPTY_PARTITION_SET: Final[PartitionSet[Any]] = PartitionSet()
"""The empty set, shared by every lookup that finds nothing."""
