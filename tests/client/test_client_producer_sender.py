"""The producer's pure parts: Produce requests from batches, what an answer means, and the
sequence numbers of a partition's queue (acknowledged, and started again under a new epoch
when a batch fails for good).
"""

from __future__ import annotations

from typing import Any

import pytest
from highwater.client.producer.accumulator import (
    SEQUENCE_MODULUS,
    PartitionQueue,
    ProducerBatch,
)
from highwater.client.producer.sender import (
    answer_error,
    answers_by_partition,
    create_produce_request,
    is_retriable_answer,
    split_requests,
)
from highwater.records import RecordBatchBuilder, iter_batches
from highwater.v1 import broker_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

PRODUCER_ID, PRODUCER_EPOCH = 7, 1


def batch(
    topic: str, partition: int, count: int, base_sequence: int | None = None
) -> ProducerBatch:
    """A sealed batch of ``count`` records, stamped with ``base_sequence`` when given."""
    builder = RecordBatchBuilder(max_bytes=1 << 20)
    for i in range(count):
        builder.append_fields((None, f"{topic}-{partition}-{i}".encode(), (), 1_000 + i))
    futures: list[Any] = [object()] * count  # only their count matters here
    made = ProducerBatch(topic, partition, builder, 0.0, 0.0, futures, [None] * count)
    if base_sequence is not None:
        made.base_sequence = base_sequence
        builder.set_producer_state(PRODUCER_ID, PRODUCER_EPOCH, base_sequence)
    made.data = builder.build()
    return made


def stamped_sequence(made: ProducerBatch, epoch: int = PRODUCER_EPOCH) -> int:
    """The base sequence written in the batch's bytes (their CRC checked), under ``epoch``."""
    assert made.data is not None
    (parsed,) = iter_batches(made.data, verify_crc=True)
    assert (parsed.header.producer_id, parsed.header.producer_epoch) == (PRODUCER_ID, epoch)
    return parsed.header.base_sequence


def test_a_produce_request_carries_each_batch_grouped_by_topic() -> None:
    batches = [batch("a", 0, 1), batch("b", 2, 2), batch("a", 1, 3)]
    request = create_produce_request(batches, acks=-1, timeout_ms=1500)
    assert (request.acks, request.timeout_ms) == (-1, 1500)
    sent = {(t.topic, p.partition): p.record_batches for t in request.topics for p in t.partitions}
    assert sent == {(b.topic, b.partition): b.data for b in batches}
    assert [t.topic for t in request.topics] == ["a", "b"]


def test_batches_for_one_broker_go_in_as_few_requests_as_fit_in_order() -> None:
    batches = [batch("a", p, 3) for p in range(5)]
    size = len(batches[0].data or b"")
    assert split_requests(batches, max_bytes=2 * size) == [
        batches[0:2],
        batches[2:4],
        batches[4:5],
    ]
    assert split_requests(batches, max_bytes=5 * size) == [batches]
    assert split_requests(batches, max_bytes=size - 1) == [[b] for b in batches]  # alone
    assert split_requests([]) == []


def test_answers_are_found_by_partition_and_errors_name_it() -> None:
    reply = pb.ProduceResponse()
    topic = reply.topics.add(topic="a")
    topic.partitions.add(partition=0, base_offset=10)
    topic.partitions.add(partition=1, error=ErrorCode.NOT_LEADER_OR_FOLLOWER)
    answers = answers_by_partition(reply)
    assert answers[("a", 0)].base_offset == 10
    error = answer_error(batch("a", 1, 1), answers[("a", 1)])
    assert error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert str(error).startswith("a-1: NOT_LEADER_OR_FOLLOWER")


@pytest.mark.parametrize(
    ("code", "retriable"),
    [
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, True),
        (ErrorCode.NOT_ENOUGH_REPLICAS, True),
        (ErrorCode.REQUEST_TIMED_OUT, True),
        (ErrorCode.UNKNOWN_PRODUCER_ID, True),  # resent under the next epoch
        (ErrorCode.MESSAGE_TOO_LARGE, False),
        (ErrorCode.INVALID_RECORD, False),
    ],
)
def test_which_answers_are_resent(code: int, retriable: bool) -> None:
    queue = PartitionQueue("a", 0)
    assert is_retriable_answer(code, batch("a", 0, 1, base_sequence=0), queue) is retriable


def test_a_sequence_error_is_resent_only_behind_an_unanswered_batch() -> None:
    queue = PartitionQueue("a", 0, acked_sequence=5)
    head, behind = batch("a", 0, 2, base_sequence=5), batch("a", 0, 2, base_sequence=7)
    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert not is_retriable_answer(code, head, queue)  # the broker expected this very batch
    assert is_retriable_answer(code, behind, queue)  # an earlier batch is still unanswered
    queue.retrying = True
    assert is_retriable_answer(code, head, queue)


def test_acknowledging_moves_the_sequence_forward_never_back() -> None:
    queue = PartitionQueue("a", 0)
    first, second = batch("a", 0, 3, base_sequence=0), batch("a", 0, 2, base_sequence=3)
    queue.in_flight += [first, second]
    queue.acknowledge(second)
    assert queue.acked_sequence == 5 and queue.in_flight == [first]
    queue.acknowledge(first)  # a resent batch answered after a later one
    assert queue.acked_sequence == 5 and queue.in_flight == []


def test_acknowledging_wraps_around_the_sequence_space() -> None:
    queue = PartitionQueue("a", 0, acked_sequence=SEQUENCE_MODULUS - 2)
    queue.acknowledge(batch("a", 0, 3, base_sequence=SEQUENCE_MODULUS - 2))
    assert queue.acked_sequence == 1


def test_a_restart_waits_for_the_answers_in_flight_and_for_the_first_sent_batch() -> None:
    """After a sent batch failed for good, the sequences start again only once nothing is
    in flight and the first sent batch still queued is known not to be in the log (its
    last answer a sequence error), or none is queued."""
    queue = PartitionQueue("a", 0, next_sequence=9, acked_sequence=5)
    resent, fresh = batch("a", 0, 2, base_sequence=7), batch("a", 0, 1)
    queue.batches.extend([resent, fresh])
    assert not queue.restart_due()  # none pending
    queue.restart_pending = True
    queue.in_flight.append(batch("a", 0, 2, base_sequence=5))
    assert not queue.restart_due()  # an answer that may acknowledge it is on its way
    queue.in_flight.clear()
    assert not queue.restart_due()  # 7 may be in the log: resend it under the old numbers
    resent.sequence_refused = True
    assert queue.restart_due()  # refused for its sequence: neither 7 nor later is held
    queue.batches.popleft()
    assert queue.restart_due()  # only a batch never sent is left
    queue.batches.clear()
    assert queue.restart_due()


def test_a_restart_numbers_the_sent_batches_from_zero_under_the_new_epoch() -> None:
    first, second = batch("a", 0, 2, base_sequence=7), batch("a", 0, 3, base_sequence=9)
    fresh = batch("a", 0, 4)
    first.sequence_refused = True
    queue = PartitionQueue("a", 0, next_sequence=12, acked_sequence=7, restart_pending=True)
    queue.batches.extend([first, second, fresh])
    queue.restart_sequences(PRODUCER_ID, PRODUCER_EPOCH + 1)
    assert (queue.producer_id, queue.producer_epoch) == (PRODUCER_ID, PRODUCER_EPOCH + 1)
    assert (first.base_sequence, second.base_sequence, fresh.base_sequence) == (0, 2, None)
    assert stamped_sequence(first, PRODUCER_EPOCH + 1) == 0
    assert stamped_sequence(second, PRODUCER_EPOCH + 1) == 2
    assert not first.sequence_refused
    assert (queue.next_sequence, queue.acked_sequence) == (5, 0)
    assert not queue.restart_pending


def opened_at(created: float, count: int = 1) -> ProducerBatch:
    """An open (not yet sealed) batch of ``count`` records, opened at ``created``."""
    made = batch("a", 0, count)
    made.data = None
    made.created = made.first_created = created
    return made


def test_a_batch_lingers_until_linger_ms_unless_closed_or_flushing() -> None:
    queue = PartitionQueue("a", 0)
    assert queue.send_delay(10.0, 0.005, False, 5) is None  # nothing queued
    queue.batches.append(opened_at(10.0))
    assert queue.send_delay(10.001, 0.005, False, 5) == pytest.approx(0.004)
    assert queue.send_delay(10.005, 0.005, False, 5) == 0.0
    assert queue.send_delay(10.001, 0.005, True, 5) == 0.0  # flushing
    queue.batches[0].closed = True  # full
    assert queue.send_delay(10.001, 0.005, False, 5) == 0.0


def test_a_queue_waits_for_its_back_off_and_its_in_flight_limit() -> None:
    queue = PartitionQueue("a", 0, backoff_until=12.0)
    queue.batches.append(opened_at(10.0))
    assert queue.send_delay(11.5, 0.0, False, 5) == pytest.approx(0.5)
    assert queue.send_delay(12.0, 0.0, False, 5) == 0.0
    queue.batches[0].closed = True  # full (an open one waits for the answers: below)
    queue.in_flight += [batch("a", 0, 1, base_sequence=i) for i in range(2)]
    assert queue.send_delay(12.0, 0.0, False, 2) is None  # as many in flight as allowed
    assert queue.send_delay(12.0, 0.0, False, 3) == 0.0


def test_at_linger_zero_a_batch_that_is_not_full_waits_for_the_answer_in_flight() -> None:
    queue = PartitionQueue("a", 0)
    queue.batches.append(opened_at(10.0))
    assert queue.send_delay(10.0, 0.0, False, 5) == 0.0  # nothing in flight: at once
    sent = batch("a", 0, 1, base_sequence=0)
    queue.in_flight.append(sent)
    assert queue.send_delay(10.5, 0.0, False, 5) is None  # only the answer moves it
    assert queue.send_delay(10.5, 0.0, True, 5) == 0.0  # flushing
    assert queue.send_delay(10.5, 0.001, False, 5) == 0.0  # lingered: Nagle's rule is linger 0's
    queue.batches[0].closed = True  # full: pipelined up to the in-flight limit
    assert queue.send_delay(10.5, 0.0, False, 5) == 0.0
    queue.batches[0].closed = False
    queue.acknowledge(sent)
    assert queue.send_delay(10.5, 0.0, False, 5) == 0.0


def test_a_resending_queue_sends_one_batch_at_a_time_until_caught_up() -> None:
    resent = batch("a", 0, 1, base_sequence=0)
    queue = PartitionQueue("a", 0, retrying=True)
    queue.batches.append(opened_at(10.0))
    queue.in_flight.append(resent)
    assert queue.send_delay(20.0, 0.0, False, 5) is None  # the resent batch is unanswered
    queue.acknowledge(resent)
    assert queue.send_delay(20.0, 0.0, False, 5) == 0.0
    assert not queue.retrying  # nothing sent before is left: new batches flow again


def test_expiry_looks_at_resent_batches_and_stops_at_the_first_live_new_one() -> None:
    timeout_s = 5.0
    resent_live = opened_at(9.0)
    resent_expired = opened_at(4.0)
    for made in (resent_live, resent_expired):
        made.attempts = 1
    new_expired, new_live = opened_at(4.5), opened_at(6.0)
    # Cannot happen (new batches are queued as they are made); it shows where the scan stops.
    out_of_order = opened_at(1.0)
    queue = PartitionQueue("a", 0)
    queue.batches.extend([resent_live, resent_expired, new_expired, new_live, out_of_order])
    assert queue.expired(10.0, timeout_s) == [resent_expired, new_expired]
    assert queue.expired(11.0, timeout_s) == [resent_expired, new_expired, new_live, out_of_order]
    assert queue.expired(3.0, timeout_s) == []
