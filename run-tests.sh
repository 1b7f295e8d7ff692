#!/bin/sh
# All tests: Python unit tests, softverbs, and the end-to-end suite (CI's
# run).  --quick: the quick tier, a few minutes (pytest marker `quick`:
# every unit test and the end-to-end tests integration/conftest.py names).
# Other arguments go to pytest.  Both print their 15 slowest tests.
#
# The suite mostly waits (Slurm, requeues, restarts: about 40% of one core
# on average).  CKPT_TEST_WORKERS=2 shares its files between two
# pytest-xdist workers (each file's namespace clusters are its worker's
# own); not the default yet: tried once on the whole suite, many tests
# failed that pass alone (which ones was not seen: the run was stopped).
set -eu
cd "$(dirname "$0")"
make -s all
workers=${CKPT_TEST_WORKERS:-1}
parallel=""
if [ "$workers" -gt 1 ] && python3 -c "import xdist" 2>/dev/null; then
	parallel="-n $workers --dist loadfile"
fi
if [ "${1:-}" = "--quick" ]; then
	shift
	exec python3 -m pytest -q --durations=15 $parallel -m quick tests integration "$@"
fi
exec python3 -m pytest -q --durations=15 $parallel tests integration "$@"
