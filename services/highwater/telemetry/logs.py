"""Log lines that carry the trace and span ids of the span they were written in.

:class:`TraceContextFilter` puts ``trace_id`` and ``span_id`` (hex, empty outside a span)
on every log record; :class:`TextFormatter` appends them to the usual line when there are
any, and :class:`JsonFormatter` writes one JSON object a line (``time``, ``level``,
``logger``, ``message``, ``trace_id``, ``span_id``, ``exception``), for log pipelines
that join logs to traces.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from opentelemetry import trace

__all__ = ["JsonFormatter", "TextFormatter", "TraceContextFilter"]


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
