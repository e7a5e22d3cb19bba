"""What an example client in another language (examples/node, examples/ruby) must have seen:
the one story each tells, checked the same way for every language."""

from __future__ import annotations

from typing import Any

from highwater.records.partitioner import partition_for_key

PARTITIONS = 3
RECORDS = 30


def check_story(seen: dict[str, Any]) -> None:
    """Keyed records placed by the broker where the Python client's partitioner puts them,
    consumed in a group through a consumer session, committed, offsets listed."""
    assert seen["create_topics"] == "NONE"
    assert seen["produce_error"] == "NONE"
    placements = {key: (partition, offset) for key, partition, offset in seen["placements"]}
    assert len(placements) == RECORDS
    for key, (partition, _) in placements.items():
        assert partition == partition_for_key(key.encode(), PARTITIONS), key
    ends = dict.fromkeys(range(PARTITIONS), 0)
    for partition, offset in placements.values():
        ends[partition] = max(ends[partition], offset + 1)

    session = seen["session"]
    assert session["assignments"][-1] == list(range(PARTITIONS))
    consumed = {r["key"]: (r["partition"], r["offset"]) for r in session["consumed"]}
    assert consumed == placements
    assert session["committed"] == [[p, ends[p], "NONE"] for p in range(PARTITIONS) if ends[p]]
    assert seen["committed"] == [[p, ends[p] or -1] for p in range(PARTITIONS)]
    assert seen["latest"] == [[p, ends[p]] for p in range(PARTITIONS)]
