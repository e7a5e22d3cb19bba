"""Consumer groups as a member sees them, shared by the client and the broker.

:mod:`~highwater.group.protocol` holds the subscription and assignment types and their
bytes; :mod:`~highwater.group.assignors` the assignors the group leader runs;
:mod:`~highwater.group.membership` a member's join, sync, heartbeats and commits. The
Python consumer runs them for itself, the broker for each consumer session of a thin
client (docs/grpc.md).
"""
