# ckpt: build the native parts and the test programs; run the demo,
# the tests and the benchmarks.
.PHONY: all native plugins apps mpi softverbs demo test bench bench-smoke bench-load fuzz statefuzz clean

all: native plugins apps mpi softverbs

plugins:
	$(MAKE) -C plugins/ib
	$(MAKE) -C plugins/pmix

native:
	$(MAKE) -C native

apps:
	$(MAKE) -C integration/apps

mpi:
	$(MAKE) -C integration/mpi

softverbs:
	@if [ -f native/softverbs/Makefile ]; then $(MAKE) -C native/softverbs; fi

demo: all
	./examples/demo.sh

test:
	./run-tests.sh

bench: all
	python3 bench/engine_bench.py
	python3 bench/compress_bench.py
	python3 bench/lazy_bench.py
	python3 bench/softverbs_bench.py
	python3 bench/mpi_bench.py
	python3 bench/mpi_verbs_bench.py
	python3 bench/multihost_bench.py
	python3 bench/slurm_bench.py
	python3 bench/ib_bench.py
	python3 bench/verify_bench.py

# every benchmark above at its smallest size, once (seconds each): fails if
# one fails (a missed target is no failure: no timing is checked); CI runs it
BENCHES = engine compress lazy softverbs mpi mpi_verbs multihost slurm ib verify
bench-smoke: all
	@failed=""; for b in $(BENCHES); do \
		echo "== bench/$${b}_bench.py --smoke"; start=$$(date +%s); \
		python3 bench/$${b}_bench.py --smoke || failed="$$failed $$b"; \
		echo "== $${b}_bench: $$(($$(date +%s) - start)) s"; \
	done; \
	if [ -n "$$failed" ]; then echo "bench-smoke: failed:$$failed" >&2; exit 1; fi

# twenty minutes: a checkpoint a second of a 16-rank job, each MPI stack
bench-load: all
	python3 bench/load_bench.py

# the image fuzzer, longer than in the suite: 20,000 mutants of a new seed
# (FUZZ_SEED=N repeats one); every finding listed in fuzz-report.txt
fuzz: all
	CKPT_FUZZ_MUTANTS=$${FUZZ_MUTANTS:-20000} CKPT_FUZZ_SEED=$${FUZZ_SEED:-random} \
	CKPT_FUZZ_REPORT=$$PWD/fuzz-report.txt \
		python3 -m pytest -q -s integration/test_fuzz_images.py -k fuzzed_checkpoints

# the fuzzer of process state, longer than in the suite: STATEFUZZ_EXAMPLES
# programs of a new seed, of every operation kind (the suite leaves out the
# kinds of known findings); STATEFUZZ_SEED=N repeats a seed; each finding is
# shrunk to its smallest program and printed with the diff
statefuzz: all
	CKPT_STATEFUZZ_EXAMPLES=$${STATEFUZZ_EXAMPLES:-300} CKPT_STATEFUZZ_SEED=$${STATEFUZZ_SEED:-random} \
	CKPT_STATEFUZZ_KINDS=$${STATEFUZZ_KINDS:-all} \
		python3 -m pytest -q -s integration/test_state_fuzz.py -k restored_state_equals

clean:
	$(MAKE) -C native clean
	$(MAKE) -C plugins/ib clean
	$(MAKE) -C plugins/pmix clean
	$(MAKE) -C integration/apps clean
	$(MAKE) -C integration/mpi clean
	@if [ -f native/softverbs/Makefile ]; then $(MAKE) -C native/softverbs clean; fi
