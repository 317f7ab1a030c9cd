#!/usr/bin/env bash
# The agent's local default and the tests need a mosquitto binary; install it when missing (as root, apt).
set -euo pipefail
if command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing mosquitto with apt-get..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto mosquitto-clients >/dev/null
else
    echo "mosquitto is not installed: install it (e.g. 'sudo apt-get install mosquitto') and try again" >&2
    exit 1
fi
