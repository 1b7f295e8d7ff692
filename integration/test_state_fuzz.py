"""The fuzzer of process state (integration/state_fuzz.py): Hypothesis
draws programs of operations on kernel state; each runs uninterrupted and
under ckpt (checkpoint --kill at its gate, restart), and both must print
the same observations of their state.  A difference is shrunk to the
smallest program and printed, with the diff.

The suite runs CKPT_STATEFUZZ_EXAMPLES (default 25) programs, derandomized
(the same ones every run), drawn from every operation kind but those of
KNOWN_FINDINGS and without the variants of KNOWN_VARIANTS, which have
their own xfail cases below.  `make statefuzz`
runs many more, of a new seed, of every kind (CKPT_STATEFUZZ_SEED=random,
CKPT_STATEFUZZ_KINDS=all); CKPT_STATEFUZZ_SEED=N repeats a seed."""
import os
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from harness import REPO
from state_fuzz import OPERATIONS, check, programs, program_text, run_uninterrupted

EXAMPLES = int(os.environ.get("CKPT_STATEFUZZ_EXAMPLES", "25"))
_SEED = os.environ.get("CKPT_STATEFUZZ_SEED", "fixed")

# Op kinds left out of the suite's run, each for a finding of the fuzzer
# that the restore does not yet pass (its minimized case is below).
KNOWN_FINDINGS = {
    "fill": "a Unix stream socket filled until EAGAIN takes 28672 bytes more after a "
            "restart (its queue's room is not the uninterrupted run's)",
    "reopen": "a pipe's read end reopened O_RDWR through /proc/self/fd comes back O_WRONLY",
}

# Variants of op kinds left out of the suite's run, each for a finding:
# name -> (does a program hold it, the finding)
KNOWN_VARIANTS = {
    "openpty-tiocgptpeer": (
        lambda ops: any(n == "openpty" and a[0] % 8 < 4 for n, a in ops),
        "a pty slave that glibc's openpty opened (ioctl TIOCGPTPEER: no O_LARGEFILE) comes "
        "back opened by path: fdinfo's and F_GETFL's flags gain O_LARGEFILE (0100000)"),
    "eventfd-fork": (
        lambda ops: _made_before_fork(ops, "eventfd"),
        "an eventfd inherited across fork comes back as two eventfds: the child's is no longer "
        "the parent's open file description (kcmp), so a write on one end no longer counts on "
        "the other"),
    "epoll-fork": (
        lambda ops: _made_before_fork(ops, "epoll"),
        "an epoll set inherited across fork comes back as two sets: the child's is no longer "
        "the parent's open file description (kcmp), so a change of the interest list in one "
        "no longer shows in the other"),
    "tcp-fill": (
        lambda ops: any(n == "tcp" for n, _ in ops) and any(n == "fill" for n, _ in ops),
        "a loopback TCP connection filled until EAGAIN comes back with its unread bytes split "
        "differently between the sender's and the receiver's queues (uninterrupted: 176640 "
        "unsent + 85504 to read; restarted: 134171 + 127973, the same 262144 in all): "
        "FIONREAD, SIOCOUTQ, the receiver's peek and how much a later write takes differ"),
    "memfd-fork": (
        lambda ops: _made_before_fork(ops, "memfd"),
        "a memfd inherited across fork comes back as two opens of it: the child's fd is no "
        "longer the parent's open file description (kcmp), so their offsets part"),
    "signalfd-fork": (
        lambda ops: _made_before_fork(ops, "signalfd"),
        "a signalfd inherited across fork comes back as two signalfds: the child's is no "
        "longer the parent's open file description (kcmp)"),
    "pty-master-closed": (
        lambda ops: _holds(ops, "openpty", "close"),
        "a pty slave whose master was closed (reads give EIO, poll 0x1d) comes back as a "
        "pipe's write end: another kind of fd"),
    "pipe-reopen-closed": (
        lambda ops: _holds(ops, "pipe", "reopen", "close"),
        "a pipe's read end opened again through /proc/self/fd/N of its write end after its "
        "first read end was closed has fdinfo flags 0, not 0100000 (open() forces "
        "O_LARGEFILE): the restart does not open it as the program did"),
    "pty-master-reopened": (
        lambda ops: _holds(ops, "openpty", "reopen"),
        "a pty master opened again through /proc/self/fd/N (a new pty, its slave never "
        "opened) comes back as a pipe's write end: another kind of fd"),
    "tcp-shutdown": (
        lambda ops: _holds(ops, "tcp", "shutdown"),
        "a TCP listener that was shut down (SHUT_RD or SHUT_RDWR) fails the checkpoint: "
        "\"DRAIN failed ...: fd 4: 2 TCP bytes not taken by the receiver (its buffer is "
        "full?)\""),
}


def _holds(ops, *kinds):
    names = {name for name, _ in ops}
    return all(k in names for k in kinds)


def _made_before_fork(ops, kind):
    made = False
    for name, _ in ops:
        made |= name == kind
        if made and name == "fork":
            return True
    return False


def known_variant(program):
    ops = program[0] + program[1]
    return any(holds(ops) for holds, _ in KNOWN_VARIANTS.values())


# The fuzzer's findings, each shrunk to its smallest program: the restore
# does not pass them yet.
FINDINGS = {
    # 2: found once mmap_shared_anon joined the suite's run (the programs drawn changed)
    "unix-stream-room-after-refill": (
        "socketpair 0\nfill 0\npipe 0\ndup2 3 1\ngate\nfill 0\npipe 0\ndup2 3 1\n",
        KNOWN_FINDINGS["fill"]),
    # 4: the same run
    "pipe-end-reopened-read-write": ("pipe 0\nreopen 0 2\ngate\n", KNOWN_FINDINGS["reopen"]),
    "pty-slave-flags": ("openpty 0\ngate\n", KNOWN_VARIANTS["openpty-tiocgptpeer"][1]),
    "eventfd-shared-across-fork": ("eventfd 0 0\nfork\ngate\n", KNOWN_VARIANTS["eventfd-fork"][1]),
    "epoll-shared-across-fork": ("epoll 0\nfork\ngate\n", KNOWN_VARIANTS["epoll-fork"][1]),
    "tcp-queues-split": ("tcp 0\nfill 0\ngate\n", KNOWN_VARIANTS["tcp-fill"][1]),
    "memfd-shared-across-fork": ("memfd 0 0\nfork\ngate\n", KNOWN_VARIANTS["memfd-fork"][1]),
    "signalfd-shared-across-fork": ("signalfd 0 0\nfork\ngate\n",
                                    KNOWN_VARIANTS["signalfd-fork"][1]),
    "pty-slave-of-closed-master": ("openpty 0\nclose 0\ngate\n",
                                   KNOWN_VARIANTS["pty-master-closed"][1]),
    "pipe-reopened-after-reader-closed": ("pipe 0\nclose 0\nreopen 0 0\ngate\n",
                                          KNOWN_VARIANTS["pipe-reopen-closed"][1]),
    "pty-master-reopened": ("openpty 4\nreopen 0 0\ngate\n", KNOWN_VARIANTS["pty-master-reopened"][1]),
    "tcp-listener-shut-down": ("tcp 2\nshutdown 0 2\ngate\n", KNOWN_VARIANTS["tcp-shutdown"][1]),
}

# Findings of the fuzzer that are fixed, each its shrunk program: they
# must stay fixed.
REGRESSIONS = {
    # 1: shared anonymous memory came back as a memfd (/proc/self/maps
    # named it /memfd:ckpt-shared (deleted), not /dev/zero (deleted))
    "shared-anonymous-map-backing": "mmap_shared_anon 0\ngate\n",
    # 7: a memfd's mode (fchmod) came back as memfd_create's 0777
    "memfd-mode": "memfd 0 0\nfchmod 0 0\ngate\n",
    # 15: the same, of a memfd that is also mapped (restored from its map's memfd)
    "mapped-memfd-mode": "memfd 0 0\nmmap_fd_shared 0\nfchmod 0 0\ngate\n",
}

KINDS = (set(OPERATIONS) if os.environ.get("CKPT_STATEFUZZ_KINDS") == "all"
         else set(OPERATIONS) - set(KNOWN_FINDINGS))
if "," in os.environ.get("CKPT_STATEFUZZ_KINDS", ""):   # a few kinds, to search them harder
    KINDS = set(os.environ["CKPT_STATEFUZZ_KINDS"].split(",")) & set(OPERATIONS)
SHRINK = os.environ.get("CKPT_STATEFUZZ_SHRINK", "1") != "0"


def _settings(f):
    f = settings(max_examples=EXAMPLES, deadline=None, database=None,
                 derandomize=_SEED == "fixed", print_blob=True,
                 phases=[Phase.generate] + ([Phase.shrink] if SHRINK else []),
                 suppress_health_check=list(HealthCheck))(f)
    if _SEED not in ("fixed", "random"):
        f = seed(int(_SEED))(f)
    return f


@pytest.fixture(scope="module", autouse=True)
def subject():
    """The subject is built here: it is not one of the engine's programs."""
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "apps"), "bin/statefuzz"],
                   check=True)


@pytest.fixture
def ran(tmp_path_factory):
    """A fresh directory for each program that Hypothesis draws."""
    count = [0]

    def where():
        count[0] += 1
        return tmp_path_factory.mktemp(f"program{count[0]}")
    yield where


# Shrinking runs a checkpoint and restart per candidate: after this many
# seconds of it, programs not run yet count as passing (the smallest
# failing program found so far is the one reported; programs already run
# give their result again, so Hypothesis' last replay still fails).
SHRINK_SECONDS = float(os.environ.get("CKPT_STATEFUZZ_SHRINK_SECONDS", "600"))


def test_restored_state_equals_an_uninterrupted_run(ran):
    results = {}        # program text -> the finding or None
    first_finding = []  # the time of the first finding: shrinking began
    started = time.monotonic()

    everything = KINDS == set(OPERATIONS)
    drawn = programs(KINDS) if everything else programs(KINDS).filter(
        lambda p: not known_variant(p))

    @_settings
    @given(drawn)
    def one(program):
        text = program_text(program)
        if text not in results:
            if first_finding and time.monotonic() - first_finding[0] > SHRINK_SECONDS:
                return
            try:
                results[text] = check(text, Path(ran()))
            except AssertionError as e:    # a checkpoint or restart that failed
                results[text] = f"program:\n{text}\nckpt failed: {e}"
            if results[text] and not first_finding:
                first_finding.append(time.monotonic())
        assert results[text] is None, results[text]
    try:
        one()
    finally:
        print(f"\nstate fuzzer: {len(results)} programs, {sum(map(bool, results.values()))} "
              f"failing, {time.monotonic() - started:.0f} s (seed {_SEED}, kinds: "
              f"{'all' if everything else ','.join(sorted(KINDS)) if ',' in os.environ.get('CKPT_STATEFUZZ_KINDS', '') else 'all but ' + ', '.join(sorted(KNOWN_FINDINGS) + sorted(KNOWN_VARIANTS))})")


def test_subject_prints_the_same_in_two_uninterrupted_runs(ran):
    """No ckpt: two runs of a program in two directories print the same, so
    that a difference under ckpt is the restore's (no false findings)."""
    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(programs(OPERATIONS, before=20, after=12))
    def one(program):
        text = program_text(program)
        first = run_uninterrupted(text, Path(ran()))
        assert first == run_uninterrupted(text, Path(ran()) / "a-longer-directory-name"), text
    one()


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression(name, ran):
    found = check(REGRESSIONS[name], Path(ran()))
    assert found is None, found


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_finding(name, ran, request):
    text, reason = FINDINGS[name]
    request.applymarker(pytest.mark.xfail(reason=reason, strict=False))
    found = check(text, Path(ran()))
    assert found is None, found
