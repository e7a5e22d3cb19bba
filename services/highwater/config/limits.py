"""The sizes the gRPC transport bounds, which configuration is validated against.

Every process of the package sends and takes gRPC messages of up to
:data:`GRPC_MESSAGE_MAX_BYTES` (``rpc/channels.py``, ``rpc/server.py``). A record batch
travels whole in one such message when it is replicated or fetched, beside the answer's
own fields, so the largest batch a topic may accept is :data:`BATCH_MAX_BYTES`: a larger
one could still be appended (a Kafka client's produce request is read up to
``socket.request.max.bytes``, 100 MiB), but no follower could replicate it and no gRPC
consumer read it, and the partition's replication would stop at it.
"""

from __future__ import annotations

from typing import Final

GRPC_MESSAGE_MAX_BYTES: Final = 64 << 20
"""The largest gRPC message, both ways: what every server takes and sends and every
channel is opened with."""

BATCH_MAX_BYTES: Final = GRPC_MESSAGE_MAX_BYTES - (1 << 20)
"""The largest record batch a topic may accept (``max.message.bytes``, the brokers'
``message.max.bytes``): the message less 1 MiB for the fields around it."""
