"""Highwater: a distributed, replicated commit log."""

__version__ = "0.1.0"
