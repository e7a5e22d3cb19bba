"""What the Spark driver asks the cluster: the partitions a subscription reads and their offsets.

Spark calls the planning methods from a Python process with no event loop of its own, so
each call runs an :class:`~highwater.client.admin.AdminClient` on an event loop of its own.
A call opens a client and closes it, unless it runs inside :meth:`ClusterOffsets.session`:
then the calls share one client and one loop, opened for the session. The source's readers
open a session per call Spark makes (partitions, then offsets, in one client), about 6
clients for an AvailableNow query of one micro-batch instead of 14. The admin client is
imported at its first use: several of the Python processes Spark starts for a query import
this package but never ask the cluster (docs/spark.md, "Where the time goes").
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal, TypeVar

from pyspark_highwater.offsets import EARLIEST, LATEST, PartitionOffsets, TopicPartitionKey
from pyspark_highwater.options import HighwaterOptionError, OffsetBound, Subscription

if TYPE_CHECKING:
    from highwater.client.admin import AdminClient

__all__ = ["ClusterOffsets", "UnknownTopicError"]

_T = TypeVar("_T")


class UnknownTopicError(ValueError):
    """A topic or partition the query names does not exist."""


class ClusterOffsets:
    """Partition lists and offsets of one cluster, as the driver plans reads."""

    def __init__(self, bootstrap_servers: str, request_timeout_s: float = 30.0) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.request_timeout_s = request_timeout_s
        self._session: tuple[asyncio.AbstractEventLoop, AdminClient] | None = None

    def __getstate__(self) -> dict[str, object]:
        # A session's loop and client stay in the process that opened them.
        return {**self.__dict__, "_session": None}

    @contextmanager
    def session(self) -> Iterator[None]:
        """Calls made inside share one client and one event loop, closed at the end
        (nested sessions use the outer one)."""
        if self._session is not None:
            yield
            return

        from highwater.client.admin import AdminClient

        async def open_client() -> AdminClient:
            return AdminClient(self.bootstrap_servers, request_timeout_s=self.request_timeout_s)

        loop = asyncio.new_event_loop()
        try:
            admin = loop.run_until_complete(open_client())
            self._session = (loop, admin)
            try:
                yield
            finally:
                self._session = None
                loop.run_until_complete(admin.close())
        finally:
            loop.close()

    def _run(self, call: Callable[[AdminClient], Awaitable[_T]]) -> _T:
        if self._session is not None:
            loop, admin = self._session
            return loop.run_until_complete(call(admin))

        from highwater.client.admin import AdminClient

        async def with_client() -> _T:
            async with AdminClient(
                self.bootstrap_servers, request_timeout_s=self.request_timeout_s
            ) as admin:
                return await call(admin)

        return asyncio.run(with_client())

    def partitions(
        self, subscription: Subscription, *, missing_ok: bool = False
    ) -> list[TopicPartitionKey]:
        """The partitions ``subscription`` reads now, sorted; named topics and assigned
        partitions must exist (:class:`UnknownTopicError`), a pattern may match none.

        With ``missing_ok`` those that do not exist (any more) are left out instead: a running
        stream whose topic was deleted sees its partitions gone, which ``failOnDataLoss``
        judges, rather than an error that ends the query whatever it says."""
        return self._run(lambda admin: _partitions(admin, subscription, missing_ok))

    def offsets(self, partitions: Iterable[TopicPartitionKey], spec: int) -> PartitionOffsets:
        """Each partition's offset for an :class:`OffsetSpec` (earliest or latest)."""
        wanted = list(partitions)
        if not wanted:
            return {}

        async def ask(admin: AdminClient) -> PartitionOffsets:
            answers = await admin.list_offsets({tp: spec for tp in wanted})
            return {tp: info.offset for tp, info in answers.items()}

        return self._run(ask)

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int | None]:
        """Each partition's first offset whose record's timestamp is at or after the
        partition's time; None where no record is."""
        from highwater.client.admin import OffsetSpec

        if not timestamps:
            return {}

        async def ask(admin: AdminClient) -> dict[TopicPartitionKey, int | None]:
            answers = await admin.list_offsets(
                {tp: OffsetSpec.for_timestamp(ts) for tp, ts in timestamps.items()}
            )
            return {tp: (info.offset if info.offset >= 0 else None) for tp, info in answers.items()}

        return self._run(ask)

    def earliest(self, partitions: Iterable[TopicPartitionKey]) -> PartitionOffsets:
        """Each partition's log start offset."""
        from highwater.client.admin import OffsetSpec

        return self.offsets(partitions, OffsetSpec.EARLIEST)

    def latest(self, partitions: Iterable[TopicPartitionKey]) -> PartitionOffsets:
        """Each partition's high watermark (the offset after the last readable record)."""
        from highwater.client.admin import OffsetSpec

        return self.offsets(partitions, OffsetSpec.LATEST)

    def resolve(
        self,
        bound: OffsetBound,
        partitions: Iterable[TopicPartitionKey],
        *,
        no_record: Literal["error", "latest"] = "latest",
    ) -> PartitionOffsets:
        """The concrete offsets ``bound`` means for ``partitions``. A per-partition bound
        names every partition read (the readers check it first) and may hold -2 (earliest)
        and -1 (latest). A bound by time in a partition with no
        record at or after the time fails (``no_record="error"``, spark-sql-kafka's
        ``startingOffsetsByTimestampStrategy=error``) or means its latest offset."""
        wanted = list(partitions)
        if bound.kind == "earliest":
            return self.earliest(wanted)
        if bound.kind == "latest":
            return self.latest(wanted)
        if bound.kind == "timestamp":
            return self._by_time(bound, {tp: bound.timestamp for tp in wanted}, no_record)
        if bound.kind == "timestamps":
            # every partition read is named (the readers check it first)
            times = {tp: bound.timestamps[tp] for tp in wanted if tp in bound.timestamps}
            return self._by_time(bound, times, no_record)
        given = {tp: bound.offsets[tp] for tp in wanted}
        resolved = {tp: offset for tp, offset in given.items() if offset >= 0}
        resolved.update(self.latest([tp for tp, offset in given.items() if offset == LATEST]))
        resolved.update(self.earliest([tp for tp, offset in given.items() if offset == EARLIEST]))
        return resolved

    def _by_time(
        self,
        bound: OffsetBound,
        timestamps: Mapping[TopicPartitionKey, int],
        no_record: Literal["error", "latest"],
    ) -> PartitionOffsets:
        found = self.offsets_for_times(timestamps)
        none = sorted(tp for tp, offset in found.items() if offset is None)
        if none and no_record == "error":
            topic, partition = none[0]
            raise HighwaterOptionError(
                f"{bound.option or 'startingTimestamp'}: {topic}-{partition} has no record at "
                f"or after timestamp {timestamps[none[0]]} (startingOffsetsByTimestampStrategy"
                "=error, the default; set it to latest to start such a partition at its "
                "latest offset)"
            )
        resolved = {tp: offset for tp, offset in found.items() if offset is not None}
        resolved.update(self.latest(none))
        return resolved


async def _partitions(
    admin: AdminClient, subscription: Subscription, missing_ok: bool
) -> list[TopicPartitionKey]:
    from highwater.client.admin import UnknownTopicOrPartitionError as AdminUnknownTopicError

    if subscription.kind == "subscribePattern":
        pattern = re.compile(subscription.pattern)
        topics = [t.name for t in await admin.list_topics() if pattern.fullmatch(t.name)]
    elif subscription.kind == "subscribe":
        topics = list(subscription.topics)
    else:
        topics = sorted({t for t, _ in subscription.partitions})
    if not topics:
        return []
    try:
        described = await admin.describe_topics(topics)
    except AdminUnknownTopicError as e:
        if not missing_ok:
            raise UnknownTopicError(
                f"{e} ({subscription.describe()}); create it first, e.g. highwater topics create"
            ) from None
        listed = {t.name for t in await admin.list_topics()}
        described = await admin.describe_topics([t for t in topics if t in listed])
    existing = sorted((name, p.partition) for name, d in described.items() for p in d.partitions)
    if subscription.kind != "assign":
        return existing
    missing = [tp for tp in subscription.partitions if tp not in set(existing)]
    if missing and missing_ok:
        return [tp for tp in subscription.partitions if tp in set(existing)]
    if missing:
        topic, partition = missing[0]
        count = len(described[topic].partitions)
        raise UnknownTopicError(
            f"assign: topic {topic!r} has {count} partition(s); partition {partition} does "
            "not exist"
        )
    return list(subscription.partitions)
