# Sourced by the start scripts: node ids from the pod's ordinal, the quorum's addresses.
# Every name comes from the environment (the <release>-config ConfigMap, the downward API).

# The pod's ordinal in its StatefulSet plus the role's node id offset ($1).
node_id() {
    echo $(($1 + ${POD_NAME##*-}))
}

# The fully qualified address of pod $2 of StatefulSet $1 behind headless Service $3, port $4.
pod_address() {
    echo "$1-$2.$3.$POD_NAMESPACE.svc.$CLUSTER_DOMAIN:$4"
}

# ID@HOST:PORT of every voter (with $1 = voters), HOST:PORT of every controller but this
# pod (with $1 = others), else HOST:PORT of every controller.
controller_list() {
    list=""
    i=0
    while [ "$i" -lt "$CONTROLLER_REPLICAS" ]; do
        address=$(pod_address "$CONTROLLER_STATEFULSET" "$i" "$CONTROLLER_HEADLESS" "$CONTROLLER_PORT")
        if [ "${1:-}" = voters ]; then
            address="$((CONTROLLER_NODE_ID_OFFSET + i))@$address"
        fi
        if [ "${1:-}" != others ] || [ "$i" != "${POD_NAME##*-}" ]; then
            list="${list:+$list,}$address"
        fi
        i=$((i + 1))
    done
    echo "$list"
}

# Word $1 (counting from 0) of the rest of the arguments; nothing if there are fewer.
nth() {
    n=$1
    shift
    if [ "$n" -lt "$#" ]; then
        shift "$n"
        echo "$1"
    fi
}

# HOST:PORT where clients outside reach this pod's EXTERNAL listener (externalAccess):
# what the init container discovered (/var/run/highwater-external/address), else the
# values: NodePort <domain, else the node's IP>:<this pod's node port>, LoadBalancer
# <this pod's load-balancer IP>:<port>, ClusterIP <domain>:<port + ordinal>.
external_address() {
    if [ -s /var/run/highwater-external/address ]; then
        cat /var/run/highwater-external/address
        return
    fi
    ordinal=${POD_NAME##*-}
    # Unquoted on purpose: the lists are words.
    # shellcheck disable=SC2086
    case "$EXTERNAL_SERVICE_TYPE" in
    NodePort)
        echo "${EXTERNAL_DOMAIN:-$HOST_IP}:$(nth "$ordinal" $EXTERNAL_NODE_PORTS)" ;;
    LoadBalancer)
        echo "$(nth "$ordinal" $EXTERNAL_LOAD_BALANCER_IPS):$EXTERNAL_PORT" ;;
    *)
        echo "$EXTERNAL_DOMAIN:$((EXTERNAL_PORT + ordinal))" ;;
    esac
}

# Where a broker or coordinator finds the metadata: the etcd store in the etcd metadata
# mode (METADATA_STORE set, with the ETCD_*_FILE files for TLS to etcd), else the
# controllers.
metadata_source() {
    if [ -n "${METADATA_STORE:-}" ]; then
        echo "--metadata-store $METADATA_STORE" \
            ${ETCD_CA_FILE:+--etcd-ca-file "$ETCD_CA_FILE"} \
            ${ETCD_CERT_FILE:+--etcd-cert-file "$ETCD_CERT_FILE"} \
            ${ETCD_KEY_FILE:+--etcd-key-file "$ETCD_KEY_FILE"}
    else
        echo "--controllers $(controller_list)"
    fi
}
