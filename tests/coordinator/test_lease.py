"""The coordinator's session lease: it lapses a session after the last acknowledged send."""

from __future__ import annotations

from highwater.coordinator.lease import SessionLease


def test_lease_runs_from_the_send_time_of_the_last_acknowledged_heartbeat() -> None:
    lease = SessionLease(3_000)
    assert lease.renew(1_000) is False
    assert lease.lapse(3_999) is False
    assert lease.lapse(4_000) is True
    assert lease.lapsed
    assert lease.lapse(5_000) is False  # reported once
    assert lease.renew(4_500) is True  # lapsed: the edge reloads its partitions
    assert not lease.lapsed
    assert lease.lapse(7_499) is False


def test_a_late_acknowledgement_of_an_older_heartbeat_does_not_shorten_the_lease() -> None:
    lease = SessionLease(3_000)
    lease.renew(2_000)
    lease.renew(1_000)
    assert lease.lapse(4_999) is False
    assert lease.lapse(5_000) is True
