"""Broker and coordinator sessions on the active controller: last contact, metadata
progress, shutdown offsets.

This is soft state, like Kafka's ``BrokerHeartbeatManager``: it lives only in the active
controller's memory and is not in the metadata log. A controller that becomes active
starts every registered broker's and coordinator's session afresh
(:meth:`BrokerHeartbeatManager.reset`), so a failover gives each a full session timeout
to find the new controller. A session belongs to one epoch of a node (a broker epoch, a
coordinator's registration epoch): a new registration starts a new one. The same class
keeps coordinators' sessions; they use only the liveness part. Time is whatever
``now_ms`` the caller passes.

Two rules keep a controller that falls behind from fencing brokers it could not hear,
as Kafka's heartbeat tracker does:

- *Contact is when a heartbeat arrived*, not when the controller got round to it: the
  I/O layer calls :meth:`BrokerHeartbeatManager.note_contact` as a heartbeat comes in,
  before it waits in the controller's queue behind other work (a batch of thousands of
  leader moves being decided, appended and committed); the heartbeat's own processing
  comes later. A broker's messages on its liveness stream are contact too, noted the
  same way: they wait for no answer, so a broker whose heartbeats' answers are held
  behind slow commits (and whose next heartbeat waits for that answer) is still heard.
- *Time the controller could not listen does not count*: expiry is checked every tick
  (100 ms); a gap between two checks longer than ``max_unheard_gap_ms`` (the heartbeat
  interval) means the controller's own loop was blocked or starved of CPU, and the
  heartbeats sent meanwhile may still be unread on its sockets. Every session is then
  extended by the excess, so such a stall costs a session at most ``max_unheard_gap_ms``.
  A broker that is really gone is still fenced: the time the controller runs counts in
  full (and a dead process's broken liveness stream fences it at once).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from highwater.metadata.image import BrokerRegistration


@dataclass(slots=True)
class BrokerSession:
    """What the controller heard from one broker incarnation."""

    broker_epoch: int
    last_contact_ms: int
    metadata_offset: int = -1
    controlled_shutdown_offset: int | None = None
    """The offset of the records that put the broker in controlled shutdown; it may stop
    once every active broker has replayed them."""


class BrokerHeartbeatManager:
    """Sessions of registered brokers, and which have expired."""

    def __init__(self, session_timeout_ms: int, max_unheard_gap_ms: int | None = None) -> None:
        """``max_unheard_gap_ms``: the longest gap between two expiry checks that counts in
        full (see the module docstring); ``None``: every gap counts."""
        self.session_timeout_ms = session_timeout_ms
        self.max_unheard_gap_ms = max_unheard_gap_ms
        self._sessions: dict[int, BrokerSession] = {}
        self._last_check_ms: int | None = None
        self.unheard_ms = 0
        """Time not counted against sessions so far (the controller's stalls)."""

    def session(self, broker_id: int) -> BrokerSession | None:
        return self._sessions.get(broker_id)

    def reset(self, brokers: Iterable[BrokerRegistration], now_ms: int) -> None:
        """Forget everything; every registered broker was last heard from at ``now_ms``."""
        self.reset_epochs({b.broker_id: b.broker_epoch for b in brokers}, now_ms)

    def reset_epochs(self, epochs: Mapping[int, int], now_ms: int) -> None:
        """Forget everything; every node of ``epochs`` (id -> epoch) was last heard from
        at ``now_ms``."""
        self._sessions = {node: BrokerSession(epoch, now_ms) for node, epoch in epochs.items()}
        self._last_check_ms = now_ms

    def register(self, broker_id: int, broker_epoch: int, now_ms: int) -> None:
        """A new registration (or incarnation): a fresh session."""
        self._sessions[broker_id] = BrokerSession(broker_epoch, now_ms)

    def remove(self, broker_id: int) -> None:
        self._sessions.pop(broker_id, None)

    def touch(self, broker_id: int, broker_epoch: int, now_ms: int, metadata_offset: int) -> None:
        """A heartbeat of the current incarnation arrived."""
        session = self._sessions.get(broker_id)
        if session is None or session.broker_epoch != broker_epoch:
            session = BrokerSession(broker_epoch, now_ms)
            self._sessions[broker_id] = session
        session.last_contact_ms = max(session.last_contact_ms, now_ms)
        session.metadata_offset = max(session.metadata_offset, metadata_offset)

    def note_contact(self, broker_id: int, broker_epoch: int, now_ms: int) -> None:
        """A heartbeat of this incarnation arrived at ``now_ms`` (it is processed later):
        its session counts from then. Nothing for an unknown session or another epoch:
        the heartbeat's processing decides about those."""
        session = self._sessions.get(broker_id)
        if session is not None and session.broker_epoch == broker_epoch:
            session.last_contact_ms = max(session.last_contact_ms, now_ms)

    def has_valid_session(self, broker_id: int, broker_epoch: int, now_ms: int) -> bool:
        """Whether this incarnation was heard from within the session timeout."""
        session = self._sessions.get(broker_id)
        return (
            session is not None
            and session.broker_epoch == broker_epoch
            and now_ms - session.last_contact_ms < self.session_timeout_ms
        )

    def expired(self, brokers: Mapping[int, BrokerRegistration], now_ms: int) -> list[int]:
        """The unfenced brokers (active or shutting down) whose session expired, by id.

        A broker this controller never heard from starts its session at ``now_ms``.
        """
        return self.expired_epochs(
            {b: broker.broker_epoch for b, broker in brokers.items() if not broker.fenced}, now_ms
        )

    def expired_epochs(self, epochs: Mapping[int, int], now_ms: int) -> list[int]:
        """The nodes of ``epochs`` (id -> the epoch registered) whose session of that epoch
        expired, by id. A node this controller never heard from in that epoch starts its
        session at ``now_ms``. A gap since the last check longer than
        ``max_unheard_gap_ms`` extends every session by the excess first."""
        self._credit_unheard(now_ms)
        expired = []
        for node, epoch in sorted(epochs.items()):
            session = self._sessions.get(node)
            if session is None or session.broker_epoch != epoch:
                self.register(node, epoch, now_ms)
                continue
            if now_ms - session.last_contact_ms >= self.session_timeout_ms:
                expired.append(node)
        return expired

    def _credit_unheard(self, now_ms: int) -> None:
        last, self._last_check_ms = self._last_check_ms, now_ms
        if last is None or self.max_unheard_gap_ms is None:
            return
        unheard = now_ms - last - self.max_unheard_gap_ms
        if unheard <= 0:
            return
        self.unheard_ms += unheard
        for session in self._sessions.values():
            session.last_contact_ms += unheard

    def set_controlled_shutdown_offset(self, broker_id: int, offset: int) -> None:
        session = self._sessions.get(broker_id)
        if session is not None and session.controlled_shutdown_offset is None:
            session.controlled_shutdown_offset = offset

    def lowest_active_offset(self, active_brokers: Iterable[int]) -> int | None:
        """The lowest metadata offset any of ``active_brokers`` reported (None: no broker)."""
        offsets = [
            session.metadata_offset if (session := self._sessions.get(b)) is not None else -1
            for b in active_brokers
        ]
        return min(offsets) if offsets else None
