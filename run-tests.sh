#!/bin/sh
# All tests: Python unit tests, softverbs, and the end-to-end suite.
set -eu
cd "$(dirname "$0")"
make -s all
exec python3 -m pytest -q --durations=30 tests integration "$@"
