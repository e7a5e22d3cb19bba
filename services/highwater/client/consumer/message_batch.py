"""What :meth:`~highwater.client.consumer.AsyncConsumer.consume_batches` returns: the records
of one partition decoded into column buffers, and a :class:`Message` made only for the
records a caller indexes or iterates.

``consume()`` returns a :class:`Message` per record; the objects, not the decoding, are
most of what a consumer's loop costs per record (docs/benchmarks.md). A
:class:`MessageBatch` holds what the decoder wrote for a run of a partition's records
(:class:`~highwater.records.columnar.ColumnBuffers`: keys, values, offsets, timestamps,
headers, with no Python object per record, filled in C by the compiled codec) and is a
read-only sequence of messages over them: ``len(batch)``, ``batch[i]``, ``for message in
batch`` make a message on demand, equal field for field to the one ``consume()`` would
have returned. :meth:`MessageBatch.values`, :meth:`MessageBatch.offsets` and
:attr:`MessageBatch.columns` give the records without a message each.

An error of the partition (what ``consume()`` returns as an error message) comes as a
batch of no records whose :meth:`MessageBatch.error` is set, after the records before it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import overload

from highwater.client.message import Message, message_makers
from highwater.records.columnar import ColumnBuffers
from highwater.records.implementation import codec
from highwater.records.record import RecordFactory

__all__ = ["MessageBatch"]

_binary_column: Callable[[bytes, memoryview, bytes, int], list[bytes | None]] | None = (
    None if codec is None else codec.binary_column
)
"""The compiled row slicer of a binary column, None on the pure-Python paths."""


class _Binary:
    """Row access to one Arrow binary column (validity bitmap, int32 offsets, bytes)."""

    __slots__ = ("data", "offsets", "validity")

    def __init__(self, validity: bytes, offsets: bytes, data: bytes) -> None:
        self.validity = validity
        self.offsets = memoryview(offsets).cast("i")
        self.data = data

    def __getitem__(self, row: int) -> bytes | None:
        if not self.validity[row >> 3] >> (row & 7) & 1:
            return None
        return self.data[self.offsets[row] : self.offsets[row + 1]]

    def column(self, length: int) -> list[bytes | None]:
        """The first ``length`` rows: in one C call with the compiled codec
        (``binary_column``), else sliced in one pass with the nulls found from the bitmap
        as one integer (the reference)."""
        column = pure_binary_column if _binary_column is None else _binary_column
        return column(self.validity, self.offsets, self.data, length)


def pure_binary_column(
    validity: bytes, offsets: memoryview, data: bytes, length: int
) -> list[bytes | None]:
    """The first ``length`` rows of a binary column (``offsets`` as int32): the reference
    of the compiled ``binary_column``."""
    bounds = offsets.tolist()
    rows: list[bytes | None] = [
        data[start:end] for start, end in itertools.pairwise(bounds[: length + 1])
    ]
    every = (1 << length) - 1
    present = int.from_bytes(validity, "little") & every
    if present != every:
        for row in range(length):
            if not present >> row & 1:
                rows[row] = None
    return rows


class MessageBatch(Sequence[Message]):
    """Records of one partition, in offset order, as a lazy sequence of :class:`Message`
    (see the module docstring)."""

    __slots__ = (
        "_epoch_rows",
        "_epochs",
        "_error",
        "_header_keys",
        "_header_offsets",
        "_header_values",
        "_keys",
        "_makers",
        "_offsets",
        "_partition",
        "_timestamp_types",
        "_timestamps",
        "_topic",
        "_values",
        "columns",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        columns: ColumnBuffers | None,
        error: BaseException | None = None,
        error_offset: int = -1,
        *,
        epochs: Sequence[tuple[int, int]] = (),
    ) -> None:
        """The records in ``columns`` (decoded with headers), or, with ``columns`` None, the
        partition's ``error`` at ``error_offset`` (the position it was found at).
        ``epochs``: ``(first row, partition leader epoch)`` of each run of rows that came
        in batches of one epoch, in row order (none: the epochs are not known)."""
        self._topic = topic
        self._partition = partition
        self._error = error
        self._epoch_rows = [row for row, _ in epochs]
        self._epochs = [epoch for _, epoch in epochs]
        self.columns = columns
        """The records as Arrow buffers, as the decoder wrote them (None for an error)."""
        if columns is None:
            self._offsets = memoryview(error_offset.to_bytes(8, "little", signed=True)).cast("q")
            return
        self._keys = _Binary(columns.key_validity, columns.key_offsets, columns.key_data)
        self._values = _Binary(columns.value_validity, columns.value_offsets, columns.value_data)
        self._offsets = memoryview(columns.offsets).cast("q")
        self._timestamps = memoryview(columns.timestamps).cast("q")
        self._timestamp_types = memoryview(columns.timestamp_types).cast("i")
        self._header_offsets = memoryview(columns.header_offsets).cast("i")
        self._header_keys = _Binary(b"", columns.header_key_offsets, columns.header_key_data)
        self._header_values = _Binary(
            columns.header_value_validity, columns.header_value_offsets, columns.header_value_data
        )
        # What makes a row a message, by leader epoch, made with the first message of the
        # epoch: a caller taking values() or the columns never pays for it.
        self._makers: dict[int, tuple[RecordFactory[Message], RecordFactory[Message]]] = {}

    def topic(self) -> str:
        """The records' topic."""
        return self._topic

    def partition(self) -> int:
        """The records' partition."""
        return self._partition

    def error(self) -> BaseException | None:
        """The partition's error (the batch then holds no record), or None."""
        return self._error

    def __len__(self) -> int:
        """How many records the batch holds (0 for an error)."""
        return 0 if self.columns is None else self.columns.length

    def first_offset(self) -> int:
        """The first record's offset (for an error: the position it was found at)."""
        return int(self._offsets[0])

    def last_offset(self) -> int:
        """The last record's offset (for an error: the position it was found at)."""
        return int(self._offsets[-1])

    def offsets(self) -> list[int]:
        """Every record's offset, without a message each."""
        return self._offsets.tolist() if self.columns is not None else []

    def values(self) -> list[bytes | None]:
        """Every record's value (None: a tombstone), without a message each."""
        return self._values.column(len(self)) if self.columns is not None else []

    def keys(self) -> list[bytes | None]:
        """Every record's key (None: no key), without a message each."""
        return self._keys.column(len(self)) if self.columns is not None else []

    def _headers(self, row: int) -> tuple[tuple[str, bytes | None], ...]:
        offsets = self._header_offsets
        if not offsets or offsets[row] == offsets[row + 1]:
            return ()
        keys, values = self._header_keys, self._header_values
        return tuple(
            (keys.data[keys.offsets[h] : keys.offsets[h + 1]].decode(), values[h])
            for h in range(offsets[row], offsets[row + 1])
        )

    def _message(self, row: int) -> Message:
        run = bisect.bisect_right(self._epoch_rows, row) - 1
        epoch = self._epochs[run] if run >= 0 else -1
        makers = self._makers.get(epoch)
        if makers is None:
            makers = self._makers[epoch] = message_makers(self._topic, self._partition, epoch)
        make = makers[self._timestamp_types[row]]
        return make(
            self._keys[row],
            self._values[row],
            self._headers(row),
            self._timestamps[row],
            self._offsets[row],
        )

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        """The record at ``index`` as a :class:`Message`, made now (a list for a slice)."""
        if isinstance(index, slice):
            return [self._message(row) for row in range(*index.indices(len(self)))]
        length = len(self)
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError("MessageBatch index out of range")
        return self._message(index)

    def __iter__(self) -> Iterator[Message]:
        """The records as messages, each made as it is reached."""
        message = self._message
        for row in range(len(self)):
            yield message(row)

    def __repr__(self) -> str:
        """Topic, partition and the offsets (or the error)."""
        where = f"{self._topic}-{self._partition}"
        if self._error is not None:
            return f"MessageBatch({where}: {self._error!r})"
        if not len(self):
            return f"MessageBatch({where}: empty)"
        return f"MessageBatch({where}@{self.first_offset()}..{self.last_offset()})"
