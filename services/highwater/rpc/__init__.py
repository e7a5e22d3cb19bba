"""The gRPC layer every service shares: endpoints, channels and servers, the process's host.

* :mod:`~highwater.rpc.endpoints`: ``HOST:PORT`` and ``controller.quorum.voters`` parsed
  and formatted;
* :mod:`~highwater.rpc.channels`: the one place where client channels are opened, with the
  options every peer uses (message size caps, quick reconnects);
* :mod:`~highwater.rpc.server`: the one place where servers are made and bound, and
  :class:`~highwater.rpc.server.GrpcHost`, the process's server with its services, health
  and reflection on one port;
* :mod:`~highwater.rpc.broker_streams`: fetches and produce requests to a broker over
  long-lived streaming calls (consumers, producers and followers alike).

Transport security and authentication belong here too: they will plug into
:func:`~highwater.rpc.channels.open_channel` and :func:`~highwater.rpc.server.new_server`
once, rather than into every service. This package knows no service's semantics; it
imports only the generated wire code, ``telemetry`` and ``errors``.
"""
