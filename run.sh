#!/usr/bin/env bash
# Set up (first time only) and run the agent against a private local Mosquitto broker.
# Extra arguments go to `daop-agent run`, e.g. ./run.sh --sample-interval 0.5
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
scripts/ensure-mosquitto.sh
exec .venv/bin/daop-agent run --local-broker "$@"  # state: $DAOP_STATE_DIR, else ~/.local/state/daop-agent
