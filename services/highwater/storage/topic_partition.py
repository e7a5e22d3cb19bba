"""Topic-partition identity: ``TopicPartition``, Kafka's topic-name rule, partition dir names."""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from highwater.errors import InvalidTopicError, StrayFileError

MAX_TOPIC_NAME_LENGTH: Final = 249
MAX_PARTITION: Final = 2**31 - 1

_LEGAL_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]+", re.ASCII)
_CANONICAL_PARTITION = re.compile(r"0|[1-9][0-9]*", re.ASCII)


def validate_topic_name(name: str) -> None:
    """Check ``name`` against Kafka's rule: 1 to 249 of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``.

    Raises :class:`~highwater.errors.InvalidTopicError` saying which part of the rule fails.
    """
    if not name:
        raise InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicError(f'Topic name {name!r} is illegal, it can\'t be "." or ".."')
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"Topic name {name[:40]!r}... is illegal, it can't be longer than "
            f"{MAX_TOPIC_NAME_LENGTH} characters (it has {len(name)})"
        )
    if not _LEGAL_TOPIC_CHARS.fullmatch(name):
        raise InvalidTopicError(
            f"Topic name {name!r} is illegal, it contains a character other than "
            "ASCII alphanumerics, '.', '_' and '-'"
        )


class TopicPartition(NamedTuple):
    """One partition of one topic; ``str()`` gives ``topic-partition``, its directory name."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def dir_name(self) -> str:
        """The name of this partition's directory in a data directory."""
        return str(self)

    @classmethod
    def parse_dir_name(cls, name: str) -> TopicPartition:
        """Parse a partition directory name ``<topic>-<partition>``.

        Topic names may contain ``-``, so the name splits at its last ``-``. The partition
        must be a non-negative 32-bit integer written canonically (``7``, not ``07`` or
        ``+7``) and the topic must be a legal name; otherwise
        :class:`~highwater.errors.StrayFileError` names the directory.
        """
        topic, sep, partition = name.rpartition("-")
        if not sep:
            raise StrayFileError(f"{name!r} is not a partition directory: no '-<partition>'")
        if not _CANONICAL_PARTITION.fullmatch(partition) or int(partition) > MAX_PARTITION:
            raise StrayFileError(
                f"{name!r} is not a partition directory: {partition!r} is not a partition number"
            )
        try:
            validate_topic_name(topic)
        except InvalidTopicError as e:
            raise StrayFileError(f"{name!r} is not a partition directory: {e}") from None
        return cls(topic, int(partition))
