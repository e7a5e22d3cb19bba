"""The controller candidate's view of its etcd prefix, kept by watch events (pure)."""

from __future__ import annotations

from highwater.etcd_metadata.connection import KeyVersion
from highwater.etcd_metadata.prefix_view import KeyChange, PrefixView


def kv(value: bytes, revision: int) -> KeyVersion:
    return KeyVersion(value, revision, revision, 0)


def test_a_view_is_current_only_when_loaded_and_watched_from_just_after_the_read() -> None:
    view = PrefixView()
    assert not view.current
    view.watching_from(11)
    assert not view.current  # never loaded
    view.load(10, {"a": kv(b"1", 5)})
    assert view.current
    view.watch_broken()
    assert not view.current
    view.watching_from(20)  # changes 11..19 would be missed
    assert not view.current
    view.load(19, {"a": kv(b"1", 5)})
    assert view.current


def test_changes_apply_once_in_order_and_deletions_remove_keys() -> None:
    view = PrefixView()
    view.watching_from(11)
    view.load(10, {"a": kv(b"1", 5), "b": kv(b"2", 9)})
    assert view.apply([KeyChange("a", 9, kv(b"old", 9))]) is False  # the read holds it
    assert view.apply([KeyChange("a", 11, kv(b"3", 11)), KeyChange("b", 12, None)])
    assert view.keys == {"a": kv(b"3", 11)} and view.revision == 12
    # One transaction: a delete and a put at one revision.
    assert view.apply([KeyChange("a", 13, None), KeyChange("c", 13, kv(b"4", 13))])
    assert view.keys == {"c": kv(b"4", 13)} and view.revision == 13


def test_changes_newer_than_a_read_in_flight_survive_its_answer() -> None:
    view = PrefixView()
    view.watching_from(11)
    view.load(10, {})
    # The watch delivers 11 and 12 while a whole read, answered at 11, is in flight.
    view.apply([KeyChange("a", 11, kv(b"1", 11)), KeyChange("b", 12, kv(b"2", 12))])
    view.load(11, {"a": kv(b"1", 11)})
    assert view.keys == {"a": kv(b"1", 11), "b": kv(b"2", 12)} and view.revision == 12
    assert view.current


def test_a_reader_is_told_the_keys_changed_since_it_last_looked_or_all_after_a_load() -> None:
    view = PrefixView()
    view.watching_from(11)
    view.load(10, {"a": kv(b"1", 5), "b": kv(b"2", 9)})
    assert view.take_changes() is None  # loaded: any key may have changed
    assert view.take_changes() == set()
    view.apply([KeyChange("a", 11, kv(b"3", 11)), KeyChange("b", 12, None)])
    view.apply([KeyChange("a", 10, kv(b"old", 10))])  # older than the view: not a change
    assert view.take_changes() == {"a", "b"}
    assert view.take_changes() == set()
    view.load(20, {"c": kv(b"4", 20)})
    assert view.take_changes() is None


def test_changes_a_reader_kept_back_are_given_again_with_the_newer_ones() -> None:
    view = PrefixView()
    view.watching_from(11)
    view.load(10, {"a": kv(b"1", 5)})
    assert view.take_changes() is None
    view.apply([KeyChange("a", 11, kv(b"2", 11))])
    taken = view.take_changes()
    assert taken == {"a"}
    view.keep_changes(taken)  # the reader could not judge them yet
    view.apply([KeyChange("b", 12, kv(b"3", 12))])
    assert view.take_changes() == {"a", "b"}
    assert view.take_changes() == set()
