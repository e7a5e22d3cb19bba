"""Records as console lines: kafka-console-consumer's formatter and kafka-console-producer's reader.

Both are driven by ``--property KEY=VALUE`` with Kafka's names, so commands written for
Kafka's console tools work unchanged.

**Printing** (``consume``; :class:`RecordFormat`, Kafka's ``DefaultMessageFormatter``):
``print.timestamp``, ``print.partition``, ``print.offset``, ``print.headers``,
``print.key`` (each ``false`` by default) and ``print.value`` (``true``) choose the
fields, printed in that order and separated by ``key.separator`` (a tab)::

    CreateTime:1700000000000<TAB>Partition:0<TAB>Offset:42<TAB>h1:v1,h2:v2<TAB>key<TAB>value

Headers are ``key:value`` pairs joined by ``headers.separator`` (``,``), ``NO_HEADERS``
when a record has none; a null key, value or header value prints as ``null.literal``
(``null``); ``line.separator`` ends each record (a newline). A timestamp prints as
``CreateTime:MS``, ``LogAppendTime:MS`` or ``NO_TIMESTAMP``. ``--formatter json``
(:func:`json_record`) prints each record as one JSON object instead:
``{"topic", "partition", "offset", "timestamp", "timestamp_type", "headers": [{"key",
"value"}], "key", "value"}`` with bytes decoded as UTF-8 (undecodable bytes replaced).

**Reading** (``produce``; :class:`LineFormat`, Kafka's ``LineMessageReader``): each line
is a value; with ``parse.key=true`` it is ``key<key.separator>value`` (a tab); with
``parse.headers=true`` the headers come first, ``h1:v1,h2:v2<headers.delimiter>...``
(``headers.delimiter`` a tab, ``headers.separator`` ``,``, ``headers.key.separator``
``:``). ``null.marker``, when set, reads a key, value or header value equal to it as
null. A line that lacks a separator it needs is an error naming the line (the other
lines are still sent).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from highwater.client.message import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Message

__all__ = [
    "LINE_PROPERTIES",
    "RECORD_PROPERTIES",
    "LineFormat",
    "RecordFormat",
    "json_record",
]

#: The ``--property`` keys :class:`RecordFormat` understands.
RECORD_PROPERTIES: Final = frozenset(
    {
        "print.timestamp",
        "print.partition",
        "print.offset",
        "print.headers",
        "print.key",
        "print.value",
        "key.separator",
        "line.separator",
        "headers.separator",
        "null.literal",
    }
)
#: The ``--property`` keys :class:`LineFormat` understands (the rest are producer configs).
LINE_PROPERTIES: Final = frozenset(
    {
        "parse.key",
        "key.separator",
        "parse.headers",
        "headers.delimiter",
        "headers.separator",
        "headers.key.separator",
        "null.marker",
    }
)
_TIMESTAMP_TYPES: Final = {
    TIMESTAMP_CREATE_TIME: "CreateTime",
    TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime",
}


def _flag(properties: Mapping[str, str], key: str, default: bool) -> bool:
    """A ``true``/``false`` property; ValueError naming it for anything else."""
    text = properties.get(key)
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"{key}={text}: expected true or false")
    return lowered == "true"


def _separator(properties: Mapping[str, str], key: str, default: str) -> str:
    """A separator property, which must not be empty."""
    value = properties.get(key, default)
    if value == "":
        raise ValueError(f"{key} must not be empty")
    return value


def _text(data: bytes | None, null: str) -> str:
    return null if data is None else data.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class RecordFormat:
    """Which fields of a consumed record print, and how (see the module docstring)."""

    print_timestamp: bool = False
    print_partition: bool = False
    print_offset: bool = False
    print_headers: bool = False
    print_key: bool = False
    print_value: bool = True
    key_separator: str = "\t"
    line_separator: str = "\n"
    headers_separator: str = ","
    null_literal: str = "null"

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> RecordFormat:
        """From ``--property`` pairs; ValueError naming an unknown key or a bad value."""
        unknown = sorted(set(properties) - RECORD_PROPERTIES)
        if unknown:
            raise ValueError(
                f"unknown property {unknown[0]!r} (known: {', '.join(sorted(RECORD_PROPERTIES))})"
            )
        return cls(
            print_timestamp=_flag(properties, "print.timestamp", False),
            print_partition=_flag(properties, "print.partition", False),
            print_offset=_flag(properties, "print.offset", False),
            print_headers=_flag(properties, "print.headers", False),
            print_key=_flag(properties, "print.key", False),
            print_value=_flag(properties, "print.value", True),
            key_separator=properties.get("key.separator", "\t"),
            line_separator=properties.get("line.separator", "\n"),
            headers_separator=properties.get("headers.separator", ","),
            null_literal=properties.get("null.literal", "null"),
        )

    def format(self, message: Message) -> str:
        """One record, ended by ``line_separator``."""
        null = self.null_literal
        fields: list[str] = []
        if self.print_timestamp:
            kind, ms = message.timestamp()
            name = _TIMESTAMP_TYPES.get(kind)
            fields.append("NO_TIMESTAMP" if name is None or ms < 0 else f"{name}:{ms}")
        if self.print_partition:
            fields.append(f"Partition:{message.partition()}")
        if self.print_offset:
            fields.append(f"Offset:{message.offset()}")
        if self.print_headers:
            headers = message.headers()
            fields.append(
                self.headers_separator.join(f"{k}:{_text(v, null)}" for k, v in headers)
                if headers
                else "NO_HEADERS"
            )
        if self.print_key:
            fields.append(_text(message.key(), null))
        if self.print_value:
            fields.append(_text(message.value(), null))
        return self.key_separator.join(fields) + self.line_separator


def json_record(message: Message) -> str:
    """One record as one line of JSON (``--formatter json``)."""
    kind, ms = message.timestamp()
    return json.dumps(
        {
            "topic": message.topic(),
            "partition": message.partition(),
            "offset": message.offset(),
            "timestamp": ms if ms >= 0 else None,
            "timestamp_type": _TIMESTAMP_TYPES.get(kind),
            "headers": [
                {"key": k, "value": None if v is None else v.decode("utf-8", errors="replace")}
                for k, v in message.headers() or ()
            ],
            "key": None if message.key() is None else _text(message.key(), ""),
            "value": None if message.value() is None else _text(message.value(), ""),
        },
        ensure_ascii=False,
    )


@dataclass(frozen=True, slots=True)
class LineFormat:
    """How a line of stdin becomes a record (see the module docstring)."""

    parse_key: bool = False
    key_separator: str = "\t"
    parse_headers: bool = False
    headers_delimiter: str = "\t"
    headers_separator: str = ","
    headers_key_separator: str = ":"
    null_marker: str | None = None

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> LineFormat:
        """From the reader's ``--property`` pairs; ValueError naming a bad value."""
        return cls(
            parse_key=_flag(properties, "parse.key", False),
            key_separator=_separator(properties, "key.separator", "\t"),
            parse_headers=_flag(properties, "parse.headers", False),
            headers_delimiter=_separator(properties, "headers.delimiter", "\t"),
            headers_separator=_separator(properties, "headers.separator", ","),
            headers_key_separator=_separator(properties, "headers.key.separator", ":"),
            null_marker=properties.get("null.marker") or None,
        )

    def _nullable(self, text: str) -> str | None:
        return None if self.null_marker is not None and text == self.null_marker else text

    def parse(
        self, line: str, number: int
    ) -> tuple[list[tuple[str, bytes | None]], str | None, str | None]:
        """``(headers, key, value)`` of line ``number``; ValueError naming what it lacks."""
        headers: list[tuple[str, bytes | None]] = []
        rest = line
        if self.parse_headers:
            text, found, rest = line.partition(self.headers_delimiter)
            if not found:
                raise ValueError(
                    f"no headers delimiter {self.headers_delimiter!r} on line {number}"
                )
            for pair in text.split(self.headers_separator) if text else ():
                name, found, value = pair.partition(self.headers_key_separator)
                if not found:
                    raise ValueError(
                        f"no header key separator {self.headers_key_separator!r} in "
                        f"{pair!r} on line {number}"
                    )
                header_value = self._nullable(value)
                headers.append((name, None if header_value is None else header_value.encode()))
        key: str | None = None
        if self.parse_key:
            key, found, rest = rest.partition(self.key_separator)
            if not found:
                raise ValueError(f"no key separator {self.key_separator!r} on line {number}")
            key = self._nullable(key)
        return headers, key, self._nullable(rest)
