"""Delta pushes in the etcd mode: what the controller sends whom (etcd_metadata/push_delta.py)
and how a node applies it (PushedMetadata.accept_delta), all pure.

The property: whatever pushes are lost, repeated or reordered, a node's image is at every
moment exactly the controller's image of that offset, and once pushes get through it is the
controller's current image, the same as a whole-image push would give."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from highwater.etcd_metadata.push_delta import DeltaPush, DeltaPushes, FullPush, PushHistory
from highwater.etcd_metadata.pushed import PushedMetadata
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import (
    BrokerEndpoint,
    ConfigRecord,
    ConfigResourceType,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    encode_record,
)
from highwater.metadata.snapshot import load_snapshot, load_snapshot_values, snapshot_values
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import given, settings
from hypothesis import strategies as st

BROKERS = (1, 2, 3)
NODE = "127.0.0.1:9091"


def _values(records: list[MetadataRecord]) -> list[bytes]:
    return [encode_record(r) for r in records]


def _brokers() -> list[MetadataRecord]:
    return [
        RegisterBrokerRecord(
            b, f"inc-{b}", b, (BrokerEndpoint("PLAINTEXT", "127.0.0.1", 9090 + b),)
        )
        for b in BROKERS
    ]


# --- PushHistory and DeltaPushes ---------------------------------------------------------


def test_the_history_chains_changes_and_answers_only_from_offsets_it_passed_through() -> None:
    history = PushHistory(10)
    history.append(10, 12, [b"a", b"b"])
    history.append(12, 13, [b"c"])
    assert history.since(10) == (b"a", b"b", b"c")
    assert history.since(12) == (b"c",)
    assert history.since(13) == ()
    assert history.since(11) is None  # inside a change: no record boundary there
    assert history.since(9) is None and history.since(14) is None
    history.append(20, 21, [b"d"])  # not from 13: the chain starts again at 20
    assert (history.oldest, history.newest) == (20, 21)
    assert history.since(12) is None and history.since(20) == (b"d",)
    with pytest.raises(ValueError, match="advance"):
        history.append(21, 21, [])


def test_the_history_drops_its_oldest_changes_past_its_size() -> None:
    history = PushHistory(0, max_records=3)
    history.append(0, 2, [b"a", b"b"])
    history.append(2, 4, [b"c", b"d"])
    assert len(history) == 2 and history.oldest == 2
    assert history.since(0) is None
    assert history.since(2) == (b"c", b"d")


def test_a_node_is_pushed_the_whole_image_until_it_acknowledges_one_of_this_epoch() -> None:
    pushes = DeltaPushes(5)
    assert pushes.plan(NODE) == FullPush(5)
    pushes.acknowledged(NODE, image_offset=5, image_epoch=2, controller_epoch=2)
    assert pushes.plan(NODE) is None
    pushes.changed(5, 7, [b"x", b"y"])
    assert pushes.plan(NODE) == DeltaPush(5, 7, (b"x", b"y"))
    # An image of another controller epoch is no base, whatever its offset.
    pushes.acknowledged(NODE, image_offset=7, image_epoch=1, controller_epoch=2)
    assert pushes.plan(NODE) == FullPush(7)
    pushes.acknowledged(NODE, image_offset=7, image_epoch=2, controller_epoch=2)
    assert pushes.plan(NODE) is None
    pushes.changed(7, 8, [b"z"])
    pushes.forget(NODE)  # it registered again
    assert pushes.plan(NODE) == FullPush(8)
    pushes.acknowledged(NODE, image_offset=8, image_epoch=2, controller_epoch=2)
    pushes.reset(8)  # the controller loaded etcd's state: equal offsets may differ now
    assert pushes.plan(NODE) == FullPush(8)


# --- PushedMetadata.accept_delta --------------------------------------------------------


def test_a_delta_applies_only_to_its_base_offset_and_controller_epoch() -> None:
    pushed = PushedMetadata()
    seen: list[int] = []
    pushed.add_listener(lambda image: seen.append(image.offset))
    base = load_snapshot(_brokers(), 3, 4)
    assert pushed.accept(
        controller_id=1, controller_epoch=4, offset=3, values=snapshot_values(base)
    ) == (
        ErrorCode.NONE,
        "",
    )
    topic = _values([TopicRecord("t", "T" * 22), PartitionRecord("T" * 22, 0, (1, 2), (1, 2), 1)])
    for epoch, base_offset in ((4, 2), (5, 3)):  # a gap; a newer controller's delta
        error, message, full = pushed.accept_delta(
            controller_id=1, controller_epoch=epoch, base_offset=base_offset, offset=5, values=topic
        )
        assert (error, full) == (ErrorCode.NONE, True)
        assert "does not apply to this node's image of offset 3" in message
        assert pushed.image == base
    error, _, full = pushed.accept_delta(
        controller_id=1, controller_epoch=3, base_offset=3, offset=5, values=topic
    )
    assert (error, full) == (ErrorCode.STALE_CONTROLLER_EPOCH, False)
    # A newer epoch was seen: epoch 4's deltas are now refused as stale, so epoch 5's whole
    # image is what the node waits for.
    assert (
        pushed.accept(controller_id=2, controller_epoch=5, offset=3, values=snapshot_values(base))[
            0
        ]
        == 0
    )
    error, _, full = pushed.accept_delta(
        controller_id=2, controller_epoch=5, base_offset=3, offset=5, values=topic
    )
    assert (error, full) == (ErrorCode.NONE, False)
    assert pushed.image.topics.by_name["t"].partitions[0].leader == 1
    assert pushed.image == MetadataDelta(load_snapshot(_brokers(), 3, 5)).replay_all(
        [TopicRecord("t", "T" * 22), PartitionRecord("T" * 22, 0, (1, 2), (1, 2), 1)]
    ).apply(5, 5)
    assert seen == [3, 3, 5]  # the same image of a new epoch is taken (its epoch changed)
    # A delta that does not replay changes nothing and asks for the whole image.
    error, message, full = pushed.accept_delta(
        controller_id=2,
        controller_epoch=5,
        base_offset=5,
        offset=6,
        values=_values([PartitionChangeRecord("U" * 22, 0, leader=2)]),
    )
    assert full and "does not replay" in message and pushed.image.offset == 5


def test_a_whole_image_of_the_same_offset_replaces_a_different_one() -> None:
    pushed = PushedMetadata()
    seen: list[int] = []
    pushed.add_listener(lambda image: seen.append(image.offset))
    one = load_snapshot(_brokers(), 3, 4)
    other = load_snapshot([*_brokers(), TopicRecord("t", "T" * 22)], 3, 4)
    for image in (one, one, other):
        pushed.accept(controller_id=1, controller_epoch=4, offset=3, values=snapshot_values(image))
    assert pushed.image == other
    assert seen == [3, 3]  # the repeat changed nothing and told nobody
    pushed.accept(controller_id=1, controller_epoch=4, offset=2, values=snapshot_values(one))
    assert pushed.image == other  # older: ignored


def test_a_newer_controller_epochs_whole_image_replaces_one_of_a_higher_offset() -> None:
    """Offsets order images within one controller epoch only: a new controller's image is
    the truth even at a lower offset (its etcd counter behind what a former controller
    pushed, as after a rollback of a migration whose dual writes lagged), and the node
    takes it instead of keeping the deposed controller's and being pushed it forever."""
    pushed = PushedMetadata()
    ahead = load_snapshot([*_brokers(), TopicRecord("t", "T" * 22)], 9, 4)
    pushed.accept(controller_id=1, controller_epoch=4, offset=9, values=snapshot_values(ahead))
    behind = load_snapshot(_brokers(), 6, 5)
    pushes = DeltaPushes()
    pushes.clear(6)
    assert isinstance(pushes.plan(NODE), FullPush)
    error, _ = pushed.accept(
        controller_id=2, controller_epoch=5, offset=6, values=snapshot_values(behind)
    )
    assert error == ErrorCode.NONE
    assert pushed.image == behind
    pushes.acknowledged(
        NODE, image_offset=pushed.image.offset, image_epoch=pushed.image.epoch, controller_epoch=5
    )
    assert pushes.plan(NODE) is None
    # Within the new epoch an older whole image is a reordered push: ignored.
    older = load_snapshot(_brokers()[:2], 5, 5)
    pushed.accept(controller_id=2, controller_epoch=5, offset=5, values=snapshot_values(older))
    assert pushed.image == behind


# --- the property ---------------------------------------------------------------------


@dataclass
class ControllerModel:
    """The etcd controller's push bookkeeping over a changing image, as EtcdController does."""

    epoch: int = 1
    image: MetadataImage = field(default_factory=MetadataImage.empty)
    images: dict[tuple[int, int], MetadataImage] = field(default_factory=dict)
    pushes: DeltaPushes = field(default_factory=lambda: DeltaPushes(max_records=12))
    topics: int = 0

    def __post_init__(self) -> None:
        self.change(_brokers())

    def change(self, records: list[MetadataRecord]) -> None:
        parent = self.image
        offset = parent.offset + len(records)
        self.image = MetadataDelta(parent).replay_all(records).apply(offset, self.epoch)
        self.images[(offset, self.epoch)] = self.image
        self.pushes.changed(parent.offset, offset, _values(records))

    def new_epoch(self) -> None:
        self.epoch += 1
        self.image = load_snapshot_values(
            snapshot_values(self.image), self.image.offset, self.epoch
        )
        self.images[(self.image.offset, self.epoch)] = self.image
        self.pushes.clear(self.image.offset)

    def request(self) -> tuple[str, dict[str, object]] | None:
        plan = self.pushes.plan(NODE)
        if plan is None:
            return None
        common = {"controller_id": 1, "controller_epoch": self.epoch, "offset": plan.offset}
        if isinstance(plan, DeltaPush):
            return "delta", {**common, "base_offset": plan.base_offset, "values": plan.records}
        return "full", {**common, "values": snapshot_values(self.image)}

    def answer(self, node: PushedMetadata, full_needed: bool) -> None:
        if full_needed:
            self.pushes.forget(NODE)
        else:
            self.pushes.acknowledged(
                NODE,
                image_offset=node.image.offset,
                image_epoch=node.image.epoch,
                controller_epoch=self.epoch,
            )


def _deliver(node: PushedMetadata, kind: str, args: dict[str, object]) -> tuple[int, bool]:
    if kind == "delta":
        error, _, full = node.accept_delta(**args)  # type: ignore[arg-type]
        return error, full
    return node.accept(**args)[0], False  # type: ignore[arg-type]


def _register(broker_id: int, epoch: int) -> RegisterBrokerRecord:
    endpoint = BrokerEndpoint("PLAINTEXT", "127.0.0.1", 9090 + broker_id)
    return RegisterBrokerRecord(broker_id, f"inc-{broker_id}-{epoch}", epoch, (endpoint,))


def _change(model: ControllerModel, data: st.DataObject) -> list[MetadataRecord]:
    topics = sorted(model.image.topics.by_name.values(), key=lambda t: t.name)
    kind = data.draw(st.sampled_from(["topic", "move", "move", "config", "remove", "broker"]))
    if kind == "topic" or not topics:
        model.topics += 1
        topic_id = f"T{model.topics:021d}"
        count = data.draw(st.integers(1, 3))
        records: list[MetadataRecord] = [TopicRecord(f"t{model.topics}", topic_id)]
        for p in range(count):
            replicas = data.draw(st.permutations(BROKERS))[:2]
            records.append(
                PartitionRecord(topic_id, p, tuple(replicas), tuple(replicas), replicas[0])
            )
        return records
    topic = data.draw(st.sampled_from(topics))
    if kind == "remove":
        return [RemoveTopicRecord(topic.topic_id)]
    if kind == "config":
        value = data.draw(st.sampled_from([None, "1000", "2000"]))
        return [ConfigRecord(ConfigResourceType.TOPIC, topic.name, "retention.ms", value)]
    if kind == "broker":
        return [_register(data.draw(st.sampled_from(BROKERS)), model.image.offset + 1)]
    moves: list[MetadataRecord] = []
    for p, partition in sorted(topic.partitions.items()):
        if data.draw(st.booleans()):
            leader = data.draw(st.sampled_from(partition.replicas))
            moves.append(PartitionChangeRecord(topic.topic_id, p, leader=leader, isr=(leader,)))
    return moves or [PartitionChangeRecord(topic.topic_id, 0, isr=topic.partitions[0].replicas)]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_a_node_holds_only_the_controllers_images_however_pushes_are_lost_or_reordered(
    data: st.DataObject,
) -> None:
    model = ControllerModel()
    node = PushedMetadata()
    in_flight: list[tuple[str, dict[str, object]]] = []
    for _ in range(data.draw(st.integers(1, 16))):
        step = data.draw(
            st.sampled_from(
                ["change", "change", "push", "push", "lose", "late", "epoch", "restart"]
            )
        )
        if step == "change":
            model.change(_change(model, data))
        elif step == "epoch":
            model.new_epoch()
        elif step == "restart":
            # The node starts again with nothing and registers again: a change whose delta
            # it cannot apply (the controller is not told to forget its base).
            node = PushedMetadata()
            model.change([_register(1, model.image.offset + 1)])
        elif step in ("push", "lose"):
            request = model.request()
            if request is not None:
                in_flight.append(request)
            if step == "push" and in_flight:
                kind, args = in_flight.pop(data.draw(st.integers(0, len(in_flight) - 1)))
                error, full_needed = _deliver(node, kind, args)
                if error == ErrorCode.NONE and args["controller_epoch"] == model.epoch:
                    model.answer(node, full_needed)
        elif step == "late" and in_flight:  # delivered, but its answer is lost
            kind, args = in_flight.pop(0)
            _deliver(node, kind, args)
        if node.image.offset >= 0:
            assert node.image == model.images[(node.image.offset, node.image.epoch)]
    # Pushes now get through: the node reaches the controller's image in a few.
    for _ in range(3):
        request = model.request()
        if request is None:
            break
        error, full_needed = _deliver(node, *request)
        assert error == ErrorCode.NONE
        model.answer(node, full_needed)
    assert model.request() is None
    assert node.image == model.image
    assert node.image == load_snapshot_values(
        snapshot_values(model.image), model.image.offset, model.epoch
    )


def test_a_delta_whose_answer_was_lost_is_followed_by_the_whole_image_not_a_replay() -> None:
    model = ControllerModel()
    topic_id = "T" * 22
    model.change([TopicRecord("t", topic_id), PartitionRecord(topic_id, 0, (1, 2), (1, 2), 1)])
    node = PushedMetadata()
    request = model.request()
    assert request is not None and request[0] == "full"
    model.answer(node, _deliver(node, *request)[1])
    assert model.request() is None
    model.change([PartitionChangeRecord(topic_id, 0, leader=2, isr=(2,))])
    request = model.request()
    assert request is not None and request[0] == "delta"
    _deliver(node, *request)  # applied; its answer lost: the controller's base stays old
    model.change([PartitionChangeRecord(topic_id, 0, leader=1, isr=(1,))])
    kind, args = model.request() or ("", {})
    assert kind == "delta" and args["base_offset"] < node.image.offset
    error, full_needed = _deliver(node, kind, args)
    assert (error, full_needed) == (ErrorCode.NONE, True)  # not replayed on a newer image
    model.answer(node, full_needed)
    kind, args = model.request() or ("", {})
    assert kind == "full"
    model.answer(node, _deliver(node, kind, args)[1])
    assert model.request() is None and node.image == model.image
    assert node.image.topics.by_name["t"].partitions[0].leader_epoch == 2
