#!/bin/sh
# One group coordinator; node id = COORDINATOR_NODE_ID_OFFSET + pod ordinal. It registers
# the address it listens on, so it listens on the pod's IP. With externalAccess
# (EXTERNAL_PORT set) it has the brokers' two named listeners: INTERNAL on the pod's IP
# and EXTERNAL at the address clients outside reach.
set -eu
. "$(dirname "$0")/common.sh"
# With TLS it listens everywhere and advertises its pod DNS name, which the release's
# certificate names (a pod IP it cannot).
bind="$POD_IP"
internal="$POD_IP:$COORDINATOR_PORT"
if [ -n "${TLS_CERT_FILE:-}" ]; then
    bind=0.0.0.0
    internal="$POD_NAME.$COORDINATOR_HEADLESS.$POD_NAMESPACE.svc.$CLUSTER_DOMAIN:$COORDINATOR_PORT"
fi
if [ -n "${EXTERNAL_PORT:-}" ]; then
    set -- \
        --listeners "INTERNAL://$bind:$COORDINATOR_PORT,EXTERNAL://0.0.0.0:$EXTERNAL_PORT" \
        --advertised-listeners "INTERNAL://$internal,EXTERNAL://$(external_address)" \
        --inter-broker-listener-name INTERNAL
elif [ -n "${TLS_CERT_FILE:-}" ]; then
    set -- \
        --listeners "PLAINTEXT://$bind:$COORDINATOR_PORT" \
        --advertised-listeners "PLAINTEXT://$internal"
else
    set -- --listen "$POD_IP:$COORDINATOR_PORT"
fi
exec highwater coordinator \
    --node-id "$(node_id "$COORDINATOR_NODE_ID_OFFSET")" \
    "$@" \
    $(metadata_source) \
    --data-dir /var/lib/highwater/data \
    --config /etc/highwater/coordinator.properties \
    ${TLS_CERT_FILE:+--tls-cert-file "$TLS_CERT_FILE"} \
    ${TLS_KEY_FILE:+--tls-key-file "$TLS_KEY_FILE"} \
    ${TLS_CA_FILE:+--tls-ca-file "$TLS_CA_FILE"} \
    ${TLS_CLIENT_AUTH:+--tls-client-auth "$TLS_CLIENT_AUTH"} \
    ${AUTHORIZER:+--authorizer "$AUTHORIZER"} \
    ${SUPER_USERS:+--super-users "$SUPER_USERS"} \
    ${ALLOW_EVERYONE_IF_NO_ACL_FOUND:+--allow-everyone-if-no-acl-found} \
    ${SASL_ENABLED_MECHANISMS:+--sasl-enabled-mechanisms "$SASL_ENABLED_MECHANISMS"} \
    ${OAUTHBEARER_JWKS_FILE:+--oauthbearer-jwks-file "$OAUTHBEARER_JWKS_FILE"} \
    ${OAUTHBEARER_ISSUER:+--oauthbearer-issuer "$OAUTHBEARER_ISSUER"} \
    ${OAUTHBEARER_AUDIENCE:+--oauthbearer-audience "$OAUTHBEARER_AUDIENCE"} \
    ${METRICS_PORT:+--metrics-listen "0.0.0.0:$METRICS_PORT"}
