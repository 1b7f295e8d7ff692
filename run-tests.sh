#!/bin/sh
# All tests: Python unit tests, softverbs, and the end-to-end suite (CI's
# run).  --quick: the quick tier, a few minutes (pytest marker `quick`:
# every unit test and the end-to-end tests integration/conftest.py names).
# Other arguments go to pytest.  Both print their 15 slowest tests.
#
# The suite mostly waits (Slurm, requeues, restarts: about 40% of one core
# on average), so it runs on CKPT_TEST_WORKERS pytest-xdist workers (2 by
# default; 1: one process), a test at a time to whichever is free
# (worksteal: the Slurm file alone is a quarter of the suite).  Each worker
# has its own namespace and Slurm clusters, every session its own job
# registry.  Serial: 47:48 for 585 tests; two workers: 27:41 for 646.
set -eu
cd "$(dirname "$0")"
make -s all
workers=${CKPT_TEST_WORKERS:-2}
parallel=""
if [ "$workers" -gt 1 ] && python3 -c "import xdist" 2>/dev/null; then
	parallel="-n $workers --dist worksteal"
fi
if [ "${1:-}" = "--quick" ]; then
	shift
	exec python3 -m pytest -q --durations=15 $parallel -m quick tests integration "$@"
fi
exec python3 -m pytest -q --durations=15 $parallel tests integration "$@"
