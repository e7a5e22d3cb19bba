"""Tests of the consumer protocol's encoding and of the range, roundrobin and sticky assignors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import pytest
from highwater.group.assignors import (
    ASSIGNORS,
    AssignmentError,
    ConsumerPartitionAssignor,
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    assign_group,
    assignor_for,
    decode_sticky_user_data,
    encode_sticky_user_data,
    select_rebalance_protocol,
    sticky_assignment,
)
from highwater.group.protocol import (
    Assignment,
    GroupMember,
    MalformedConsumerProtocolError,
    RebalanceProtocol,
    Subscription,
    TopicPartitionKey,
    assignment_change,
    decode_assignment,
    decode_group_subscription,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    member_sort_key,
)
from highwater.v1 import consumer_protocol_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TOPIC_NAMES = ["a", "b", "c", "d"]

Counts = dict[str, int]
Result = Mapping[str, Assignment]


def tp(topic: str, partition: int) -> TopicPartitionKey:
    return (topic, partition)


def parts(result: Result) -> dict[str, list[TopicPartitionKey]]:
    return {m: list(a.partitions) for m, a in result.items()}


# --- Strategies ---------------------------------------------------------------------------

member_ids = st.lists(
    st.text(alphabet="mnxyz019", min_size=1, max_size=4), min_size=1, max_size=7, unique=True
)
topic_counts = st.dictionaries(
    st.sampled_from(TOPIC_NAMES), st.integers(0, 9), min_size=1, max_size=4
)


@st.composite
def groups(draw: st.DrawFn, identical: bool = False) -> tuple[Counts, dict[str, Subscription]]:
    """Partition counts and fresh subscriptions (nothing owned); some topics unknown."""
    counts = draw(topic_counts)
    names = [*sorted(counts), "unknown"]
    members = draw(member_ids)
    shared = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    subscriptions = {}
    for member in members:
        topics = shared if identical else draw(st.lists(st.sampled_from(names), min_size=1))
        static = draw(st.one_of(st.none(), st.text(alphabet="sx", min_size=1, max_size=3)))
        subscriptions[member] = Subscription(tuple(topics), group_instance_id=static)
    # group.instance.id is unique within a group.
    seen: set[str] = set()
    for member, sub in list(subscriptions.items()):
        if sub.group_instance_id in seen:
            subscriptions[member] = Subscription(sub.topics)
        elif sub.group_instance_id is not None:
            seen.add(sub.group_instance_id)
    return counts, subscriptions


def check_valid(counts: Counts, subscriptions: Mapping[str, Subscription], result: Result) -> None:
    """Every partition of a subscribed topic exactly once, to a subscriber; nothing else."""
    assert set(result) == set(subscriptions)
    holders = Counter(p for a in result.values() for p in a.partitions)
    assert all(n == 1 for n in holders.values()), holders
    for member, assignment in result.items():
        for topic, _ in assignment.partitions:
            assert topic in subscriptions[member].topics
    expected = {
        (topic, p)
        for topic, count in counts.items()
        if any(topic in s.topics for s in subscriptions.values())
        for p in range(count)
    }
    assert set(holders) == expected


def check_balanced(subscriptions: Mapping[str, Subscription], result: Result) -> None:
    """Members with identical subscriptions differ by at most one partition."""
    classes: dict[tuple[str, ...], list[int]] = {}
    for member, sub in subscriptions.items():
        classes.setdefault(sub.topics, []).append(len(result[member].partitions))
    for sizes in classes.values():
        assert max(sizes) - min(sizes) <= 1, classes


def owned_subscriptions(
    subscriptions: Mapping[str, Subscription], owned: Result, generation: int
) -> dict[str, Subscription]:
    """``subscriptions`` owning what ``owned`` gave them (cooperative: owned_partitions)."""
    return {
        m: Subscription(
            s.topics,
            owned_partitions=owned[m].partitions if m in owned else (),
            generation_id=generation,
            group_instance_id=s.group_instance_id,
        )
        for m, s in subscriptions.items()
    }


def sticky_subscriptions(
    subscriptions: Mapping[str, Subscription], owned: Result, generation: int
) -> dict[str, Subscription]:
    """``subscriptions`` carrying their previous assignment in sticky user data (eager)."""
    assignor = StickyAssignor()
    return {
        m: Subscription(
            s.topics,
            user_data=assignor.subscription_user_data(
                s.topics, owned[m].partitions if m in owned else (), generation
            ),
            group_instance_id=s.group_instance_id,
        )
        for m, s in subscriptions.items()
    }


# --- Every assignor: valid and deterministic ------------------------------------------------


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@FAST
@given(group=groups())
def test_every_partition_goes_to_exactly_one_subscriber(
    name: str, group: tuple[Counts, dict[str, Subscription]]
) -> None:
    counts, subscriptions = group
    assignor = assignor_for(name)
    result = assignor.assign(counts, subscriptions)
    check_valid(counts, subscriptions, result)
    # Deterministic whatever the order the subscriptions come in.
    reordered = dict(reversed(list(subscriptions.items())))
    assert assignor.assign(counts, reordered) == result


@pytest.mark.parametrize("name", ["roundrobin", "sticky", "cooperative-sticky"])
@FAST
@given(group=groups(identical=True))
def test_identical_subscriptions_are_balanced_within_one(
    name: str, group: tuple[Counts, dict[str, Subscription]]
) -> None:
    counts, subscriptions = group
    check_balanced(subscriptions, assignor_for(name).assign(counts, subscriptions))


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
@FAST
@given(group=groups())
def test_sticky_balances_each_subscription_class_within_one(
    name: str, group: tuple[Counts, dict[str, Subscription]]
) -> None:
    counts, subscriptions = group
    check_balanced(subscriptions, assignor_for(name).assign(counts, subscriptions))


# --- Range ------------------------------------------------------------------------------------


@FAST
@given(group=groups())
def test_range_gives_consecutive_ranges_per_topic_first_members_one_more(
    group: tuple[Counts, dict[str, Subscription]],
) -> None:
    counts, subscriptions = group
    result = RangeAssignor().assign(counts, subscriptions)
    for topic, count in counts.items():
        members = sorted(
            (m for m, s in subscriptions.items() if topic in s.topics),
            key=lambda m: member_sort_key(m, subscriptions[m].group_instance_id),
        )
        start = 0
        for i, member in enumerate(members):
            length = count // len(members) + (1 if i < count % len(members) else 0)
            got = [p for t, p in result[member].partitions if t == topic]
            assert got == list(range(start, start + length))
            start += length


def test_range_kafka_example() -> None:
    subscriptions = {"C0": Subscription(("t0", "t1")), "C1": Subscription(("t0", "t1"))}
    result = RangeAssignor().assign({"t0": 3, "t1": 3}, subscriptions)
    assert parts(result) == {
        "C0": [tp("t0", 0), tp("t0", 1), tp("t1", 0), tp("t1", 1)],
        "C1": [tp("t0", 2), tp("t1", 2)],
    }


def test_range_orders_static_members_first_by_instance_id() -> None:
    subscriptions = {
        "a-dynamic": Subscription(("t",)),
        "z-member": Subscription(("t",), group_instance_id="instance-1"),
        "b-member": Subscription(("t",), group_instance_id="instance-2"),
    }
    result = RangeAssignor().assign({"t": 4}, subscriptions)
    assert parts(result) == {
        "z-member": [tp("t", 0), tp("t", 1)],
        "b-member": [tp("t", 2)],
        "a-dynamic": [tp("t", 3)],
    }


def test_assignors_skip_topics_without_metadata_and_give_everyone_an_entry() -> None:
    subscriptions = {"m1": Subscription(("gone",)), "m2": Subscription(("t", "gone"))}
    for name in ASSIGNORS:
        result = assignor_for(name).assign({"t": 2, "empty": 0}, subscriptions)
        assert parts(result) == {"m1": [], "m2": [tp("t", 0), tp("t", 1)]}, name
    assert RangeAssignor().assign({"t": 1}, {}) == {}


# --- Round robin ----------------------------------------------------------------------------


def test_roundrobin_kafka_examples() -> None:
    same = {"C0": Subscription(("t0", "t1")), "C1": Subscription(("t0", "t1"))}
    assert parts(RoundRobinAssignor().assign({"t0": 3, "t1": 3}, same)) == {
        "C0": [tp("t0", 0), tp("t0", 2), tp("t1", 1)],
        "C1": [tp("t0", 1), tp("t1", 0), tp("t1", 2)],
    }
    # Different subscriptions (the javadoc's example).
    different = {
        "C0": Subscription(("t0",)),
        "C1": Subscription(("t0", "t1")),
        "C2": Subscription(("t0", "t1", "t2")),
    }
    assert parts(RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3}, different)) == {
        "C0": [tp("t0", 0)],
        "C1": [tp("t1", 0)],
        "C2": [tp("t1", 1), tp("t2", 0), tp("t2", 1), tp("t2", 2)],
    }


# --- Sticky -----------------------------------------------------------------------------------


def test_sticky_kip54_examples() -> None:
    counts = {"t0": 2, "t1": 2, "t2": 2, "t3": 2}
    topics = tuple(counts)
    subscriptions = {c: Subscription(topics) for c in ("C0", "C1", "C2")}
    first = StickyAssignor().assign(counts, subscriptions)
    assert parts(first) == {
        "C0": [tp("t0", 0), tp("t1", 1), tp("t3", 0)],
        "C1": [tp("t0", 1), tp("t2", 0), tp("t3", 1)],
        "C2": [tp("t1", 0), tp("t2", 1)],
    }
    # C1 leaves: C0 and C2 keep theirs and share C1's.
    rest = {c: s for c, s in subscriptions.items() if c != "C1"}
    second = StickyAssignor().assign(counts, sticky_subscriptions(rest, first, 1))
    assert parts(second) == {
        "C0": [tp("t0", 0), tp("t1", 1), tp("t2", 0), tp("t3", 0)],
        "C2": [tp("t0", 1), tp("t1", 0), tp("t2", 1), tp("t3", 1)],
    }


def test_sticky_kip54_example_with_different_subscriptions() -> None:
    counts = {"t0": 1, "t1": 2, "t2": 3}
    subscriptions = {
        "C0": Subscription(("t0",)),
        "C1": Subscription(("t0", "t1")),
        "C2": Subscription(("t0", "t1", "t2")),
    }
    first = StickyAssignor().assign(counts, subscriptions)
    assert parts(first) == {
        "C0": [tp("t0", 0)],
        "C1": [tp("t1", 0), tp("t1", 1)],
        "C2": [tp("t2", 0), tp("t2", 1), tp("t2", 2)],
    }
    rest = {c: s for c, s in subscriptions.items() if c != "C0"}
    second = StickyAssignor().assign(counts, sticky_subscriptions(rest, first, 1))
    assert parts(second) == {
        "C1": [tp("t0", 0), tp("t1", 0), tp("t1", 1)],
        "C2": [tp("t2", 0), tp("t2", 1), tp("t2", 2)],
    }


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
@FAST
@given(group=groups(identical=True), data=st.data())
def test_sticky_adding_a_member_moves_only_partitions_to_it(
    name: str, group: tuple[Counts, dict[str, Subscription]], data: st.DataObject
) -> None:
    counts, subscriptions = group
    before = StickyAssignor().assign(counts, subscriptions)
    newcomer = data.draw(st.text(alphabet="mnxyz019", min_size=5, max_size=6))
    joined = dict(
        subscriptions, **{newcomer: Subscription(next(iter(subscriptions.values())).topics)}
    )
    with_owned = (
        sticky_subscriptions(joined, before, 1)
        if name == "sticky"
        else owned_subscriptions(joined, before, 1)
    )
    after = sticky_assignment(counts, with_owned, {m: (before[m].partitions, 1) for m in before})
    if name == "sticky":
        assert StickyAssignor().assign(counts, with_owned) == after
    check_valid(counts, joined, after)
    check_balanced(joined, after)
    for member, assignment in before.items():
        moved = set(assignment.partitions) - set(after[member].partitions)
        assert moved <= set(after[newcomer].partitions)


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
@FAST
@given(group=groups(identical=True), data=st.data())
def test_sticky_removing_a_member_moves_only_its_partitions(
    name: str, group: tuple[Counts, dict[str, Subscription]], data: st.DataObject
) -> None:
    counts, subscriptions = group
    before = StickyAssignor().assign(counts, subscriptions)
    leaver = data.draw(st.sampled_from(sorted(subscriptions)))
    rest = {m: s for m, s in subscriptions.items() if m != leaver}
    build = sticky_subscriptions if name == "sticky" else owned_subscriptions
    after = assignor_for(name).assign(counts, build(rest, before, 1))
    check_valid(counts, rest, after)
    check_balanced(rest, after)
    for member in rest:
        assert set(before[member].partitions) <= set(after[member].partitions)


@st.composite
def owned_groups(
    draw: st.DrawFn, identical: bool = False
) -> tuple[Counts, dict[str, Subscription], dict[str, Assignment]]:
    """A group whose members own a conflict-free previous assignment of another assignor,
    after some members joined and left and subscriptions changed."""
    counts, subscriptions = draw(groups(identical=identical))
    previous = assignor_for(draw(st.sampled_from(["range", "roundrobin"]))).assign(
        counts, subscriptions
    )
    leavers = draw(st.lists(st.sampled_from(sorted(subscriptions)), unique=True))
    members = {m: s for m, s in subscriptions.items() if m not in leavers}
    topics = next(iter(subscriptions.values())).topics
    for newcomer in draw(st.lists(st.text(alphabet="pq", min_size=1, max_size=3), unique=True)):
        members[newcomer] = Subscription(
            topics
            if identical
            else draw(st.sampled_from([s.topics for s in subscriptions.values()]))
        )
    if not members:
        members["pp"] = Subscription(topics)
    return counts, members, previous


@FAST
@given(group=owned_groups(identical=True))
def test_sticky_keeps_every_owned_partition_balance_allows(
    group: tuple[Counts, dict[str, Subscription], dict[str, Assignment]],
) -> None:
    counts, members, previous = group
    result = StickyAssignor().assign(counts, sticky_subscriptions(members, previous, 3))
    check_valid(counts, members, result)
    check_balanced(members, result)
    for member in members:
        owned = set(previous[member].partitions) if member in previous else set()
        owned = {p for p in owned if p[0] in members[member].topics}
        kept = owned & set(result[member].partitions)
        assert len(kept) == min(len(owned), len(result[member].partitions))


def test_sticky_claims_highest_generation_wins_and_a_tie_keeps_neither() -> None:
    counts = {"t": 4}
    subscriptions = {
        "A": Subscription(("t",), owned_partitions=(tp("t", 0), tp("t", 1)), generation_id=5),
        "B": Subscription(("t",), owned_partitions=(tp("t", 1), tp("t", 2)), generation_id=3),
    }
    # A's generation 5 beats B's 3 for t-1.
    assert parts(CooperativeStickyAssignor().assign(counts, subscriptions))["A"] == [
        tp("t", 0),
        tp("t", 1),
    ]
    tie = {
        "A": Subscription(("t",), owned_partitions=(tp("t", 0), tp("t", 1)), generation_id=4),
        "B": Subscription(("t",), owned_partitions=(tp("t", 1), tp("t", 2)), generation_id=4),
    }
    claims = {m: (s.owned_partitions, s.generation_id) for m, s in tie.items()}
    result = sticky_assignment(counts, tie, claims)
    # t-1 is invalidated for both; A keeps t-0, B keeps t-2, the rest is dealt out.
    assert parts(result) == {"A": [tp("t", 0), tp("t", 1)], "B": [tp("t", 2), tp("t", 3)]}


def test_sticky_user_data_carries_the_previous_assignment_and_generation() -> None:
    assignor = StickyAssignor()
    assert assignor.subscription_user_data(["t"], [], -1) == b""
    data = assignor.subscription_user_data(["t"], [tp("t", 1), tp("t", 0)], 7)
    assert decode_sticky_user_data(data) == ((tp("t", 0), tp("t", 1)), 7)
    stale = encode_sticky_user_data([tp("t", 0)], 2)
    subscriptions = {
        "A": Subscription(("t",), user_data=data),
        "B": Subscription(("t",), user_data=stale),
    }
    # A's generation 7 claim on t-0 beats B's stale generation 2 one; A then gives up t-1.
    assert parts(assignor.assign({"t": 2}, subscriptions)) == {
        "A": [tp("t", 0)],
        "B": [tp("t", 1)],
    }
    assert parts(assignor.assign({"t": 3}, subscriptions)) == {
        "A": [tp("t", 0), tp("t", 1)],
        "B": [tp("t", 2)],
    }


def test_sticky_garbage_user_data_only_costs_that_member_its_stickiness() -> None:
    subscriptions = {
        "A": Subscription(("t",), user_data=b"\xff\xff\xff"),
        "B": Subscription(("t",), user_data=encode_sticky_user_data([tp("t", 0)], 1)),
    }
    result = parts(StickyAssignor().assign({"t": 2}, subscriptions))
    assert result == {"A": [tp("t", 1)], "B": [tp("t", 0)]}
    with pytest.raises(MalformedConsumerProtocolError):
        decode_sticky_user_data(b"\xff\xff\xff")


# --- Cooperative sticky -------------------------------------------------------------------


def check_cooperative_round(subscriptions: Mapping[str, Subscription], result: Result) -> None:
    """No partition is newly given to a member while another member still owns it.

    (A member keeps a partition it owns even if a stale member of an older generation lists
    it too, as in Kafka; inputs without such double claims never give a partition to one
    member while another owns it.)
    """
    owners: dict[TopicPartitionKey, set[str]] = {}
    for member, sub in subscriptions.items():
        for p in sub.owned_partitions:
            owners.setdefault(p, set()).add(member)
    for member, assignment in result.items():
        for p in assignment.partitions:
            if p not in subscriptions[member].owned_partitions:
                assert not owners.get(p), (p, member, owners.get(p))


@FAST
@given(group=owned_groups(identical=True))
def test_cooperative_two_rounds_are_safe_and_reach_the_sticky_target(
    group: tuple[Counts, dict[str, Subscription], dict[str, Assignment]],
) -> None:
    counts, members, previous = group
    assignor = CooperativeStickyAssignor()
    first_in = owned_subscriptions(members, previous, 4)
    first = assignor.assign(counts, first_in)
    check_cooperative_round(first_in, first)
    second_in = owned_subscriptions(members, first, 5)
    second = assignor.assign(counts, second_in)
    check_cooperative_round(second_in, second)
    claims = {m: (s.owned_partitions, s.generation_id) for m, s in second_in.items()}
    assert second == sticky_assignment(counts, second_in, claims)
    check_valid(counts, members, second)
    check_balanced(members, second)
    for member in members:
        assert set(first[member].partitions) <= set(second[member].partitions)
        change = assignment_change(
            first[member].partitions, second[member].partitions, RebalanceProtocol.COOPERATIVE
        )
        assert change.revoked == () and not change.rejoin


@FAST
@given(group=owned_groups())
def test_cooperative_rounds_with_different_subscriptions_are_always_safe(
    group: tuple[Counts, dict[str, Subscription], dict[str, Assignment]],
) -> None:
    counts, members, previous = group
    assignor = CooperativeStickyAssignor()
    owned: Result = previous
    for generation in range(4, 10):
        subscriptions = owned_subscriptions(members, owned, generation)
        result = assignor.assign(counts, subscriptions)
        check_cooperative_round(subscriptions, result)
        revoked = any(
            set(s.owned_partitions) - set(result[m].partitions) for m, s in subscriptions.items()
        )
        owned = result
        if not revoked:
            break
    else:
        pytest.fail("cooperative rebalances did not settle")
    check_valid(counts, members, owned)
    check_balanced(members, owned)


def test_cooperative_gives_a_partition_two_members_claim_in_one_generation_to_no_one() -> None:
    # As Kafka's AbstractStickyAssignor (partitionsWithMultiplePreviousOwners): both
    # claimants may be consuming t-1, so not even the one the target gives it to keeps it;
    # both revoke it, and the next round deals it out.
    counts = {"t": 4}
    tie = {
        "A": Subscription(("t",), owned_partitions=(tp("t", 0), tp("t", 1)), generation_id=4),
        "B": Subscription(("t",), owned_partitions=(tp("t", 1), tp("t", 2)), generation_id=4),
    }
    first = CooperativeStickyAssignor().assign(counts, tie)
    assert parts(first) == {"A": [tp("t", 0)], "B": [tp("t", 2), tp("t", 3)]}
    after = {
        m: Subscription(("t",), owned_partitions=first[m].partitions, generation_id=5) for m in tie
    }
    second = CooperativeStickyAssignor().assign(counts, after)
    assert parts(second) == {"A": [tp("t", 0), tp("t", 1)], "B": [tp("t", 2), tp("t", 3)]}


def test_cooperative_moves_a_partition_in_two_rounds() -> None:
    assignor = CooperativeStickyAssignor()
    counts = {"t": 3}
    everything = (tp("t", 0), tp("t", 1), tp("t", 2))
    first_in = {
        "C0": Subscription(("t",), owned_partitions=everything, generation_id=1),
        "C1": Subscription(("t",)),
    }
    first = assignor.assign(counts, first_in)
    # C0 gives up t-2 (it keeps its first partitions); C1 does not get it yet.
    assert parts(first) == {"C0": [tp("t", 0), tp("t", 1)], "C1": []}
    change = assignment_change(everything, first["C0"].partitions, RebalanceProtocol.COOPERATIVE)
    assert change.revoked == (tp("t", 2),) and change.added == () and change.rejoin
    second_in = {
        "C0": Subscription(("t",), owned_partitions=first["C0"].partitions, generation_id=2),
        "C1": Subscription(("t",), generation_id=2),
    }
    second = assignor.assign(counts, second_in)
    assert parts(second) == {"C0": [tp("t", 0), tp("t", 1)], "C1": [tp("t", 2)]}
    change = assignment_change((), second["C1"].partitions, RebalanceProtocol.COOPERATIVE)
    assert change.added == (tp("t", 2),) and not change.rejoin


def test_assignment_change_eager_revokes_everything() -> None:
    change = assignment_change(
        [tp("t", 0), tp("t", 1)], [tp("t", 1), tp("t", 2)], RebalanceProtocol.EAGER
    )
    assert change.revoked == (tp("t", 0), tp("t", 1))
    assert change.added == (tp("t", 1), tp("t", 2))
    assert not change.rejoin


# --- Encoding --------------------------------------------------------------------------------

partition_lists = st.lists(st.tuples(st.sampled_from(TOPIC_NAMES), st.integers(0, 2**31 - 1)))


@FAST
@given(
    topics=st.lists(st.text(min_size=1, max_size=8)),
    user_data=st.binary(max_size=20),
    owned=partition_lists,
    generation=st.integers(-1, 2**31 - 1),
    rack=st.one_of(st.none(), st.text(max_size=5)),
    instance=st.one_of(st.none(), st.text(min_size=1, max_size=5)),
)
def test_subscription_round_trip(
    topics: list[str],
    user_data: bytes,
    owned: list[TopicPartitionKey],
    generation: int,
    rack: str | None,
    instance: str | None,
) -> None:
    sub = Subscription(tuple(topics), user_data, tuple(owned), generation, instance, rack)
    assert decode_subscription(encode_subscription(sub), instance) == sub


@FAST
@given(partitions=partition_lists, user_data=st.binary(max_size=20))
def test_assignment_round_trip(partitions: list[TopicPartitionKey], user_data: bytes) -> None:
    assignment = Assignment(tuple(partitions), user_data)
    assert decode_assignment(encode_assignment(assignment)) == assignment


@FAST
@given(partitions=partition_lists, generation=st.integers(-1, 2**31 - 1))
def test_sticky_user_data_round_trip(partitions: list[TopicPartitionKey], generation: int) -> None:
    data = encode_sticky_user_data(partitions, generation)
    assert decode_sticky_user_data(data) == (Assignment(tuple(partitions)).partitions, generation)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=40))
def test_arbitrary_bytes_decode_or_raise_the_typed_error(data: bytes) -> None:
    for decode in (decode_subscription, decode_assignment, decode_sticky_user_data):
        try:
            decode(data)
        except MalformedConsumerProtocolError as exc:
            assert exc.code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def _bad_utf8_topic() -> bytes:
    # Field 1 (topics), length 2, bytes that are not UTF-8.
    return b"\x0a\x02\xc3\x28"


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xff\xff",
        b"\x0a\x05ab",  # truncated length-delimited field
        b"\x00",  # field number 0
        _bad_utf8_topic(),
        pb.ConsumerProtocolSubscription(topics=[""]).SerializeToString(),
        pb.ConsumerProtocolSubscription(generation_id=-2).SerializeToString(),
        pb.ConsumerProtocolSubscription(
            owned_partitions=[pb.ConsumerProtocolTopicPartitions(topic="t", partitions=[-1])]
        ).SerializeToString(),
        pb.ConsumerProtocolSubscription(
            owned_partitions=[pb.ConsumerProtocolTopicPartitions(topic="", partitions=[0])]
        ).SerializeToString(),
    ],
)
def test_malformed_subscription_raises_the_typed_error(data: bytes) -> None:
    with pytest.raises(MalformedConsumerProtocolError):
        decode_subscription(data)


def test_malformed_assignment_raises_the_typed_error() -> None:
    bad = pb.ConsumerProtocolAssignment(
        assigned_partitions=[pb.ConsumerProtocolTopicPartitions(topic="t", partitions=[-3])]
    ).SerializeToString()
    for data in (bad, b"\xff\xff\xff", b"\x0a\x02\x0a"):
        with pytest.raises(MalformedConsumerProtocolError):
            decode_assignment(data)
    assert decode_assignment(b"") == Assignment(())


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    data = encode_subscription(Subscription(("t",))) + b"\xa0\x06\x01"  # field 100, varint 1
    assert decode_subscription(data) == Subscription(("t",))


# --- The leader's step ------------------------------------------------------------------------


def test_leader_gives_a_member_with_garbage_metadata_an_empty_assignment() -> None:
    members = [
        GroupMember("good-1", encode_subscription(Subscription(("t",)))),
        GroupMember("garbage", b"\xff\xff\xff"),
        GroupMember("good-2", encode_subscription(Subscription(("t",))), "static-2"),
    ]
    group = decode_group_subscription(members)
    assert sorted(group.subscriptions) == ["good-1", "good-2"]
    assert group.subscriptions["good-2"].group_instance_id == "static-2"
    assert set(group.malformed) == {"garbage"}
    result = assign_group(RangeAssignor(), {"t": 3}, group, RebalanceProtocol.EAGER)
    # The static member comes first.
    assert parts(result) == {
        "good-2": [tp("t", 0), tp("t", 1)],
        "good-1": [tp("t", 2)],
        "garbage": [],
    }
    assert decode_assignment(encode_assignment(result["garbage"])) == Assignment(())


class _BrokenAssignor(ConsumerPartitionAssignor):
    name = "broken"

    def __init__(self, result: dict[str, Assignment]) -> None:
        self.result = result

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        return self.result


def test_leader_rejects_an_assignment_that_breaks_the_rules() -> None:
    subs = {
        "A": Subscription(("t",), owned_partitions=(tp("t", 0),), generation_id=1),
        "B": Subscription(("t",)),
    }
    group = decode_group_subscription(
        GroupMember(m, encode_subscription(s)) for m, s in subs.items()
    )
    twice = {"A": Assignment((tp("t", 0),)), "B": Assignment((tp("t", 0),))}
    missing = {"A": Assignment((tp("t", 7),))}
    stranger = {"Z": Assignment(())}
    stolen = {"A": Assignment(()), "B": Assignment((tp("t", 0),))}
    for bad in (twice, missing, stranger):
        with pytest.raises(AssignmentError):
            assign_group(_BrokenAssignor(bad), {"t": 2}, group, RebalanceProtocol.EAGER)
    with pytest.raises(AssignmentError):
        assign_group(_BrokenAssignor(stolen), {"t": 2}, group, RebalanceProtocol.COOPERATIVE)
    # Eager members revoked everything before joining: a move is fine.
    eager = assign_group(_BrokenAssignor(stolen), {"t": 2}, group, RebalanceProtocol.EAGER)
    assert parts(eager) == {"A": [], "B": [tp("t", 0)]}


def test_rebalance_protocol_selection_and_assignor_names() -> None:
    assert select_rebalance_protocol([CooperativeStickyAssignor()]) is RebalanceProtocol.COOPERATIVE
    assert (
        select_rebalance_protocol([CooperativeStickyAssignor(), RangeAssignor()])
        is RebalanceProtocol.EAGER
    )
    with pytest.raises(ValueError):
        select_rebalance_protocol([])
    with pytest.raises(ValueError):
        assignor_for("nope")
    assert sorted(ASSIGNORS) == ["cooperative-sticky", "range", "roundrobin", "sticky"]


def test_member_order_is_java_string_order_static_first() -> None:
    members = {"b": None, "a": None, "z": "i1", "y": "i0", "\U0001f600": None, "\uff61": None}
    ordered = sorted(members, key=lambda m: member_sort_key(m, members[m]))
    # UTF-16: the surrogate pair of U+1F600 (0xD83D...) sorts before U+FF61, as in Java.
    assert ordered == ["y", "z", "a", "b", "\U0001f600", "\uff61"]
