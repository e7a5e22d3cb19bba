"""The group coordinator service: consumer groups, rebalances and committed offsets."""
