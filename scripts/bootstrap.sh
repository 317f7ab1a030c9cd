#!/usr/bin/env bash
# Create .venv with daop-agent installed (editable), once; later calls are quick no-ops.
# Usage: scripts/bootstrap.sh [extra]   e.g. "test" installs the test dependencies too.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "daop-agent needs Python >= 3.11")'
    "$python" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=".venv/.installed${extra:+-$extra}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ clients/python/pyproject.toml -nt "$stamp" ]; then
    spec="."
    [ -n "$extra" ] && spec=".[$extra]"
    # daop-client (clients/python) is daop-agent's dependency: installed from this checkout, in the same call
    .venv/bin/python -m pip install --quiet -e clients/python -e "$spec"
    touch "$stamp"
fi
