#!/bin/sh
# All tests: Python unit tests, softverbs, and the end-to-end suite (CI's
# run).  --quick: the quick tier, a few minutes (pytest marker `quick`:
# every unit test and the end-to-end tests integration/conftest.py names).
# Other arguments go to pytest.  Both print their 15 slowest tests.
set -eu
cd "$(dirname "$0")"
make -s all
if [ "${1:-}" = "--quick" ]; then
	shift
	exec python3 -m pytest -q --durations=15 -m quick tests integration "$@"
fi
exec python3 -m pytest -q --durations=15 tests integration "$@"
