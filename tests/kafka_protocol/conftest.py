"""One ``highwater server --kafka-listen`` for the Kafka listener's test modules (each test
uses topics and groups of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafka_servers import KafkaServer, kafka_server


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    with kafka_server(tmp_path_factory.mktemp("kafka-listener")) as running:
        yield running
