#!/usr/bin/env bash
# tests/test_fleet_cluster.py and bench/fleet.py start a 3-node RabbitMQ cluster (its MQTT plugin) on free ports;
# install Debian's rabbitmq-server when missing (as root, apt), without starting the package's own service (the
# test cluster runs its own nodes, under their own names and ports).
set -euo pipefail
if [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing rabbitmq-server with apt-get..." >&2
    apt-get update -qq >/dev/null
    if [ ! -e /usr/sbin/policy-rc.d ]; then  # the package's postinst must not start a system broker here
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server >/dev/null
else
    echo "rabbitmq-server is not installed: install it (e.g. 'sudo apt-get install rabbitmq-server') and try again" >&2
    exit 1
fi
