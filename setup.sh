#!/bin/sh
# Build everything ckpt needs on Debian 12, put `ckpt` on PATH, and run the
# demo (skip it with --no-demo).  Installs missing Debian packages when run
# as root; otherwise says which ones to install.
set -eu
cd "$(dirname "$0")"

DEBS="gcc make libc6-dev libxxhash-dev libzstd-dev zstd util-linux procps
python3 python3-pip python3-click python3-yaml python3-psutil python3-cffi
python3-xxhash python3-pytest python3-pytest-xdist python3-rich python3-jsonschema python3-plotly python3-selenium python3-hypothesis chromium chromium-driver libibverbs-dev ibverbs-utils rdma-core ibverbs-providers
libucx0 ucx-utils perftest
mpich libmpich-dev openmpi-bin libopenmpi-dev libpmix-dev pkg-config python3-mpi4py python3-dev iproute2
openssh-client openssh-server slurm-wlm slurm-client munge fio"

missing=""
for pkg in $DEBS; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" ||
		missing="$missing $pkg"
done
if [ -n "$missing" ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "setup: please install:$missing" >&2
		exit 1
	fi
	echo "setup: installing$missing"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

# UCX uses an IB device only if /dev/infiniband/<its uverbs name> is a
# character device the user may open.  softverbs has no kernel side, so the
# nodes of its devices (uverbs0..7) stand for the null device.
if [ "$(id -u)" -eq 0 ]; then
	mkdir -p /dev/infiniband
	for i in 0 1 2 3 4 5 6 7; do
		[ -e /dev/infiniband/uverbs$i ] ||
			ln -s /dev/null /dev/infiniband/uverbs$i
	done
fi

# The python3 on PATH may not be Debian's (pyenv, venv): give it the modules.
if ! python3 -c "import click, yaml, cffi, xxhash, psutil, pytest, xdist, rich, jsonschema, plotly, selenium, hypothesis" 2>/dev/null; then
	python3 -m pip install -q click pyyaml cffi xxhash psutil pytest pytest-xdist rich jsonschema plotly selenium hypothesis ||
		python3 -m pip install -q --user --break-system-packages \
			click pyyaml cffi xxhash psutil pytest pytest-xdist rich jsonschema plotly selenium hypothesis
fi

make -s all
python3 -c "import sys; print(sys.executable)" > bin/.python	# for bin/ckpt

# Debian's mpi4py is built for Open MPI: the MPI tests build one for MPICH
MPI4PY_MPICH=integration/mpi/build/mpi4py-mpich
if [ ! -d "$MPI4PY_MPICH/mpi4py" ]; then
	echo "setup: building mpi4py for MPICH (a minute or two)"
	MPICC=mpicc.mpich /usr/bin/python3 -m pip install -q --no-cache-dir \
		--no-binary mpi4py --target "$MPI4PY_MPICH" mpi4py 2>/dev/null ||
		echo "setup: mpi4py for MPICH did not build; its test will be skipped" >&2
fi

# `ckpt` on PATH: a link to the checkout's launcher script
if [ "$(id -u)" -eq 0 ]; then
	ln -sf "$PWD/bin/ckpt" /usr/local/bin/ckpt
else
	mkdir -p "$HOME/.local/bin"
	ln -sf "$PWD/bin/ckpt" "$HOME/.local/bin/ckpt"
	case ":$PATH:" in *":$HOME/.local/bin:"*) ;; *)
		echo "setup: add ~/.local/bin to PATH to use ckpt" >&2 ;;
	esac
fi
echo "setup: built native/libckpt.so, native/ckpt-restart, native/ckpt-remote, native/ckpt-flush; ckpt is on PATH"

if [ "${1:-}" != "--no-demo" ]; then
	./examples/demo.sh
fi
