"""Kafka's RecordBatch v2, on the wire and on disk: header, varints, records, codecs, batches.

:data:`IMPLEMENTATION` says whether the compiled hot paths are loaded (``"compiled"``) or
the pure-Python ones (``"pure-python"``, also what ``HIGHWATER_PURE_PYTHON=1`` selects);
see :mod:`.implementation`.
"""

from .batch import (
    DEFAULT_BATCH_SIZE,
    RecordBatch,
    RecordBatchBuilder,
    build_batch,
    iter_batches,
)
from .compression import DEFAULT_MAX_DECOMPRESSED_SIZE, compress, decompress
from .header import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Compression,
    TimestampType,
    check_batch,
    read_header,
)
from .implementation import IMPLEMENTATION
from .record import Header, Headers, Record, SimpleRecord, SimpleRecordLike, SlotFactory

__all__ = [
    "BATCH_HEADER_SIZE",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_DECOMPRESSED_SIZE",
    "IMPLEMENTATION",
    "LOG_OVERHEAD",
    "BatchHeader",
    "Compression",
    "Header",
    "Headers",
    "Record",
    "RecordBatch",
    "RecordBatchBuilder",
    "SimpleRecord",
    "SimpleRecordLike",
    "SlotFactory",
    "TimestampType",
    "build_batch",
    "check_batch",
    "compress",
    "decompress",
    "iter_batches",
    "read_header",
]
