"""Fixtures for the softverbs tests: build the library and the C helpers
once per session, and give every test its own SOFTVERBS_DIR (its own
"fabric") with softverbs first on LD_LIBRARY_PATH."""
import os
import socket
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SV = os.path.join(ROOT, "native", "softverbs")
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def softverbs_lib():
    subprocess.run(["make", "-s", "-C", SV], check=True)
    lib = os.path.join(SV, "libibverbs.so.1")
    assert os.path.exists(lib)
    return SV


@pytest.fixture(scope="session")
def cbin(tmp_path_factory, softverbs_lib):
    """Compile tests/softverbs/<name>.c against the system libibverbs."""
    out = tmp_path_factory.mktemp("cbin")
    built = {}

    def build(name):
        if name not in built:
            exe = str(out / name)
            subprocess.run(["gcc", "-O2", "-g", "-Wall", "-Wextra", "-Werror",
                            "-o", exe, os.path.join(HERE, name + ".c"),
                            "-libverbs"], check=True)
            built[name] = exe
        return built[name]
    return build


@pytest.fixture
def sv_env(tmp_path, softverbs_lib):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = softverbs_lib + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["SOFTVERBS_DIR"] = str(tmp_path / "sv")
    for k in ("SOFTVERBS_DEVICES", "SOFTVERBS_SEED", "SOFTVERBS_CONFIG"):
        env.pop(k, None)
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, timeout=10.0):
    """Wait until some socket listens on TCP port (without connecting to
    it: the pingpong servers accept exactly one connection)."""
    want = ":%04X" % port
    end = time.time() + timeout
    while time.time() < end:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    for line in f.readlines()[1:]:
                        fields = line.split()
                        if fields[1].endswith(want) and fields[3] == "0A":
                            return
            except OSError:
                pass
        if proc.poll() is not None:
            raise AssertionError("server exited early: %s" %
                                 proc.communicate()[0])
        time.sleep(0.02)
    raise AssertionError("server never listened on %d" % port)
