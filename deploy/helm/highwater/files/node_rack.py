"""Writes a broker's rack: one label of the node its pod runs on, read from the Kubernetes API.

Run by the broker pods' init container as ``python3 node_rack.py OUTPUT``; the node is
``$NODE_NAME`` (the downward API's ``spec.nodeName``) and the label ``$RACK_TOPOLOGY_KEY``.
A node without the label leaves OUTPUT empty: the broker then runs without a rack.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request
from pathlib import Path

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def node_label(node: str, key: str) -> str:
    """The value of label ``key`` on ``node`` ("" if the node has no such label)."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host:
        host = f"[{host}]"
    token = (SERVICE_ACCOUNT / "token").read_text().strip()
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    request = urllib.request.Request(
        f"https://{host}:{port}/api/v1/nodes/{node}",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:
        labels: dict[str, str] = json.load(reply)["metadata"].get("labels", {})
    return labels.get(key, "")


def main() -> None:
    rack = node_label(os.environ["NODE_NAME"], os.environ["RACK_TOPOLOGY_KEY"])
    Path(sys.argv[1]).write_text(rack)
    print(f"rack: {rack or '(none: the node has no such label)'}")


if __name__ == "__main__":
    main()
