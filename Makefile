# ckpt: build the native parts and the test programs; run the demo,
# the tests and the benchmarks.
.PHONY: all native apps softverbs demo test bench clean

all: native apps softverbs

native:
	$(MAKE) -C native

apps:
	$(MAKE) -C integration/apps

softverbs:
	@if [ -f native/softverbs/Makefile ]; then $(MAKE) -C native/softverbs; fi

demo: all
	./examples/demo.sh

test:
	./run-tests.sh

bench: all
	python3 bench/engine_bench.py
	python3 bench/softverbs_bench.py

clean:
	$(MAKE) -C native clean
	$(MAKE) -C integration/apps clean
	@if [ -f native/softverbs/Makefile ]; then $(MAKE) -C native/softverbs clean; fi
