"""The Spark source's offset planning: offset JSON, read limits, range splits, data loss."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark_highwater.offsets import (
    DataLoss,
    OffsetJsonError,
    OffsetRange,
    OffsetsWentBack,
    from_json_dict,
    limit_total,
    missing_partitions,
    next_end,
    offsets_went_back,
    parse_offsets_json,
    plan_ranges,
    reconcile_start,
    to_json_dict,
)


def test_offset_json_round_trips_through_the_checkpoint_form() -> None:
    offsets = {("orders", 0): 23, ("orders", 1): 40, ("audit", 0): 0}
    document = to_json_dict(offsets)
    assert document == {"audit": {"0": 0}, "orders": {"0": 23, "1": 40}}
    assert from_json_dict(document) == offsets


def test_offset_json_takes_earliest_and_latest_markers() -> None:
    parsed = parse_offsets_json('{"a": {"0": -2, "1": -1, "2": 7}}', "startingOffsets")
    assert parsed == {("a", 0): -2, ("a", 1): -1, ("a", 2): 7}


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object of topics"),
        ('{"a": [0, 1]}', "must map partitions to offsets"),
        ('{"a": {"x": 1}}', "partition 'x' of topic 'a' is not a number"),
        ('{"a": {"-1": 1}}', "partition -1 of 'a' is < 0"),
        ('{"a": {"0": "5"}}', "must be an integer"),
        ('{"a": {"0": true}}', "must be an integer"),
        ('{"a": {"0": -3}}', "has offset -3"),
        ('{"": {"0": 1}}', "a topic name is empty"),
        ('{"a": {"0": 1, "00": 2}}', "partition 0 of topic 'a' is given twice"),
        ('{"a": {"1": 1, "1": 2}}', "partition 1 of topic 'a' is given twice"),
        ('{"a": {"0": 1}, "a": {"1": 2}}', "topic 'a' is given twice"),
    ],
)
def test_malformed_offset_json_names_the_option_and_the_fault(text: str, fault: str) -> None:
    with pytest.raises(OffsetJsonError, match="startingOffsets") as raised:
        parse_offsets_json(text, "startingOffsets")
    assert fault in str(raised.value)


def test_a_checkpointed_offset_is_never_a_marker() -> None:
    with pytest.raises(OffsetJsonError, match="expected an offset >= 0"):
        from_json_dict({"a": {"0": -1}})


def test_ranges_cover_each_partition_from_start_to_end() -> None:
    ranges = plan_ranges(
        {("a", 0): 5, ("a", 1): 0, ("b", 0): 3}, {("a", 0): 9, ("a", 1): 0, ("b", 0): 4}
    )
    assert ranges == [OffsetRange("a", 0, 5, 9), OffsetRange("b", 0, 3, 4)]


def test_partitions_without_a_start_are_not_planned() -> None:
    assert plan_ranges({}, {("a", 0): 10}) == []


def test_min_partitions_splits_large_ranges_in_proportion() -> None:
    ranges = plan_ranges(
        {("a", 0): 0, ("a", 1): 0}, {("a", 0): 300, ("a", 1): 100}, min_partitions=8
    )
    pieces = {p: [r for r in ranges if r.partition == p] for p in (0, 1)}
    assert len(pieces[0]) == 6 and len(pieces[1]) == 2
    for p, until in ((0, 300), (1, 100)):
        assert pieces[p][0].start == 0 and pieces[p][-1].end == until
        assert all(x.end == y.start for x, y in zip(pieces[p], pieces[p][1:], strict=False))
        assert max(r.size for r in pieces[p]) - min(r.size for r in pieces[p]) <= 1


def test_no_split_when_there_are_enough_ranges_already() -> None:
    ranges = plan_ranges(
        {("a", 0): 0, ("a", 1): 0}, {("a", 0): 300, ("a", 1): 100}, min_partitions=2
    )
    assert len(ranges) == 2


def test_max_records_per_partition_caps_every_piece() -> None:
    ranges = plan_ranges({("a", 0): 10}, {("a", 0): 1010}, max_records_per_partition=300)
    assert [r.size for r in ranges] == [250, 250, 250, 250]


@given(
    st.dictionaries(
        st.tuples(st.sampled_from("abc"), st.integers(0, 5)),
        st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
        max_size=8,
    ),
    st.integers(1, 64),
)
def test_split_ranges_tile_exactly_what_was_asked(
    bounds: dict[tuple[str, int], tuple[int, int]], min_partitions: int
) -> None:
    start = {tp: min(a, b) for tp, (a, b) in bounds.items()}
    end = {tp: max(a, b) for tp, (a, b) in bounds.items()}
    ranges = plan_ranges(start, end, min_partitions=min_partitions)
    for tp in end:
        mine = sorted((r for r in ranges if (r.topic, r.partition) == tp), key=lambda r: r.start)
        covered = [o for r in mine for o in range(r.start, r.end)]
        assert covered == list(range(start[tp], end[tp]))
        assert all(r.size > 0 for r in mine)


def test_limit_shares_records_in_proportion_to_what_waits() -> None:
    end = limit_total({("a", 0): 0, ("a", 1): 0}, {("a", 0): 300, ("a", 1): 100}, 100)
    assert end == {("a", 0): 75, ("a", 1): 25}


def test_limit_above_what_waits_reads_everything() -> None:
    latest = {("a", 0): 30, ("a", 1): 10}
    assert limit_total({("a", 0): 0, ("a", 1): 5}, latest, 1000) == latest


def test_limit_starts_new_partitions_at_their_latest_when_no_start_is_known() -> None:
    assert limit_total({}, {("a", 0): 30}, 10) == {("a", 0): 30}


@given(
    st.dictionaries(
        st.integers(0, 10), st.tuples(st.integers(0, 500), st.integers(0, 500)), min_size=1
    ),
    st.integers(0, 2000),
)
def test_limit_reads_exactly_min_of_limit_and_waiting(
    bounds: dict[int, tuple[int, int]], limit: int
) -> None:
    start = {("t", p): min(a, b) for p, (a, b) in bounds.items()}
    latest = {("t", p): max(a, b) for p, (a, b) in bounds.items()}
    end = limit_total(start, latest, limit)
    waiting = sum(latest[tp] - start[tp] for tp in latest)
    assert sum(end[tp] - start[tp] for tp in latest) == min(limit, waiting)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in latest)


def test_starts_below_the_log_start_are_data_loss() -> None:
    adjusted, losses = reconcile_start({("a", 0): 3, ("a", 1): 50}, {("a", 0): 10, ("a", 1): 0})
    assert adjusted == {("a", 0): 10, ("a", 1): 50}
    assert losses == [DataLoss("a", 0, 3, 10)]
    assert "offsets 3 to 9 were removed" in losses[0].describe()


def test_partitions_gone_from_the_cluster_are_listed() -> None:
    assert missing_partitions([("a", 0), ("b", 0)], [("a", 0)]) == [("b", 0)]


def test_next_end_reads_everything_without_a_limit() -> None:
    start = {("a", 0): 5, ("a", 1): 0}
    assert next_end(start, {("a", 0): 9, ("a", 1): 3}) == {("a", 0): 9, ("a", 1): 3}


def test_next_end_shares_out_max_records() -> None:
    end = next_end({("a", 0): 0, ("a", 1): 0}, {("a", 0): 30, ("a", 1): 10}, max_records=8)
    assert end == {("a", 0): 6, ("a", 1): 2}


def test_next_end_waits_for_min_records_unless_a_target_must_be_reached() -> None:
    start = {("a", 0): 0}
    assert next_end(start, {("a", 0): 4}, min_records=5) == start
    assert next_end(start, {("a", 0): 4}, min_records=5, target={("a", 0): 4}) == {("a", 0): 4}


def test_next_end_stops_at_the_available_now_target() -> None:
    start = {("a", 0): 0, ("a", 1): 0}
    latest = {("a", 0): 50, ("a", 1): 50, ("a", 2): 50}
    end = next_end({**start, ("a", 2): 0}, latest, target={("a", 0): 20, ("a", 1): 30})
    assert end == {("a", 0): 20, ("a", 1): 30, ("a", 2): 0}


def test_next_end_follows_a_partition_whose_offsets_went_back() -> None:
    # a topic recreated under the same name (or a log truncated below what was read): the end
    # goes back with it, so that planning sees the change and reports it; keeping the old
    # position would skip the new records below it without a word
    start = {("a", 0): 40, ("a", 1): 0}
    latest = {("a", 0): 25, ("a", 1): 30}
    assert next_end(start, latest) == {("a", 0): 25, ("a", 1): 30}
    assert next_end(start, latest, max_records=10) == {("a", 0): 25, ("a", 1): 10}
    assert next_end(start, latest, min_records=100) == {("a", 0): 25, ("a", 1): 0}
    assert next_end(start, latest, target={("a", 0): 50, ("a", 1): 5}) == {
        ("a", 0): 25,
        ("a", 1): 5,
    }


def test_next_end_leaves_out_partitions_that_no_longer_exist() -> None:
    # planning reports them once (they are in the start, not in the end); a topic created
    # again under the name is then a new one, read from its beginning
    assert next_end({("a", 0): 5, ("b", 0): 3}, {("a", 0): 9}) == {("a", 0): 9}
    assert next_end({("a", 0): 5, ("b", 0): 3}, {("a", 0): 9}, min_records=100) == {("a", 0): 5}


def test_ends_below_their_starts_are_offsets_that_went_back() -> None:
    begin = {("a", 0): 40, ("a", 1): 3, ("b", 0): 7}
    until = {("a", 0): 25, ("a", 1): 9, ("b", 0): 7}
    assert offsets_went_back(begin, until) == [OffsetsWentBack("a", 0, 40, 25)]
    assert "a-0: its offsets went back from 40 to 25" in OffsetsWentBack("a", 0, 40, 25).describe()
    assert offsets_went_back({("a", 0): 4}, {("a", 1): 0}) == []
