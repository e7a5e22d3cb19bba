"""KIP-853 voter sets: the VotersRecord, bootstrap parsing, and each refusal of a change."""

from __future__ import annotations

import itertools
import uuid

import pytest
from highwater.errors import InvalidRecordError, KafkaStorageError
from highwater.raft.voter_set import (
    ChangeInProgressError,
    DuplicateVoterError,
    InvalidVoterError,
    LastVoterError,
    LeaderView,
    NotAControllerError,
    NotCaughtUpError,
    Voter,
    VoterNotFoundError,
    VoterSet,
    VoterSetHistory,
    check_add_voter,
    check_remove_voter,
    check_update_voter,
    decode_voters_record,
    encode_voters_record,
    is_voters_record,
    load_or_create_directory_id,
    parse_initial_controllers,
)
from highwater.v1.common_pb2 import ErrorCode

D1, D2, D3, D4, DNEW = (uuid.UUID(int=i) for i in (1, 2, 3, 4, 99))


def three() -> VoterSet:
    return VoterSet.of([Voter(1, D1, "h1:9001"), Voter(2, D2, "h2:9001"), Voter(3, D3, "h3:9001")])


def view(voters: VoterSet | None = None, **overrides: object) -> LeaderView:
    fields: dict[str, object] = {
        "voters": voters or three(),
        "leader_id": 1,
        "log_end_offset": 100,
        "pending_change": False,
        "committed_in_epoch": True,
    }
    fields.update(overrides)
    return LeaderView(**fields)  # type: ignore[arg-type]


def add(
    v: LeaderView, voter: Voter, caught_up_ms: int | None = 950, endpoint: str | None = None
) -> VoterSet:
    return check_add_voter(
        v,
        voter,
        observer_caught_up_ms=caught_up_ms,
        observer_directory_id=voter.directory_id,
        observer_endpoint=voter.endpoint if endpoint is None else endpoint,
        now_ms=1000,
        catch_up_ms=100,
    )


def test_voters_record_round_trips_and_is_recognised() -> None:
    value = encode_voters_record(three())
    assert is_voters_record(value)
    assert decode_voters_record(value) == three()
    with pytest.raises(InvalidRecordError):
        decode_voters_record(b'{"type":"voters","version":0,"voters":[{"id":1}]}')
    with pytest.raises(InvalidRecordError):
        decode_voters_record(b'{"type":"leader_change","leader_id":1,"voters":[1]}')


def test_initial_controllers_parse_and_bad_entries_are_named() -> None:
    voters = parse_initial_controllers(f"1@h1:9001:{D1},2@h2:9001:{D2},3@h3:9001:{D3}")
    assert voters == three()
    for bad in (f"x@h:1:{D1}", f"1@h:0:{D1}", "1@h:1:not-a-uuid", f"1h:1:{D1}", ""):
        with pytest.raises(InvalidVoterError):
            parse_initial_controllers(bad)
    with pytest.raises(DuplicateVoterError):
        parse_initial_controllers(f"1@h1:9001:{D1},1@h2:9001:{D2}")


def test_directory_id_is_made_once_and_a_wiped_dir_gets_a_new_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    first = load_or_create_directory_id(tmp_path / "a")
    assert load_or_create_directory_id(tmp_path / "a") == first
    assert load_or_create_directory_id(tmp_path / "b") != first
    (tmp_path / "a" / "directory-id").write_text("garbage")
    with pytest.raises(KafkaStorageError):
        load_or_create_directory_id(tmp_path / "a")


def test_add_a_caught_up_observer() -> None:
    assert add(view(), Voter(4, D4, "h4:9001")).ids == {1, 2, 3, 4}


def test_add_refuses_an_observer_not_caught_up() -> None:
    for caught_up_ms in (None, 899):
        with pytest.raises(NotCaughtUpError, match="not a caught-up observer") as info:
            add(view(), Voter(4, D4, "h4:9001"), caught_up_ms)
        assert info.value.code == ErrorCode.REQUEST_TIMED_OUT


def test_add_refuses_an_observer_that_announces_no_controller_endpoint() -> None:
    # A broker's or a coordinator's metadata replica fetches with a directory id and no
    # endpoint: caught up or not, whatever endpoint the request names, it is refused.
    new = Voter(4, D4, "h4:9001")
    for caught_up_ms in (950, None):
        with pytest.raises(NotAControllerError, match="node 4 is not a controller"):
            add(view(), new, caught_up_ms=caught_up_ms, endpoint="")
    assert NotAControllerError.code == ErrorCode.INVALID_REQUEST
    # Never heard from (no endpoint known either way): the caught-up rule refuses it.
    with pytest.raises(NotCaughtUpError):
        check_add_voter(
            view(),
            new,
            observer_caught_up_ms=None,
            observer_directory_id=None,
            observer_endpoint=None,
            now_ms=1000,
            catch_up_ms=100,
        )
    assert 4 in add(view(), new, endpoint="h4:9001").ids


def test_a_second_change_while_one_is_uncommitted_is_refused() -> None:
    pending = view(pending_change=True)
    fresh_leader = view(committed_in_epoch=False)
    for v in (pending, fresh_leader):
        with pytest.raises(ChangeInProgressError) as info:
            add(v, Voter(4, D4, "h4:9001"))
        assert info.value.code == ErrorCode.REQUEST_TIMED_OUT
        with pytest.raises(ChangeInProgressError):
            check_remove_voter(v, 2, None)
        with pytest.raises(ChangeInProgressError):
            check_update_voter(v, Voter(2, D2, "h2:9002"))


def test_a_reused_id_with_a_new_directory_is_a_different_voter() -> None:
    with pytest.raises(DuplicateVoterError, match="remove the old voter first"):
        add(view(), Voter(3, DNEW, "h3:9001"))
    with pytest.raises(VoterNotFoundError):
        check_remove_voter(view(), 3, DNEW)
    with pytest.raises(VoterNotFoundError):
        check_update_voter(view(), Voter(3, DNEW, "h3:9002"))
    # Remove the old incarnation, then the new one can be added.
    removed = check_remove_voter(view(), 3, D3).voters
    assert add(view(removed), Voter(3, DNEW, "h3:9001")).get(3) == Voter(3, DNEW, "h3:9001")


def test_removing_the_leader_resigns_it_after_commit_and_the_last_voter_stays() -> None:
    removal = check_remove_voter(view(), 1, None)
    assert removal.leader_resigns and removal.voters.ids == {2, 3}
    assert not check_remove_voter(view(), 2, D2).leader_resigns
    single = VoterSet.of([Voter(1, D1, "h1:9001")])
    with pytest.raises(LastVoterError):
        check_remove_voter(view(single), 1, None)
    with pytest.raises(VoterNotFoundError):
        check_remove_voter(view(), 7, None)


def test_update_changes_the_endpoint_only() -> None:
    assert check_update_voter(view(), Voter(2, D2, "h2:9002")).get(2) == Voter(2, D2, "h2:9002")


def _brute_force_overlap(a: VoterSet, b: VoterSet) -> bool:
    def majorities(s: VoterSet) -> list[set[int]]:
        ids = sorted(s.ids)
        return [
            set(c)
            for r in range(len(ids) + 1)
            for c in itertools.combinations(ids, r)
            if s.is_majority(c)
        ]

    return all(x & y for x in majorities(a) for y in majorities(b))


def test_majority_overlap_matches_brute_force_and_one_change_always_overlaps() -> None:
    universe = range(1, 6)
    sets = [
        VoterSet.of(Voter(i, uuid.UUID(int=i), f"h{i}:1") for i in ids)
        for r in range(1, 6)
        for ids in itertools.combinations(universe, r)
    ]
    for a in sets:
        for b in sets:
            assert a.majorities_overlap(b) == _brute_force_overlap(a, b)
            if len(a.ids ^ b.ids) == 1:
                assert a.majorities_overlap(b)


def test_history_uses_the_latest_set_and_falls_back_on_truncation() -> None:
    base = three()
    four = base.with_voter(Voter(4, D4, "h4:9001"))
    history = VoterSetHistory(base)
    history.add_at(10, four)
    assert history.latest() == four  # in use before it commits
    assert history.pending_change(high_watermark=10)
    assert history.committed(high_watermark=10) == base
    assert not history.pending_change(high_watermark=11)
    assert history.committed(high_watermark=11) == four
    with pytest.raises(ValueError):
        history.add_at(10, base)
    history.truncate_to(10)  # the uncommitted change is cut away
    assert history.latest() == base and history.latest_offset() == -1
    history.add_at(12, four)
    history.add_at(20, four.without(1))
    history.forget_before(15)
    assert history.committed(high_watermark=0) == four
    history.truncate_to(0)
    assert history.latest() == four  # the snapshot's set is never dropped
