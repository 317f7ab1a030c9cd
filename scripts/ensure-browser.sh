#!/usr/bin/env bash
# The browser tests (tests/test_web_client.py) need Debian's Chromium and clients/js's npm packages (mqtt,
# playwright-core; Node.js >= 20). Install what is missing: Chromium with apt-get (as root), the packages with
# `npm ci`. Quick once installed. Where something cannot be installed it says so and the browser tests skip
# (in CI, with CI set, they fail instead).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing chromium with apt-get..." >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "browser tests: no /usr/bin/chromium (install it: sudo apt-get install chromium)" >&2
    fi
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "browser tests: no npm (they need Node.js >= 20 and npm)" >&2
    exit 0
fi
stamp=clients/js/node_modules/.installed
if [ ! -f "$stamp" ] || [ clients/js/package-lock.json -nt "$stamp" ]; then
    if (cd clients/js && npm ci --no-audit --no-fund --loglevel=error); then
        touch "$stamp"
    else
        echo "browser tests: npm ci in clients/js failed" >&2
    fi
fi
