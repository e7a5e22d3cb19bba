"""Asks a local server's ``grpc.health.v1`` over TLS, presenting the pod's certificate.

The kubelet's gRPC probe speaks no TLS, so with ``tls.enabled`` every probe is an exec
probe running ``python3 health_check.py PORT [SERVICE]``: it connects to
``localhost:PORT`` with the certificate, key and CA of ``$TLS_CERT_FILE``,
``$TLS_KEY_FILE`` and ``$TLS_CA_FILE`` (mutual TLS, as the pods speak to each other)
and exits 0 when SERVICE (the empty name: the whole server) is SERVING, 1 otherwise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def credentials() -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=Path(os.environ["TLS_CA_FILE"]).read_bytes(),
        private_key=Path(os.environ["TLS_KEY_FILE"]).read_bytes(),
        certificate_chain=Path(os.environ["TLS_CERT_FILE"]).read_bytes(),
    )


def main() -> int:
    port = sys.argv[1]
    service = sys.argv[2] if len(sys.argv) > 2 else ""
    try:
        with grpc.secure_channel(f"localhost:{port}", credentials()) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=4
            )
    except grpc.RpcError as e:
        print(f"health of {service or 'the server'}: {e.code().name}", file=sys.stderr)
        return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    if not serving:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        print(f"{service or 'the server'}: {status}", file=sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
