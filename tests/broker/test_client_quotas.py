"""Client quotas' pure core: KIP-55's precedence and who shares a quota, Kafka's sampled
rate and throttle time on a fake clock, and the client's bookkeeping of throttled brokers."""

from __future__ import annotations

import heapq

import pytest
from highwater.broker.quotas import QuotaSettings, SampledRate, Throttle, throttle_time_ms
from highwater.client.cluster import BrokerThrottles
from highwater.metadata.client_quotas import (
    DEFAULT_ENTITY,
    PRODUCER_BYTE_RATE,
    ClientQuotaEntity,
    ClientQuotasImage,
    precedence,
)

D = DEFAULT_ENTITY
# KIP-55's order for user "alice" with client id "app", most specific first.
LEVELS = [
    ClientQuotaEntity("alice", "app"),
    ClientQuotaEntity("alice", D),
    ClientQuotaEntity("alice", None),
    ClientQuotaEntity(D, "app"),
    ClientQuotaEntity(D, D),
    ClientQuotaEntity(D, None),
    ClientQuotaEntity(None, "app"),
    ClientQuotaEntity(None, D),
]
# The quota metric tags (user, client id) each level shares its rate under.
TAGS = [
    ("alice", "app"),
    ("alice", "app"),
    ("alice", ""),
    ("alice", "app"),
    ("alice", "app"),
    ("alice", ""),
    ("", "app"),
    ("", "app"),
]


def test_precedence_is_kip_55s_order() -> None:
    assert precedence("alice", "app") == tuple(LEVELS)


@pytest.mark.parametrize("level", range(8))
def test_the_most_specific_entity_that_sets_the_key_wins(level: int) -> None:
    # Every entity from `level` down sets the key (and an unrelated user and client too);
    # the entities above it set only another key.
    entities = {
        ClientQuotaEntity("bob", None): {PRODUCER_BYTE_RATE: 1.0},
        ClientQuotaEntity(None, "other"): {PRODUCER_BYTE_RATE: 2.0},
    }
    for index, entity in enumerate(LEVELS):
        if index >= level:
            entities[entity] = {PRODUCER_BYTE_RATE: 1000.0 + index}
        else:
            entities[entity] = {"consumer_byte_rate": 5.0}
    match = ClientQuotasImage(entities).quota("alice", "app", PRODUCER_BYTE_RATE)
    assert match is not None
    assert (match.bound, match.entity) == (1000.0 + level, LEVELS[level])
    assert (match.user, match.client_id) == TAGS[level]


def test_no_entity_no_quota() -> None:
    quotas = ClientQuotasImage({ClientQuotaEntity("bob", None): {PRODUCER_BYTE_RATE: 1.0}})
    assert quotas.quota("alice", "app", PRODUCER_BYTE_RATE) is None
    assert quotas.quota("bob", "app", "consumer_byte_rate") is None
    assert Throttle().produce.record(quotas, "alice", "app", 10**9, 0).throttle_ms == 0


def test_the_rate_spans_at_least_all_windows_but_one() -> None:
    rate = SampledRate(window_num=11, window_ms=1000)
    rate.record(2000, now_ms=0)
    assert rate.span_ms(0) == 10_000  # a first request is measured over 10 windows
    assert rate.rate(0) == 200.0
    rate.record(1000, now_ms=2500)
    assert rate.span_ms(2500) == 10_500  # two whole windows passed: 2.5 s + 8 windows
    assert rate.total(2500) == 3000
    # Once every window has passed, the first sample is dropped.
    assert rate.total(11_000) == 1000
    assert rate.total(13_500) == 0


def test_throttle_time_is_kafkas() -> None:
    settings = QuotaSettings(window_num=11, window_size_seconds=1)
    rate = SampledRate(settings.window_num, settings.window_ms)
    rate.record(1000, 0)
    assert throttle_time_ms(rate, 100.0, 0) == 0  # 100 B/s, at the quota
    rate.record(1000, 0)
    # 200 B/s over 10 s against 100 B/s: 10 s more makes 2000 B over 20 s, the quota.
    assert throttle_time_ms(rate, 100.0, 0) == 10_000


def test_the_request_quota_is_bounded_by_a_window_and_the_byte_rates_are_not() -> None:
    quotas = ClientQuotasImage(
        {ClientQuotaEntity("alice", None): {PRODUCER_BYTE_RATE: 10.0, "request_percentage": 1.0}}
    )
    throttle = Throttle(QuotaSettings(window_num=2, window_size_seconds=1))
    produced = throttle.produce.record(quotas, "alice", "app", 1000, 0)
    assert produced.throttle_ms == 99_000  # 1000 B/s against 10 B/s over one window
    handled = throttle.request.record(quotas, "alice", "app", 50.0, 0)  # half a second
    assert handled.throttle_ms == 1000


def test_a_users_clients_share_its_quota_and_each_user_has_the_default() -> None:
    quotas = ClientQuotasImage(
        {
            ClientQuotaEntity("alice", None): {PRODUCER_BYTE_RATE: 100.0},
            ClientQuotaEntity(D, None): {PRODUCER_BYTE_RATE: 100.0},
        }
    )
    manager = Throttle(QuotaSettings(window_num=2, window_size_seconds=1)).produce
    assert manager.record(quotas, "alice", "a", 100, 0).throttle_ms == 0
    assert manager.record(quotas, "alice", "b", 100, 0).throttle_ms == 1000  # shared
    assert manager.record(quotas, "bob", "a", 100, 0).throttle_ms == 0  # bob's own
    assert manager.rate("alice", "", 0) == 200.0 and manager.rate("bob", "", 0) == 100.0
    assert len(manager) == 2
    # Rates nobody records to are forgotten once every window has passed.
    manager.record(quotas, "carol", "a", 1, 10_000)
    assert len(manager) == 1


@pytest.mark.parametrize(("batch", "in_flight"), [(4096, 1), (4096, 5), (8192, 5)])
def test_a_throttled_producer_gets_its_rate(batch: int, in_flight: int) -> None:
    """A producer that always has data, answers held for their throttle time and no
    request read while its connection is muted (as the broker's streams do): over whole
    cycles of the windows it gets its quota."""
    quota = 100 * 1024.0
    quotas = ClientQuotasImage({ClientQuotaEntity(None, "app"): {PRODUCER_BYTE_RATE: quota}})
    throttle = Throttle(QuotaSettings(window_num=2, window_size_seconds=1))
    arrivals = [float(i) for i in range(in_flight)]
    heapq.heapify(arrivals)
    muted_until = 0.0
    answered: list[tuple[float, int]] = []
    while (arrival := heapq.heappop(arrivals)) < 20_000:
        handled = max(arrival, muted_until) + 2  # 2 ms to append
        held = throttle.produce.record(quotas, "ANONYMOUS", "app", batch, handled).throttle_ms
        if held:
            muted_until = handled + held
        answered.append((handled + held, batch))
        heapq.heappush(arrivals, handled + held + 0.5)
    for start in (2000.0, 3300.0, 7100.0):
        sent = sum(size for at, size in answered if start <= at < start + 4000)
        assert sent / 4 == pytest.approx(quota, rel=0.1)


def test_the_client_waits_for_a_throttled_broker_from_when_it_sent() -> None:
    throttles = BrokerThrottles()
    throttles.note("b1:9092", sent_at=10.0, throttle_time_ms=0)
    assert throttles.remaining("b1:9092", 10.0) == 0
    throttles.note("b1:9092", sent_at=10.0, throttle_time_ms=500)
    throttles.note("b1:9092", sent_at=10.1, throttle_time_ms=100)  # an earlier end: kept
    assert throttles.remaining("b1:9092", 10.2) == pytest.approx(0.3)
    assert throttles.remaining("b2:9092", 10.2) == 0
    assert throttles.remaining("b1:9092", 10.5) == 0
