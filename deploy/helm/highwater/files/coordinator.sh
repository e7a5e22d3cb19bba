#!/bin/sh
# One group coordinator; node id = COORDINATOR_NODE_ID_OFFSET + pod ordinal. It registers
# the address it listens on, so it listens on the pod's IP.
set -eu
. "$(dirname "$0")/common.sh"
exec highwater coordinator \
    --node-id "$(node_id "$COORDINATOR_NODE_ID_OFFSET")" \
    --listen "$POD_IP:$COORDINATOR_PORT" \
    --controllers "$(controller_list)" \
    --data-dir /var/lib/highwater/data \
    --config /etc/highwater/coordinator.properties \
    ${METRICS_PORT:+--metrics-listen "0.0.0.0:$METRICS_PORT"}
