"""A partition log directory's ``partition.metadata`` file: the topic id its log belongs to.

Kafka's ``PartitionMetadataFile``: two lines, ``version: 0`` and ``topic_id: <id>``, the id
as the controller hands it out (a 16-byte uuid in URL-safe base64 without padding, which
is also Kafka's ``Uuid.toString``). It is written when a log is first given to a topic id
(temporary file, fsync, rename, fsync of the directory), and read when the log is loaded.
A name's topic can be deleted and created again while a broker is down: at its next start
the log it finds under that name is the old topic's, and only this file tells the two
apart (the broker removes a log whose recorded id is not the image's before making the
new topic's replica). A log without the file (written before the file existed) takes the
image's id, as Kafka's ``assignTopicId`` does.
"""

from __future__ import annotations

import re
from pathlib import Path

from highwater.errors import HighwaterError, KafkaStorageError
from highwater.storage.checkpoint import write_atomically

PARTITION_METADATA = "partition.metadata"
VERSION = 0
_TOPIC_ID = re.compile(r"[A-Za-z0-9_-]+")


class InconsistentTopicIdError(HighwaterError):
    """A log recording one topic id was asked to serve another (Kafka's
    ``InconsistentTopicIdException``): it is a former topic's under the same name."""


class InconsistentPartitionMetadataError(KafkaStorageError):
    """A ``partition.metadata`` file that cannot be read as one: an unknown version, a
    missing or malformed topic id. Its log directory is taken offline, as Kafka does with
    the ``KafkaStorageException`` its read raises: the broker keeps serving the others."""


def read_topic_id(log_dir: Path) -> str | None:
    """The topic id recorded in ``log_dir``, None when it has no ``partition.metadata``."""
    path = log_dir / PARTITION_METADATA
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise InconsistentPartitionMetadataError(f"{path}: not text: {e}") from None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise InconsistentPartitionMetadataError(f"{path}: malformed line {line!r}")
        fields[key.strip()] = value.strip()
    if fields.get("version") != str(VERSION):
        raise InconsistentPartitionMetadataError(
            f"{path}: unknown version {fields.get('version')!r}, expected {VERSION}"
        )
    topic_id = fields.get("topic_id", "")
    if not _TOPIC_ID.fullmatch(topic_id):
        raise InconsistentPartitionMetadataError(f"{path}: malformed topic id {topic_id!r}")
    return topic_id


def write_topic_id(log_dir: Path, topic_id: str) -> None:
    """Record ``topic_id`` in ``log_dir`` durably: a crash leaves the old file or the new
    one, never a torn one (:func:`~highwater.storage.checkpoint.write_atomically`, whose
    writes the simulated disks can fault)."""
    if not _TOPIC_ID.fullmatch(topic_id):
        raise ValueError(f"malformed topic id {topic_id!r}")
    text = f"version: {VERSION}\ntopic_id: {topic_id}\n"
    write_atomically(log_dir / PARTITION_METADATA, text.encode("utf-8"))
