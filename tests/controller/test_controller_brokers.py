"""Broker lifecycle: registration, fencing until caught up, session timeout, controlled shutdown."""

from __future__ import annotations

from controller_helpers import NONE, Harness, check_invariants
from highwater.controller import ControllerConfig
from highwater.controller.results import ControllerResult
from highwater.controller_api.messages import (
    AlterableConfig,
    AlterConfigsRequest,
    AlterConfigsResource,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    OfflineReplica,
    RegisterBrokerRequest,
    UnregisterBrokerRequest,
)
from highwater.metadata import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    ConfigResourceType,
    FenceBrokerRecord,
    PartitionChangeRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)
from highwater.v1.common_pb2 import ErrorCode

SESSION = 9000


# --- Registration ----------------------------------------------------------------------


def test_a_registration_is_fenced_with_the_offset_of_its_record_as_epoch() -> None:
    h = Harness()
    h.store.append([])  # nothing
    result = h.controller.register_broker(
        RegisterBrokerRequest(3, "inc-a", rack="r1"), h.clock.now_ms
    )
    assert result.records == [RegisterBrokerRecord(3, "inc-a", 0, (), "r1", fenced=True)]
    h.commit(result)
    assert result.response.broker_epoch == 0 == h.image.offset
    broker = h.image.broker(3)
    assert broker is not None and broker.fenced and broker.rack == "r1"


def test_a_retried_registration_gets_the_same_epoch_and_no_record() -> None:
    h = Harness()
    first = h.register(1)
    again = h.controller.register_broker(
        RegisterBrokerRequest(1, "incarnation-1", h.broker(1).listeners),
        h.clock.now_ms,
    )
    assert again.records == []
    assert again.response.broker_epoch == first.broker_epoch


def test_a_new_incarnation_gets_a_new_epoch_once_the_old_session_expired() -> None:
    h = Harness()
    h.start_brokers([1])
    old_epoch = h.epochs[1]
    refused = h.controller.register_broker(RegisterBrokerRequest(1, "restarted"), h.clock.now_ms)
    assert refused.records == []
    assert refused.response.error == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    h.clock.advance(SESSION)
    response = h.register(1, incarnation="restarted")
    assert response.error == NONE
    assert response.broker_epoch > old_epoch
    broker = h.image.broker(1)
    assert broker is not None and broker.fenced and broker.incarnation_id == "restarted"
    # The old epoch is stale now.
    stale = h.controller.broker_heartbeat(
        BrokerHeartbeatRequest(1, old_epoch, h.image.offset), h.clock.now_ms
    )
    assert stale.response.error == ErrorCode.STALE_BROKER_EPOCH


def test_a_broker_that_shut_down_cleanly_may_re_register_at_once() -> None:
    h = Harness()
    h.start_brokers([1])
    request = RegisterBrokerRequest(1, "restarted", previous_broker_epoch=h.epochs[1])
    result = h.controller.register_broker(request, h.clock.now_ms)
    assert result.response.error == NONE
    assert result.response.broker_epoch > h.epochs[1]


def test_a_new_incarnation_of_a_live_broker_moves_its_leaderships_in_the_same_batch() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 2, 2)
    led = {p for p in range(2) if h.partition("t", p).leader == 1}
    h.clock.advance(SESSION)  # the session expired, but no tick fenced it yet
    h.heartbeat(2)
    result = h.controller.register_broker(RegisterBrokerRequest(1, "again"), h.clock.now_ms)
    assert isinstance(result.records[0], RegisterBrokerRecord)
    h.commit(result)
    for p in range(2):
        partition = h.partition("t", p)
        assert partition.leader == 2 and partition.isr == (2,)
    assert led  # the test did move something
    check_invariants(h.image)


def test_registration_errors() -> None:
    h = Harness(ControllerConfig(cluster_id="cluster-a"))
    controller, now = h.controller, h.clock.now_ms
    wrong = controller.register_broker(RegisterBrokerRequest(1, "i", cluster_id="b"), now)
    assert wrong.response.error == ErrorCode.INCONSISTENT_CLUSTER_ID and not wrong.records
    assert controller.register_broker(RegisterBrokerRequest(-1, "i"), now).response.error == (
        ErrorCode.INVALID_REQUEST
    )
    assert controller.register_broker(RegisterBrokerRequest(1, ""), now).response.error == (
        ErrorCode.INVALID_REQUEST
    )
    ok = controller.register_broker(RegisterBrokerRequest(1, "i", cluster_id="cluster-a"), now)
    assert ok.response.error == NONE


# --- Heartbeats and fencing ------------------------------------------------------------


def test_a_broker_stays_fenced_until_it_has_replayed_its_registration() -> None:
    h = Harness()
    h.start_brokers([1])
    h.create_topic("t", 1, 1)
    h.register(2)
    registration_offset = h.epochs[2]
    behind = h.heartbeat(2, offset=registration_offset - 1)
    assert behind.is_fenced and not behind.is_caught_up
    assert h.broker(2).fenced
    result = h.controller.broker_heartbeat(
        BrokerHeartbeatRequest(2, h.epochs[2], registration_offset), h.clock.now_ms
    )
    assert result.records == [UnfenceBrokerRecord(2, h.epochs[2])]
    assert not result.response.is_fenced and result.response.is_caught_up
    h.commit(result)
    assert h.image.is_active_broker(2)
    # A fenced broker that wants to stay fenced stays fenced.
    h.register(3)
    assert h.heartbeat(3, want_fence=True).is_fenced


def test_heartbeats_from_unknown_or_stale_brokers_are_refused() -> None:
    h = Harness()
    unknown = h.controller.broker_heartbeat(BrokerHeartbeatRequest(5, 0, 0), h.clock.now_ms)
    assert unknown.response.error == ErrorCode.BROKER_ID_NOT_REGISTERED
    h.start_brokers([5])
    stale = h.controller.broker_heartbeat(
        BrokerHeartbeatRequest(5, h.epochs[5] + 1, 0), h.clock.now_ms
    )
    assert stale.response.error == ErrorCode.STALE_BROKER_EPOCH and not stale.records


def test_a_silent_broker_is_fenced_and_loses_its_leaderships_in_the_same_batch() -> None:
    h = Harness()
    h.start_brokers([1, 2, 3])
    h.create_topic("t", 6, 3)
    led_by_1 = [p for p in range(6) if h.partition("t", p).leader == 1]
    assert led_by_1
    h.clock.advance(SESSION - 1)
    h.heartbeat(2)
    h.heartbeat(3)
    assert h.controller.tick(h.clock.now_ms).records == []  # not yet
    h.clock.advance(1)
    result = h.controller.tick(h.clock.now_ms)
    assert result.response.fenced_brokers == (1,)
    assert result.records[0] == FenceBrokerRecord(1, h.epochs[1])
    changes = [r for r in result.records if isinstance(r, PartitionChangeRecord)]
    assert len(changes) == 6  # every partition: leaders moved, ISRs shrunk
    h.commit(result)
    for p in range(6):
        partition = h.partition("t", p)
        assert 1 not in partition.isr
        assert partition.leader in (2, 3)
        assert partition.leader == next(b for b in partition.replicas if b != 1)
    for p in led_by_1:
        assert h.partition("t", p).leader_epoch == 1
    check_invariants(h.image)


def test_a_disconnected_broker_is_fenced_at_once_and_only_in_its_epoch() -> None:
    h = Harness()
    h.start_brokers([1, 2, 3])
    h.create_topic("t", 6, 3)
    epoch = h.epochs[1]
    # Another epoch's stream (an older incarnation's), or an unknown broker: nothing.
    assert h.controller.broker_disconnected(1, epoch - 1).records == []
    assert h.controller.broker_disconnected(9, 0).records == []
    # Its own: fenced now, with no session expired, its leaderships moved in the batch.
    result = h.controller.broker_disconnected(1, epoch)
    assert result.response is True
    assert result.records[0] == FenceBrokerRecord(1, epoch)
    changes = [r for r in result.records if isinstance(r, PartitionChangeRecord)]
    assert len(changes) == 6
    h.commit(result)
    assert h.broker(1).fenced
    for p in range(6):
        assert h.partition("t", p).leader in (2, 3) and 1 not in h.partition("t", p).isr
    # Told twice (a stream of the same epoch again): already fenced, nothing more.
    again = h.controller.broker_disconnected(1, epoch)
    assert again.records == [] and again.response is False
    check_invariants(h.image)


def test_the_last_isr_member_stays_and_the_partition_goes_offline() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 2)
    h.clock.advance(SESSION)
    h.heartbeat(2)
    h.tick()  # broker 1 fenced
    partition = h.partition("t")
    assert partition.isr == (2,) and partition.leader == 2
    h.clock.advance(SESSION)
    h.tick()  # broker 2 fenced: the last ISR member
    partition = h.partition("t")
    assert partition.isr == (2,)
    assert partition.leader == NO_LEADER
    check_invariants(h.image)
    # Broker 1 comes back: not in the ISR, so no clean election; the partition stays offline.
    h.clock.advance(1)
    h.register(1, incarnation="back")
    h.heartbeat(1)
    assert h.partition("t").leader == NO_LEADER
    # Broker 2 comes back: it is the ISR, it leads again.
    h.register(2, incarnation="back")
    h.heartbeat(2)
    partition = h.partition("t")
    assert partition.leader == 2 and partition.isr == (2,)
    check_invariants(h.image)


def test_an_unclean_election_needs_the_topic_to_allow_it() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 2, {"unclean.leader.election.enable": "true"})
    h.create_topic("u", 1, 2)
    h.clock.advance(SESSION)
    h.heartbeat(1)
    h.tick()  # 2 fenced
    h.clock.advance(SESSION)
    h.tick()  # 1 fenced: both topics offline, ISR (1,)
    assert h.partition("t").leader == NO_LEADER and h.partition("u").leader == NO_LEADER
    h.register(2, incarnation="back")
    h.heartbeat(2)  # broker 2 is not in the ISR
    assert h.partition("t").leader == 2 and h.partition("t").isr == (2,)
    assert h.partition("u").leader == NO_LEADER
    check_invariants(h.image)


def test_a_tick_elects_unclean_leaders_once_the_config_allows_it() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("u", 1, 2)
    h.clock.advance(SESSION)
    h.heartbeat(1)
    h.tick()
    h.clock.advance(SESSION)
    h.tick()
    h.register(2, incarnation="back")
    h.heartbeat(2)
    assert h.partition("u").leader == NO_LEADER

    h.commit(
        h.controller.alter_configs(
            AlterConfigsRequest(
                (
                    AlterConfigsResource(
                        ConfigResourceType.TOPIC,
                        "u",
                        (AlterableConfig("unclean.leader.election.enable", value="true"),),
                    ),
                )
            )
        )
    )
    result = h.controller.tick(h.clock.now_ms)
    assert result.response.unclean_elections == 1
    h.commit(result)
    assert h.partition("u").leader == 2


def test_a_broker_may_ask_to_be_fenced() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 2, 2)
    response = h.heartbeat(1, want_fence=True)
    assert response.is_fenced
    assert h.broker(1).fenced
    assert all(h.partition("t", p).leader == 2 for p in range(2))
    check_invariants(h.image)


def test_a_restarted_controller_gives_every_broker_a_full_session() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    h.clock.advance(SESSION - 1)
    h.controller.activate(h.clock.now_ms)  # a failover: the new controller heard nobody yet
    h.clock.advance(SESSION - 1)
    assert h.controller.tick(h.clock.now_ms).records == []
    h.clock.advance(1)
    assert h.controller.tick(h.clock.now_ms).response.fenced_brokers == (1, 2)


# --- Controlled shutdown ---------------------------------------------------------------


def test_controlled_shutdown_moves_leadership_first_then_lets_the_broker_go() -> None:
    h = Harness()
    h.start_brokers([1, 2, 3])
    h.create_topic("t", 6, 2)
    assert h.image.partitions_led_by(1)
    result = h.controller.broker_heartbeat(
        BrokerHeartbeatRequest(1, h.epochs[1], h.image.offset, want_shutdown=True),
        h.clock.now_ms,
    )
    assert result.records[0] == BrokerRegistrationChangeRecord(
        1, h.epochs[1], in_controlled_shutdown=True
    )
    assert not result.response.should_shut_down
    h.commit(result)
    assert not h.image.partitions_led_by(1)
    assert all(1 not in h.partition("t", p).isr for p in range(6))
    check_invariants(h.image)
    # Not yet: the other brokers have not replayed the new leaders.
    assert not h.heartbeat(1, want_shutdown=True).should_shut_down
    h.heartbeat(2)
    assert not h.heartbeat(1, want_shutdown=True).should_shut_down
    h.heartbeat(3)
    done = h.heartbeat(1, want_shutdown=True)
    assert done.should_shut_down and not done.is_fenced
    # It cannot take it back.
    assert h.heartbeat(1).should_shut_down


def test_controlled_shutdown_of_the_last_isr_member_takes_the_partition_offline() -> None:
    h = Harness()
    h.start_brokers([1])
    h.create_topic("t", 1, 1)
    h.heartbeat(1, want_shutdown=True)
    partition = h.partition("t")
    assert partition.leader == NO_LEADER and partition.isr == (1,)
    assert h.heartbeat(1, want_shutdown=True).should_shut_down


def test_a_fenced_broker_that_wants_to_shut_down_may_at_once() -> None:
    h = Harness()
    h.register(1)
    response = h.heartbeat(1, offset=-1, want_shutdown=True)
    assert response.should_shut_down and response.is_fenced


def test_a_broker_in_controlled_shutdown_that_goes_silent_is_fenced() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    h.heartbeat(1, want_shutdown=True)
    h.clock.advance(SESSION)
    h.heartbeat(2)
    result = h.controller.tick(h.clock.now_ms)
    assert result.response.fenced_brokers == (1,)
    h.commit(result)
    broker = h.image.broker(1)
    assert broker is not None and broker.fenced and not broker.in_controlled_shutdown


def test_unregistering_a_broker_without_replicas_removes_its_registration() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 1)
    spare = next(b for b in (1, 2) if not h.image.replicas_of(b))
    result = h.controller.unregister_broker(UnregisterBrokerRequest(spare))
    assert result.records[0] == FenceBrokerRecord(spare, h.epochs[spare])
    assert result.records[-1] == UnregisterBrokerRecord(spare, h.epochs[spare])
    h.commit(result)
    assert h.image.broker(spare) is None
    missing = h.controller.unregister_broker(UnregisterBrokerRequest(spare))
    assert missing.response.error == ErrorCode.BROKER_ID_NOT_REGISTERED


def test_every_image_replays_from_the_log() -> None:
    h = Harness()
    h.start_brokers([1, 2, 3])
    h.create_topic("t", 4, 3)
    h.heartbeat(1, want_shutdown=True)
    h.clock.advance(SESSION)
    h.heartbeat(2)
    h.tick()
    assert h.replayed() == h.image


# --- Failed log directories (KIP-858) ----------------------------------------------------


def offline_heartbeat(
    h: Harness, broker_id: int, replicas: list[tuple[str, int]]
) -> ControllerResult[BrokerHeartbeatResponse]:
    """A heartbeat naming a failed log directory and the replicas on it."""
    return h.controller.broker_heartbeat(
        BrokerHeartbeatRequest(
            broker_id,
            h.epochs[broker_id],
            h.image.offset,
            offline_log_dirs=("dir-a",) if replicas else (),
            offline_replicas=tuple(
                OfflineReplica(h.topic_id(topic), partition) for topic, partition in replicas
            ),
        ),
        h.clock.now_ms,
    )


def test_replicas_on_a_failed_log_directory_lose_leadership_and_isr_only() -> None:
    h = Harness()
    h.start_brokers([1, 2, 3])
    h.create_topic("t", 6, 3)
    led_by_1 = [p for p in range(6) if h.partition("t", p).leader == 1]
    offline = led_by_1[:1] + [p for p in range(6) if h.partition("t", p).leader != 1][:1]
    result = offline_heartbeat(h, 1, [("t", p) for p in offline])
    changes = [r for r in result.records if isinstance(r, PartitionChangeRecord)]
    assert len(changes) == 2 and not result.response.is_fenced
    h.commit(result)
    for p in range(6):
        partition = h.partition("t", p)
        if p in offline:
            assert 1 not in partition.isr and partition.leader in (2, 3)
        else:
            assert 1 in partition.isr  # the broker's other directories keep serving
    assert h.broker(1).is_active
    # Every heartbeat repeats the report; nothing more to do once they are off.
    assert offline_heartbeat(h, 1, [("t", p) for p in offline]).records == []
    check_invariants(h.image)


def test_an_offline_replica_is_never_elected_even_as_the_last_isr_member() -> None:
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 2, {"unclean.leader.election.enable": "true"})
    h.clock.advance(SESSION)
    h.heartbeat(1)
    h.tick()  # 2 fenced: 1 is the whole ISR and leads
    assert h.partition("t").isr == (1,) and h.partition("t").leader == 1
    h.commit(offline_heartbeat(h, 1, [("t", 0)]))
    partition = h.partition("t")
    assert partition.isr == (1,) and partition.leader == NO_LEADER  # no one else may lead
    # Broker 2 comes back: an unclean election (allowed) picks it, never broker 1.
    h.register(2, incarnation="back")
    h.heartbeat(2)
    assert h.partition("t").leader == 2 and h.partition("t").isr == (2,)
    check_invariants(h.image)


def test_a_registration_records_the_brokers_log_directory_ids() -> None:
    h = Harness()
    request = RegisterBrokerRequest(1, "inc", log_dirs=("dir-a", "dir-b"))
    first = h.commit(h.controller.register_broker(request, h.clock.now_ms))
    assert h.broker(1).log_dirs == ("dir-a", "dir-b")
    assert h.replayed().broker(1).log_dirs == ("dir-a", "dir-b")  # replayed from the log
    # A retry is the same registration; the same incarnation with other directories is not.
    assert h.controller.register_broker(request, h.clock.now_ms).records == []
    changed = RegisterBrokerRequest(1, "inc", log_dirs=("dir-b",))
    second = h.commit(h.controller.register_broker(changed, h.clock.now_ms))
    assert second.broker_epoch > first.broker_epoch and h.broker(1).log_dirs == ("dir-b",)
