"""A fuzzer of process state (issue 37): Hypothesis draws a short program
of operations on kernel state, integration/apps/statefuzz.c runs it, and
a restart must hand the program exactly the state an uninterrupted run has.

A program is two lists of operations: the ones before the checkpoint and
the ones after the restart.  The subject runs the first list, prints READY
and waits at its gate; then it prints an observation of its state (every
fd's kind, path, flags, offset, queued bytes, poll state, which fds share
an open file description by kcmp across its processes, pipe and socket
peers, mappings' contents in each process, signal mask, pending signals,
handlers, umask, cwd, rlimits, the files' contents), runs the second list
(each operation's result is printed) and prints a second observation.

run_uninterrupted() runs it without ckpt, run_restarted() under `ckpt
launch`, checkpointed with --kill at the gate and restarted with `ckpt
restart`; the two outputs must be equal, byte for byte (the subject
prints structure, never fd numbers, pids, addresses or inode numbers).

    python3 integration/state_fuzz.py PROGRAM_FILE   # one program, both ways, the diff
"""
import difflib
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import APPS, REPO, Job, Session, restart_and_finish  # noqa: E402

SUBJECT = APPS / "statefuzz"

# operation name -> a strategy of its arguments (slots are taken modulo
# the table's size by the subject, so any small number names one)
SLOT = st.integers(0, 7)
OPERATIONS = {
    # files: open with O_RDWR / O_RDWR|O_APPEND / O_RDONLY / O_WRONLY|O_APPEND
    "open": st.tuples(st.integers(0, 2), st.integers(0, 3)),
    "lseek": st.tuples(SLOT, st.sampled_from([0, 1, 7, 100, 5000]), st.integers(0, 2)),
    "write": st.tuples(SLOT, st.sampled_from([1, 10, 100, 4096, 5000])),
    "read": st.tuples(SLOT, st.sampled_from([1, 10, 100, 4096, 70000])),
    "unlink": st.tuples(st.integers(0, 2)),
    # sharing of fds and open file descriptions
    "dup": st.tuples(SLOT),
    "dup2": st.tuples(SLOT, st.integers(0, 7)),
    "dupfd": st.tuples(SLOT, st.integers(0, 7), st.integers(0, 1)),
    "reopen": st.tuples(SLOT, st.integers(0, 2)),   # /proc/self/fd/N: RDONLY, WRONLY, RDWR
    "close": st.tuples(SLOT),
    "fork": st.tuples(),                            # a child that keeps every fd and map
    "childwrite": st.tuples(SLOT, st.sampled_from([1, 100, 5000])),  # writes, closes, ends
    # pipes and Unix socket pairs (stream, dgram, seqpacket)
    "pipe": st.tuples(st.integers(0, 1)),           # O_NONBLOCK on both ends or not
    "fill": st.tuples(SLOT),
    "socketpair": st.tuples(st.integers(0, 2)),
    "shutdown": st.tuples(SLOT, st.integers(0, 2)),
    "sendfd": st.tuples(SLOT, SLOT),                # an fd in flight (SCM_RIGHTS)
    "recvfd": st.tuples(SLOT),
    # fd flags
    "setfl": st.tuples(SLOT, st.integers(0, 1), st.integers(0, 1)),  # O_NONBLOCK, O_APPEND
    "setfd": st.tuples(SLOT, st.integers(0, 1)),    # FD_CLOEXEC
    # memory: anonymous private, file shared, file private (of file c), of
    # a pages; shared anonymous memory is a kind of its own
    "mmap": st.tuples(st.sampled_from([0, 2, 3]), st.integers(0, 3), st.integers(0, 2)),
    "mmap_shared_anon": st.tuples(st.integers(0, 3)),
    "mwrite": st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 25)),
    "pwrite": st.tuples(st.integers(0, 2), st.integers(0, 3)),  # the file under a map changes
    # signals: SIGUSR1, SIGUSR2, SIGWINCH, SIGRTMIN+2
    "sigblock": st.tuples(st.integers(0, 3), st.integers(0, 1)),
    "sigaction": st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 7)),
    "raise": st.tuples(st.integers(0, 3)),
    # the process
    "umask": st.tuples(st.sampled_from([0, 0o22, 0o77, 0o27, 0o777])),
    "chdir": st.tuples(st.integers(0, 2)),
    "rlimit": st.tuples(st.integers(0, 3), st.integers(0, 7), st.integers(0, 1)),
}

# Operations that set up objects (drawn more often at first, so that
# the others find something to work on)
MAKERS = ["open", "pipe", "socketpair", "mmap", "mmap_shared_anon"]

# More kinds of state that real programs hold (issue 37's shapes)
OPERATIONS.update({
    # threads: one with its own signal mask (a: the 4 signals' bits), TLS
    # value and name, blocked in a read; commands to it (block, unblock a
    # signal, rename, a new TLS value), each answered with what it sees;
    # a signal to one thread; the main thread's name
    "thread": st.tuples(st.integers(0, 15)),
    "tcmd": st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 7)),
    "tkill": st.tuples(st.integers(0, 3), st.integers(0, 3)),
    "pname": st.tuples(st.integers(0, 3)),
    # memfds (sealable, 1-4 pages), maps of a slot's file or memfd,
    # shared or private, seals, modes
    "memfd": st.tuples(st.integers(0, 2), st.integers(0, 7)),
    "mmap_fd_shared": st.tuples(SLOT),
    "mmap_fd_private": st.tuples(SLOT),
    "seal": st.tuples(SLOT, st.integers(0, 4)),
    "fchmod": st.tuples(SLOT, st.integers(0, 3)),
    # ptys: a pair in one of four settings, termios changes, window sizes
    "openpty": st.tuples(st.integers(0, 7)),       # 4-7: the slave by open(ptsname)
    "termios": st.tuples(SLOT, st.integers(0, 5)),
    "winsize": st.tuples(SLOT, st.integers(0, 3)),
    # epoll: sets, ADD/MOD/DEL of six kinds of events (c: kind * 3 + op),
    # waits that never block
    "epoll": st.tuples(st.integers(0, 1)),
    "epoll_ctl": st.tuples(SLOT, SLOT, st.integers(0, 17)),
    "epoll_wait": st.tuples(SLOT, st.integers(0, 3)),
    # eventfd (initial count, EFD_SEMAPHORE, EFD_NONBLOCK), timerfd
    # (clock; disarmed, expired, armed for an hour, periodic), signalfd
    "eventfd": st.tuples(st.integers(0, 2), st.integers(0, 3)),
    "evwrite": st.tuples(SLOT, st.integers(0, 2)),
    "timerfd": st.tuples(st.integers(0, 2), st.integers(0, 3)),
    "signalfd": st.tuples(st.integers(0, 3), st.integers(0, 3)),
    # TCP on loopback: a connected pair, a listener with a connection not
    # accepted, a listener alone; accept
    "tcp": st.tuples(st.integers(0, 2)),
    "accept": st.tuples(SLOT),
})
MAKERS += ["thread", "memfd", "openpty", "epoll", "eventfd", "timerfd", "signalfd", "tcp"]


def operation(kinds):
    return st.one_of(*[st.tuples(st.just(k), OPERATIONS[k]) for k in sorted(kinds)])


def programs(kinds=OPERATIONS, before=12, after=8):
    """A program: (operations before the checkpoint, operations after)."""
    kinds = sorted(kinds)
    makers = [k for k in MAKERS if k in kinds]
    first = st.lists(operation(makers), min_size=1, max_size=3)
    return st.tuples(
        st.tuples(first, st.lists(operation(kinds), max_size=before)).map(lambda t: t[0] + t[1]),
        st.lists(operation(kinds), max_size=after))


def program_text(program):
    before, after = program
    line = lambda op: " ".join([op[0], *map(str, op[1])])  # noqa: E731
    return "\n".join([*map(line, before), "gate", *map(line, after)]) + "\n"


def parse_program(text):
    before, after, part = [], [], None
    part = before
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.strip() == "gate":
            part = after
            continue
        name, *args = line.split()
        part.append((name, tuple(int(a) for a in args)))
    return before, after


def run_uninterrupted(text, where):
    """The subject's output without ckpt, in a fresh directory."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "program").write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("ZDTM_HOLD", "LD_PRELOAD")}
    proc = subprocess.run([str(SUBJECT), "program"], cwd=where, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.endswith("PASS\n"), \
        f"the subject failed without ckpt ({proc.returncode}): {proc.stdout[-400:]} {proc.stderr}"
    return proc.stdout


def run_restarted(text, root, job_id="sf"):
    """The subject's output under ckpt: launched, checkpointed with --kill
    at its gate, restarted, run to its end."""
    session = Session(root, rng=random.Random(0))
    try:
        program = session.work / "program"
        program.write_text(text)
        job = Job(session, job_id, "statefuzz", "program")
        job.wait_ready()
        image = job.checkpoint("--kill")
        job.wait(timeout=60)
        return restart_and_finish(session, image, job)
    finally:
        session.end()


def section(output, tag):
    """One observation of an output (OBSERVE tag ... END tag)."""
    start = output.find(f"OBSERVE {tag}\n")
    return output[start:output.find(f"END {tag}\n", start)] if start >= 0 else ""


def difference(text, expected, got):
    """None, or what a finding prints: the program and the diff."""
    if expected == got:
        return None
    if section(expected, "gate") != section(got, "gate"):
        # before the checkpoint: the launch's difference, not the restore's
        raise RuntimeError("the job differs from an uninterrupted run before its checkpoint "
                           "(a difference of `ckpt launch`, or the subject prints something "
                           "that is not the same on every run):\n" + text + "".join(
                               difflib.unified_diff(section(expected, "gate").splitlines(True),
                                                    section(got, "gate").splitlines(True))))
    diff = "".join(difflib.unified_diff(expected.splitlines(True), got.splitlines(True),
                                        "uninterrupted", "restarted", n=2))
    return (f"the restarted run differs from the uninterrupted one.\n"
            f"program (before the gate: until the checkpoint):\n{text}\n{diff}")


def check(text, root):
    """Run the program both ways under root; the finding or None."""
    expected = run_uninterrupted(text, root / "uninterrupted")
    got = run_restarted(text, root / "ckpt")
    return difference(text, expected, got)


if __name__ == "__main__":
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "apps"), "bin/statefuzz"],
                   check=True)
    from harness import become_subreaper
    become_subreaper()
    root = Path(tempfile.mkdtemp(prefix="statefuzz-"))
    found = check(Path(sys.argv[1]).read_text(), root)
    shutil.rmtree(root, ignore_errors=True)
    print(found or "same state")
    sys.exit(1 if found else 0)
