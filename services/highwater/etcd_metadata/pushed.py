"""``PushedMetadata``: the image a broker or coordinator is pushed by the etcd-mode controller.

The node's image source in etcd mode, in place of the metadata log observer: it offers
``image`` and ``add_listener`` as the observer does, so the rest of the node runs
unchanged. The active controller sends, with its controller epoch and the image's offset
(``BrokerMetadata.UpdateMetadata``), either the whole image (the records that recreate
it: :meth:`PushedMetadata.accept`) or only the records made since the image the node
acknowledged (:meth:`PushedMetadata.accept_delta`; what to send whom is
:mod:`highwater.etcd_metadata.push_delta`). Both refuse a push from an older controller
epoch than the newest accepted (STALE_CONTROLLER_EPOCH: a deposed controller that does not
know it yet, ZooKeeper-era Kafka's controller epoch check). A whole image of the held
image's controller epoch but an older offset is a reordered push and is ignored; one of
the same offset replaces it if it differs, and one of a newer controller epoch replaces it
whatever its offset (a new controller's image is the truth: offsets order the images of
one controller epoch only). A delta applies only to an image of exactly its base
offset built in the same controller epoch; otherwise nothing changes and the node answers
``full_image_needed``, so a lost, repeated or reordered push leads to a whole image, never
to a wrong one. :class:`MetadataPushChannels` is the sending side, which the etcd-mode
controller and the KRaft controller migrating from etcd share.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import grpc.aio

from highwater.internal.v1 import broker_metadata_pb2 as pb
from highwater.internal.v1 import broker_metadata_pb2_grpc
from highwater.metadata.delta import MetadataDelta
from highwater.metadata.image import MetadataImage
from highwater.metadata.records import decode_record
from highwater.metadata.snapshot import load_snapshot
from highwater.rpc.channels import open_channel
from highwater.v1.common_pb2 import ErrorCode

__all__ = [
    "BROKER_METADATA_SERVICE_NAME",
    "MetadataPushChannels",
    "PushedMetadata",
    "add_pushed_metadata_servicer",
    "push_addresses",
]

log = logging.getLogger(__name__)

BROKER_METADATA_SERVICE_NAME = "highwater.internal.v1.BrokerMetadata"


class PushedMetadata:
    """The latest image pushed by the active controller (see the module docstring)."""

    def __init__(self) -> None:
        self._image = MetadataImage.empty()
        self._listeners: list[Callable[[MetadataImage], None]] = []
        self.controller_id = -1
        self.controller_epoch = -1
        self.controller_address = ""

    @property
    def image(self) -> MetadataImage:
        return self._image

    def add_listener(self, listener: Callable[[MetadataImage], None]) -> None:
        self._listeners.append(listener)

    def accept(
        self,
        *,
        controller_id: int,
        controller_epoch: int,
        offset: int,
        values: Iterable[bytes],
        controller_address: str = "",
    ) -> tuple[int, str]:
        """Take a push; ``(error code, message)``."""
        if controller_epoch < self.controller_epoch:
            return (
                ErrorCode.STALE_CONTROLLER_EPOCH,
                f"controller {controller_id} of epoch {controller_epoch} was deposed: "
                f"controller {self.controller_id} of epoch {self.controller_epoch} is newer",
            )
        self.controller_id = controller_id
        self.controller_epoch = controller_epoch
        self.controller_address = controller_address
        if controller_epoch == self._image.epoch and offset < self._image.offset:
            return ErrorCode.NONE, ""  # a reordered push of this epoch: older than held
        try:
            image = load_snapshot((decode_record(v) for v in values), offset, controller_epoch)
        except Exception as e:  # a push this node cannot replay is refused whole
            log.exception("refused a metadata push at offset %d", offset)
            return ErrorCode.INVALID_REQUEST, f"the pushed records do not replay: {e}"
        if image != self._image:
            self._take(image)
        return ErrorCode.NONE, ""

    def accept_delta(
        self,
        *,
        controller_id: int,
        controller_epoch: int,
        base_offset: int,
        offset: int,
        values: Iterable[bytes],
        controller_address: str = "",
    ) -> tuple[int, str, bool]:
        """Take a delta push: the records made after ``base_offset`` up to ``offset``;
        ``(error code, message, full image needed)``."""
        if controller_epoch < self.controller_epoch:
            return (
                ErrorCode.STALE_CONTROLLER_EPOCH,
                f"controller {controller_id} of epoch {controller_epoch} was deposed: "
                f"controller {self.controller_id} of epoch {self.controller_epoch} is newer",
                False,
            )
        self.controller_id = controller_id
        self.controller_epoch = controller_epoch
        self.controller_address = controller_address
        held = self._image
        if held.epoch != controller_epoch or held.offset != base_offset or offset <= base_offset:
            return (
                ErrorCode.NONE,
                f"a delta from offset {base_offset} of controller epoch {controller_epoch} "
                f"does not apply to this node's image of offset {held.offset} of controller "
                f"epoch {held.epoch}",
                True,
            )
        try:
            delta = MetadataDelta(held).replay_all(decode_record(v) for v in values)
            image = delta.apply(offset, controller_epoch)
        except Exception as e:  # a delta this node cannot replay: the whole image instead
            log.warning("a metadata delta to offset %d does not replay: %s", offset, e)
            return ErrorCode.NONE, f"the pushed delta does not replay: {e}", True
        self._take(image)
        return ErrorCode.NONE, "", False

    def _take(self, image: MetadataImage) -> None:
        self._image = image
        for listener in self._listeners:
            listener(image)


class BrokerMetadataServicer(broker_metadata_pb2_grpc.BrokerMetadataServicer):
    """``highwater.internal.v1.BrokerMetadata`` over a :class:`PushedMetadata`."""

    def __init__(self, pushed: PushedMetadata) -> None:
        self._pushed = pushed

    async def UpdateMetadata(
        self, request: pb.UpdateMetadataRequest, context: Any
    ) -> pb.UpdateMetadataResponse:
        full_image_needed = False
        if request.delta:
            error, message, full_image_needed = self._pushed.accept_delta(
                controller_id=request.controller_id,
                controller_epoch=request.controller_epoch,
                base_offset=request.base_offset,
                offset=request.offset,
                values=request.records,
                controller_address=request.controller_address,
            )
        else:
            error, message = self._pushed.accept(
                controller_id=request.controller_id,
                controller_epoch=request.controller_epoch,
                offset=request.offset,
                values=request.records,
                controller_address=request.controller_address,
            )
        image = self._pushed.image
        return pb.UpdateMetadataResponse(
            error=error,  # type: ignore[arg-type]
            error_message=message,
            full_image_needed=full_image_needed,
            image_offset=image.offset,
            image_controller_epoch=image.epoch,
        )


def add_pushed_metadata_servicer(server: grpc.aio.Server, pushed: PushedMetadata) -> None:
    broker_metadata_pb2_grpc.add_BrokerMetadataServicer_to_server(
        BrokerMetadataServicer(pushed), server
    )


PUSH_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""A whole-image push: a million partitions' records fit."""


class MetadataPushChannels:
    """One channel per node pushed to, and the ``UpdateMetadata`` call on it."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def update_metadata(
        self, address: str, request: pb.UpdateMetadataRequest, timeout_s: float
    ) -> pb.UpdateMetadataResponse | None:
        """The node's answer, or None if it could not be reached (logged; the caller's next
        round pushes again)."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(
                address, max_message_bytes=PUSH_MAX_MESSAGE_BYTES
            )
        try:
            reply: pb.UpdateMetadataResponse = await broker_metadata_pb2_grpc.BrokerMetadataStub(
                channel
            ).UpdateMetadata(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            log.debug("node %d: pushing to %s failed: %s", self.node_id, address, e.code().name)
            return None
        return reply

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


def push_addresses(image: MetadataImage, broker_ids: Iterable[int] | None = None) -> list[str]:
    """Where a push of ``image`` goes: the first listener of each registered broker (of
    ``broker_ids`` only, if given) and of each coordinator."""
    brokers = (
        list(image.brokers.values())
        if broker_ids is None
        else [b for b in map(image.broker, sorted(broker_ids)) if b is not None]
    )
    listeners = [b.listeners for b in brokers]
    listeners.extend(c.listeners for c in image.cluster.coordinators.values())
    return [f"{own[0].host}:{own[0].port}" for own in listeners if own]
