"""What :meth:`~highwater.client.producer.AsyncProducer.produce` returns: a record's delivery
handle, whose :class:`asyncio.Future` is made only when a caller waits on it.

A future per record was the largest single cost of ``produce()`` and of its delivery (the
future itself, its ``set_result``, a :class:`RecordMetadata` made for it), paid even by the
callers who never look at it (those who use delivery callbacks, or only ``flush()``). A
:class:`DeliveryHandle` is a small object that points at its record's batch and index: the
batch's outcome (its base offset, its append time, or its error) is set once for all of
its records, and the handle reads its own :class:`RecordMetadata` from it when asked.
``await handle``, :meth:`~DeliveryHandle.add_done_callback` or
:meth:`~DeliveryHandle.cancel` make the future then (already resolved when the record
was delivered before); a future made before the delivery is resolved with the batch.

The handle answers what callers asked of the future (``await``, ``result()``,
``exception()``, ``done()``, ``cancelled()``, ``add_done_callback()``,
``remove_done_callback()``, ``get_loop()``): ``asyncio.wait`` takes it as a future, and
``asyncio.gather`` and ``asyncio.wait_for`` as any awaitable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from highwater.client.producer.delivery import RecordMetadata, consume_exception

if TYPE_CHECKING:
    from highwater.client.producer.accumulator import ProducerBatch

__all__ = ["DeliveryHandle"]


class DeliveryHandle:
    """One produced record's delivery report, read from its batch when asked (see the
    module docstring)."""

    __slots__ = ("_batch", "_error", "_future", "_index")

    def __init__(self) -> None:
        """A handle of a record not placed in a batch yet."""
        self._batch: ProducerBatch | None = None
        self._index = 0
        self._future: asyncio.Future[RecordMetadata] | None = None
        self._error: BaseException | None = None
        """The record's own error (it failed before it reached a batch)."""

    def _outcome(self) -> RecordMetadata | BaseException | None:
        """The record's metadata or error; None while it is undelivered."""
        if self._error is not None:
            return self._error
        batch = self._batch
        if batch is None or not batch.delivered:
            return None
        if batch.error is not None:
            return batch.error
        return batch.metadata_of(self._index)

    def _fail(self, error: BaseException) -> None:
        """The record failed on its own (not as part of a batch)."""
        self._error = error
        if self._future is not None:
            self._resolve()

    def _resolve(self) -> None:
        """Resolve the future made before the delivery (the producer calls this)."""
        future = self._future
        if future is None or future.done():
            return
        outcome = self._outcome()
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
            future.add_done_callback(consume_exception)
        elif outcome is not None:
            future.set_result(outcome)

    def future(self) -> asyncio.Future[RecordMetadata]:
        """The record's future, made now if it was not (on the running loop)."""
        future = self._future
        if future is None:
            future = self._future = asyncio.get_running_loop().create_future()
            if self._outcome() is not None:
                self._resolve()
            elif self._batch is not None:
                self._batch.waiters.append(self)
            # else: the record waits for metadata; placing it registers the handle
        return future

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        """``await handle``: the record's :class:`RecordMetadata`, or its delivery error."""
        return self.future().__await__()

    def done(self) -> bool:
        """Whether the record was delivered (written or failed for good), or cancelled."""
        if self._future is not None and self._future.cancelled():
            return True
        return self._outcome() is not None

    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called (the record is delivered all the same)."""
        return self._future is not None and self._future.cancelled()

    def cancel(self) -> bool:
        """Stop waiting on the record (its future is cancelled; the record itself is still
        sent and reported to its callbacks, as with the future ``produce()`` returned)."""
        return self.future().cancel()

    def result(self) -> RecordMetadata:
        """The record's :class:`RecordMetadata`; raises its delivery error, or
        :class:`asyncio.InvalidStateError` while it is undelivered."""
        if self._future is not None and self._future.cancelled():
            raise asyncio.CancelledError()
        outcome = self._outcome()
        if outcome is None:
            raise asyncio.InvalidStateError("the record has not been delivered yet")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def exception(self) -> BaseException | None:
        """The record's delivery error (None once written); raises
        :class:`asyncio.InvalidStateError` while it is undelivered."""
        if self._future is not None and self._future.cancelled():
            raise asyncio.CancelledError()
        outcome = self._outcome()
        if outcome is None:
            raise asyncio.InvalidStateError("the record has not been delivered yet")
        return outcome if isinstance(outcome, BaseException) else None

    def add_done_callback(
        self, callback: Callable[[asyncio.Future[RecordMetadata]], object]
    ) -> None:
        """``callback(future)`` once the record is delivered (makes the future)."""
        self.future().add_done_callback(callback)

    def remove_done_callback(
        self, callback: Callable[[asyncio.Future[RecordMetadata]], object]
    ) -> int:
        """Remove ``callback`` from the future's callbacks; returns how many were removed
        (``asyncio.wait`` takes the handle as a future and calls this)."""
        return 0 if self._future is None else self._future.remove_done_callback(callback)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop of the record's future (made now if it was not)."""
        return self.future().get_loop()

    def __repr__(self) -> str:
        """The outcome so far."""
        outcome = self._outcome()
        state = "pending" if outcome is None else repr(outcome)
        return f"DeliveryHandle({state})"
