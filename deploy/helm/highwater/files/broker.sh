#!/bin/sh
# One broker; node id = BROKER_NODE_ID_OFFSET + pod ordinal. It advertises its stable pod
# DNS name, and its rack when the init container found one (/var/run/highwater/rack),
# which wins over a broker.rack of its properties file. With externalAccess
# (EXTERNAL_PORT set) it has two named listeners: INTERNAL at the pod DNS name, which
# the pods use between them, and EXTERNAL at the address clients outside reach. With
# BROKER_KAFKA_PORT set (broker.kafka.enabled) it also serves Kafka's wire protocol
# there with the security protocol BROKER_KAFKA_SECURITY_PROTOCOL (PLAINTEXT if unset),
# advertised under the same pod name (docs/kafka-protocol.md).
set -eu
. "$(dirname "$0")/common.sh"
rack=""
if [ -s /var/run/highwater/rack ]; then
    rack=$(cat /var/run/highwater/rack)
fi
internal="$POD_NAME.$BROKER_HEADLESS.$POD_NAMESPACE.svc.$CLUSTER_DOMAIN:$BROKER_PORT"
if [ -n "${EXTERNAL_PORT:-}" ]; then
    set -- \
        --listeners "INTERNAL://0.0.0.0:$BROKER_PORT,EXTERNAL://0.0.0.0:$EXTERNAL_PORT" \
        --advertised-listeners "INTERNAL://$internal,EXTERNAL://$(external_address)" \
        --inter-broker-listener-name INTERNAL
else
    set -- --listen "0.0.0.0:$BROKER_PORT" --advertised-listener "$internal"
fi
if [ -n "${BROKER_KAFKA_PORT:-}" ]; then
    set -- "$@" --kafka-listen "${BROKER_KAFKA_SECURITY_PROTOCOL:-PLAINTEXT}://0.0.0.0:$BROKER_KAFKA_PORT" \
        --kafka-advertised-listener "$POD_NAME.$BROKER_HEADLESS.$POD_NAMESPACE.svc.$CLUSTER_DOMAIN:$BROKER_KAFKA_PORT"
fi
exec highwater broker \
    --node-id "$(node_id "$BROKER_NODE_ID_OFFSET")" \
    "$@" \
    $(metadata_source) \
    --data-dir /var/lib/highwater/data \
    --config /etc/highwater/broker.properties \
    ${rack:+--rack "$rack"} \
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
