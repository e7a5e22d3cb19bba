"""The CLI's output helpers without a cluster: the table renderer (text and JSON), the wait
progress (drawn only on a terminal, only after a second), and console record formats."""

from __future__ import annotations

import io
import json

import pytest
from highwater.cli import progress
from highwater.cli.console_format import LineFormat, RecordFormat
from highwater.cli.tables import Column, print_table, render_text
from highwater.client.message import TIMESTAMP_LOG_APPEND_TIME, Message

COLUMNS = (Column("GROUP"), Column("CURRENT-OFFSET"), Column("#MEMBERS", "members"))


def test_text_tables_are_aligned_one_row_per_line_without_trailing_blanks() -> None:
    long_name = "a-topic-name-far-longer-than-any-terminal-is-wide-" * 4
    text = render_text(COLUMNS, [(long_name, 5, None), ("g", None, 12)])
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["GROUP", "CURRENT-OFFSET", "#MEMBERS"]
    assert lines[1].split() == [long_name, "5", "-"]
    assert lines[2].split() == ["g", "-", "12"]
    assert all(line == line.rstrip() for line in lines)
    column = lines[0].index("CURRENT-OFFSET")
    assert lines[1][column] == "5" and lines[2][column] == "-"


def test_json_rows_keep_types_and_unknowns(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(COLUMNS, [("g", 3, None), ("h", None, 2)], "json")
    assert json.loads(capsys.readouterr().out) == [
        {"group": "g", "current_offset": 3, "members": None},
        {"group": "h", "current_offset": None, "members": 2},
    ]
    print_table(COLUMNS, [], "text", header_when_empty=False)
    print_table(COLUMNS, [], "json")
    assert capsys.readouterr().out == "[]\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_drawn_only_on_a_terminal_after_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with progress.waiting("moving partitions", total=4) as shown:
        shown.update(completed=1)  # at once: nothing drawn yet
    assert terminal.getvalue() == ""

    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    with progress.waiting("moving partitions", total=4) as shown:
        shown.update(completed=3, detail="2 to go")
    assert "moving partitions: 2 to go" in terminal.getvalue()

    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    with progress.waiting("waiting") as shown:
        shown.update(detail="x")
    assert pipe.getvalue() == ""


def test_record_format_prints_kafkas_fields_in_kafkas_order() -> None:
    message = Message(
        "t", 2, b"k", None, [("h", b"1"), ("n", None)], 1234, offset=7,
        timestamp_type=TIMESTAMP_LOG_APPEND_TIME,
    )  # fmt: skip
    every = RecordFormat.from_properties(
        {
            "print.timestamp": "true", "print.partition": "true", "print.offset": "true",
            "print.headers": "TRUE", "print.key": "true", "null.literal": "~",
            "key.separator": " | ", "headers.separator": ";",
        }
    )  # fmt: skip
    assert (
        every.format(message) == "LogAppendTime:1234 | Partition:2 | Offset:7 | h:1;n:~ | k | ~\n"
    )
    with pytest.raises(ValueError, match=r"print\.key=maybe"):
        RecordFormat.from_properties({"print.key": "maybe"})
    with pytest.raises(ValueError, match=r"unknown property 'print\.keys'"):
        RecordFormat.from_properties({"print.keys": "true"})


def test_line_format_reads_headers_keys_and_nulls() -> None:
    reader = LineFormat.from_properties(
        {"parse.headers": "true", "parse.key": "true", "null.marker": "-"}
    )
    assert reader.parse("a:1,b:-\tk\tv\tw", 1) == ([("a", b"1"), ("b", None)], "k", "v\tw")
    assert reader.parse("\t-\t-", 2) == ([], None, None)
    with pytest.raises(ValueError, match="no key separator '\\\\t' on line 3"):
        reader.parse("a:1\tnokey", 3)
    with pytest.raises(ValueError, match="must not be empty"):
        LineFormat.from_properties({"headers.delimiter": ""})
