"""Consumer groups, the client side: the embedded consumer protocol and the partition assignors.

:mod:`~highwater.client.group.protocol` holds the subscription and assignment types and their
bytes; :mod:`~highwater.client.group.assignors` the assignors the group leader runs.
"""
