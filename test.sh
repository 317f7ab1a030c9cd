#!/usr/bin/env bash
# Set up (first time only) and run the test suite. Extra arguments go to pytest.
#
# Two phases. First every test not marked `host`, in parallel workers (pytest-xdist; DAOP_TEST_WORKERS, default
# 4): most of their time is spent waiting on agents, brokers and browsers, not on the CPUs. Then the `host` tests,
# one at a time: they run a device in real time on this host's CPUs, which the other tests would share. Extra
# arguments go to both phases; a phase they select nothing from is not a failure.
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh test
scripts/ensure-mosquitto.sh
scripts/ensure-rabbitmq.sh || [ "${CI:-}" != 1 ]  # outside CI the cluster tests skip without it
scripts/ensure-browser.sh
DAOP_TEST_SHARED_DIR="$(mktemp -d)"  # the session's calibration, made once for both phases (tests/conftest.py)
export DAOP_TEST_SHARED_DIR
trap 'rm -rf "$DAOP_TEST_SHARED_DIR"' EXIT
rc=0
.venv/bin/python -m pytest -n "${DAOP_TEST_WORKERS:-4}" -m "not host" "$@" || [ $? = 5 ] || rc=1
.venv/bin/python -m pytest -m host "$@" || [ $? = 5 ] || rc=1
exit $rc
