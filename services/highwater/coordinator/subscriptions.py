"""The topics a consumer group member subscribes to, read from its JoinGroup metadata.

The coordinator treats a member's metadata as opaque except here: OffsetDelete keeps the
offsets of topics the group's members subscribe to, and KIP-496 expires the others. A
consumer group (protocol type ``consumer``) carries one of two encodings:

- Highwater's, the ``ConsumerProtocolSubscription`` message of ``consumer_protocol.proto``
  (Highwater's clients);
- Kafka's ``ConsumerProtocol`` subscription (Kafka clients, through the Kafka listener, which
  relays the bytes as they are). It starts with an int16 version, and every version begins
  with version 0's fields: the topics, an int32 count of int16-length UTF-8 strings, then the
  user data, nullable int32-length bytes. As Kafka's ``ClassicGroup.computeSubscribedTopics``
  does, only that version 0 prefix is read, so a version added later reads as well.

The two cannot be taken for each other: a Kafka subscription starts with a zero byte (its
version is below 256), which no protobuf message does (field number 0 is invalid), so it
never decodes as Highwater's. The Kafka prefix is parsed here with ``struct`` rather than
with kafka-python's protocol classes or the broker's Kafka codec: the coordinator needs four
fields of one message, and neither a client library nor broker code belongs in it.
"""

from __future__ import annotations

import struct

from google.protobuf.message import DecodeError

from highwater.v1.consumer_protocol_pb2 import ConsumerProtocolSubscription

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics of a member's subscription in either encoding; None if it is neither."""
    try:
        return frozenset(ConsumerProtocolSubscription.FromString(metadata).topics)
    except DecodeError:
        return kafka_subscription_topics(metadata)


def kafka_subscription_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics of a Kafka ``ConsumerProtocol`` subscription (any version, read with version
    0's schema); None if the bytes are not one (a negative version, a negative topic count or
    string length, invalid UTF-8, or fewer bytes than the fields say)."""
    try:
        (version,) = _INT16.unpack_from(metadata, 0)
        (count,) = _INT32.unpack_from(metadata, 2)
        if version < 0 or count < 0:
            return None
        offset = 6
        topics: set[str] = set()
        for _ in range(count):
            (length,) = _INT16.unpack_from(metadata, offset)
            offset += 2
            if length < 0 or offset + length > len(metadata):
                return None
            topics.add(metadata[offset : offset + length].decode())
            offset += length
        (user_data_length,) = _INT32.unpack_from(metadata, offset)
        if user_data_length < -1 or offset + 4 + max(user_data_length, 0) > len(metadata):
            return None
    except (struct.error, UnicodeDecodeError):
        return None
    return frozenset(topics)
