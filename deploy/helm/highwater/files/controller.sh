#!/bin/sh
# One voter of the metadata quorum; node id = CONTROLLER_NODE_ID_OFFSET + pod ordinal.
# Its server configuration (cluster defaults included) is the chart's properties file.
set -eu
. "$(dirname "$0")/common.sh"
exec highwater controller \
    --node-id "$(node_id "$CONTROLLER_NODE_ID_OFFSET")" \
    --listen "0.0.0.0:$CONTROLLER_PORT" \
    --voters "$(controller_list voters)" \
    --data-dir /var/lib/highwater/data \
    --config /etc/highwater/controller.properties \
    ${CLUSTER_ID:+--cluster-id "$CLUSTER_ID"} \
    ${METRICS_PORT:+--metrics-listen "0.0.0.0:$METRICS_PORT"}
