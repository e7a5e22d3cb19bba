"""A Controller service that does nothing: the ceiling any Python controller can reach here.

``python -m bench._grpc_floor PORT`` serves ``highwater.internal.v1.Controller`` with every call
answered at once by an empty response of the right type, on grpc.aio and uvloop like
``highwater controller``. Driven by the same client with the same requests as the real
quorum, it measures what the client, gRPC and the machine allow before any validation,
Raft round trip or fsync: the floor of the quorum benchmarks' latency and the ceiling of
their throughput.

``python -m bench._grpc_floor PORT DELAY_MS`` answers each call after ``DELAY_MS`` of
waiting on the event loop instead (no CPU: a stand-in for a commit's round trips and
fsyncs): with N writers, gRPC could then answer up to N / DELAY_MS calls per
millisecond if it took calls in concurrently; what it reaches is the intake's own
ceiling on this machine (docs/raft.md, "Seventh pass").

``python -m bench._grpc_floor PORT DELAY_MS project`` builds the server with the project's
:func:`~highwater.rpc.server.new_server` instead of a bare ``grpc.aio.server()`` (its
interceptors, message caps and options, authentication off as in the benchmarks): what
the project's server plumbing costs per call before any servicer (docs/raft.md,
"Eighth pass").
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc
import grpc.aio
import uvloop
from google.protobuf import message_factory
from highwater.internal.v1 import controller_pb2


def _handlers(delay_ms: float, coroutines: bool = False) -> grpc.GenericRpcHandler:
    """The Controller service's methods answered at once (``coroutines``: by coroutine
    functions, as the project's servicers are and its interceptor requires), or after
    ``delay_ms``."""
    service = controller_pb2.DESCRIPTOR.services_by_name["Controller"]
    handlers = {}
    for method in service.methods:
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)

        def answer(_request: Any, _context: Any, response_type: Any = response_type) -> Any:
            return response_type()

        async def answer_now(
            _request: Any, _context: Any, response_type: Any = response_type
        ) -> Any:
            return response_type()

        async def answer_later(
            _request: Any, _context: Any, response_type: Any = response_type
        ) -> Any:
            await asyncio.sleep(delay_ms / 1000)
            return response_type()

        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            answer_later if delay_ms > 0 else answer_now if coroutines else answer,
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


async def serve(port: int, delay_ms: float = 0.0, server_kind: str = "bare") -> None:
    if server_kind == "project":
        from highwater.rpc.server import new_server

        server = new_server(max_message_bytes=4 << 20)
    else:
        server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handlers(delay_ms, server_kind == "project"),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(
        serve(
            int(sys.argv[1]),
            float(sys.argv[2]) if len(sys.argv) > 2 else 0.0,
            sys.argv[3] if len(sys.argv) > 3 else "bare",
        )
    )
