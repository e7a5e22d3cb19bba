"""Keeps a large metadata image out of the garbage collector's full collections.

An image of a million partitions is millions of tuples, and CPython's full (generation 2)
collection walks every tracked object each time it runs: hundreds of milliseconds to
seconds of pause on a controller or broker, recurring as the metadata changes. The image
is immutable and acyclic (tuples, named tuples, frozen dataclasses), so what a full
collection looks for, unreachable cycles, is not in it; objects that leave it are freed by
their reference counts, frozen or not. :class:`ImageHeapFreezer` moves every object alive
at that moment into the collector's permanent generation (``gc.freeze``), once the image
first holds :data:`FREEZE_MIN_PARTITIONS` partitions and again whenever its partition count
has doubled since: a controller that loaded a large snapshot or log, a broker that caught
up, pay one full collection then, and the later ones walk only what changed since.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Final

from highwater.metadata.image import MetadataImage

__all__ = ["FREEZE_MIN_PARTITIONS", "ImageHeapFreezer"]

log = logging.getLogger(__name__)

FREEZE_MIN_PARTITIONS: Final = 10_000
"""Below this many partitions a full collection of the image is too short to matter."""


class ImageHeapFreezer:
    """Freezes the heap after a published image that reached the next threshold: the
    first at ``min_partitions``, each later one at twice the count of the last freeze
    (so the freezes cost O(1) per partition added, not one per image)."""

    def __init__(self, min_partitions: int = FREEZE_MIN_PARTITIONS) -> None:
        self._next = min_partitions
        self._topics: object = None

    def after_publish(self, image: MetadataImage) -> bool:
        """Freeze if ``image`` reached the threshold; whether it did. Most images change
        no topic (the same topics image): those cost one comparison."""
        if image.topics is self._topics:
            return False
        self._topics = image.topics
        partitions = image.partition_count
        if partitions < self._next:
            return False
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        self._next = 2 * partitions
        log.info(
            "metadata image of %d partitions: %d objects frozen out of the garbage "
            "collector's full collections in %.2f s",
            partitions,
            gc.get_freeze_count(),
            time.perf_counter() - started,
        )
        return True
