#!/bin/sh
# One controller of the metadata quorum; node id = CONTROLLER_NODE_ID_OFFSET + pod ordinal.
# Its server configuration (cluster defaults included) is the chart's properties file;
# TLS and the authorizer come from the environment (the tls and auth values).
#
# CONTROLLER_QUORUM=static: every pod is a voter of a fixed set (--voters); so is a pod
# whose data directory holds a static quorum's state, whatever CONTROLLER_QUORUM says.
# CONTROLLER_QUORUM=dynamic (KIP-853, docs/kubernetes.md "The controller quorum"):
# - a data directory that holds the quorum's voters restarts with --bootstrap-controllers;
# - an empty one joins with --bootstrap-controllers and auto-join: once it follows the
#   leader it asks to be added, first removing the voter its node id had before its
#   volume was lost;
# - except on ordinal 0, where an empty data directory forms the quorum alone
#   (--initial-controllers with a new directory id) when every other controller answers
#   that it knows no quorum, which is so only when the cluster is new. While one cannot
#   be asked, it waits.
set -eu
. "$(dirname "$0")/common.sh"
data_dir=${HIGHWATER_DATA_DIR:-/var/lib/highwater/data}
metadata_dir="$data_dir/__cluster_metadata-0"
node_id=$(node_id "$CONTROLLER_NODE_ID_OFFSET")
own=$(pod_address "$CONTROLLER_STATEFULSET" "${POD_NAME##*-}" "$CONTROLLER_HEADLESS" "$CONTROLLER_PORT")

quorum=$CONTROLLER_QUORUM
if [ "$quorum" = dynamic ] && [ -e "$metadata_dir/quorum-state" ] &&
    [ ! -e "$metadata_dir/quorum-voters" ]; then
    # A release installed before controller.quorum existed, upgraded: its quorum cannot
    # become dynamic, so this voter goes on as it was.
    echo "$metadata_dir holds a static quorum's state (--voters), which stays static;" \
        "set controller.quorum to static for this release" >&2
    quorum=static
fi

case "$quorum" in
static)
    set -- --voters "$(controller_list voters)" ;;
dynamic)
    # The endpoint it announces to the quorum: its pod address, not --listen's 0.0.0.0.
    set -- --advertised-listener "$own" --bootstrap-controllers "$(controller_list)" \
        --override controller.quorum.auto.join.enable=true \
        --override controller.quorum.bootstrap.timeout.ms=3600000
    if [ ! -e "$metadata_dir/quorum-voters" ] && [ "${POD_NAME##*-}" = 0 ]; then
        if [ "$CONTROLLER_REPLICAS" = 1 ]; then
            formed=3
        else
            while :; do
                formed=0
                highwater quorum formed --controllers "$(controller_list others)" \
                    ${CLIENT_CONFIG:+--command-config "$CLIENT_CONFIG"} >&2 || formed=$?
                [ "$formed" = 1 ] || break
                sleep 2
            done
        fi
        if [ "$formed" = 3 ]; then
            set -- --advertised-listener "$own" \
                --initial-controllers "$node_id@$own:$(cat /proc/sys/kernel/random/uuid)"
        elif [ "$formed" != 0 ]; then
            exit "$formed"
        fi
    fi ;;
*)
    echo "CONTROLLER_QUORUM is '$CONTROLLER_QUORUM': static or dynamic" >&2
    exit 1 ;;
esac

exec highwater controller \
    --node-id "$node_id" \
    --listen "0.0.0.0:$CONTROLLER_PORT" \
    "$@" \
    --data-dir "$data_dir" \
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
