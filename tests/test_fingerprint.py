"""ckpt/fingerprint.py on real processes (children of the test)."""
import json
import os
import subprocess
import sys
import textwrap
import time

from ckpt import fingerprint
from ckpt.config import load_config

CHILD = textwrap.dedent("""
    import fcntl, os, sys, time
    r, w = os.pipe()
    w2 = os.open(f"/proc/self/fd/{w}", os.O_WRONLY)
    d = os.dup(w)
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    print(r, w, w2, d, flush=True)
    time.sleep(60)
""")


def start_child():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    fds = [int(n) for n in child.stdout.readline().split()]
    return child, fds


def test_two_fingerprints_of_a_quiet_process_agree():
    child, _ = start_child()
    try:
        first = fingerprint.take([(child.pid, child.pid)])
        time.sleep(0.05)
        second = fingerprint.take([(child.pid, child.pid)])
    finally:
        child.kill()
        child.wait()
    assert first[str(child.pid)]["fds"]
    assert fingerprint.compare(first, second) == []


def test_open_file_descriptions_of_a_pipe_end():
    child, (r, w, w2, d) = start_child()
    try:
        taken = fingerprint.take([(child.pid, child.pid)])[str(child.pid)]
    finally:
        child.kill()
        child.wait()
    assert taken[f"fd {w} flags"] == "O_WRONLY|O_NONBLOCK|O_CLOEXEC"
    assert taken[f"fd {d} flags"] == "O_WRONLY|O_NONBLOCK|O_CLOEXEC"
    assert taken[f"fd {w2} flags"] == "O_WRONLY|O_LARGEFILE|O_CLOEXEC"
    assert taken[f"fd {w} shared with"] == f"2 fds, the first {child.pid}:{min(w, d)}"
    assert taken[f"fd {d} shared with"] == taken[f"fd {w} shared with"]
    assert f"fd {w2} shared with" not in taken
    assert taken[f"fd {r} same object as"] == \
        f"{len({r, w, w2})} open file descriptions, the first {child.pid}:{min(r, w, w2, d)}"
    assert taken[f"fd {w} kind"] == "pipe"


def test_a_difference_is_one_line():
    before = {"7": {"fd 4 flags": "O_WRONLY|O_NONBLOCK", "cwd": "/a"}}
    after = {"7": {"fd 4 flags": "O_WRONLY", "cwd": "/a", "fd 5 kind": "pipe"}}
    found = fingerprint.compare(before, after)
    assert [fingerprint.describe(d) for d in found] == [
        "process 7: fd 4 flags: O_WRONLY|O_NONBLOCK at the checkpoint, O_WRONLY after the restart",
        "process 7: fd 5 kind: absent at the checkpoint, pipe after the restart"]


def test_verify_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_CONFIG", str(tmp_path / "config.yaml"))
    monkeypatch.delenv("CKPT_VERIFY", raising=False)
    assert load_config().verify == "warn"
    (tmp_path / "config.yaml").write_text("verify: off\n")   # YAML's boolean
    assert load_config().verify == "off"
    monkeypatch.setenv("CKPT_VERIFY", "ON")
    assert load_config().verify == "on"
    assert load_config(verify="warn").verify == "warn"
    monkeypatch.setenv("CKPT_VERIFY", "maybe")
    import pytest
    from ckpt.errors import CkptError
    with pytest.raises(CkptError, match="CKPT_VERIFY: verify must be on, warn or off"):
        load_config()
    assert os.environ["CKPT_VERIFY"] == "maybe"


PRIVATE_MAP = textwrap.dedent("""
    import mmap, os, time
    fd = os.memfd_create("copies")
    os.write(fd, b"x" * 4 * mmap.PAGESIZE)
    m = mmap.mmap(fd, 4 * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)
    m[0:1] = b"y"                       # one page copied on write
    m[2 * mmap.PAGESIZE]                # one only read: the file's
    print("ready", flush=True)
    time.sleep(60)
""")


def test_private_copies_of_an_unlinked_file():
    child = subprocess.Popen([sys.executable, "-c", PRIVATE_MAP], stdout=subprocess.PIPE,
                             text=True)
    try:
        child.stdout.readline()
        taken = fingerprint.take([(child.pid, child.pid)])[str(child.pid)]
    finally:
        child.kill()
        child.wait()
    page_kb = os.sysconf("SC_PAGESIZE") // 1024
    assert taken["private copies of /memfd:copies (deleted)"] == f"{page_kb} kB"


def test_a_fingerprint_of_another_format_is_not_compared(tmp_path):
    """A checkpoint of another ckpt version: its restore goes on unverified
    (a warning), rather than failing on words it cannot compare."""
    from ckpt import verify
    saved = tmp_path / "fingerprint.json"
    saved.write_text(json.dumps({"format": 1, "processes": {}}))
    assert verify._other_format(saved) == 1
    saved.write_text(json.dumps({"format": fingerprint.FORMAT, "processes": {}}))
    assert verify._other_format(saved) is None
