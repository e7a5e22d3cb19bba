#!/bin/sh
# The SCRAM users of auth.scram.usersSecret, mounted at /etc/highwater-users (a file per
# user, holding the password): `highwater users create` for each, as the pods' own
# certificate principal (a super user), tried again until the cluster answers.
set -eu
for file in /etc/highwater-users/*; do
    [ -f "$file" ] || continue
    user=$(basename "$file")
    until highwater users create --bootstrap-server "$BOOTSTRAP" --user "$user" \
        --mechanism "$SCRAM_MECHANISM" --password-file "$file" --command-config "$CLIENT_CONFIG"; do
        echo "the cluster does not take the user $user yet; trying again in 5 s" >&2
        sleep 5
    done
done
