#!/bin/sh
# One group coordinator; node id = COORDINATOR_NODE_ID_OFFSET + pod ordinal. It registers
# the address it listens on, so it listens on the pod's IP. With externalAccess
# (EXTERNAL_PORT set) it has the brokers' two named listeners: INTERNAL on the pod's IP
# and EXTERNAL at the address clients outside reach.
set -eu
. "$(dirname "$0")/common.sh"
if [ -n "${EXTERNAL_PORT:-}" ]; then
    set -- \
        --listeners "INTERNAL://$POD_IP:$COORDINATOR_PORT,EXTERNAL://0.0.0.0:$EXTERNAL_PORT" \
        --advertised-listeners "EXTERNAL://$(external_address)" \
        --inter-broker-listener-name INTERNAL
else
    set -- --listen "$POD_IP:$COORDINATOR_PORT"
fi
exec highwater coordinator \
    --node-id "$(node_id "$COORDINATOR_NODE_ID_OFFSET")" \
    "$@" \
    --controllers "$(controller_list)" \
    --data-dir /var/lib/highwater/data \
    --config /etc/highwater/coordinator.properties \
    ${METRICS_PORT:+--metrics-listen "0.0.0.0:$METRICS_PORT"}
