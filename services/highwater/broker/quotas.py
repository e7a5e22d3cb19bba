"""Client quota enforcement, its pure core: measured rates and throttle times, as Kafka's.

Each quota type has a :class:`ClientQuotaManager`: produce bytes (``producer_byte_rate``),
fetch bytes (``consumer_byte_rate``) and request handler time (``request_percentage``).
A request of user ``U`` with client id ``C`` is governed by the quota the image's
:class:`~highwater.metadata.client_quotas.ClientQuotasImage` finds for them (KIP-55's
precedence); every request the same entity governs adds to one measured rate, a
:class:`SampledRate` kept per quota metric tags (the user and/or client id the entity
names).

The rate is Kafka's ``Rate`` over a ``SampledStat``: ``quota.window.num`` samples of
``quota.window.size.seconds`` each. A value goes to the current sample, or starts a new
one once the current is a window old; samples older than all the windows together are
dropped. The rate is the samples' total over the time since the oldest began, counted as
at least ``quota.window.num - 1`` whole windows, so that a client's first requests are
measured over that span rather than over a few milliseconds.

After a value is recorded, a rate above the bound ``Q`` is throttled (Kafka's
``ClientQuotaManager.throttleTime``): by ``(rate - Q) / Q * span``, the time after which
the same total over the longer span would be exactly at the quota; the request quota's is
bounded by one window (Kafka's ``ClientRequestQuotaManager``). A request handler's time
counts as a percentage of one handler: a second of handling per second is 100.

Everything here takes the clock as an argument (``now_ms``), so it is tested with a fake
clock; the broker's request handler holds the answer for the throttle time
(:mod:`highwater.broker.request_handler`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

from highwater.metadata.client_quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ClientQuotasImage,
    QuotaMatch,
)

__all__ = [
    "NOT_LIMITED",
    "ClientQuotaManager",
    "QuotaSettings",
    "SampledRate",
    "Throttle",
    "ThrottleDecision",
    "percentage_of_handler",
    "throttle_time_ms",
]

_MS_PER_SECOND: Final = 1000.0


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """``quota.window.num`` and ``quota.window.size.seconds`` (Kafka's defaults: 11, 1)."""

    window_num: int = 11
    window_size_seconds: int = 1

    def __post_init__(self) -> None:
        if self.window_num < 1 or self.window_size_seconds < 1:
            raise ValueError("quota.window.num and quota.window.size.seconds must be at least 1")

    @property
    def window_ms(self) -> int:
        return self.window_size_seconds * 1000


class SampledRate:
    """A rate per second over ``window_num`` samples of ``window_ms`` (see the module
    docstring)."""

    __slots__ = ("_samples", "_window_ms", "_window_num", "last_record_ms")

    def __init__(self, window_num: int, window_ms: int) -> None:
        self._window_num = window_num
        self._window_ms = window_ms
        self._samples: deque[list[float]] = deque()  # [start_ms, total], oldest first
        self.last_record_ms = 0.0

    def record(self, value: float, now_ms: float) -> None:
        """Add ``value`` at ``now_ms`` to the current sample (a new one once it is a window old)."""
        self._purge(now_ms)
        samples = self._samples
        if not samples or now_ms - samples[-1][0] >= self._window_ms:
            samples.append([now_ms, 0.0])
            if len(samples) > self._window_num:
                samples.popleft()
        samples[-1][1] += value
        self.last_record_ms = now_ms

    def span_ms(self, now_ms: float) -> float:
        """The time the rate is measured over: since the oldest sample began, at least
        ``window_num - 1`` whole windows, at least 1 ms."""
        self._purge(now_ms)
        oldest = self._samples[0][0] if self._samples else now_ms
        elapsed = now_ms - oldest
        full_windows = int(elapsed // self._window_ms)
        if full_windows < self._window_num - 1:
            elapsed += (self._window_num - 1 - full_windows) * self._window_ms
        return max(elapsed, 1.0)

    def total(self, now_ms: float) -> float:
        """The sum of the samples still kept."""
        self._purge(now_ms)
        return sum(sample[1] for sample in self._samples)

    def rate(self, now_ms: float) -> float:
        """Per second."""
        return self.total(now_ms) / (self.span_ms(now_ms) / _MS_PER_SECOND)

    def _purge(self, now_ms: float) -> None:
        expired = self._window_num * self._window_ms
        samples = self._samples
        while samples and now_ms - samples[0][0] >= expired:
            samples.popleft()


@dataclass(frozen=True, slots=True)
class ThrottleDecision:
    """What recording one request's value gave: how long to hold its answer (0: not at
    all) and the quota that governed it (``None``: none applies)."""

    throttle_ms: int
    quota: QuotaMatch | None


NOT_LIMITED: Final = ThrottleDecision(0, None)


class ClientQuotaManager:
    """One quota type's rates and throttle times (see the module docstring)."""

    def __init__(self, key: str, settings: QuotaSettings, *, bounded: bool = False) -> None:
        """``key``: the quota key this manager enforces (``producer_byte_rate``...);
        ``bounded``: throttle times are at most one window (the request quota's, as
        Kafka's ``ClientRequestQuotaManager`` bounds them; the byte rates' are not)."""
        self.key = key
        self.settings = settings
        self._max_throttle_ms = settings.window_ms if bounded else None
        self._rates: dict[tuple[str, str], SampledRate] = {}
        self._next_sweep_ms = 0.0

    def __len__(self) -> int:
        """How many measured rates are kept (one per quota metric tags in use)."""
        return len(self._rates)

    def record(
        self, quotas: ClientQuotasImage, user: str, client_id: str, value: float, now_ms: float
    ) -> ThrottleDecision:
        """Record ``value`` for a request of ``user`` with ``client_id``; how long its
        answer is held. Requests no quota governs are not measured."""
        quota = quotas.quota(user, client_id, self.key)
        if quota is None:
            return NOT_LIMITED
        self._sweep(now_ms)
        tags = (quota.user, quota.client_id)
        rate = self._rates.get(tags)
        if rate is None:
            rate = self._rates[tags] = SampledRate(
                self.settings.window_num, self.settings.window_ms
            )
        rate.record(value, now_ms)
        throttle = throttle_time_ms(rate, quota.bound, now_ms)
        if self._max_throttle_ms is not None:
            throttle = min(throttle, self._max_throttle_ms)
        return ThrottleDecision(throttle, quota)

    def rate(self, user_tag: str, client_id_tag: str, now_ms: float) -> float:
        """The measured rate of the quota metric tags (0 if none is kept)."""
        rate = self._rates.get((user_tag, client_id_tag))
        return 0.0 if rate is None else rate.rate(now_ms)

    def _sweep(self, now_ms: float) -> None:
        """Forget the rates nobody recorded to for all the windows (they measure 0)."""
        if now_ms < self._next_sweep_ms:
            return
        span = self.settings.window_num * self.settings.window_ms
        self._next_sweep_ms = now_ms + span
        idle = [tags for tags, r in self._rates.items() if now_ms - r.last_record_ms >= span]
        for tags in idle:
            del self._rates[tags]


def throttle_time_ms(rate: SampledRate, bound: float, now_ms: float) -> int:
    """Kafka's throttle time: 0 at or below ``bound``, else ``(rate - bound) / bound *
    span``."""
    measured = rate.rate(now_ms)
    if measured <= bound:
        return 0
    return round((measured - bound) / bound * rate.span_ms(now_ms))


def percentage_of_handler(seconds: float) -> float:
    """Handler time as ``request_percentage`` counts it: 1 s of handling is 100 (percent
    of one handler for one second)."""
    return seconds * 100.0


class Throttle:
    """The broker's three quota types (see the module docstring)."""

    def __init__(self, settings: QuotaSettings | None = None) -> None:
        self.settings = settings = settings or QuotaSettings()
        self.produce = ClientQuotaManager(PRODUCER_BYTE_RATE, settings)
        self.fetch = ClientQuotaManager(CONSUMER_BYTE_RATE, settings)
        self.request = ClientQuotaManager(REQUEST_PERCENTAGE, settings, bounded=True)
