"""A controller data directory's ``meta.properties``: which node's it is.

Format, as a broker's log directory has it (``storage/log_manager.py``) and as Kafka's
``meta.properties`` is: ``key=value`` lines, ``#`` comments, here::

    version=1
    node.id=1

A voter's ``quorum-state`` records whom it voted for in which epoch; that promise is only
kept if the directory is started again under the node id it was made for. So the first
start writes the node id, and every later start checks it (Kafka's
``MetaPropertiesEnsemble.verify``: "Stored node id 0 doesn't match previous node id 1"):
a data directory taken over by another node id is refused before anything in it is read,
where otherwise that node would inherit the other's vote and could vote twice in an
epoch. A directory from before the file existed is adopted as it stands and gets one.
Keys other than ``node.id`` (a broker's, if a log directory is shared) are kept as found.
"""

from __future__ import annotations

from pathlib import Path

from highwater.errors import KafkaStorageError
from highwater.storage.checkpoint import write_atomically
from highwater.storage.log_manager import META_PROPERTIES, read_meta_properties

__all__ = ["META_PROPERTIES", "check_node_id", "read_meta_properties"]


def check_node_id(data_dir: Path, node_id: int) -> None:
    """Refuse ``data_dir`` if its ``meta.properties`` names another node; record
    ``node_id`` in it if it names none (a new directory, or one from before the file)."""
    meta = read_meta_properties(data_dir)
    stored = meta.get("node.id")
    if stored is not None:
        if stored != str(node_id):
            raise KafkaStorageError(
                f"Stored node id {stored} doesn't match the configured node id {node_id} "
                f"in {data_dir / META_PROPERTIES}: start it with --node-id {stored}, or "
                f"give node {node_id} a data directory of its own"
            )
        return
    lines = [f"version={meta.pop('version', '1')}", f"node.id={node_id}"]
    lines += [f"{key}={value}" for key, value in meta.items()]
    data_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(data_dir / META_PROPERTIES, ("\n".join(lines) + "\n").encode())
