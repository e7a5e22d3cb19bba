"""Kafka's default partitioner: the murmur2 key hash and the uniform sticky partitioner.

Shared by the client's producer and the broker, which places the plain records of a
produce to partition -1 by the same rules (so Java, librdkafka, our client and a thin
client's broker-placed records agree on where a key lands).

A record goes to, in this order (Kafka's ``KafkaProducer.partition`` and ``RecordAccumulator``):

1. the partition the record names, which must exist;
2. for a record with a key, ``to_positive(murmur2(key)) % num_partitions``, over *all*
   partitions whether or not they have a leader, so that a key lands on the partition a Java
   producer would put it on;
3. otherwise the topic's sticky partition (KIP-794, Kafka 3.3+). The producer sticks to one
   partition until about ``batch.size`` bytes went to it, then picks the next one at random,
   weighted towards partitions with fewer batches queued when the producer reports queue
   sizes (adaptive partitioning), uniformly among the partitions that have a leader otherwise.

The sticky partitioner is plain bookkeeping: the caller reports what it appended
(:meth:`StickyPartitioner.on_produced`) and, optionally, its queue sizes
(:meth:`StickyPartitioner.update_queue_sizes`); randomness comes from an injected
:class:`random.Random`, so a seeded partitioner replays the same choices. It is not thread-safe:
a producer drives it from one thread or one event loop.
"""

from __future__ import annotations

import bisect
import itertools
import random
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from highwater.errors import UnknownPartitionError
from highwater.records.implementation import codec

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "PartitionLoadStats",
    "StickyPartitioner",
    "UnknownPartitionError",
    "choose_partition",
    "murmur2",
    "partition_for_key",
    "partition_load_stats",
    "to_positive",
]

#: Kafka's default ``batch.size``: the bytes produced to a sticky partition before switching.
DEFAULT_BATCH_SIZE = 16384

_MASK32 = 0xFFFFFFFF
_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_BLOCKS = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` of ``data``: MurmurHash2, seed 0x9747b28c, as a signed int32.

    The 4-byte blocks are read little-endian; the 1 to 3 trailing bytes are folded in the way
    Java's fall-through ``switch`` does. All arithmetic wraps at 32 bits like Java's ``int``.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    body = length & ~3
    for (k,) in _BLOCKS.iter_unpack(data[:body]):
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[body + 2] << 16
    if tail >= 2:
        h ^= data[body + 1] << 8
    if tail >= 1:
        h ^= data[body]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


pure_murmur2 = murmur2
"""The pure-Python :func:`murmur2`, the reference of the compiled one."""

if codec is not None:  # the compiled twin (highwater.records._codec), same results
    murmur2 = codec.murmur2


def to_positive(n: int) -> int:
    """Kafka's ``Utils.toPositive``: ``n`` with the sign bit cleared (``n & 0x7fffffff``).

    Unlike ``abs`` it maps every int32 to [0, 2**31 - 1], ``Integer.MIN_VALUE`` included.
    """
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition of a keyed record: Kafka's ``BuiltInPartitioner.partitionForKey``.

    ``to_positive(murmur2(key)) % num_partitions``, where ``key`` is the serialized key (an empty
    key is a key, and hashes like any other) and ``num_partitions`` counts every partition of
    the topic, available or not.
    """
    _check_partition_count(num_partitions)
    return to_positive(murmur2(key)) % num_partitions


@dataclass(frozen=True, slots=True)
class PartitionLoadStats:
    """The weights adaptive partitioning draws the next sticky partition with.

    ``weights[i]`` belongs to ``partition_ids[i]``: the largest queue size plus one, minus that
    partition's queue size, so the partition with the longest queue weighs 1 and an idle one
    the most. Kafka keeps the running sum of these (its cumulative frequency table).
    """

    partition_ids: tuple[int, ...]
    weights: tuple[int, ...]


def partition_load_stats(
    queue_sizes: Mapping[int, int] | None, num_partitions: int
) -> PartitionLoadStats | None:
    """Load stats from the number of batches queued per partition, as Kafka builds them.

    ``queue_sizes`` maps each partition that may be chosen (it has a leader and is not excluded
    for latency) to how many batches wait in its queue; ``num_partitions`` is the topic's
    partition count. Returns None, meaning "choose uniformly", when there are no queue sizes,
    when the topic has fewer than two partitions, or when every partition is listed and all
    queues are equally long (Kafka's ``BuiltInPartitioner.updatePartitionLoadStats``).
    """
    _check_partition_count(num_partitions)
    if queue_sizes is None:
        return None
    for partition, size in queue_sizes.items():
        _check_partition(partition, num_partitions)
        if size < 0:
            raise ValueError(f"queue size of partition {partition} is negative: {size}")
    if len(queue_sizes) < 1 or num_partitions < 2:
        return None
    ids = tuple(sorted(queue_sizes))
    sizes = [queue_sizes[p] for p in ids]
    if len(ids) == num_partitions and len(set(sizes)) == 1:
        return None
    max_plus_one = max(sizes) + 1
    return PartitionLoadStats(ids, tuple(max_plus_one - size for size in sizes))


@dataclass(slots=True)
class _TopicState:
    """One topic's sticky partition, the bytes produced to it and the last load stats."""

    current: int | None = None
    previous: int | None = None
    produced_bytes: int = 0
    load_stats: PartitionLoadStats | None = None


class StickyPartitioner:
    """Kafka's built-in uniform sticky partitioner (KIP-794) for records with no key.

    For each topic it keeps one sticky partition. :meth:`partition` returns it, picking one
    first if there is none; :meth:`on_produced` counts the bytes appended to it and drops it
    once ``batch_size`` bytes went to it (or ``2 * batch_size`` when switching was held back),
    so the next :meth:`partition` picks a new one:

    - with load stats (:meth:`update_queue_sizes`, and ``adaptive`` on), at random weighted by
      :class:`PartitionLoadStats`, which favours partitions with shorter queues;
    - otherwise uniformly at random among the available partitions (those with a leader), or
      among all partitions when none is available.

    With ``avoid_repeats`` (the default) the partition just left is not picked again when
    another candidate exists; Kafka 3.3+ may re-pick it, so ``avoid_repeats=False`` is the
    exact Kafka behaviour. A sticky partition that is no longer available is also left at once.
    """

    def __init__(
        self,
        batch_size: int = DEFAULT_BATCH_SIZE,
        *,
        rng: random.Random | None = None,
        adaptive: bool = True,
        avoid_repeats: bool = True,
    ) -> None:
        """Set up the partitioner; ``batch_size`` is Kafka's ``batch.size``.

        ``adaptive`` is ``partitioner.adaptive.partitioning.enable``; ``rng`` is the source of
        every random choice (a fresh unseeded one when None).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.adaptive = adaptive
        self.avoid_repeats = avoid_repeats
        self._rng = rng if rng is not None else random.Random()
        self._topics: dict[str, _TopicState] = {}

    def partition(
        self, topic: str, num_partitions: int, available_partitions: Iterable[int]
    ) -> int:
        """The partition for the next record of ``topic`` that has no key and no partition.

        ``available_partitions`` are the partitions that currently have a leader.
        """
        _check_partition_count(num_partitions)
        available = _normalise(available_partitions, num_partitions)
        state = self._topics.setdefault(topic, _TopicState())
        current = state.current
        if (
            current is not None
            and current < num_partitions
            and (not available or current in available)
        ):
            return current
        if current is not None:
            state.previous = current
        chosen = self._next_partition(state, num_partitions, available)
        state.current = chosen
        state.produced_bytes = 0
        return chosen

    def on_produced(
        self, topic: str, partition: int, size_bytes: int, *, enable_switch: bool = True
    ) -> None:
        """Count ``size_bytes`` appended to ``partition`` of ``topic`` by the sticky partitioner.

        Call it only for records :meth:`partition` placed (keyed records and records with an
        explicit partition do not count, as in Kafka); bytes for any partition other than the
        current sticky one are ignored. Pass ``enable_switch=False`` while the partition's
        queue still holds a batch that is not full: the switch then waits until ``2 *
        batch_size`` bytes, to line partition switches up with batch boundaries.
        """
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
        state = self._topics.get(topic)
        if state is None or state.current is None or state.current != partition:
            return
        state.produced_bytes += size_bytes
        produced = state.produced_bytes
        if (produced >= self.batch_size and enable_switch) or produced >= 2 * self.batch_size:
            state.previous = state.current
            state.current = None
            state.produced_bytes = 0

    def update_queue_sizes(
        self, topic: str, num_partitions: int, queue_sizes: Mapping[int, int] | None
    ) -> None:
        """Record how many batches are queued per choosable partition of ``topic`` (or None).

        Feeds adaptive partitioning; see :func:`partition_load_stats` for the rules. Kafka
        starts reporting queue sizes only once every partition of the topic has had a batch.
        Ignored (stats cleared) when ``adaptive`` is off.
        """
        stats = partition_load_stats(queue_sizes, num_partitions)
        state = self._topics.setdefault(topic, _TopicState())
        state.load_stats = stats if self.adaptive else None

    def current_partition(self, topic: str) -> int | None:
        """The sticky partition of ``topic`` now, or None until :meth:`partition` picks one."""
        state = self._topics.get(topic)
        return None if state is None else state.current

    def produced_bytes(self, topic: str) -> int:
        """The bytes counted towards the current sticky partition of ``topic``."""
        state = self._topics.get(topic)
        return 0 if state is None else state.produced_bytes

    def _next_partition(self, state: _TopicState, num_partitions: int, available: list[int]) -> int:
        """Draw the next sticky partition (Kafka's ``BuiltInPartitioner.nextPartition``)."""
        stats = state.load_stats
        if stats is not None and stats.partition_ids[-1] < num_partitions:
            allowed = set(available) if available else None
            pairs = [
                (p, w)
                for p, w in zip(stats.partition_ids, stats.weights, strict=True)
                if allowed is None or p in allowed
            ]
            pairs = self._without_previous(pairs, state.previous)
            if pairs:
                cumulative = list(itertools.accumulate(w for _, w in pairs))
                # The first running sum strictly greater than the draw, as Kafka's search.
                index = bisect.bisect_right(cumulative, self._draw() % cumulative[-1])
                return pairs[index][0]
        candidates = available if available else list(range(num_partitions))
        uniform = self._without_previous([(p, 1) for p in candidates], state.previous)
        return uniform[self._draw() % len(uniform)][0]

    def _without_previous(
        self, pairs: list[tuple[int, int]], previous: int | None
    ) -> list[tuple[int, int]]:
        """``pairs`` without the partition just left, unless it is the only candidate."""
        if not self.avoid_repeats or previous is None:
            return pairs
        others = [pair for pair in pairs if pair[0] != previous]
        return others if others else pairs

    def _draw(self) -> int:
        """A random non-negative int32, like Kafka's ``toPositive(random.nextInt())``."""
        return self._rng.getrandbits(31)


def choose_partition(
    topic: str,
    num_partitions: int,
    key: bytes | None,
    partition: int | None,
    available_partitions: Iterable[int],
    *,
    sticky: StickyPartitioner,
    ignore_keys: bool = False,
) -> int:
    """The partition a record goes to: explicit partition, then key hash, then sticky.

    ``partition`` must be in [0, num_partitions), else :class:`UnknownPartitionError`. A
    ``key`` (unless ``ignore_keys``, Kafka's ``partitioner.ignore.keys``) hashes over all
    ``num_partitions`` partitions regardless of availability. A record with neither goes to
    ``sticky``'s partition among ``available_partitions``; report its size to
    :meth:`StickyPartitioner.on_produced` once appended.
    """
    _check_partition_count(num_partitions)
    if partition is not None:
        if not 0 <= partition < num_partitions:
            raise UnknownPartitionError(
                f"Invalid partition given with record: {partition} is not in the range "
                f"[0...{num_partitions}) of topic {topic!r}."
            )
        return partition
    if key is not None and not ignore_keys:
        return partition_for_key(key, num_partitions)
    return sticky.partition(topic, num_partitions, available_partitions)


def _check_partition_count(num_partitions: int) -> None:
    """Raise ValueError unless a topic with ``num_partitions`` partitions can take records."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")


def _check_partition(partition: int, num_partitions: int) -> None:
    """Raise :class:`UnknownPartitionError` unless ``partition`` is in [0, num_partitions)."""
    if not 0 <= partition < num_partitions:
        raise UnknownPartitionError(
            f"partition {partition} is not in the range [0...{num_partitions})"
        )


def _normalise(partitions: Iterable[int], num_partitions: int) -> list[int]:
    """The distinct partitions, sorted, each checked to be in [0, num_partitions)."""
    result = sorted(set(partitions))
    for partition in result:
        _check_partition(partition, num_partitions)
    return result
