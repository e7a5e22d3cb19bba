"""``MethodWrappingInterceptor``: a server interceptor that wraps each method's handler once.

The package's server interceptors (:mod:`~highwater.rpc.auth`'s identity and ACL checks,
:mod:`~highwater.rpc.undecodable`'s answer to requests that do not decode) wrap the
handler of every method they see. Each wrapped handler is built at the method's first
call and kept: the servicers are registered before the server starts and the interceptors
after each one keep theirs per method too, so the handler below a method never changes.
What is kept is only the wrapping; whatever the wrapper checks runs inside it, on every
call.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

__all__ = ["MethodWrappingInterceptor"]


class MethodWrappingInterceptor(grpc.aio.ServerInterceptor):
    """Gives each method the handler :meth:`wrap` makes of the one below it, made once."""

    def __init__(self) -> None:
        self._handlers: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        try:
            return self._handlers[method]
        except KeyError:
            pass
        handler = await continuation(handler_call_details)
        wrapped = None if handler is None else self.wrap(method, handler)
        self._handlers[method] = wrapped
        return wrapped

    @abc.abstractmethod
    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The handler that serves ``method`` in place of ``handler``."""
