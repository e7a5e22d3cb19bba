"""The storage engine: segmented partition logs on disk, their indexes, checkpoints, cleaners."""
