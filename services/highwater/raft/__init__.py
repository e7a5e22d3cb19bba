"""The metadata quorum's Raft: a pure, pull-based (KRaft) core and the I/O that drives it."""
