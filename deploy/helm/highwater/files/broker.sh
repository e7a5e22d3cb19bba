#!/bin/sh
# One broker; node id = BROKER_NODE_ID_OFFSET + pod ordinal. It advertises its stable pod
# DNS name, and its rack when the init container found one (/var/run/highwater/rack),
# which wins over a broker.rack of its properties file. With BROKER_KAFKA_PORT set
# (broker.kafka.enabled) it also serves Kafka's wire protocol there, advertised under the
# same pod name (docs/kafka-protocol.md).
set -eu
. "$(dirname "$0")/common.sh"
rack=""
if [ -s /var/run/highwater/rack ]; then
    rack=$(cat /var/run/highwater/rack)
fi
if [ -n "${BROKER_KAFKA_PORT:-}" ]; then
    set -- --kafka-listen "0.0.0.0:$BROKER_KAFKA_PORT" \
        --kafka-advertised-listener "$POD_NAME.$BROKER_HEADLESS.$POD_NAMESPACE.svc.$CLUSTER_DOMAIN:$BROKER_KAFKA_PORT"
fi
exec highwater broker \
    --node-id "$(node_id "$BROKER_NODE_ID_OFFSET")" \
    --listen "0.0.0.0:$BROKER_PORT" \
    --advertised-listener "$POD_NAME.$BROKER_HEADLESS.$POD_NAMESPACE.svc.$CLUSTER_DOMAIN:$BROKER_PORT" \
    --controllers "$(controller_list)" \
    --data-dir /var/lib/highwater/data \
    --config /etc/highwater/broker.properties \
    ${rack:+--rack "$rack"} \
    ${METRICS_PORT:+--metrics-listen "0.0.0.0:$METRICS_PORT"} \
    "$@"
