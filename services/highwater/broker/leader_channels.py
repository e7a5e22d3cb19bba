"""Channels from this broker to the other brokers, for what it does on a client's behalf.

A produce to partition -1 appends each partition's share at its leader, and a consumer
session reads partitions this broker does not lead from their leaders. Both reach another
broker at the first listener of its registration in the metadata image, over one channel
per address kept for the broker's lifetime (many sessions share it; nothing is opened per
call).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc.aio

from highwater.metadata.image import MetadataImage
from highwater.rpc.channels import open_channel
from highwater.v1 import broker_pb2_grpc

__all__ = ["LeaderChannels"]


class LeaderChannels:
    """Broker stubs by node id, on channels kept per address until :meth:`close`."""

    def __init__(self, image: Callable[[], MetadataImage]) -> None:
        self._image = image
        self._channels: dict[str, grpc.aio.Channel] = {}

    def address(self, broker_id: int) -> str | None:
        """``HOST:PORT`` of broker ``broker_id``'s first listener; None if not registered."""
        broker = self._image().broker(broker_id)
        if broker is None or not broker.listeners:
            return None
        endpoint = broker.listeners[0]
        return f"{endpoint.host}:{endpoint.port}"

    def stub(self, broker_id: int) -> broker_pb2_grpc.BrokerStub | None:
        """A stub for broker ``broker_id``, or None when it has no registered listener."""
        address = self.address(broker_id)
        if address is None:
            return None
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, traced=True)
        return broker_pb2_grpc.BrokerStub(channel)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
