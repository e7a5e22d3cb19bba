"""Leader moves in bounded batches: a broker taken out of service has its leaderships and
ISR memberships moved ``leader_moves_per_batch`` partitions at a time (its leaderships
first), the rest by the following ticks, and a newly active controller finishes what a
former one left; a restarted broker's registration moves its old incarnation's the same
way, and the new incarnation stays fenced until they are written. After an unclean
shutdown those moves include its ELR memberships, and the registration record says so:
a controller that becomes active mid-way (from the log or a snapshot) finishes them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from controller_helpers import Harness, check_invariants
from highwater.controller import ControllerConfig, QuorumController
from highwater.controller.store import InMemoryMetadataStore
from highwater.controller_api.messages import RegisterBrokerRequest
from highwater.metadata import (
    FenceBrokerRecord,
    MetadataImage,
    PartitionChangeRecord,
    RegisterBrokerRecord,
    load_snapshot_values,
    replay,
    snapshot_values,
)
from highwater.metadata.image import IndexKind, build_broker_index
from highwater.metadata.records import decode_record, encode_record

BATCH = 5
SESSION = ControllerConfig().broker_session_timeout_ms


def _cluster(batch: int) -> Harness:
    """Three brokers, 24 partitions with replication factor 3: each broker leads 8."""
    h = Harness(ControllerConfig(leader_moves_per_batch=batch))
    h.start_brokers([0, 1, 2])
    h.create_topic("t", partitions=24, replication_factor=3)
    return h


def _silence(h: Harness, broker_id: int) -> None:
    """Let ``broker_id``'s session expire while the others heartbeat."""
    h.clock.advance(SESSION + 1)
    for other in h.image.brokers:
        if other != broker_id:
            h.heartbeat(other)


def _partitions(image: MetadataImage) -> dict[object, object]:
    return {key: (p.leader, p.isr, p.leader_epoch) for key, p in image.partitions()}


def _unbounded_fence_of_broker_0() -> dict[object, object]:
    h = _cluster(batch=1_000)
    _silence(h, 0)
    result = h.controller.tick(h.clock.now_ms)
    assert result.response.fenced_brokers == (0,)
    h.commit(result)
    return _partitions(h.image)


def test_a_fence_moves_leaderships_in_batches_of_bounded_size() -> None:
    h = _cluster(BATCH)
    assert len(h.image.partitions_with_isr_member(0)) == 24
    _silence(h, 0)
    first = h.controller.tick(h.clock.now_ms)
    assert first.response.fenced_brokers == (0,)
    assert isinstance(first.records[0], FenceBrokerRecord)
    assert len(first.records) == 1 + BATCH
    h.commit(first)
    batches = []
    while True:
        tick = h.controller.tick(h.clock.now_ms)
        if not tick.records:
            break
        assert len(tick.records) <= BATCH
        assert all(isinstance(r, PartitionChangeRecord) for r in tick.records)
        assert tick.response.leader_moves == len(tick.records)
        batches.append(len(tick.records))
        h.commit(tick)
    # 24 partitions lose broker 0 from their ISR; 8 of them also get a new leader.
    assert sum(batches) + BATCH == 24
    assert not h.image.partitions_led_by(0) and not h.image.partitions_with_isr_member(0)
    check_invariants(h.image)
    # The same end state as one unbounded batch.
    assert _partitions(h.image) == _unbounded_fence_of_broker_0()


def test_brokers_fenced_together_share_one_batch_budget() -> None:
    def fence_brokers_0_and_1(batch: int) -> tuple[int, dict[object, object]]:
        h = _cluster(batch)
        h.clock.advance(SESSION + 1)
        h.heartbeat(2)
        first = h.controller.tick(h.clock.now_ms)
        assert first.response.fenced_brokers == (0, 1)
        h.commit(first)
        largest = len(first.records) - 2  # beside the two fence records
        while (tick := h.controller.tick(h.clock.now_ms)).records:
            largest = max(largest, len(tick.records))
            h.commit(tick)
        assert not h.image.partitions_led_by(0) and not h.image.partitions_led_by(1)
        check_invariants(h.image)
        return largest, _partitions(h.image)

    largest, bounded = fence_brokers_0_and_1(BATCH)
    assert largest == BATCH
    assert bounded == fence_brokers_0_and_1(1_000)[1]


def test_a_new_controller_finishes_a_half_written_fence() -> None:
    h = _cluster(BATCH)
    _silence(h, 0)
    h.commit(h.controller.tick(h.clock.now_ms))
    assert len(h.image.partitions_with_isr_member(0)) == 24 - BATCH
    # The active controller fails; the next one knows only the image.
    successor = QuorumController(h.store.latest_image, h.config, seed=1)
    successor.activate(h.clock.now_ms)
    ticks = 0
    while (tick := successor.tick(h.clock.now_ms)).records:
        assert len(tick.records) <= BATCH
        h.commit(tick)
        ticks += 1
    assert ticks == 4  # 19 partitions, 5 at a time
    assert not h.image.partitions_with_isr_member(0)
    assert _partitions(h.image) == _unbounded_fence_of_broker_0()
    # Moving a partition off an inactive broker twice changes nothing.
    again = QuorumController(h.store.latest_image, h.config, seed=2)
    again.activate(h.clock.now_ms)
    assert again.tick(h.clock.now_ms).records == []


def test_a_broker_back_in_service_has_no_moves_left() -> None:
    h = _cluster(BATCH)
    h.heartbeat(0, want_fence=True)
    assert h.broker(0).fenced
    assert len(h.image.partitions_with_isr_member(0)) == 24 - BATCH
    h.heartbeat(0)  # caught up: unfenced again
    assert not h.broker(0).fenced
    tick = h.controller.tick(h.clock.now_ms)
    assert tick.response.leader_moves == 0
    assert not tick.records
    assert len(h.image.partitions_with_isr_member(0)) == 24 - BATCH


def test_a_controlled_shutdown_completes_once_its_batches_are_in() -> None:
    h = _cluster(BATCH)
    h.heartbeat(1, want_shutdown=True)
    assert h.broker(1).in_controlled_shutdown
    assert h.image.partitions_led_by(1)
    assert not h.heartbeat(1).should_shut_down
    while (tick := h.controller.tick(h.clock.now_ms)).records:
        assert len(tick.records) <= BATCH
        h.commit(tick)
    assert not h.image.partitions_led_by(1)
    for broker_id in (0, 2):
        h.heartbeat(broker_id)
    assert h.heartbeat(1).should_shut_down
    check_invariants(h.image)


def test_by_default_a_fence_of_thousands_of_partitions_goes_in_batches_of_a_thousand() -> None:
    # Broker 0 is in the ISR of 2,500 partitions (RF 3 on 3 brokers) and leads a third.
    default = ControllerConfig().leader_moves_per_batch
    assert default == 1_000
    h = Harness()
    h.start_brokers([0, 1, 2])
    for topic in range(5):
        h.create_topic(f"t{topic}", partitions=500, replication_factor=3)
    held = len(h.image.partitions_with_isr_member(0))
    assert held == 2_500
    _silence(h, 0)
    sizes = []
    tick = h.controller.tick(h.clock.now_ms)
    assert tick.response.fenced_brokers == (0,)
    while tick.records:
        sizes.append(sum(isinstance(r, PartitionChangeRecord) for r in tick.records))
        h.commit(tick)
        tick = h.controller.tick(h.clock.now_ms)
    assert sizes == [1_000, 1_000, 500]  # ceil(2,500 / 1,000) batches
    assert not h.image.partitions_with_isr_member(0) and not h.image.partitions_led_by(0)
    check_invariants(h.image)


def test_a_fence_moves_the_broker_s_leaderships_before_its_other_isr_memberships() -> None:
    h = _cluster(batch=8)
    assert len(h.image.partitions_led_by(0)) == 8
    _silence(h, 0)
    h.commit(h.controller.tick(h.clock.now_ms))
    # The first batch is the 8 partitions broker 0 led: all have a new leader.
    assert not h.image.partitions_led_by(0)
    assert len(h.image.partitions_with_isr_member(0)) == 16


def test_a_restarted_broker_s_registration_moves_its_old_leaderships_in_batches() -> None:
    h = _cluster(BATCH)
    h.clock.advance(SESSION)  # the old incarnation's session expired, no tick fenced it yet
    h.heartbeat(1)
    h.heartbeat(2)
    result = h.controller.register_broker(
        RegisterBrokerRequest(0, "restarted", h.broker(0).listeners), h.clock.now_ms
    )
    assert isinstance(result.records[0], RegisterBrokerRecord)
    assert len(result.records) == 1 + BATCH
    h.epochs[0] = h.commit(result).broker_epoch
    # Caught up, but the old incarnation's moves are not all written: still fenced.
    assert h.heartbeat(0).is_fenced and h.broker(0).fenced
    ticks = 0
    while (tick := h.controller.tick(h.clock.now_ms)).records:
        assert len(tick.records) <= BATCH
        h.commit(tick)
        ticks += 1
        h.heartbeat(1)
        h.heartbeat(2)
    assert ticks == 4  # 19 partitions left, 5 at a time
    assert not h.image.partitions_led_by(0) and not h.image.partitions_with_isr_member(0)
    check_invariants(h.image)
    assert not h.heartbeat(0).is_fenced
    assert not h.broker(0).fenced


def test_a_new_controller_keeps_a_registered_broker_fenced_until_its_moves_are_in() -> None:
    h = _cluster(BATCH)
    h.clock.advance(SESSION)
    h.heartbeat(1)
    h.heartbeat(2)
    h.epochs[0] = h.register(0, incarnation="restarted").broker_epoch
    assert h.image.partitions_with_isr_member(0)
    successor = QuorumController(h.store.latest_image, h.config, seed=1)
    successor.activate(h.clock.now_ms)
    h.controller = successor
    assert h.heartbeat(0).is_fenced
    while (tick := successor.tick(h.clock.now_ms)).records:
        h.commit(tick)
    assert not h.heartbeat(0).is_fenced
    check_invariants(h.image)


def test_a_prepared_standby_s_later_images_carry_the_indexes_its_activation_reads() -> None:
    h = _cluster(BATCH)
    # A standby's store: the same log replayed, on images that never built an index.
    standby, cold = InMemoryMetadataStore(), InMemoryMetadataStore()
    for _, batch in h.store.batches:
        standby.append(batch)
        cold.append(batch)
    assert not standby.latest_image().topics.built_indexes()
    QuorumController(standby.latest_image, h.config, seed=1).prepare_standby()
    # Later changes, replayed as a standby follows the log.
    moved = PartitionChangeRecord(*_first_partition(h.image), isr=(1, 2), leader=1)
    for store in (standby, cold):
        store.append([moved])
    after = standby.latest_image()
    for kind in (IndexKind.LEADERS, IndexKind.ISR, IndexKind.ELR):
        assert after.topics.built_indexes()[kind] == build_broker_index(
            after.topics.by_id.values(), kind
        )
    assert not cold.latest_image().topics.built_indexes()


def _first_partition(image: MetadataImage) -> tuple[str, int]:
    key, _ = next(iter(image.partitions()))
    return key.topic_id, key.partition_id


# --- An unclean shutdown's ELR removals (KIP-966) ------------------------------------

ELR_PARTITIONS = 12


def _broker_1_in_every_elr(batch: int) -> Harness:
    """Brokers 0, 1, 2; a topic of ``ELR_PARTITIONS`` partitions, replication factor 3,
    ``min.insync.replicas`` 2. Broker 2 is fenced (the ISRs keep 0 and 1), then broker 1
    (the ISRs fall to 0 alone, below min ISR: 1 holds every committed record and joins
    every ELR). Broker 1 then leads nothing and is in no ISR: its ELR memberships are all
    an unclean restart has to remove."""
    h = Harness(ControllerConfig(leader_moves_per_batch=batch))
    h.start_brokers([0, 1, 2])
    h.create_topic(
        "t", partitions=ELR_PARTITIONS, replication_factor=3, configs={"min.insync.replicas": "2"}
    )
    for silent, alive in ((2, (0, 1)), (1, (0,))):
        h.clock.advance(SESSION + 1)
        for broker_id in alive:
            h.heartbeat(broker_id)
        while (tick := h.controller.tick(h.clock.now_ms)).records:
            h.commit(tick)
        assert h.broker(silent).fenced
    assert all(p.elr == (1,) and p.isr == (0,) for _, p in h.image.partitions())
    return h


def _register_unclean(h: Harness, broker_id: int, incarnation: str, previous: int = -1) -> None:
    result = h.controller.register_broker(
        RegisterBrokerRequest(
            broker_id, incarnation, h.broker(broker_id).listeners, previous_broker_epoch=previous
        ),
        h.clock.now_ms,
    )
    h.epochs[broker_id] = h.commit(result).broker_epoch


def _in_an_elr(image: MetadataImage, broker_id: int) -> int:
    return sum(broker_id in p.elr for _, p in image.partitions())


def _unbounded_unclean_restart_of_broker_1() -> dict[object, object]:
    h = _broker_1_in_every_elr(batch=1_000)
    _register_unclean(h, 1, "restarted")
    assert not h.heartbeat(1).is_fenced
    return dict(h.image.partitions())


def _from_the_log(h: Harness) -> InMemoryMetadataStore:
    """A store whose image was replayed from the log's bytes, record by record."""
    records = [decode_record(encode_record(r)) for r in h.store.records]
    return InMemoryMetadataStore(replay(records, h.image.offset, h.image.epoch))


def _from_a_snapshot(h: Harness) -> InMemoryMetadataStore:
    image = h.image
    return InMemoryMetadataStore(
        load_snapshot_values(snapshot_values(image), image.offset, image.epoch)
    )


@pytest.mark.parametrize("successor_store", [_from_the_log, _from_a_snapshot])
def test_a_new_controller_finishes_an_unclean_shutdown_s_elr_removals_before_unfencing(
    successor_store: Callable[[Harness], InMemoryMetadataStore],
) -> None:
    h = _broker_1_in_every_elr(BATCH)
    _register_unclean(h, 1, "restarted")
    registration = h.store.batches[-1][1][0]
    assert isinstance(registration, RegisterBrokerRecord) and registration.unclean_shutdown
    assert _in_an_elr(h.image, 1) == ELR_PARTITIONS - BATCH
    # The active controller fails mid-way; the next one knows only the log (or a snapshot).
    h.store = successor_store(h)
    assert h.broker(1).unclean_shutdown
    h.controller = QuorumController(h.store.latest_image, h.config, seed=1)
    h.controller.activate(h.clock.now_ms)
    assert h.heartbeat(1).is_fenced  # caught up, but still in ELRs: it may have lost records
    ticks = 0
    while (tick := h.controller.tick(h.clock.now_ms)).records:
        assert len(tick.records) <= BATCH
        h.commit(tick)
        ticks += 1
        if _in_an_elr(h.image, 1):
            assert h.heartbeat(1).is_fenced
    assert ticks == 2  # 7 partitions left, 5 at a time
    assert _in_an_elr(h.image, 1) == 0
    assert not h.heartbeat(1).is_fenced
    assert not h.broker(1).unclean_shutdown  # its unfencing settled what was owed
    assert dict(h.image.partitions()) == _unbounded_unclean_restart_of_broker_1()
    check_invariants(h.image)


def test_a_clean_stop_of_an_incarnation_that_still_owed_elr_removals_passes_them_on() -> None:
    h = _broker_1_in_every_elr(BATCH)
    _register_unclean(h, 1, "restarted")
    assert _in_an_elr(h.image, 1) == ELR_PARTITIONS - BATCH
    # That incarnation stops cleanly before the ticks wrote the rest: what it lost before
    # is still lost, so the next registration owes the same removals.
    _register_unclean(h, 1, "restarted-again", previous=h.epochs[1])
    assert h.broker(1).unclean_shutdown
    assert h.heartbeat(1).is_fenced
    while (tick := h.controller.tick(h.clock.now_ms)).records:
        h.commit(tick)
    assert _in_an_elr(h.image, 1) == 0
    assert not h.heartbeat(1).is_fenced
    check_invariants(h.image)


def test_a_clean_restart_after_the_removals_were_written_owes_nothing() -> None:
    h = _broker_1_in_every_elr(BATCH)
    _register_unclean(h, 1, "restarted")
    while (tick := h.controller.tick(h.clock.now_ms)).records:
        h.commit(tick)
    assert not h.heartbeat(1).is_fenced
    _register_unclean(h, 1, "restarted-cleanly", previous=h.epochs[1])
    assert not h.broker(1).unclean_shutdown
    registration = h.store.batches[-1][1][0]
    assert isinstance(registration, RegisterBrokerRecord) and not registration.unclean_shutdown
