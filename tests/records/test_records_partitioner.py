"""Tests of the producer's partitioner: Kafka's murmur2, key hashing and the sticky partitioner."""

from __future__ import annotations

import random
import warnings
from collections import Counter
from itertools import pairwise

import pytest
from highwater.errors import HighwaterError
from highwater.records.partitioner import (
    DEFAULT_BATCH_SIZE,
    PartitionLoadStats,
    StickyPartitioner,
    UnknownPartitionError,
    choose_partition,
    murmur2,
    partition_for_key,
    partition_load_stats,
    to_positive,
)
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import given
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python's import-time noise
    from kafka.partitioner.default import murmur2 as kafka_python_murmur2

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# Kafka's own expectations, from UtilsTest.testMurmur2 in apache/kafka
# (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java): the signed int that
# org.apache.kafka.common.utils.Utils.murmur2 returns for each input.
KAFKA_MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
]


class ScriptedRandom(random.Random):
    """A Random whose ``getrandbits`` returns the given values in turn: to pin a draw down."""

    def __init__(self, draws: list[int]) -> None:
        super().__init__(0)
        self.draws = list(draws)

    def getrandbits(self, k: int) -> int:
        return self.draws.pop(0)


def fill(sticky: StickyPartitioner, topic: str, num: int, available: list[int]) -> int:
    """Produce exactly one batch_size worth of bytes to the sticky partition; return it."""
    partition = sticky.partition(topic, num, available)
    sticky.on_produced(topic, partition, sticky.batch_size)
    return partition


def switches(
    sticky: StickyPartitioner, topic: str, num: int, available: list[int], count: int
) -> list[int]:
    """The sticky partitions of ``count`` consecutive full batches."""
    return [fill(sticky, topic, num, available) for _ in range(count)]


# --- murmur2 -----------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka_utils_test(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@given(st.binary(max_size=300))
def test_murmur2_agrees_with_kafka_python(data: bytes) -> None:
    # kafka-python returns the same 32 bits as an unsigned int; Kafka's Java returns them signed.
    ours = murmur2(data)
    assert INT32_MIN <= ours <= INT32_MAX
    assert ours & 0xFFFFFFFF == kafka_python_murmur2(data)


@pytest.mark.parametrize("length", range(13))
def test_murmur2_every_tail_length_agrees_with_kafka_python(length: int) -> None:
    # The Java vectors have tails of 0, 2 and 3 bytes; make sure 1 (and high bytes) is covered.
    data = bytes((0xFF - 7 * i) & 0xFF for i in range(length))
    assert murmur2(data) & 0xFFFFFFFF == kafka_python_murmur2(data)


def test_murmur2_of_empty_input() -> None:
    assert murmur2(b"") == kafka_python_murmur2(b"") == 275646681


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, 0),
        (7, 7),
        (INT32_MAX, INT32_MAX),
        (-1, INT32_MAX),
        (INT32_MIN, 0),
        (-973932308, 1173551340),
    ],
)
def test_to_positive_clears_the_sign_bit(n: int, expected: int) -> None:
    assert to_positive(n) == expected


# --- keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("num_partitions", [1, 3, 7, 10, 16, 100])
@pytest.mark.parametrize(("key", "java_hash"), KAFKA_MURMUR2_VECTORS)
def test_partition_for_key_is_kafkas_formula(
    key: bytes, java_hash: int, num_partitions: int
) -> None:
    expected = (java_hash & 0x7FFFFFFF) % num_partitions
    assert partition_for_key(key, num_partitions) == expected


def test_partition_for_key_examples() -> None:
    # toPositive(-973932308) = 1173551340: 1173551340 % 3 == 0, % 7 == 3, % 16 == 12.
    assert [partition_for_key(b"21", n) for n in (3, 7, 16)] == [0, 3, 12]
    assert [partition_for_key(b"abc", n) for n in (3, 7, 16)] == [0, 4, 11]


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_for_key_agrees_with_kafka_python(key: bytes, num_partitions: int) -> None:
    expected = (kafka_python_murmur2(key) & 0x7FFFFFFF) % num_partitions
    assert partition_for_key(key, num_partitions) == expected


@pytest.mark.parametrize("num_partitions", [0, -1])
def test_partition_for_key_needs_partitions(num_partitions: int) -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        partition_for_key(b"k", num_partitions)


# --- choose_partition ------------------------------------------------------------------------


def test_explicit_partition_wins_over_key_and_availability() -> None:
    sticky = StickyPartitioner(rng=random.Random(1))
    assert choose_partition("t", 8, b"21", 5, [0, 1], sticky=sticky) == 5
    assert choose_partition("t", 8, None, 0, [], sticky=sticky) == 0
    assert choose_partition("t", 8, None, 7, [1, 2], sticky=sticky) == 7
    # Explicit partitions leave the sticky partitioner alone.
    assert sticky.current_partition("t") is None


@pytest.mark.parametrize("partition", [-1, 8, 9, 1000])
def test_explicit_partition_out_of_range_is_a_typed_error(partition: int) -> None:
    sticky = StickyPartitioner(rng=random.Random(1))
    with pytest.raises(UnknownPartitionError, match=rf"{partition} is not in the range \[0...8\)"):
        choose_partition("t", 8, b"k", partition, range(8), sticky=sticky)
    try:
        choose_partition("t", 8, None, partition, range(8), sticky=sticky)
    except UnknownPartitionError as error:
        assert isinstance(error, ValueError)
        assert isinstance(error, HighwaterError)
        assert error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    else:
        pytest.fail("no UnknownPartitionError")


def test_keyed_records_hash_over_all_partitions_ignoring_availability() -> None:
    sticky = StickyPartitioner(rng=random.Random(1))
    for key, java_hash in KAFKA_MURMUR2_VECTORS:
        expected = (java_hash & 0x7FFFFFFF) % 12
        for available in ([], [expected], [p for p in range(12) if p != expected], range(12)):
            assert choose_partition("t", 12, key, None, available, sticky=sticky) == expected
    assert sticky.current_partition("t") is None


def test_an_empty_key_is_hashed_not_sticky() -> None:
    sticky = StickyPartitioner(rng=random.Random(1))
    expected = (kafka_python_murmur2(b"") & 0x7FFFFFFF) % 10
    assert choose_partition("t", 10, b"", None, [], sticky=sticky) == expected
    assert sticky.current_partition("t") is None


def test_keyless_records_go_to_the_sticky_partition() -> None:
    sticky = StickyPartitioner(rng=random.Random(3))
    first = choose_partition("t", 6, None, None, range(6), sticky=sticky)
    assert sticky.current_partition("t") == first
    assert all(
        choose_partition("t", 6, None, None, range(6), sticky=sticky) == first for _ in range(20)
    )


def test_ignore_keys_sends_keyed_records_to_the_sticky_partition() -> None:
    sticky = StickyPartitioner(rng=random.Random(3))
    first = choose_partition("t", 50, b"21", None, range(50), sticky=sticky, ignore_keys=True)
    assert sticky.current_partition("t") == first
    for key, _ in KAFKA_MURMUR2_VECTORS:
        assert (
            choose_partition("t", 50, key, None, range(50), sticky=sticky, ignore_keys=True)
            == first
        )


def test_choose_partition_needs_partitions() -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        choose_partition("t", 0, None, None, [], sticky=StickyPartitioner())


# --- sticky: when to switch -------------------------------------------------------------------


def test_sticks_until_batch_size_bytes_then_switches() -> None:
    sticky = StickyPartitioner(1000, rng=random.Random(7))
    first = sticky.partition("t", 8, range(8))
    for produced in range(100, 1000, 100):
        sticky.on_produced("t", first, 100)
        assert sticky.partition("t", 8, range(8)) == first
        assert sticky.produced_bytes("t") == produced
    sticky.on_produced("t", first, 100)  # 1000 bytes: batch.size reached
    assert sticky.current_partition("t") is None
    second = sticky.partition("t", 8, range(8))
    assert second != first
    assert sticky.produced_bytes("t") == 0


def test_switches_on_the_record_that_crosses_batch_size() -> None:
    sticky = StickyPartitioner(1000, rng=random.Random(7))
    first = sticky.partition("t", 4, range(4))
    sticky.on_produced("t", first, 999)
    assert sticky.partition("t", 4, range(4)) == first
    sticky.on_produced("t", first, 5000)  # one large record
    assert sticky.partition("t", 4, range(4)) != first


def test_default_batch_size_is_kafkas() -> None:
    sticky = StickyPartitioner(rng=random.Random(7))
    assert sticky.batch_size == DEFAULT_BATCH_SIZE == 16384
    first = sticky.partition("t", 4, range(4))
    sticky.on_produced("t", first, 16383)
    assert sticky.partition("t", 4, range(4)) == first
    sticky.on_produced("t", first, 1)
    assert sticky.partition("t", 4, range(4)) != first


def test_held_back_switch_waits_for_twice_batch_size() -> None:
    sticky = StickyPartitioner(1000, rng=random.Random(7))
    first = sticky.partition("t", 4, range(4))
    sticky.on_produced("t", first, 1500, enable_switch=False)
    assert sticky.partition("t", 4, range(4)) == first
    sticky.on_produced("t", first, 499, enable_switch=False)
    assert sticky.partition("t", 4, range(4)) == first
    sticky.on_produced("t", first, 1, enable_switch=False)  # 2000 bytes: switch regardless
    assert sticky.partition("t", 4, range(4)) != first


def test_held_back_switch_happens_once_switching_is_allowed_again() -> None:
    sticky = StickyPartitioner(1000, rng=random.Random(7))
    first = sticky.partition("t", 4, range(4))
    sticky.on_produced("t", first, 1200, enable_switch=False)
    assert sticky.partition("t", 4, range(4)) == first
    sticky.on_produced("t", first, 10)
    assert sticky.partition("t", 4, range(4)) != first


def test_bytes_for_other_partitions_and_topics_do_not_count() -> None:
    sticky = StickyPartitioner(1000, rng=random.Random(7))
    first = sticky.partition("t", 4, range(4))
    other = (first + 1) % 4
    sticky.on_produced("t", other, 10_000)
    sticky.on_produced("u", first, 10_000)
    assert sticky.partition("t", 4, range(4)) == first
    assert sticky.produced_bytes("t") == 0
    assert sticky.current_partition("u") is None


def test_topics_are_independent() -> None:
    sticky = StickyPartitioner(1000, rng=random.Random(7))
    a = sticky.partition("a", 16, range(16))
    b = sticky.partition("b", 16, range(16))
    sticky.on_produced("a", a, 1000)
    assert sticky.current_partition("a") is None
    assert sticky.current_partition("b") == b


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        StickyPartitioner(0)
    sticky = StickyPartitioner(rng=random.Random(7))
    with pytest.raises(ValueError, match="size_bytes"):
        sticky.on_produced("t", 0, -1)
    with pytest.raises(UnknownPartitionError):
        sticky.partition("t", 4, [0, 4])


# --- sticky: which partition next ---------------------------------------------------------------


def test_never_the_same_partition_twice_in_a_row() -> None:
    sticky = StickyPartitioner(rng=random.Random(11))
    chosen = switches(sticky, "t", 5, list(range(5)), 2000)
    assert all(a != b for a, b in pairwise(chosen))
    assert set(chosen) == set(range(5))


def test_two_partitions_alternate() -> None:
    sticky = StickyPartitioner(rng=random.Random(11))
    chosen = switches(sticky, "t", 2, [0, 1], 50)
    assert chosen[0::2] == [chosen[0]] * 25
    assert chosen[1::2] == [1 - chosen[0]] * 25


def test_one_available_partition_is_reused() -> None:
    sticky = StickyPartitioner(rng=random.Random(11))
    assert switches(sticky, "t", 6, [4], 10) == [4] * 10


def test_only_available_partitions_are_chosen() -> None:
    sticky = StickyPartitioner(rng=random.Random(13))
    chosen = switches(sticky, "t", 8, [1, 3, 5], 600)
    assert set(chosen) == {1, 3, 5}
    assert all(a != b for a, b in pairwise(chosen))


def test_all_partitions_when_none_is_available() -> None:
    sticky = StickyPartitioner(rng=random.Random(13))
    assert set(switches(sticky, "t", 4, [], 200)) == {0, 1, 2, 3}


def test_sticky_partition_that_loses_its_leader_is_left() -> None:
    sticky = StickyPartitioner(rng=random.Random(13))
    first = sticky.partition("t", 4, range(4))
    others = [p for p in range(4) if p != first]
    assert sticky.partition("t", 4, others) in others
    assert sticky.produced_bytes("t") == 0


def test_uniform_choice_is_roughly_uniform() -> None:
    sticky = StickyPartitioner(rng=random.Random(17), avoid_repeats=False)
    counts = Counter(switches(sticky, "t", 4, list(range(4)), 8000))
    assert all(1700 <= counts[p] <= 2300 for p in range(4)), counts


def test_kafka_mode_may_repeat_a_partition() -> None:
    # Kafka 3.3+ draws afresh on every switch, so the same partition can come up again.
    sticky = StickyPartitioner(rng=random.Random(17), avoid_repeats=False)
    chosen = switches(sticky, "t", 3, [0, 1, 2], 300)
    assert any(a == b for a, b in pairwise(chosen))


def test_seeded_partitioners_replay_the_same_sequence() -> None:
    def run(seed: int) -> list[int]:
        sticky = StickyPartitioner(500, rng=random.Random(seed))
        sequence = []
        for step in range(300):
            if step == 150:
                sticky.update_queue_sizes("t", 10, {p: p % 4 for p in range(10)})
            partition = sticky.partition("t", 10, range(10))
            sequence.append(partition)
            sticky.on_produced("t", partition, 120)
        return sequence

    assert run(2024) == run(2024)
    assert run(2024) != run(2025)


# --- sticky: adaptive (queue sizes) ---------------------------------------------------------------


def test_load_stats_rules() -> None:
    assert partition_load_stats(None, 3) is None
    assert partition_load_stats({}, 3) is None
    assert partition_load_stats({0: 5}, 1) is None  # fewer than two partitions
    assert partition_load_stats({0: 2, 1: 2, 2: 2}, 3) is None  # all equal: uniform
    # Kafka's example: queue sizes 0 3 1 invert to weights 4 1 3 (running sums 4 5 8).
    assert partition_load_stats({0: 0, 1: 3, 2: 1}, 3) == PartitionLoadStats((0, 1, 2), (4, 1, 3))
    # Equal queues, but a partition is left out: stats over the others.
    assert partition_load_stats({0: 2, 2: 2}, 3) == PartitionLoadStats((0, 2), (1, 1))
    with pytest.raises(ValueError, match="negative"):
        partition_load_stats({0: -1, 1: 0}, 2)
    with pytest.raises(UnknownPartitionError):
        partition_load_stats({0: 1, 3: 0}, 3)


@pytest.mark.parametrize(
    ("draw", "expected"), [(0, 0), (3, 0), (4, 1), (5, 2), (7, 2), (8, 0), (12, 1), (2**31 - 1, 2)]
)
def test_weighted_draw_maps_like_kafkas_cumulative_table(draw: int, expected: int) -> None:
    # Running sums 4 5 8: draws 0-3 -> partition 0, 4 -> 1, 5-7 -> 2, taken modulo 8.
    sticky = StickyPartitioner(rng=ScriptedRandom([draw]), avoid_repeats=False)
    sticky.update_queue_sizes("t", 3, {0: 0, 1: 3, 2: 1})
    assert sticky.partition("t", 3, [0, 1, 2]) == expected


def test_weighted_draw_leaves_out_the_previous_partition() -> None:
    # Weights 4 1 3. The partition just left is taken out of the table before the draw.
    sticky = StickyPartitioner(rng=ScriptedRandom([0, 0, 4, 3]))
    assert sticky.partition("t", 3, [0, 1, 2]) == 0  # no stats yet: uniform, draw 0 % 3
    sticky.update_queue_sizes("t", 3, {0: 0, 1: 3, 2: 1})
    sticky.on_produced("t", 0, sticky.batch_size)
    assert sticky.partition("t", 3, [0, 1, 2]) == 1  # over 1 and 2, sums 1 4: draw 0 -> 1
    sticky.on_produced("t", 1, sticky.batch_size)
    assert sticky.partition("t", 3, [0, 1, 2]) == 2  # over 0 and 2, sums 4 7: draw 4 -> 2
    sticky.on_produced("t", 2, sticky.batch_size)
    assert sticky.partition("t", 3, [0, 1, 2]) == 0  # over 0 and 1, sums 4 5: draw 3 -> 0


def test_weighted_choice_favours_short_queues_like_kafka() -> None:
    # Queue sizes 0 9 9 9 -> weights 10 1 1 1: Kafka picks partition 0 with probability 10/13.
    sticky = StickyPartitioner(rng=random.Random(5), avoid_repeats=False)
    sticky.update_queue_sizes("t", 4, {0: 0, 1: 9, 2: 9, 3: 9})
    counts = Counter(switches(sticky, "t", 4, list(range(4)), 6000))
    assert 0.72 <= counts[0] / 6000 <= 0.82, counts
    assert all(0.05 <= counts[p] / 6000 <= 0.11 for p in (1, 2, 3)), counts


def test_weighted_choice_without_repeats_still_favours_short_queues() -> None:
    # Leaving 1, 2 or 3, partition 0 is drawn with probability 10/12; leaving 0, one of the
    # others uniformly: partition 0 holds 10/22 of the switches in the long run.
    sticky = StickyPartitioner(rng=random.Random(5))
    sticky.update_queue_sizes("t", 4, {0: 0, 1: 9, 2: 9, 3: 9})
    chosen = switches(sticky, "t", 4, list(range(4)), 6000)
    counts = Counter(chosen)
    assert 0.41 <= counts[0] / 6000 <= 0.50, counts
    assert all(0.15 <= counts[p] / 6000 <= 0.22 for p in (1, 2, 3)), counts
    assert all(a != b for a, b in pairwise(chosen))
    from_others = [b for a, b in pairwise(chosen) if a != 0]
    assert 0.79 <= from_others.count(0) / len(from_others) <= 0.88


def test_weighted_choice_respects_availability() -> None:
    # Partition 0 has the shortest queue but no leader: the draw is over 1 2 3, weights 6 1 1.
    sticky = StickyPartitioner(rng=random.Random(5), avoid_repeats=False)
    sticky.update_queue_sizes("t", 6, {0: 0, 1: 0, 2: 5, 3: 5, 4: 5, 5: 5})
    counts = Counter(switches(sticky, "t", 6, [1, 2, 3], 3000))
    assert set(counts) == {1, 2, 3}
    assert 0.70 <= counts[1] / 3000 <= 0.80, counts


def test_equal_queues_fall_back_to_uniform() -> None:
    sticky = StickyPartitioner(rng=random.Random(5), avoid_repeats=False)
    sticky.update_queue_sizes("t", 4, {p: 3 for p in range(4)})
    counts = Counter(switches(sticky, "t", 4, list(range(4)), 8000))
    assert all(1700 <= counts[p] <= 2300 for p in range(4)), counts


def test_queue_sizes_cleared_go_back_to_uniform() -> None:
    sticky = StickyPartitioner(rng=random.Random(5), avoid_repeats=False)
    sticky.update_queue_sizes("t", 4, {0: 0, 1: 9, 2: 9, 3: 9})
    sticky.update_queue_sizes("t", 4, None)
    counts = Counter(switches(sticky, "t", 4, list(range(4)), 8000))
    assert all(1700 <= counts[p] <= 2300 for p in range(4)), counts


def test_adaptive_off_ignores_queue_sizes() -> None:
    sticky = StickyPartitioner(rng=random.Random(5), adaptive=False, avoid_repeats=False)
    sticky.update_queue_sizes("t", 4, {0: 0, 1: 9, 2: 9, 3: 9})
    counts = Counter(switches(sticky, "t", 4, list(range(4)), 8000))
    assert all(1700 <= counts[p] <= 2300 for p in range(4)), counts
