"""`ckpt inspect` on real jobs: --diff of a job checkpointed twice, with
changes in between that the job made itself (a file opened and one closed,
an offset moved, 8 MiB mapped, a thread and a child process started); the
signals, timers and resource limits a job set, read back from its image."""
import json
import os
import re
import time

import jsonschema

from harness import REPO, SYSTEM_PYTHON, Job

MiB = 1 << 20


def validated(name, text):
    """A command's --json output, checked against docs/schemas/NAME.schema.json."""
    document = json.loads(text)
    schema = json.loads((REPO / "docs" / "schemas" / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(document)
    return document
CHANGING = r'''
import mmap, os, subprocess, sys, threading, time
work = sys.argv[1]
log = open(os.path.join(work, "log"), "w")
closed_later = open(os.path.join(work, "closed-later"), "w")
log.write("start\n"); log.flush()
print("READY", os.getpid(), log.fileno(), closed_later.fileno(), flush=True)
while not os.path.exists(os.path.join(work, "go")):
    time.sleep(0.05)
opened = open(os.path.join(work, "opened-later"), "a")
closed_later.close()
log.write("x" * 1000); log.flush()
region = mmap.mmap(-1, 8 << 20)
region[::4096] = b"\1" * 2048
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
child = subprocess.Popen(["sleep", "3600"])
print("CHANGED", opened.fileno(), child.pid, flush=True)
while True:
    time.sleep(1)
'''


def test_diff_of_two_checkpoints_of_a_real_job(session):
    script = session.work / "changing.py"
    script.write_text(CHANGING)
    job = Job(session, "diffed", [SYSTEM_PYTHON, script, session.work])
    job.wait_ready()
    pid, log_fd, closed_fd = map(int, re.search(r"READY (\d+) (\d+) (\d+)", job.output()).groups())
    first = job.checkpoint()
    (session.work / "go").touch()
    deadline = time.monotonic() + 60
    while "CHANGED" not in job.output():
        assert time.monotonic() < deadline, job.output()
        time.sleep(0.05)
    opened_fd, child_pid = map(int, re.search(r"CHANGED (\d+) (\d+)", job.output()).groups())
    second = job.checkpoint()

    found = validated("inspect-diff",
                      session.ckpt("inspect", "--diff", first, second, "--json").stdout)
    assert found["v"] == 1 and found["job_id"] == job.id
    assert (found["a"]["checkpoint"], found["b"]["checkpoint"]) == (1, 2)
    [appeared] = found["appeared"]
    assert appeared["pid"] == child_pid and appeared["ppid"] == pid, appeared
    assert appeared["exe"].endswith("/sleep") and found["gone"] == []
    [python] = [p for p in found["changed"] if p["pid"] == pid]
    assert [t["tid"] for t in python["threads"]["added"]] != [] and python["threads"]["removed"] == []
    assert [fd["fd"] for fd in python["fds"]["opened"]] == [opened_fd]
    assert python["fds"]["opened"][0]["path"] == str(session.work / "opened-later")
    assert python["fds"]["opened"][0]["flags"] == "O_WRONLY|O_APPEND"
    assert [(fd["fd"], fd["path"]) for fd in python["fds"]["closed"]] == \
        [(closed_fd, str(session.work / "closed-later"))]
    [moved] = [fd for fd in python["fds"]["changed"] if fd["fd"] == log_fd]
    assert moved["offset"] == [len("start\n"), len("start\n") + 1000], moved
    # the 8 MiB mapping: a region of its own, or the growth of one next to it
    memory = python["memory"]
    grown = sum(r["end"] - r["start"] for r in memory["added"]) + \
        sum(r["size_after"] - r["size_before"] for r in memory["resized"])
    assert grown >= 8 * MiB, memory
    assert memory["mapped_bytes"][1] - memory["mapped_bytes"][0] == memory["mapped_change"]
    # the second checkpoint saved the 2048 touched pages (it is a full one)
    assert memory["saved_bytes"][1] - memory["saved_bytes"][0] >= 2048 * 4096 // 2

    text = session.ckpt("inspect", "--diff", first, second).stdout
    assert text.startswith(f"job {job.id}: checkpoint 1 ({first}) -> checkpoint 2 ({second})\n")
    assert f"+ process {child_pid} on " in text and f"~ process {pid} on " in text, text
    assert f"    + fd {opened_fd} file O_WRONLY|O_APPEND offset 0  {session.work}/opened-later" in text
    assert f"    - fd {closed_fd} file  {session.work}/closed-later" in text
    assert f"    ~ fd {log_fd}: offset 6 -> 1006" in text, text
    assert "    + thread " in text

    # a checkpoint against itself: no change; against another job's: refused
    for checkpoint, pids in ((first, {pid}), (second, {pid, child_pid})):  # every process
        whole = validated("inspect", session.ckpt("inspect", checkpoint, "--json").stdout)
        assert {p["pid"] for p in whole["processes"]} == pids, whole["processes"]
    same = session.ckpt("inspect", "--diff", second, second).stdout
    assert same.splitlines()[1:] == ["  unchanged: 2 processes", "  no change"], same
    other = Job(session, "other", [SYSTEM_PYTHON, "-c",
                                   "import time; print('READY', flush=True); time.sleep(3600)"])
    other.wait_ready()
    foreign = other.checkpoint()
    refused = session.ckpt("inspect", "--diff", first, foreign, check=False)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "checkpoints of two jobs" in refused.stderr
    other.kill()
    job.kill()


SIGNALLED = r"""
import ctypes, os, resource, signal, time
libc = ctypes.CDLL(None, use_errno=True)
signal.signal(signal.SIGUSR1, lambda *a: None)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rt = signal.SIGRTMIN + 2
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2, rt])
os.kill(os.getpid(), signal.SIGUSR2)
assert libc.sigqueue(os.getpid(), rt, ctypes.c_void_p(4242)) == 0
resource.setrlimit(resource.RLIMIT_NOFILE, (777, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
resource.setrlimit(resource.RLIMIT_CORE, (0, 12345678))
signal.setitimer(signal.ITIMER_REAL, 5000, 2000)

class Sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_char * 48)]

class Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

class Itimerspec(ctypes.Structure):
    _fields_ = [("interval", Timespec), ("value", Timespec)]

timer = ctypes.c_void_p()
event = Sigevent(ctypes.c_void_p(77), signal.SIGRTMIN + 1, 0)  # SIGEV_SIGNAL
assert libc.timer_create(1, ctypes.byref(event), ctypes.byref(timer)) == 0  # CLOCK_MONOTONIC
spec = Itimerspec(Timespec(300, 0), Timespec(9000, 0))
assert libc.timer_settime(timer, 0, ctypes.byref(spec), None) == 0
print("READY", os.getpid(), timer.value or 0, flush=True)
while True:
    time.sleep(1)
"""


def test_signals_timers_and_rlimits_from_the_image(session):
    script = session.work / "signalled.py"
    script.write_text(SIGNALLED)
    job = Job(session, "signalled", [SYSTEM_PYTHON, script])
    job.wait_ready()
    pid, timer_id = map(int, re.search(r"READY (\d+) (\d+)", job.output()).groups())
    path = job.checkpoint()
    [proc] = validated("inspect", session.ckpt("inspect", path, "--json").stdout)["processes"]
    assert proc["pid"] == pid
    signals = proc["signals"]
    # SIGUSR2 (kill) and SIGRTMIN+2 (sigqueue, its value) wait, blocked, in the process's queue
    assert {"SIGUSR2", "SIGRTMIN+2"} <= set(signals["pending"]), signals["pending"]
    queued = [sig for queue in signals["queued"] if queue["tid"] is None
              for sig in queue["signals"]]
    assert {"signal": "SIGUSR2", "code": "SI_USER", "sender_pid": pid, "sender_uid": os.getuid()} \
        in queued, queued
    assert {"signal": "SIGRTMIN+2", "code": "SI_QUEUE", "sender_pid": pid,
            "sender_uid": os.getuid(), "value": 4242} in queued, queued
    handlers = {h["signal"]: h for h in signals["handlers"]}
    assert handlers["SIGTERM"]["handler"] == "ignore"
    assert handlers["SIGUSR1"]["handler"].startswith("0x")
    assert "SIGHUP" not in handlers  # left at its default
    [itimer] = proc["timers"]["itimers"]
    assert itimer["which"] == "real" and itimer["interval_s"] == 2000
    assert 0 < itimer["value_s"] <= 5000
    [posix] = proc["timers"]["posix"]
    assert posix["id"] == timer_id and posix["clock"] == "monotonic"
    assert posix["notify"] == "signal" and posix["signal"] == "SIGRTMIN+1"
    assert posix["value"] == 77 and posix["interval_s"] == 300 and posix["armed"]
    assert 0 < posix["left_s"] <= 9000
    assert proc["rlimits"]["nofile"]["soft"] == 777
    assert proc["rlimits"]["core"] == {"soft": 0, "hard": 12345678}
    assert proc["rlimits"]["cpu"] == {"soft": None, "hard": None}  # unlimited

    text = session.ckpt("inspect", path, "--pid", pid).stdout
    assert f"    queued for the process: SIGRTMIN+2 (SI_QUEUE from pid {pid} uid {os.getuid()}, " \
        "value 4242)" in text, text
    assert "    handler SIGTERM: ignore" in text
    assert re.search(r"    itimer real: [0-9.]+ s left, every 2000\.000 s", text), text
    assert re.search(rf"    posix timer {timer_id} \(monotonic\): [0-9.]+ s left, every "
                     r"300\.000 s, notify signal SIGRTMIN\+1", text), text
    assert "nofile 777/" in text and "core 0 B/11.8 MiB" in text, text
    job.kill()
