"""Persistent collections the metadata image is built from: a chunked vector and a bucketed set.

Both are immutable; an update returns a new collection that shares every part it did not
touch (copy-on-write by chunk, or by group of partitions), so an update costs the size of the
change, not of the collection. The image keeps a topic's partitions in a
:class:`PartitionMap` and each broker's entry of a per-broker index in a
:class:`PartitionSet`. The map is generic in what it holds, the set holds
``(topic_id, partition_id)`` pairs (a ``TopicIdPartition`` is one); both sit below the
image (:mod:`highwater.metadata.image`) and know nothing of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Final, TypeVar

PARTITION_CHUNK: Final = 512
"""Entries per chunk of a :class:`PartitionMap`: the unit of copy-on-write."""

SET_SPAN: Final = 512
"""Partitions of one topic per group of a :class:`PartitionSet`: the unit of copy-on-write of
the broker index."""

_V = TypeVar("_V")
_K = TypeVar("_K", bound=tuple[str, int])


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
        # In partition order, one chunk at a time: each touched chunk is copied once, and
        # new partitions append to the last one in order.
        current = -1
        chunk: list[_V] = []
        for partition_id in sorted(changes):
            index = partition_id // PARTITION_CHUNK
            if index != current:
                if current >= 0:
                    chunks[current] = tuple(chunk)
                current = index
                if index < len(chunks):
                    chunk = list(chunks[index])
                else:
                    chunk = []
                    chunks.append(())
            slot = partition_id - index * PARTITION_CHUNK
            if slot < len(chunk):
                chunk[slot] = changes[partition_id]
            else:
                chunk.append(changes[partition_id])
        chunks[current] = tuple(chunk)
        return PartitionMap._of(tuple(chunks), new_size)

    def __repr__(self) -> str:
        return f"PartitionMap({self._size} partitions)"


class PartitionSet(AbstractSet[_K]):
    """An immutable set of partitions ``(topic_id, partition_id)``, grouped by partition range.

    A group holds the members among one topic's partitions ``k * SET_SPAN`` to
    ``(k + 1) * SET_SPAN - 1``, so groups follow the partition order. :meth:`updated`
    copies only the groups it touches plus the group directory (a dict of one entry per
    group, a few thousand for a broker of 600,000 partitions in topics of 1,000): a
    controller that moves a broker's partitions in sorted batches touches the groups of
    the batch, not every group of the broker, as hash buckets would.
    """

    __slots__ = ("_groups", "_size")

    def __init__(self, keys: Iterable[_K] = ()) -> None:
        grouped: dict[tuple[str, int], list[_K]] = {}
        for key in keys:
            group = (key[0], key[1] // SET_SPAN)
            members = grouped.get(group)
            if members is None:
                grouped[group] = [key]
            else:
                members.append(key)
        self._groups: dict[tuple[str, int], frozenset[_K]] = {
            group: frozenset(members) for group, members in grouped.items()
        }
        self._size = sum(len(members) for members in self._groups.values())

    @classmethod
    def of_groups(cls, groups: dict[tuple[str, int], frozenset[_K]]) -> PartitionSet[_K]:
        """A set made of ``groups`` (group -> its non-empty members, all of that group),
        which it takes over: the caller neither keeps nor changes the dict."""
        new: PartitionSet[_K] = cls.__new__(cls)
        new._groups = groups
        new._size = sum(len(members) for members in groups.values())
        return new

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2 or not isinstance(key[1], int):
            return False
        try:
            members = self._groups.get((key[0], key[1] // SET_SPAN))
        except TypeError:  # an unhashable topic
            return False
        return members is not None and key in members

    def __iter__(self) -> Iterator[_K]:
        for members in self._groups.values():
            yield from members

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"PartitionSet({sorted(self)!r})"

    def group(self, topic_id: str, span: int) -> frozenset[_K]:
        """The members among ``topic_id``'s partitions ``span * SET_SPAN`` to
        ``(span + 1) * SET_SPAN - 1`` (the unit :meth:`updated` copies)."""
        return self._groups.get((topic_id, span), _NO_KEYS)

    def updated(self, added: Iterable[_K], removed: Iterable[_K]) -> PartitionSet[_K]:
        """This set with ``added`` and without ``removed``; untouched groups are shared."""
        changes: dict[tuple[str, int], tuple[list[_K], list[_K]]] = {}
        for side, keys in ((0, added), (1, removed)):
            for key in keys:
                group = (key[0], key[1] // SET_SPAN)
                entry = changes.get(group)
                if entry is None:
                    entry = changes[group] = ([], [])
                entry[side].append(key)
        if not changes:
            return self
        groups = dict(self._groups)
        size = self._size
        for group, (adds, removes) in changes.items():
            old = groups.get(group, _NO_KEYS)
            new = old.difference(removes) if removes else old
            if adds:
                new = new.union(adds)
            size += len(new) - len(old)
            if new:
                groups[group] = new
            elif old:
                del groups[group]
        result: PartitionSet[_K] = PartitionSet.__new__(PartitionSet)
        result._groups = groups
        result._size = size
        return result


_NO_KEYS: Final[frozenset[Any]] = frozenset()
EMPTY_PARTITION_SET: Final[PartitionSet[Any]] = PartitionSet()
"""The empty set, shared by every lookup that finds nothing."""
