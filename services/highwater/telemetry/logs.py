"""Log lines that carry the trace and span ids of the span they were written in.

:class:`TraceContextFilter` puts ``trace_id`` and ``span_id`` (hex, empty outside a span)
on every log record; :class:`TextFormatter` appends them to the usual line when there are
any, and :class:`JsonFormatter` writes one JSON object a line (``time``, ``level``,
``logger``, ``message``, ``trace_id``, ``span_id``, ``exception``), for log pipelines
that join logs to traces. :class:`UndecodableRequestFilter` makes gRPC's report of a
request that is not a protobuf message one warning line instead of an error with a
traceback.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

from google.protobuf.message import DecodeError
from opentelemetry import trace

__all__ = [
    "GRPC_LOGGERS",
    "JsonFormatter",
    "TextFormatter",
    "TraceContextFilter",
    "UndecodableRequestFilter",
]

GRPC_LOGGERS = ("grpc._cython.cygrpc", "grpc._common")
"""Where gRPC's asyncio and thread servers log a request they could not decode."""

_METHOD = re.compile(r"\[(/[^\]]+)\]")


class TraceContextFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` of the current span to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = f"{context.trace_id:032x}"
            record.span_id = f"{context.span_id:016x}"
        else:
            record.trace_id = record.span_id = ""
        return True


class UndecodableRequestFilter(logging.Filter):
    """For the :data:`GRPC_LOGGERS`: a request that does not decode is the sender's
    mistake (gRPC answers it with an error status before any service code runs), not the
    server's, so it is logged as one WARNING line naming the method and the decoding error,
    without a traceback. Exceptions raised anywhere else keep their ERROR and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and _raised_by_grpc_deserializer(record.exc_info[1]):
            method = _METHOD.search(record.getMessage())
            record.msg = "refused a request to %s that does not decode: %s"
            record.args = (method.group(1) if method else "a method", record.exc_info[1])
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = None
            record.exc_text = None
        return True


def _raised_by_grpc_deserializer(error: BaseException | None) -> bool:
    """Whether ``error`` is protobuf's DecodeError raised in gRPC's own ``deserialize``."""
    if not isinstance(error, DecodeError) or error.__traceback__ is None:
        return False
    frame = error.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    code = frame.tb_frame.f_code
    return code.co_name.endswith("deserialize") and "grpc" in code.co_filename


class TextFormatter(logging.Formatter):
    """The plain format, with `` trace_id=… span_id=…`` when written in a span."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            line = f"{line} trace_id={trace_id} span_id={getattr(record, 'span_id', '')}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "trace_id": getattr(record, "trace_id", ""),
            "span_id": getattr(record, "span_id", ""),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)
