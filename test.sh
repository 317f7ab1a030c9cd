#!/usr/bin/env bash
# Set up (first time only) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh test
scripts/ensure-mosquitto.sh
scripts/ensure-rabbitmq.sh || [ "${CI:-}" != 1 ]  # outside CI the cluster tests skip without it
scripts/ensure-browser.sh
exec .venv/bin/python -m pytest "$@"
