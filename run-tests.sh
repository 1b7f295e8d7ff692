#!/bin/sh
# All tests: Python unit tests, softverbs, and the end-to-end suite (CI's
# run).  --quick: the quick tier, a few minutes (pytest marker `quick`:
# every unit test and the end-to-end tests integration/conftest.py names).
# Other arguments go to pytest.  Both print their 15 slowest tests.
#
# The suite mostly waits (Slurm, requeues, restarts: about 40% of one core
# on average).  CKPT_TEST_WORKERS=2 runs it on two pytest-xdist workers,
# a test at a time to whichever is free (worksteal: the Slurm file alone is
# a quarter of the suite); each worker has its own namespace and Slurm
# clusters, and every session its own job registry.
set -eu
cd "$(dirname "$0")"
make -s all
workers=${CKPT_TEST_WORKERS:-1}
parallel=""
if [ "$workers" -gt 1 ] && python3 -c "import xdist" 2>/dev/null; then
	parallel="-n $workers --dist worksteal"
fi
if [ "${1:-}" = "--quick" ]; then
	shift
	exec python3 -m pytest -q --durations=15 $parallel -m quick tests integration "$@"
fi
exec python3 -m pytest -q --durations=15 $parallel tests integration "$@"
