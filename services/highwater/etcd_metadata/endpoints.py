"""``etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]``: where the etcd metadata store is, parsed.

``https://`` instead of ``etcd://`` means TLS to etcd: the scheme etcd's own tools mark a
TLS client URL with (``etcdctl --endpoints https://e1:2379``, etcd's
``--advertise-client-urls``), so an operator's URL is written the same way here; each
member may repeat it, as etcdctl's list does (``https://e1:2379,https://e2:2379``).
:func:`with_client_tls` adds what the channel trusts and presents (``--etcd-ca-file``,
``--etcd-cert-file``, ``--etcd-key-file``: without a CA, the system's; with a certificate,
mutual TLS), read once here so a missing or unreadable file stops the process at start.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from highwater.errors import InvalidConfigError
from highwater.rpc.tls import ClientTls, TlsConfigError

__all__ = [
    "DEFAULT_CLUSTER_NAME",
    "EtcdStoreAddress",
    "parse_metadata_store",
    "with_client_tls",
]

DEFAULT_CLUSTER_NAME = "default"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True, slots=True)
class EtcdStoreAddress:
    """The etcd members to try, in order, and the cluster whose keys live under
    ``/highwater/<cluster>/``."""

    endpoints: tuple[tuple[str, int], ...]
    cluster: str = DEFAULT_CLUSTER_NAME
    tls: ClientTls | None = None
    """TLS to etcd (``https://``); ``None``: plaintext (``etcd://``)."""

    @property
    def prefix(self) -> str:
        return f"/highwater/{self.cluster}/"

    def __str__(self) -> str:
        members = ",".join(f"{host}:{port}" for host, port in self.endpoints)
        scheme = "https" if self.tls is not None else "etcd"
        return f"{scheme}://{members}/{self.cluster}"


def parse_metadata_store(value: str) -> EtcdStoreAddress:
    """Parse ``etcd://h1:2379,h2:2379`` or ``https://...`` (TLS; optionally
    ``/cluster-name``); a clear :class:`InvalidConfigError` for anything else."""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("etcd", "https"):
        raise InvalidConfigError(
            f"metadata store {value!r}: expected etcd://HOST:PORT[,HOST:PORT...][/CLUSTER] "
            "(https://... for TLS)"
        )
    members, cluster = _members_and_cluster(rest, scheme)
    cluster = cluster.strip("/") or DEFAULT_CLUSTER_NAME
    if not _NAME.match(cluster):
        raise InvalidConfigError(
            f"metadata store {value!r}: cluster name {cluster!r} may hold only letters, "
            "digits, '.', '_' and '-'"
        )
    endpoints: list[tuple[str, int]] = []
    for member in members:
        host, colon, port = member.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidConfigError(
                f"metadata store {value!r}: {member.strip()!r} is not HOST:PORT"
            )
        endpoints.append((host.strip("[]"), int(port)))
    return EtcdStoreAddress(tuple(endpoints), cluster, ClientTls() if scheme == "https" else None)


def _members_and_cluster(rest: str, scheme: str) -> tuple[list[str], str]:
    """The members of ``h1:p1,[scheme://]h2:p2[/CLUSTER]`` and the cluster part; a member
    naming another scheme is refused (one store is all TLS or all plaintext)."""
    members = []
    cluster = ""
    for i, member in enumerate(rest.split(",")):
        member_scheme, sep, address = member.strip().partition("://")
        if sep:
            if member_scheme != scheme:
                raise InvalidConfigError(
                    f"metadata store {scheme}://{rest}: member {member.strip()!r} is not "
                    f"{scheme}:// (all members use one scheme)"
                )
            member = address
        address, slash, tail = member.partition("/")
        if slash:
            if i != rest.count(","):
                raise InvalidConfigError(
                    f"metadata store {scheme}://{rest}: /CLUSTER goes after the last member"
                )
            cluster = tail
        members.append(address)
    return members, cluster


def with_client_tls(
    address: EtcdStoreAddress,
    *,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
) -> EtcdStoreAddress:
    """``address`` with the TLS files given (none given: unchanged). The files are read
    now: a missing, unreadable or non-PEM file, a certificate without its key, or files
    for a plaintext ``etcd://`` store are an :class:`InvalidConfigError` naming them."""
    if ca_file is None and cert_file is None and key_file is None:
        return address
    if address.tls is None:
        raise InvalidConfigError(
            f"--etcd-ca-file, --etcd-cert-file and --etcd-key-file need TLS to etcd: "
            f"write the metadata store {address} as https://..."
        )
    try:
        tls = ClientTls(ca_file=ca_file, cert_file=cert_file, key_file=key_file)
        tls.credentials()
    except TlsConfigError as e:
        raise InvalidConfigError(f"TLS to etcd: {e}") from None
    return dataclasses.replace(address, tls=tls)
