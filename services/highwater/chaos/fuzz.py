"""The fuzzer: malformed and random requests to every gRPC endpoint of every process,
while the workload's real clients go on.

Every method of the ``Broker``, ``ReplicaFetchService``, ``Controller``,
``GroupCoordinator`` and ``Raft`` services (from the generated descriptors, so a new
method is fuzzed without a change here) is called at the processes of the cluster
(mostly at those that serve it) with one of:

- ``garbage``: random bytes that are not a protobuf message at all;
- ``truncated``: a random message's encoding cut short;
- ``random``: a well-formed message with random fields (boundary integers, odd
  strings, random bytes, up to three levels deep, lists of up to three);
- ``empty``: the message with no field set.

The answer's gRPC status is recorded (``fuzz`` entries). DESIGN.md §4 wants a clear
error for bad input: the checker reports a well-formed request (``random``, ``empty``)
answered ``UNKNOWN`` (an exception the service did not handle). Names the workload uses
never appear in a fuzzed message, so the fuzzer cannot legitimately delete its topic
or group; nor does the node id of any of the cluster's processes in an integer field
named as an id (``voter_id``, ``broker_id``, ...), so it cannot legitimately remove a
controller from the quorum, register a broker's id anew or unregister it: on an
unsecured cluster those are an operator's calls, which the checks do not model.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import grpc.aio
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from highwater.chaos.history import HistoryWriter
from highwater.internal.v1 import controller_pb2, raft_pb2, replication_pb2
from highwater.rpc.channels import open_channel
from highwater.v1 import broker_pb2, coordinator_pb2, security_pb2

MODES = ("garbage", "truncated", "random", "empty")
#: Which role serves each service: most calls go to a process that implements the method.
SERVED_BY = {
    "Broker": "broker",
    "ReplicaFetchService": "broker",
    "Controller": "controller",
    "Raft": "controller",
    "GroupCoordinator": "coordinator",
    "Authentication": "broker",
}
INTS_32 = (0, 1, -1, 2, 3, 100, 2**31 - 1, -(2**31), 2**15, 65535)
INTS_64 = (*INTS_32, 2**63 - 1, -(2**63), 2**40)
STRINGS = ("", "x", "\x00", "a" * 300, "../../etc/passwd", "topic.with.dots", "é☃💥", "-1", " ")


@dataclass(frozen=True)
class Endpoint:
    path: str
    """``/highwater.v1.Broker/Produce``."""
    role: str
    """The role whose processes serve it."""
    request: Descriptor
    streaming: bool


def endpoints(*, secure: bool = False) -> list[Endpoint]:
    """Every method of the cluster's gRPC services (a secured cluster's ``Authenticate`` too)."""
    found = []
    modules = (broker_pb2, replication_pb2, controller_pb2, coordinator_pb2, raft_pb2)
    for module in (*modules, security_pb2) if secure else modules:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                found.append(
                    Endpoint(
                        f"/{service.full_name}/{method.name}",
                        SERVED_BY.get(service.name, ""),
                        method.input_type,
                        method.client_streaming or method.server_streaming,
                    )
                )
    return found


def _is_id(field: FieldDescriptor) -> bool:
    """Whether the field names a node (or anything else) by an integer id."""
    return field.name == "id" or field.name.endswith(("_id", "_ids"))


def _scalar(
    field: FieldDescriptor, rng: random.Random, avoid_ids: frozenset[int] = frozenset()
) -> object:
    """A random value for ``field``; never one of ``avoid_ids`` in an id field."""
    value = _any_scalar(field, rng)
    while avoid_ids and value in avoid_ids and _is_id(field):
        value = _any_scalar(field, rng)
    return value


def _any_scalar(field: FieldDescriptor, rng: random.Random) -> object:
    t = field.type
    if t in (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SFIXED32,
    ):
        return rng.choice(INTS_32) if rng.random() < 0.7 else rng.randint(-(2**31), 2**31 - 1)
    if t in (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
    ):
        return rng.choice(INTS_64) if rng.random() < 0.7 else rng.randint(-(2**63), 2**63 - 1)
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return rng.choice((0, 1, 2**32 - 1, rng.randint(0, 2**32 - 1)))
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return rng.choice((0, 1, 2**64 - 1, rng.randint(0, 2**64 - 1)))
    if t == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return rng.choice((0.0, -1.0, 1e30, float("nan"), float("inf")))
    if t == FieldDescriptor.TYPE_STRING:
        if rng.random() < 0.7:
            return rng.choice(STRINGS)
        return "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(1, 40)))
    if t == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.choice((0, 1, 12, 61, 100, rng.randint(0, 4000))))
    if t == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type
        values = [v.number for v in enum.values] if enum is not None else [0]
        return rng.choice(values) if rng.random() < 0.8 else rng.randint(-5, 1000)
    raise ValueError(f"no random value for field type {t}")


def _repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)
    if isinstance(flag, bool):
        return flag
    return bool(getattr(field, "label", 0) == FieldDescriptor.LABEL_REPEATED)


def random_message(
    descriptor: Descriptor,
    rng: random.Random,
    depth: int = 0,
    *,
    avoid_ids: frozenset[int] = frozenset(),
) -> Message:
    """A message of ``descriptor``'s type with random fields set, none of ``avoid_ids`` in
    a field named as an id."""
    message = GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if rng.random() < 0.4:
            continue
        nested = field.message_type if field.type == FieldDescriptor.TYPE_MESSAGE else None
        if nested is not None and depth >= 3:
            continue
        target = getattr(message, field.name)
        if nested is not None and nested.GetOptions().map_entry:
            key_field, value_field = nested.fields_by_name["key"], nested.fields_by_name["value"]
            for _ in range(rng.randint(0, 3)):
                key = _scalar(key_field, rng, avoid_ids)
                if value_field.message_type is not None:
                    target[key].CopyFrom(
                        random_message(
                            value_field.message_type, rng, depth + 1, avoid_ids=avoid_ids
                        )
                    )
                else:
                    target[key] = _scalar(value_field, rng, avoid_ids)
        elif _repeated(field):
            for _ in range(rng.randint(0, 3)):
                if nested is not None:
                    target.add().CopyFrom(
                        random_message(nested, rng, depth + 1, avoid_ids=avoid_ids)
                    )
                else:
                    target.append(_scalar(field, rng, avoid_ids))
        elif nested is not None:
            target.CopyFrom(random_message(nested, rng, depth + 1, avoid_ids=avoid_ids))
        else:
            setattr(message, field.name, _scalar(field, rng, avoid_ids))
    return message


def request_bytes(
    endpoint: Endpoint,
    mode: str,
    rng: random.Random,
    *,
    avoid_ids: frozenset[int] = frozenset(),
) -> bytes:
    """The serialized request ``mode`` makes for ``endpoint`` (see the module docstring),
    none of ``avoid_ids`` in a field named as an id."""
    if mode == "garbage":
        return rng.randbytes(rng.randint(1, 300))
    if mode == "empty":
        return b""
    encoded = random_message(endpoint.request, rng, avoid_ids=avoid_ids).SerializeToString()
    if mode == "truncated":
        return encoded[: rng.randint(0, max(len(encoded) - 1, 0))] + rng.randbytes(1)
    return encoded


def _identity(data: bytes) -> bytes:
    return data


class Fuzzer:
    """Sends fuzzed requests to ``targets`` (process name -> address) at ``rate`` calls/s;
    ``avoid``: names no request carries; ``avoid_ids``: node ids no id field takes."""

    def __init__(
        self,
        targets: dict[str, str],
        history: HistoryWriter,
        seed: int,
        *,
        rate: float = 10.0,
        avoid: Sequence[str] = (),
        avoid_ids: frozenset[int] = frozenset(),
        secure: bool = False,
    ) -> None:
        self.targets = targets
        self.history = history
        self.rng = random.Random(seed ^ 0x5EED)
        self.rate = rate
        self.endpoints = endpoints(secure=secure)
        self.avoid = tuple(avoid)
        self.avoid_ids = avoid_ids
        self.calls = 0

    async def run(self, stop: asyncio.Event) -> None:
        channels = {name: open_channel(address) for name, address in self.targets.items()}
        try:
            names = sorted(channels)
            while not stop.is_set():
                name = self.rng.choice(names)
                role = name.partition("-")[0]
                served = [e for e in self.endpoints if e.role == role]
                pool = served if served and self.rng.random() < 0.85 else self.endpoints
                endpoint = self.rng.choice(pool)
                mode = self.rng.choice(MODES)
                payload = request_bytes(endpoint, mode, self.rng, avoid_ids=self.avoid_ids)
                if any(word.encode() in payload for word in self.avoid):
                    continue
                code = await self._call(channels[name], endpoint, payload)
                self.calls += 1
                self.history.record(
                    "fuzz",
                    "fuzzer",
                    target=name,
                    method=endpoint.path,
                    mode=mode,
                    size=len(payload),
                    code=code,
                )
                await asyncio.sleep(1.0 / self.rate)
        finally:
            for channel in channels.values():
                await channel.close()

    @staticmethod
    async def _call(channel: grpc.aio.Channel, endpoint: Endpoint, payload: bytes) -> str:
        try:
            if endpoint.streaming:
                call = channel.stream_stream(
                    endpoint.path, request_serializer=_identity, response_deserializer=_identity
                )(iter([payload]), timeout=2)
                async for _ in call:
                    break
                call.cancel()
            else:
                await channel.unary_unary(
                    endpoint.path, request_serializer=_identity, response_deserializer=_identity
                )(payload, timeout=2)
        except grpc.aio.AioRpcError as e:
            return str(e.code().name)
        return "OK"
