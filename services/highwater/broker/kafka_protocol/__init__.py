"""Kafka's binary protocol at the broker's edge: real Kafka clients use Highwater unchanged.

``codec`` holds the glue to the message codec (kafka-python's ``kafka.protocol``, generated
from Kafka's own JSON message schemas; docs/kafka-protocol.md says why): the APIs and
versions served, request headers, response frames. ``apis`` translates each Kafka request
into the broker's own (``highwater.v1``) request, hands it to the same code the gRPC
servicer uses, and translates the answer back (its KIP-227 fetch sessions are the broker's
:mod:`highwater.broker.fetch_sessions`, shared with the replica fetches). ``listener`` is
the asyncio TCP server: framing, the ``socket.request.max.bytes`` limit, pipelined
requests answered in order per connection, TLS. ``sasl`` is a connection's authentication
(SaslHandshake, SaslAuthenticate, KIP-368's re-authentication) over the process's
``Authenticator``; ``door`` assembles the listener over a broker and its security
protocol.
"""

import warnings

# kafka-python reads its message schemas with ``importlib.resources.read_text`` (and
# ``open_text``), which Python 3.11 deprecates: the warning says nothing about this package.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "(read|open)_text is deprecated", DeprecationWarning)
    import kafka.protocol.admin
    import kafka.protocol.api_header
    import kafka.protocol.consumer
    import kafka.protocol.metadata
    import kafka.protocol.producer
    import kafka.protocol.sasl  # noqa: F401
