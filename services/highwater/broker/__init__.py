"""The broker: partitions served, produced to, fetched from and replicated by pull."""
