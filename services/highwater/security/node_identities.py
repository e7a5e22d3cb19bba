"""A broker may only speak for its own node id: which principal speaks for which node.

With the authorizer on, a principal with ``CLUSTER_ACTION`` on the cluster may make the
inter-service calls; this adds that it may make them only *as its own node*. The rule:

- the principal that registers broker N is recorded in its registration, in the metadata
  log (``RegisterBrokerRecord.principal``), so every controller and every broker knows it,
  after failovers and restarts too (``rpc/auth.py:may_speak_for_node`` reads the image);
- before a registration with a principal is in the process's image (a call racing the
  registration's commit, or a node registered while the checks were off), the principal
  whose call first speaks for node N on the process is N's there: this class keeps those;
- a call for N from any other principal is refused (``CLUSTER_AUTHORIZATION_FAILED``),
  whatever ACLs it has, until N is unregistered;
- super users are exempt (an operator's tools may act for any node).

So a broker's stolen certificate can act only as that broker, not unregister, fence or
change the ISR of the others. Deployments give each broker its own certificate (or its
own SCRAM user); brokers that share one certificate share one identity, as they would in
Kafka.
"""

from __future__ import annotations

__all__ = ["NodeIdentities"]


class NodeIdentities:
    """Node id to the principal that speaks for it (see the module docstring)."""

    def __init__(self) -> None:
        self._principals: dict[int, str] = {}

    def claim(self, node_id: int, principal: str) -> bool:
        """Whether ``principal`` may speak for ``node_id`` (recording it if first)."""
        holder = self._principals.setdefault(node_id, principal)
        return holder == principal

    def release(self, node_id: int, principal: str) -> None:
        """Forget ``node_id``'s principal (it was unregistered by it, or by an operator)."""
        if self._principals.get(node_id) in (principal, None) or principal == "":
            self._principals.pop(node_id, None)

    def principal_of(self, node_id: int) -> str | None:
        return self._principals.get(node_id)
