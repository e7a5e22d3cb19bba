"""Kafka's RecordBatch v2, on the wire and on disk: header, varints, records, codecs, batches."""

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
from .record import Header, Headers, Record, SimpleRecord, SimpleRecordLike

__all__ = [
    "BATCH_HEADER_SIZE",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_DECOMPRESSED_SIZE",
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
    "TimestampType",
    "build_batch",
    "check_batch",
    "compress",
    "decompress",
    "iter_batches",
    "read_header",
]
