"""Typed configuration: Kafka's setting names, types, defaults and validation, one per scope."""
