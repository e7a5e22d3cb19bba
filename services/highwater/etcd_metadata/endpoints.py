"""``etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]``: where the etcd metadata store is, parsed."""

from __future__ import annotations

import re
from dataclasses import dataclass

from highwater.errors import InvalidConfigError

__all__ = ["DEFAULT_CLUSTER_NAME", "EtcdStoreAddress", "parse_metadata_store"]

DEFAULT_CLUSTER_NAME = "default"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True, slots=True)
class EtcdStoreAddress:
    """The etcd members to try, in order, and the cluster whose keys live under
    ``/highwater/<cluster>/``."""

    endpoints: tuple[tuple[str, int], ...]
    cluster: str = DEFAULT_CLUSTER_NAME

    @property
    def prefix(self) -> str:
        return f"/highwater/{self.cluster}/"

    def __str__(self) -> str:
        members = ",".join(f"{host}:{port}" for host, port in self.endpoints)
        return f"etcd://{members}/{self.cluster}"


def parse_metadata_store(value: str) -> EtcdStoreAddress:
    """Parse ``etcd://h1:2379,h2:2379`` (optionally ``/cluster-name``); a clear
    :class:`InvalidConfigError` for anything else."""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme != "etcd":
        raise InvalidConfigError(
            f"metadata store {value!r}: expected etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]"
        )
    members, _, cluster = rest.partition("/")
    cluster = cluster.strip("/") or DEFAULT_CLUSTER_NAME
    if not _NAME.match(cluster):
        raise InvalidConfigError(
            f"metadata store {value!r}: cluster name {cluster!r} may hold only letters, "
            "digits, '.', '_' and '-'"
        )
    endpoints: list[tuple[str, int]] = []
    for member in members.split(","):
        host, colon, port = member.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidConfigError(
                f"metadata store {value!r}: {member.strip()!r} is not HOST:PORT"
            )
        endpoints.append((host.strip("[]"), int(port)))
    return EtcdStoreAddress(tuple(endpoints), cluster)
