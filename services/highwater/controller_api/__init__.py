"""The controller's API as its callers see it: request and response values, their wire codec,
and the client that finds the active controller.

* :mod:`~highwater.controller_api.messages`: the Controller service's requests and
  responses as plain values (what the quorum controller's pure core handles);
* :mod:`~highwater.controller_api.codec`: those values to and from ``controller.proto``,
  and the table of RPCs;
* :mod:`~highwater.controller_api.client`: :class:`ControllerClient`, which sends each
  call to the active controller of a quorum, wherever it is.

Brokers, coordinators, the admin client and the CLI call the controller through this
package; none of it imports the controller's core (:mod:`highwater.controller`), so a
client does not load the quorum controller to talk to it. The controller itself uses the
messages and the codec on its side of the wire.
"""
