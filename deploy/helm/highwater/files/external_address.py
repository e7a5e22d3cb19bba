"""Writes a pod's external address (its EXTERNAL listener's, as clients outside reach it).

Run by the broker and coordinator pods' init container when externalAccess leaves a
pod's NodePort or load-balancer address to Kubernetes, as ``python3 external_address.py
OUTPUT``: it reads the pod's Service (``$EXTERNAL_SERVICE_PREFIX-<ordinal>-external``)
from the Kubernetes API and writes ``HOST:PORT`` to OUTPUT, which the start script
advertises.

- NodePort: the Service's node port, on ``$EXTERNAL_DOMAIN`` or else the IP of the node
  the pod runs on (``$HOST_IP``, the downward API's ``status.hostIP``).
- LoadBalancer: the first ingress IP (or host name) of the Service's status, waited for
  until the cloud has assigned one, on the Service's port.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def service(namespace: str, name: str) -> dict[str, Any]:
    """The Service ``name`` in ``namespace``, as the API returns it."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host:
        host = f"[{host}]"
    token = (SERVICE_ACCOUNT / "token").read_text().strip()
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    request = urllib.request.Request(
        f"https://{host}:{port}/api/v1/namespaces/{namespace}/services/{name}",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:
        found: dict[str, Any] = json.load(reply)
    return found


def external_address(found: dict[str, Any], environ: dict[str, str]) -> str | None:
    """``HOST:PORT`` of a Service for clients outside; None while a load balancer has no
    address yet."""
    port = found["spec"]["ports"][0]
    if found["spec"]["type"] == "NodePort":
        host = environ.get("EXTERNAL_DOMAIN") or environ["HOST_IP"]
        return f"{host}:{port['nodePort']}"
    for ingress in found.get("status", {}).get("loadBalancer", {}).get("ingress", []):
        host = ingress.get("ip") or ingress.get("hostname")
        if host:
            return f"{host}:{port['port']}"
    return None


def main() -> None:
    ordinal = os.environ["POD_NAME"].rsplit("-", 1)[1]
    name = f"{os.environ['EXTERNAL_SERVICE_PREFIX']}-{ordinal}-external"
    while True:
        address = external_address(service(os.environ["POD_NAMESPACE"], name), dict(os.environ))
        if address is not None:
            break
        print(f"waiting for the load balancer of {name} to get an address")
        time.sleep(5)
    Path(sys.argv[1]).write_text(address)
    print(f"external address: {address}")


if __name__ == "__main__":
    main()
