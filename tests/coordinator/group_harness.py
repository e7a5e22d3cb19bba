"""A test harness around the pure group coordinator core: a clock, replies by token, and an
in-memory ``__consumer_offsets`` that appends writes when told to."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from highwater.coordinator.core import (
    CommitResult,
    Effect,
    GroupCoordinatorCore,
    GroupCoordinatorSettings,
    JoinRequest,
    JoinResult,
    OffsetToCommit,
    RebalanceCompleted,
    Reply,
    SyncRequest,
    SyncResult,
    Write,
)
from highwater.coordinator.group import Protocol
from highwater.coordinator.records import KeyValue, OffsetsRecord, decode_record
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode

SESSION_MS = 10_000
REBALANCE_MS = 30_000
PARTITIONS = 4


def partition_for(group_id: str) -> int:
    return sum(group_id.encode()) % PARTITIONS


@dataclass
class Harness:
    settings: GroupCoordinatorSettings = field(
        default_factory=lambda: GroupCoordinatorSettings(group_initial_rebalance_delay_ms=0)
    )
    auto_write: bool = True
    now: int = 1_000_000
    replies: dict[object, object] = field(default_factory=dict)
    log: dict[int, list[KeyValue]] = field(default_factory=dict)
    pending_writes: list[Write] = field(default_factory=list)
    rebalances: list[RebalanceCompleted] = field(default_factory=list)
    core: GroupCoordinatorCore = field(init=False)
    _tokens: itertools.count[int] = field(default_factory=itertools.count)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.core = GroupCoordinatorCore(
            self.settings, partition_for, new_member_id=lambda p: f"{p or 'm'}-{next(self._ids)}"
        )
        for partition in range(PARTITIONS):
            self.core.load(partition, 0, [], self.now)

    # -- driving the core -------------------------------------------------------------------

    def run(self, effects: Sequence[Effect]) -> None:
        queue = list(effects)
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, Reply):
                assert effect.token not in self.replies, f"answered twice: {effect.token}"
                self.replies[effect.token] = effect.result
            elif isinstance(effect, RebalanceCompleted):
                self.rebalances.append(effect)
            elif self.auto_write:
                self.log.setdefault(effect.partition, []).extend(effect.records)
                queue += self.core.write_completed(effect.write_id, ErrorCode.NONE, self.now)
            else:
                self.pending_writes.append(effect)

    def complete_writes(self, error: int = ErrorCode.NONE) -> None:
        writes, self.pending_writes = self.pending_writes, []
        for write in writes:
            if error == ErrorCode.NONE:
                self.log.setdefault(write.partition, []).extend(write.records)
            self.run(self.core.write_completed(write.write_id, error, self.now))

    def advance(self, ms: int) -> None:
        self.now += ms
        self.run(self.core.tick(self.now))

    def token(self) -> int:
        return next(self._tokens)

    def join(
        self,
        group: str,
        member_id: str = "",
        *,
        instance_id: str | None = None,
        protocols: Sequence[tuple[str, bytes]] = (("range", b"sub"),),
        protocol_type: str = "consumer",
        client_id: str = "client",
        session_ms: int = SESSION_MS,
        rebalance_ms: int = REBALANCE_MS,
    ) -> int:
        token = self.token()
        request = JoinRequest(
            group,
            member_id,
            instance_id,
            protocol_type,
            tuple(Protocol(n, m) for n, m in protocols),
            session_ms,
            rebalance_ms,
            client_id=client_id,
            client_host="/127.0.0.1",
        )
        self.run(self.core.join_group(token, request, self.now))
        return token

    def join_new(self, group: str, **kwargs: object) -> int:
        """A dynamic member's two-step first join (MEMBER_ID_REQUIRED, then with the id)."""
        first = self.join_result(self.join(group, **kwargs))  # type: ignore[arg-type]
        assert first.error == ErrorCode.MEMBER_ID_REQUIRED
        return self.join(group, first.member_id, **kwargs)  # type: ignore[arg-type]

    def sync(
        self,
        group: str,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        *,
        instance_id: str | None = None,
    ) -> int:
        token = self.token()
        request = SyncRequest(
            group, generation, member_id, instance_id, "consumer", "", assignments or {}
        )
        self.run(self.core.sync_group(token, request, self.now))
        return token

    def heartbeat(
        self, group: str, member_id: str, generation: int, instance_id: str | None = None
    ) -> int:
        return self.core.heartbeat(group, member_id, generation, instance_id, self.now).error

    def leave(self, group: str, member_id: str, instance_id: str | None = None) -> int:
        outcomes, effects = self.core.leave_group(group, [(member_id, instance_id)], self.now)
        self.run(effects)
        return outcomes[0].error

    def commit(
        self,
        group: str,
        member_id: str,
        generation: int,
        offsets: dict[TopicPartition, int],
        metadata: str = "",
    ) -> CommitResult:
        token = self.token()
        items = [OffsetToCommit(tp, o, 3, metadata) for tp, o in offsets.items()]
        self.run(
            self.core.commit_offsets(token, group, member_id, generation, None, items, self.now)
        )
        result = self.replies.pop(token)
        assert isinstance(result, CommitResult)
        return result

    # -- reading answers --------------------------------------------------------------------

    def join_result(self, token: int) -> JoinResult:
        result = self.replies.pop(token)
        assert isinstance(result, JoinResult)
        return result

    def sync_result(self, token: int) -> SyncResult:
        result = self.replies.pop(token)
        assert isinstance(result, SyncResult)
        return result

    def answered(self, token: int) -> bool:
        return token in self.replies

    def records(self, partition: int) -> list[OffsetsRecord]:
        return [decode_record(k, v) for k, v in self.log.get(partition, [])]
