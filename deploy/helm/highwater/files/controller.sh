#!/bin/sh
# One voter of the metadata quorum; node id = CONTROLLER_NODE_ID_OFFSET + pod ordinal.
# Its server configuration (cluster defaults included) is the chart's properties file;
# TLS and the authorizer come from the environment (the tls and auth values).
set -eu
. "$(dirname "$0")/common.sh"
exec highwater controller \
    --node-id "$(node_id "$CONTROLLER_NODE_ID_OFFSET")" \
    --listen "0.0.0.0:$CONTROLLER_PORT" \
    --voters "$(controller_list voters)" \
    --data-dir /var/lib/highwater/data \
    --config /etc/highwater/controller.properties \
    ${CLUSTER_ID:+--cluster-id "$CLUSTER_ID"} \
    ${TLS_CERT_FILE:+--tls-cert-file "$TLS_CERT_FILE"} \
    ${TLS_KEY_FILE:+--tls-key-file "$TLS_KEY_FILE"} \
    ${TLS_CA_FILE:+--tls-ca-file "$TLS_CA_FILE"} \
    ${TLS_CLIENT_AUTH:+--tls-client-auth "$TLS_CLIENT_AUTH"} \
    ${AUTHORIZER:+--authorizer "$AUTHORIZER"} \
    ${SUPER_USERS:+--super-users "$SUPER_USERS"} \
    ${ALLOW_EVERYONE_IF_NO_ACL_FOUND:+--allow-everyone-if-no-acl-found} \
    ${METRICS_PORT:+--metrics-listen "0.0.0.0:$METRICS_PORT"}
