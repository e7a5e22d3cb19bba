#!/bin/sh
# The rolling-restart gates of this broker: `ready` (readiness probe) or `pre-stop`
# (preStop hook); see `highwater rolling --help` and docs/kubernetes.md.
set -eu
. "$(dirname "$0")/common.sh"
gate="$1"
shift
if [ "$gate" = pre-stop ]; then
    set -- --timeout "$PRESTOP_TIMEOUT_SECONDS" "$@"
fi
exec highwater rolling "$gate" \
    --node-id "$(node_id "$BROKER_NODE_ID_OFFSET")" \
    --bootstrap-server "127.0.0.1:$BROKER_PORT" \
    ${CLIENT_CONFIG:+--command-config "$CLIENT_CONFIG"} "$@"
